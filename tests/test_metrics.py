"""kinetic_airflow.report() and the Keras callback: the runner's buffer, its bounded write rate,
storage errors, and what Airflow reads back (plain numbers only)."""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time

import cloudpickle
import pytest
from jobkit import make_job, run_runner

from kinetic_airflow.job import metrics as job_metrics
from kinetic_airflow.job.layout import JobLayout
from kinetic_airflow.job.storage import FileStorage, StorageNotFound, open_storage

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class CountingStorage(FileStorage):
    """Real file storage that counts the writes (the metrics writer's only calls)."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.writes: list[float] = []
        self.fail = fail
        self.lock = threading.Lock()

    def write_bytes(self, uri, data, *, if_absent=False):
        with self.lock:
            self.writes.append(time.monotonic())
        if self.fail:
            raise OSError("storage is down")
        return super().write_bytes(uri, data, if_absent=if_absent)


def _writer(tmp_path, storage, interval):
    layout = JobLayout.for_job(f"file://{tmp_path}", "job-1")
    return layout, job_metrics.MetricsWriter(storage, layout, 0, interval).activate()


def test_report_outside_a_job_does_nothing():
    assert job_metrics._active is None
    import kinetic_airflow

    kinetic_airflow.report(step=1, loss=0.5)  # no error, no buffer anywhere
    assert kinetic_airflow.report is job_metrics.report


def test_writes_are_bounded_by_the_interval_whatever_the_report_rate(tmp_path):
    storage = CountingStorage()
    layout, writer = _writer(tmp_path, storage, interval=0.2)
    started = time.monotonic()
    step = 0
    while time.monotonic() - started < 1.5:  # as fast as this loop goes: far above 1 per interval
        step += 1
        job_metrics.report(step=step, loss=1.0 / step, accuracy=step / (step + 1))
    elapsed = time.monotonic() - started
    writer.close()
    assert step > 10_000
    # one per elapsed interval, plus the final flush when the function returns
    assert 1 <= len(storage.writes) <= int(elapsed / 0.2) + 2, (len(storage.writes), elapsed)
    gaps = [b - a for a, b in zip(storage.writes, storage.writes[1:-1], strict=False)]
    assert all(gap >= 0.2 * 0.9 for gap in gaps), gaps
    read = job_metrics.read_attempt(storage, layout)
    # thinned for the charts, exact in the summary
    assert len(read["points"]["loss"]) <= job_metrics.MAX_POINTS_PER_CHUNK * len(storage.writes)
    assert read["points"]["loss"][-1] == [step, 1.0 / step]
    assert read["summary"]["loss"]["last"] == 1.0 / step and read["summary"]["loss"]["min"] == 1.0 / step
    assert read["summary"]["loss"]["count"] == step and read["summary"]["loss"]["max"] == 1.0
    assert read["summary"]["accuracy"]["max"] == step / (step + 1)
    assert job_metrics.best_of("accuracy", read["summary"]["accuracy"]) == step / (step + 1)
    assert job_metrics.best_of("val_loss", {"min": 1, "max": 2}) == 1


def test_a_storage_error_drops_points_with_one_warning(tmp_path, capsys):
    storage = CountingStorage(fail=True)
    _, writer = _writer(tmp_path, storage, interval=0.05)
    for i in range(5):
        job_metrics.report(loss=float(i))
        time.sleep(0.07)
    writer.close()
    assert len(storage.writes) >= 3
    err = capsys.readouterr().err
    assert err.count("could not write metrics") == 1, err
    assert writer.dropped == 5 and writer.summary["loss"]["count"] == 5


class FlakyStorage(CountingStorage):
    """Fails the first ``failures`` writes, then works."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def write_bytes(self, uri, data, *, if_absent=False):
        if self.failures > 0:
            self.failures -= 1
            raise OSError("a storage blip")
        return super().write_bytes(uri, data, if_absent=if_absent)


