"""A graceful stop the function can see (issue 41 item 4): ``kinetic_airflow.stop_requested()``,
``on_stop`` hooks, a grace period from ``stop_grace_seconds``, and the metrics flushed on the way
out, through the real runner, the local backend and the emulated cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
from jobkit import KEY_ENV, key_of, make_job

from kinetic_airflow.job import metrics as job_metrics
from kinetic_airflow.job.storage import open_storage

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _checkpoints_on_stop(folder: str) -> str:
    """A training loop that saves its checkpoint when asked to stop; its stop hook reports the
    last metrics. Runs in the job."""
    import pathlib
    import threading
    import time

    import kinetic_airflow

    seen = {}

    def last_words() -> None:
        seen["hook_thread"] = threading.current_thread().name
        kinetic_airflow.report(step=10_000, final_loss=0.5)

    kinetic_airflow.on_stop(last_words)
    out = pathlib.Path(folder)
    step = 0
    while not kinetic_airflow.stop_requested():
        step += 1
        kinetic_airflow.report(step=step, loss=1.0 / step)
        if step == 3:
            (out / "running").write_text("3 steps")
        time.sleep(0.05)
    while "hook_thread" not in seen:  # the hook runs beside the function, in its own thread
        time.sleep(0.01)
    (out / "checkpoint.json").write_text(json.dumps({"step": step, "hook_thread": seen["hook_thread"]}))
    return "stopped"


def _wait_for(path: Path, proc: subprocess.Popen | None = None, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if proc is not None:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_the_runner_tells_the_function_and_flushes_its_last_metrics(tmp_path):
    """SIGTERM: stop_requested() turns True, the hook runs in the kinetic-stop-hooks thread and
    reports, the function saves its checkpoint and returns; the job still ends of SIGTERM with no
    result (a stopped job does not succeed), and every point reported is in storage."""
    layout = make_job(
        f"file://{tmp_path}",
        _checkpoints_on_stop,
        (str(tmp_path),),
        # the writer's interval is far away: only the stop's flush can store the points
        manifest_overrides={"metrics_interval": 600, "stop_grace_seconds": 60},
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "kinetic_airflow.runner", "--job-uri", layout.job_uri],
        env={**os.environ, KEY_ENV: key_of(layout.job_uri)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(tmp_path / "running", proc)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM, stderr
    checkpoint = json.loads((tmp_path / "checkpoint.json").read_text())
    assert checkpoint["hook_thread"] == "kinetic-stop-hooks"
    storage = open_storage(layout.job_uri)
    assert storage.read_text_or_none(layout.result_summary()) is None, "a stopped job has no result"
    assert storage.read_text_or_none(layout.status("terminated")) is not None
    read = job_metrics.read_attempt(storage, layout)
    assert read["summary"]["final_loss"]["last"] == 0.5, read["summary"]
    assert read["summary"]["loss"]["count"] >= 3, read["summary"]
    assert "no result is written" in stderr


def _ignores_the_stop(folder: str) -> None:
    import pathlib
    import time

    pathlib.Path(folder, "running").write_text("yes")
    time.sleep(600)


def test_a_function_that_ignores_the_stop_ends_after_its_grace(tmp_path):
    """The grace bounds the stop: a function that never looks is ended once it is over."""
    layout = make_job(
        f"file://{tmp_path}",
        _ignores_the_stop,
        (str(tmp_path),),
        manifest_overrides={"stop_grace_seconds": 1},
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "kinetic_airflow.runner", "--job-uri", layout.job_uri],
        env={**os.environ, KEY_ENV: key_of(layout.job_uri)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(tmp_path / "running", proc)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM, stderr
    assert "stop grace period over; the function still running" in stderr


def test_outside_a_job_nothing_asks_for_a_stop():
    import kinetic_airflow

    assert kinetic_airflow.stop_requested() is False
    with pytest.raises(TypeError, match="a function to call with no arguments"):
        kinetic_airflow.on_stop("save")  # type: ignore[arg-type]


def test_stop_grace_seconds_is_checked_at_parse_time():
    from kinetic_airflow.options import KineticOptionError, check_option

    assert check_option("stop_grace_seconds", 0) == 0
    fix = r"stop_grace_seconds=-5 must be 0 or more.*e\.g\. stop_grace_seconds=60"
    with pytest.raises(KineticOptionError, match=fix):
        check_option("stop_grace_seconds", -5)


# Through the backends' own cancel: the local process tree and the emulated cluster's pods -------
def _cancel_and_check(backend: str, folder: Path, grace: float, stop=None):
    """Start the checkpointing job, stop it with ``stop(ref)`` (the backend's cancel by default)
    once it runs, and check its checkpoint and its stop hook's metrics."""
    from jobkit import gke_job

    from kinetic_airflow.backends.registry import get_backend
    from kinetic_airflow.job.layout import JobLayout

    _, ref, storage = gke_job(
        "stops",
        _checkpoints_on_stop,
        [str(folder)],
        backend=backend,
        operator_kwargs={"stop_grace_seconds": grace},
        manifest={"stop_grace_seconds": grace, "metrics_interval": 600},
    )
    assert ref.stop_grace_seconds == grace
    _wait_for(folder / "running")
    if stop is None:
        get_backend(backend).cancel(ref)  # what `kinetic-airflow jobs cancel` and on_kill end with
    else:
        stop(ref)
    _wait_for(folder / "checkpoint.json", seconds=60)
    layout = JobLayout(ref.job_uri)
    deadline = time.monotonic() + 60
    while "final_loss" not in job_metrics.read_attempt(storage, layout)["summary"]:
        assert time.monotonic() < deadline, "the stop hook's metrics never reached storage"
        time.sleep(0.2)
    read = job_metrics.read_attempt(storage, layout)
    assert read["summary"]["final_loss"]["last"] == 0.5 and read["summary"]["loss"]["count"] >= 3
    assert storage.read_text_or_none(layout.result_summary()) is None, "a stopped job has no result"
    return ref


def test_local_cancel_leaves_the_checkpoint_and_the_last_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    _cancel_and_check("local", tmp_path, 30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from emulated_cluster import running_emulator

    with running_emulator(tmp_path_factory) as running:
        yield running


def test_an_emulated_pod_deleted_leaves_the_checkpoint_and_the_last_metrics(cluster, tmp_path, monkeypatch):
    """The Job's pod gets terminationGracePeriodSeconds = grace + the flush's margin; deleting the
    Job (the backend's cancel) sends SIGTERM to the runner, which saves and flushes in it (the
    emulator caps grace periods at 5 s, still room for this function's quick save)."""
    import kubernetes
    from emulated_cluster import point_kinetic_at

    point_kinetic_at(*cluster, monkeypatch)
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    from kinetic_airflow.backends.gke.backend import GKEBackend

    ref = _cancel_and_check("gke", tmp_path, 3)
    assert GKEBackend().manifest(ref)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 13
    core = kubernetes.client.CoreV1Api(cluster[0].api_client())
    pods = core.list_namespaced_pod("default", label_selector="kinetic.airflow/task-id=stops").items
    for pod in pods:  # the pod may already be gone once deleted
        assert pod.spec.termination_grace_period_seconds == 13


def test_an_emulated_spot_preemption_leaves_the_checkpoint_and_the_last_metrics(
    cluster, tmp_path, monkeypatch
):
    """A Spot node reclaimed (the emulator's preempt_pod: the pod gets SIGTERM, its grace, then a
    DisruptionTarget condition, as GKE's graceful node shutdown does): the function sees the stop,
    saves its checkpoint and its last metrics reach storage before the pod ends."""
    import kubernetes
    from emulated_cluster import point_kinetic_at

    emulator = cluster[0]
    point_kinetic_at(*cluster, monkeypatch)
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    core = kubernetes.client.CoreV1Api(emulator.api_client())

    def preempt(ref) -> None:
        selector = f"job-id={ref.job_id}"
        (pod,) = core.list_namespaced_pod("default", label_selector=selector).items
        emulator.preempt_pod("default", pod.metadata.name)

    _cancel_and_check("gke", tmp_path, 3, stop=preempt)


def test_execution_timeout_leaves_the_checkpoint_and_the_last_metrics(tmp_path, monkeypatch):
    """dag.test(): the task's execution_timeout stops the local job; the function sees it, saves
    its checkpoint in KINETIC_OUTPUT_DIR, and its stop hook's metrics are in storage."""
    import kn_stop
    from helpers import ti_states

    from kinetic_airflow.job.layout import JobLayout
    from kinetic_airflow.job.storage import uri_to_local_path

    base_uri = f"file://{tmp_path}/kinetic"
    monkeypatch.setenv("KINETIC_BASE_URI", base_uri)
    dr = kn_stop.kn_stop_timeout().test()
    assert ti_states(dr) == {"trains_until_stopped": "failed"}
    storage = open_storage(base_uri)
    (job,) = [p.name for p in (tmp_path / "kinetic/jobs").iterdir()]
    layout = JobLayout.for_job(base_uri, job)
    manifest = json.loads(storage.read_text_or_none(layout.manifest))
    assert manifest["stop_grace_seconds"] == 30
    checkpoint = Path(uri_to_local_path(manifest["output_dir"])) / "checkpoint.json"
    assert json.loads(checkpoint.read_text())["step"] >= 1
    read = job_metrics.read_attempt(storage, layout)
    assert read["summary"]["final_loss"]["last"] == 0.5, read["summary"]
    assert storage.read_text_or_none(layout.result_summary()) is None


def _fits_until_stopped(folder: str) -> str:
    import os
    import pathlib

    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras
    import numpy as np

    from kinetic_airflow.keras import CheckpointOnStop

    class Started(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                pathlib.Path(folder, "running").write_text("2 epochs")

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    stop = CheckpointOnStop(filepath=str(pathlib.Path(folder, "stopped.keras")))
    history = model.fit(x, y, epochs=100_000, batch_size=16, verbose=0, callbacks=[Started(), stop])
    pathlib.Path(folder, "fit_returned").write_text(str(len(history.epoch)))
    return "stopped"


def test_the_keras_callback_saves_the_model_and_ends_fit_when_asked(tmp_path):
    layout = make_job(
        f"file://{tmp_path}",
        _fits_until_stopped,
        (str(tmp_path),),
        manifest_overrides={"stop_grace_seconds": 60},
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "kinetic_airflow.runner", "--job-uri", layout.job_uri],
        env={**os.environ, KEY_ENV: key_of(layout.job_uri), "KERAS_BACKEND": "jax"},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(tmp_path / "running", proc, seconds=300)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM, stderr
    assert (tmp_path / "stopped.keras").stat().st_size > 0
    assert int((tmp_path / "fit_returned").read_text()) < 100_000  # fit ended early, on the stop