def test_the_final_flush_tries_again_after_a_storage_blip(tmp_path, capsys):
    """The last chunk's points are carried by no later chunk: two failed writes still store it."""
    storage = FlakyStorage(failures=2)
    layout, writer = _writer(tmp_path, storage, interval=600)
    job_metrics.report(step=1, loss=0.5)
    writer.close()
    read = job_metrics.read_attempt(storage, layout)
    assert read["summary"]["loss"]["count"] == 1 and writer.dropped == 0, read
    assert "could not write metrics" not in capsys.readouterr().err


def test_numbers_are_checked_steps_default_and_nan_is_a_gap(tmp_path, capsys):
    storage = CountingStorage()
    layout, writer = _writer(tmp_path, storage, interval=60)
    np = pytest.importorskip("numpy")
    job_metrics.report(loss=1.0, name="text", flag=True, version="1.5")
    job_metrics.report(loss=np.float32(0.5), name="again")
    job_metrics.report(step=10, loss=float("nan"))
    job_metrics.report(loss=0.25)
    writer.close()
    err = capsys.readouterr().err
    assert err.count("'text' is not a plain number") == 1 and "flag=True" in err
    assert "version='1.5' is not a plain number" in err  # a numeric string is still a string
    read = job_metrics.read_attempt(storage, layout)
    assert read["points"] == {"loss": [[1, 1.0], [2, 0.5], [10, None], [11, 0.25]]}
    assert read["summary"]["loss"] == {"last": 0.25, "last_step": 11, "min": 0.25, "max": 1.0, "count": 4}


def test_reading_keeps_only_plain_numbers(tmp_path):
    storage = open_storage(f"file://{tmp_path}")
    layout = JobLayout.for_job(f"file://{tmp_path}", "job-1")
    forged = {
        "points": {"loss": [[1, 0.5], [2, "<script>"], ["3", 1], [4, True], [5, {"x": 1}], [6, 0.25]]},
        "summary": {"loss": {"last": 0.25, "min": "x"}, "ok": {"last": 1, "count": 2}},
    }
    storage.write_text(layout.metrics_chunk(1), json.dumps(forged))
    storage.write_text(layout.metrics_chunk(2), "not json")
    read = job_metrics.read_attempt(storage, layout)
    assert read["points"] == {"loss": [[1, 0.5], [6, 0.25]]}
    assert read["summary"] == {"ok": {"last": 1, "last_step": None, "min": None, "max": None, "count": 2}}


def test_reading_is_bounded_whatever_storage_holds(tmp_path, monkeypatch):
    """A long job's many chunks come back thinned; a chunk too large to be ours, or its metrics
    past the limit, are left out (a bucket writer can forge them; the api-server reads them)."""
    storage = open_storage(f"file://{tmp_path}")
    layout = JobLayout.for_job(f"file://{tmp_path}", "job-1")
    for seq in range(1, 4):
        series = [[(seq - 1) * 2000 + i, 0.5] for i in range(1, 2001)]
        storage.write_text(layout.metrics_chunk(seq), json.dumps({"points": {"loss": series}}))
    many = {"points": {f"m{i}": [[1, 1.0]] for i in range(300)}}
    storage.write_text(layout.metrics_chunk(4), json.dumps(many))
    monkeypatch.setattr(job_metrics, "_MAX_CHUNK_BYTES", 200_000)
    storage.write_text(layout.metrics_chunk(5), json.dumps({"points": {"huge": [[1, 1.0]] * 20_000}}))
    whole_reads: list[str] = []
    monkeypatch.setattr(storage, "read_bytes", lambda uri: whole_reads.append(uri) or b"")
    read = job_metrics.read_attempt(storage, layout)
    assert whole_reads == []  # every chunk read through the bounded read, the huge one not whole
    loss = read["points"]["loss"]
    assert len(loss) == job_metrics.MAX_CURVE_POINTS and loss[-1] == [6000, 0.5] and loss[0] == [1, 0.5]
    assert "huge" not in read["points"]
    # as many metrics as a job's writer reports at most: loss and the first 199 of the forged 300
    assert len(read["points"]) == job_metrics._MAX_METRICS and "m198" in read["points"]


@pytest.mark.parametrize("scheme", ["file", "gs"])
def test_a_bounded_read_returns_none_past_the_limit_without_reading_the_rest(scheme, tmp_path, request):
    """Through the real storages (fake-gcs-server for gs://): a ranged read of limit + 1 bytes."""
    base = f"file://{tmp_path}" if scheme == "file" else request.getfixturevalue("gcs_bucket") + "/bounded"
    storage = open_storage(base)
    storage.write_bytes(f"{base}/small", b"x" * 100)
    storage.write_bytes(f"{base}/large", b"y" * 5000)
    assert storage.read_at_most(f"{base}/small", 100) == b"x" * 100
    assert storage.read_at_most(f"{base}/large", 100) is None
    assert storage.read_at_most(f"{base}/large", 5000) == b"y" * 5000
    storage.write_bytes(f"{base}/empty", b"")  # GCS answers a range on an empty object with 416
    assert storage.read_at_most(f"{base}/empty", 100) == b""
    with pytest.raises(StorageNotFound):
        storage.read_at_most(f"{base}/missing", 100)


def test_the_final_values_read_one_chunk_the_newest_readable(tmp_path):
    storage = open_storage(f"file://{tmp_path}")
    layout = JobLayout.for_job(f"file://{tmp_path}", "job-1")
    for seq, last in ((1, 0.9), (2, 0.5)):
        summary = {"loss": {"last": last, "last_step": seq, "min": last, "max": 0.9, "count": seq}}
        storage.write_text(
            layout.metrics_chunk(seq), json.dumps({"points": {"loss": [[seq, last]]}, "summary": summary})
        )
    storage.write_text(layout.metrics_chunk(3), "cut sho")
    read = job_metrics.read_attempt(storage, layout, summary_only=True)
    assert read == {
        "points": {},
        "summary": {"loss": {"last": 0.5, "last_step": 2, "min": 0.5, "max": 0.9, "count": 2}},
    }


def _trains(steps):
    import kinetic_airflow

    for step in range(1, steps + 1):
        kinetic_airflow.report(step=step, loss=1.0 / step)
    return "trained"


def test_the_runner_stores_the_points_before_the_result(base_uri):
    """On local disk and on GCS's wire protocol (fake-gcs-server)."""
    layout = make_job(base_uri, _trains, (5000,), manifest_overrides={"metrics_interval": 30})
    proc, summary = run_runner(layout)
    assert proc.returncode == 0, proc.stderr
    assert summary["ok"] and summary["value_repr"] == "'trained'"
    storage = open_storage(layout.job_uri)
    assert len(storage.list(layout.metrics_prefix)) == 1  # a short job: only the final flush
    read = job_metrics.read_attempt(storage, layout)
    assert read["summary"]["loss"]["last"] == 1 / 5000 and read["summary"]["loss"]["count"] == 5000


def _reports_then_waits(marker):
    import pathlib
    import time

    import kinetic_airflow

    for step in range(1, 4):
        kinetic_airflow.report(step=step, loss=1.0 / step)
    pathlib.Path(marker).write_text("reported")
    time.sleep(120)


def test_a_terminated_job_stores_the_points_of_its_last_interval(tmp_path):
    """SIGTERM (a preemption) before the writer's next interval: the points are stored anyway,
    so the next attempt's curve continues from them."""
    import signal
    import subprocess
    import sys
    import time

    from jobkit import KEY_ENV, key_of

    marker = tmp_path / "reported"
    layout = make_job(
        f"file://{tmp_path}",
        _reports_then_waits,
        (str(marker),),
        manifest_overrides={"metrics_interval": 600},
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "kinetic_airflow.runner", "--job-uri", layout.job_uri],
        env={**os.environ, KEY_ENV: key_of(layout.job_uri)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, (
                proc.stderr.read() if proc.stderr else ""
            )
            time.sleep(0.05)
        storage = open_storage(layout.job_uri)
        assert storage.list(layout.metrics_prefix) == []  # nothing written yet: the interval is 600 s
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM
    read = job_metrics.read_attempt(storage, layout)
    assert read["summary"]["loss"]["count"] == 3 and read["summary"]["loss"]["last"] == 1 / 3, read


def test_the_runner_survives_unwritable_metrics_storage(tmp_path):
    """A real storage error (the metrics folder's place is taken by a file): one warning in the
    job log, and the function's result is stored as usual."""
    layout = make_job(f"file://{tmp_path}", _trains, (100,), manifest_overrides={"metrics_interval": 0.05})
    (tmp_path / "jobs/job-1/metrics").write_text("not a folder")
    proc, summary = run_runner(layout)
    assert proc.returncode == 0, proc.stderr
    assert summary["ok"] and summary["value_repr"] == "'trained'"
    assert proc.stderr.count("could not write metrics") == 1, proc.stderr


def _fits_keras(epochs):
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras
    import numpy as np

    from kinetic_airflow.keras import MetricsCallback

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], dtype="float32"))[:, None]
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    model.fit(x, y, epochs=epochs, batch_size=16, verbose=0, callbacks=[MetricsCallback(every_n_batches=2)])
    return epochs


def test_keras_callback_reports_epochs_and_batches(tmp_path):
    layout = make_job(f"file://{tmp_path}", _fits_keras, (3,), manifest_overrides={"metrics_interval": 30})
    proc, summary = run_runner(layout, env={**os.environ, "KERAS_BACKEND": "jax"})
    assert proc.returncode == 0, proc.stderr
    assert summary["ok"], summary
    read = job_metrics.read_attempt(open_storage(layout.job_uri), layout)
    assert [p[0] for p in read["points"]["loss"]] == [1, 2, 3]
    assert [p[0] for p in read["points"]["mae"]] == [1, 2, 3]
    assert [p[0] for p in read["points"]["batch_loss"]] == [2, 4, 6, 8, 10, 12]  # 4 batches an epoch
    assert read["points"]["loss"][-1][1] < read["points"]["loss"][0][1]  # it trained


def test_keras_callback_checks_its_argument(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    pytest.importorskip("keras")
    from kinetic_airflow.keras import MetricsCallback

    with pytest.raises(ValueError, match="every_n_batches"):
        MetricsCallback(every_n_batches=0)


def test_an_epoch_only_callback_keeps_keras_batch_dispatch_asynchronous(monkeypatch):
    """Keras turns off asynchronous batch callbacks when any callback overrides a batch hook."""
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    keras = pytest.importorskip("keras")
    from kinetic_airflow.keras import MetricsCallback

    epochs_only = keras.callbacks.CallbackList([MetricsCallback()])
    every_batch = keras.callbacks.CallbackList([MetricsCallback(every_n_batches=1)])
    assert epochs_only._async_train is True
    assert every_batch._async_train is False


def test_the_vendored_chart_library_ships_in_the_wheel(built_wheel):
    """uPlot (from the npm registry) with its license and recorded version, beside the pages."""
    import zipfile

    with zipfile.ZipFile(built_wheel) as wheel:
        names = set(wheel.namelist())
        version = wheel.read("kinetic_airflow/ui/static/uplot/VERSION").decode()
    for name in ("uPlot.iife.min.js", "uPlot.min.css", "LICENSE", "VERSION"):
        assert f"kinetic_airflow/ui/static/uplot/{name}" in names, name
    assert "kinetic_airflow/ui/static/sweep.html" in names
    from kinetic_airflow.ui.app import UPLOT_VERSION

    assert version.startswith(f"uplot {UPLOT_VERSION},")


def test_a_multi_host_job_reports_from_host_0_unless_told(tmp_path, monkeypatch):
    storage = CountingStorage()
    layout = JobLayout.for_job(f"file://{tmp_path}", "job-1")
    assert job_metrics.start_for_job(storage, layout, 1, 0.05) is None
    job_metrics.report(loss=1.0)  # host 1: nothing buffered, nothing written
    assert storage.writes == []
    monkeypatch.setenv("KINETIC_METRICS_ALL_HOSTS", "1")
    writer = job_metrics.start_for_job(storage, layout, 1, 60)
    job_metrics.report(loss=2.0)
    writer.close()
    assert storage.list(layout.metrics_prefix) == [layout.metrics_chunk(1, host=1)]
    assert job_metrics.read_attempt(storage, layout, host=1)["summary"]["loss"]["last"] == 2.0
    assert job_metrics.read_attempt(storage, layout)["summary"] == {}  # host 0's curve: none


def test_attempts_after_a_preemption_continue_the_curve(tmp_path):
    """Each attempt is its own job (and its own chunks); the try's final is the newest attempt's
    last value, its best the best over all of them."""
    from kinetic_airflow.reported_metrics import combine, read_attempts

    storage = CountingStorage()
    jobs = []
    for attempt, steps in ((1, range(1, 6)), (2, range(4, 11))):  # resumed from the step-3 checkpoint
        layout = JobLayout.for_job(f"file://{tmp_path}", f"job-a{attempt}")
        writer = job_metrics.MetricsWriter(storage, layout, 0, 60).activate()
        for step in steps:
            job_metrics.report(step=step, loss=10.0 / step + attempt, acc=step / 10)
        writer.close()
        jobs.append(
            {"job_id": layout.job_uri.rsplit("/", 1)[1], "job_uri": layout.job_uri, "attempt": attempt}
        )
    attempts = read_attempts(jobs, lambda uri: storage)
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert [p[0] for p in attempts[1]["points"]["loss"]] == list(range(4, 11))
    combined = combine(attempts)
    assert combined["final"] == {"loss": 10.0 / 10 + 2, "acc": 1.0}
    assert combined["best"] == {"loss": min(10.0 / 5 + 1, 10.0 / 10 + 2), "acc": 1.0}
    assert combined["steps"] == {"loss": 10, "acc": 10}


def test_the_writer_stays_within_what_readers_accept(tmp_path, capsys):
    """The limits readers hold chunks to are the writer's own: at most 200 names a job (later ones
    dropped with one warning), 2,000 points a metric and 20,000 a chunk, and the bytes of the
    largest such chunk (long names, long floats) under the readers' byte limit."""
    storage = CountingStorage()
    layout, writer = _writer(tmp_path, storage, interval=600)
    wide = "é" * 100  # \u00e9 in JSON: six characters for one
    for step in range(2000):
        job_metrics.report(
            step=step * 1.000000000000001e300,
            **{f"{wide[:95]}{i:05d}": -1.2345678901234567e-300 for i in range(250)},
        )
    writer.close()
    assert capsys.readouterr().err.count("more than 200 metric names") == 1
    (chunk,) = storage.list(layout.metrics_prefix)
    data = open(chunk[len("file://") :], "rb").read()
    document = json.loads(data)
    assert len(document["points"]) == 200 and len(document["summary"]) == 200
    assert sum(len(series) for series in document["points"].values()) <= job_metrics.MAX_CHUNK_POINTS
    assert len(data) <= job_metrics._MAX_CHUNK_BYTES and job_metrics._within_writer_limits(data)
    read = job_metrics.read_attempt(storage, layout)
    assert len(read["points"]) == 200 and all(series for series in read["points"].values())


def _forged_chunk(points: int) -> bytes:
    return json.dumps({"points": {"loss": [[i, 0.5] for i in range(points)]}}).encode()


def test_forged_chunks_are_refused_before_they_are_parsed(tmp_path):
    """20 chunks of 8 MiB (1.4 M points each, what the old cap let through) and 20 of the
    largest size a writer's chunk can have, but packed with tiny points: the reader refuses them
    all from their bytes, and its peak allocation stays far below what one parse would cost."""
    import tracemalloc

    storage = open_storage(f"file://{tmp_path}")
    layout = JobLayout.for_job(f"file://{tmp_path}", "job-1")
    big = _forged_chunk(1_400_000)
    assert len(big) >= 8 * 1024 * 1024 - 1024 * 1024
    packed = b'{"points": {"loss": [' + b"[1,0]," * ((job_metrics._MAX_CHUNK_BYTES - 64) // 6) + b"[1,0]]}}"
    assert len(packed) <= job_metrics._MAX_CHUNK_BYTES
    for seq in range(1, 21):
        storage.write_bytes(layout.metrics_chunk(seq), big[: 8 * 1024 * 1024])
        storage.write_bytes(layout.metrics_chunk(100 + seq), packed)
    storage.write_text(layout.metrics_chunk(200), json.dumps({"points": {"loss": [[1, 0.5]]}}))
    tracemalloc.start()
    try:
        read = job_metrics.read_attempt(storage, layout, cache={})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert read["points"] == {"loss": [[1, 0.5]]}
    assert peak < 8 * 1024 * 1024, peak  # the bytes of one bounded read, not a parse of them


def test_curves_are_thinned_as_they_are_read_evenly_and_keep_the_last_point(tmp_path):
    """A long job's chunks (here 400 of 2,000 points: 800,000) come back as MAX_CURVE_POINTS evenly
    spaced points from first to last, and all curves of an attempt together within
    MAX_ATTEMPT_POINTS, while no more than a few of each curve's shares are held at once."""
    storage = open_storage(f"file://{tmp_path}")
    layout = JobLayout.for_job(f"file://{tmp_path}", "job-1")
    step = 0
    for seq in range(1, 401):
        series = [[step + i, float(step + i)] for i in range(2000)]
        step += 2000
        storage.write_text(layout.metrics_chunk(seq), json.dumps({"points": {"loss": series}}))
    read = job_metrics.read_attempt(storage, layout)
    loss = read["points"]["loss"]
    assert len(loss) == job_metrics.MAX_CURVE_POINTS
    assert loss[0] == [0, 0] and loss[-1] == [step - 1, step - 1]
    gaps = {b[0] - a[0] for a, b in itertools.pairwise(loss[:-1])}
    assert max(gaps) <= 2 * min(gaps), sorted(gaps)  # evenly spaced (strides of 2^k, at most two)

    many = JobLayout.for_job(f"file://{tmp_path}", "job-2")
    for seq in range(1, 11):
        points = {f"m{i}": [[seq * 100 + j, 1.0] for j in range(100)] for i in range(200)}
        storage.write_text(many.metrics_chunk(seq), json.dumps({"points": points}))
    read = job_metrics.read_attempt(storage, many)
    assert len(read["points"]) == 200
    assert sum(len(s) for s in read["points"].values()) <= job_metrics.MAX_ATTEMPT_POINTS
    assert all(len(s) == job_metrics.MAX_ATTEMPT_POINTS // 200 for s in read["points"].values())


def test_the_chunk_cache_is_sized_by_the_points_it_holds(tmp_path, monkeypatch):
    """However many chunks are read, the process-wide cache holds at most its budget of points
    (a count of chunks bounded nothing: one chunk may hold 20,000 points or one)."""
    from kinetic_airflow import reported_metrics

    monkeypatch.setattr(reported_metrics, "_CHUNKS", reported_metrics.OrderedDict())
    monkeypatch.setattr(reported_metrics, "_chunks_held", 0)
    monkeypatch.setattr(reported_metrics, "_CHUNKS_POINTS", 50_000)
    storage = open_storage(f"file://{tmp_path}")
    jobs = []
    for n in range(4):
        layout = JobLayout.for_job(f"file://{tmp_path}", f"job-{n}")
        for seq in range(1, 11):
            series = [[seq * 2000 + i, 0.5] for i in range(2000)]
            storage.write_text(layout.metrics_chunk(seq), json.dumps({"points": {"loss": series}}))
        jobs.append({"job_id": f"job-{n}", "job_uri": layout.job_uri})
    attempts = reported_metrics.read_attempts(jobs, lambda uri: storage)
    assert all(len(a["points"]["loss"]) == job_metrics.MAX_CURVE_POINTS for a in attempts)
    held = sum(weight for _, weight in reported_metrics._CHUNKS.values())
    assert held == reported_metrics._chunks_held <= 50_000
    assert len(reported_metrics._CHUNKS) == 50_000 // 2002  # whole chunks, the newest kept
