"""A job exists only while a try of its task watches it or has delivered it.

Between the backend call that creates a job and the hand-off to a watcher (the trigger, or
the in-worker wait) the worker owns the job; an error there must not leave it running for
nobody (on GKE: an accelerator billed for nothing, shown live for ever). Here an error is
injected at every step of that stretch, on every backend — local processes, and GKE Jobs and
Pathways LeaderWorkerSets on the cluster emulator, whose pods are real processes — through a
real ``dag.test()`` run; afterwards no job of the task is alive, the task failed with the
injected error itself, and the job record and the job's cancelled marker say who stopped
the job and why.

The faults are injected with monkeypatch on the one step function each (the code under test
runs unchanged around them).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from emulated_cluster import point_kinetic_at, running_emulator
from helpers import ti_states

from kinetic_airflow.backends.local import process_alive
from kinetic_airflow.backends.registry import get_backend
from kinetic_airflow.job.layout import STATE_KEY
from kinetic_airflow.job.ref import JobRef
from kinetic_airflow.job.storage import open_storage
from kinetic_airflow.lifecycle import Phase, cancelled_marker

pytestmark = pytest.mark.timeout(240)

TASK = "runs_until_told"


class InjectedFault(RuntimeError):
    pass


def _raise(step: str):
    raise InjectedFault(f"injected fault at {step}")


def _after(monkeypatch, owner, name: str, step: str) -> None:
    """``owner.name`` does its work, then fails (a response lost after the request took effect)."""
    original = getattr(owner, name)

    def fails_after(*args, **kwargs):
        original(*args, **kwargs)
        _raise(step)

    monkeypatch.setattr(owner, name, fails_after)


def _instead(monkeypatch, owner, name: str, step: str, *, is_async: bool = False) -> None:
    def fails(*args, **kwargs):
        _raise(step)

    async def afails(*args, **kwargs):
        _raise(step)

    monkeypatch.setattr(owner, name, afails if is_async else fails)


def _record_write_fails(monkeypatch, phase: Phase, step: str) -> None:
    """The worker's job-record write (``kinetic_airflow.driver``) fails for ``phase`` only."""
    import kinetic_airflow.driver as driver

    original = driver.save_record

    def save_record(store, wanted, **kwargs):
        if wanted is phase:
            _raise(step)
        return original(store, wanted, **kwargs)

    monkeypatch.setattr(driver, "save_record", save_record)


def _inject(step: str, backend: str, monkeypatch) -> None:
    from kinetic_airflow.driver import JobDriver
    from kinetic_airflow.operators import KineticRunOperator
    from kinetic_airflow.triggers import KineticJobTrigger
    from kinetic_airflow.watch import JobWatcher

    if step == "backend_submit":  # the backend created the job, then its call failed
        _after(monkeypatch, type(get_backend(backend)), "submit", step)
    elif step == "record_created":
        _record_write_fails(monkeypatch, Phase.CREATED, step)
    elif step == "ship_payload":
        _instead(monkeypatch, JobDriver, "_ship_payload", step)
    elif step == "record_shipped":
        _record_write_fails(monkeypatch, Phase.SHIPPED, step)
    elif step == "record_waiting":
        _record_write_fails(monkeypatch, Phase.WAITING, step)
    elif step == "push_links":
        _instead(monkeypatch, JobDriver, "_push_links", step)
    elif step == "build_watcher":  # the in-worker wait (wait_before_defer) builds a watcher
        monkeypatch.setenv("KINETIC_WAIT_BEFORE_DEFER", "30")
        _instead(monkeypatch, JobDriver, "_watcher", step)
    elif step == "in_worker_wait":
        monkeypatch.setenv("KINETIC_WAIT_BEFORE_DEFER", "30")
        _instead(monkeypatch, JobWatcher, "wait", step, is_async=True)
    elif step == "build_trigger":
        _instead(monkeypatch, KineticJobTrigger, "__init__", step)
    elif step == "defer":  # e.g. a trigger that cannot be serialized
        _instead(monkeypatch, KineticRunOperator, "defer", step)
    else:
        raise AssertionError(step)


STEPS = [
    "backend_submit",
    "record_created",
    "ship_payload",
    "record_shipped",
    "record_waiting",
    "push_links",
    "build_watcher",
    "in_worker_wait",
    "build_trigger",
    "defer",
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_emulator(tmp_path_factory) as running:  # every TPU and GPU pool
        yield running


@pytest.fixture
def job_env(tmp_path, monkeypatch):
    """A flag that ends the job (set at teardown, so a job left behind does not run on), and
    a place for the task's error."""
    flag = tmp_path / "flag"
    monkeypatch.setenv("KN_UNWATCHED_FLAG", str(flag))
    out = tmp_path / "failures"
    out.mkdir()
    monkeypatch.setenv("KN_TEST_FAILURES", str(out))
    yield out
    flag.write_text("stop")


def _store_record(dr) -> dict:
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        value = session.scalar(
            select(TaskStateStoreModel.value).where(
                TaskStateStoreModel.dag_id == dr.dag_id,
                TaskStateStoreModel.run_id == dr.run_id,
                TaskStateStoreModel.task_id == TASK,
                TaskStateStoreModel.key == STATE_KEY,
            )
        )
    assert value, "no job record: the task never got as far as creating its job"
    record = json.loads(value)
    return json.loads(record) if isinstance(record, str) else record


def _local_processes(job: JobRef) -> list[int]:
    """Live processes of a local job: its supervisor and everything in its process group."""
    launch = Path(job.local_dir) / "launch.json"
    if not launch.exists():
        return []
    pid = int(json.loads(launch.read_text())["pid"])
    live = [pid] if process_alive(pid) else []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pid:  # state, ppid, pgrp
            live.append(int(stat.parent.name))
    return sorted(set(live))


def _cluster_leftovers(emulator, job: JobRef) -> list[str]:
    """The job's Kubernetes object (Job or LeaderWorkerSet), its pods, and their processes."""
    import kubernetes

    backend = get_backend(job.backend)
    name = backend.object_name(job)
    client = emulator.api_client()
    left: list[str] = []
    if job.backend == "gke":
        batch = kubernetes.client.BatchV1Api(client)
        left += [
            f"Job {j.metadata.name}"
            for j in batch.list_namespaced_job("default").items
            if j.metadata.name == name
        ]
    else:
        custom = kubernetes.client.CustomObjectsApi(client)
        groups = custom.list_namespaced_custom_object(
            "leaderworkerset.x-k8s.io", "v1", "default", "leaderworkersets"
        )["items"]
        left += [f"LeaderWorkerSet {g['metadata']['name']}" for g in groups if g["metadata"]["name"] == name]
    core = kubernetes.client.CoreV1Api(client)
    left += [
        f"Pod {p.metadata.name}"
        for p in core.list_namespaced_pod("default").items
        if p.metadata.name.startswith(name)
    ]
    left += [
        f"process {p['pid']} of pod {p['pod']}" for p in emulator.processes() if p["pod"].startswith(name)
    ]
    return left


def _live(job: JobRef, emulator) -> list[str]:
    if job.backend == "local":
        return [f"process {pid}" for pid in _local_processes(job)]
    return _cluster_leftovers(emulator, job)


def _eventually_none_live(job: JobRef, emulator, timeout: float = 45) -> None:
    """A cancelled job's pods take a moment to stop; a job nobody cancelled runs for 300 s."""
    end = time.monotonic() + timeout
    while True:
        live = _live(job, emulator)
        if not live or time.monotonic() > end:
            break
        time.sleep(0.3)
    assert live == [], f"job {job.job_id} was left running unwatched: {live}"


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("backend", ["local", "gke", "pathways"])
def test_an_error_before_a_watcher_holds_the_job_leaves_no_job_running(
    backend, step, job_env, tmp_path, monkeypatch, request
):
    import kn_unwatched

    emulator = None
    if backend == "local":
        monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    else:
        emulator, kubeconfig = request.getfixturevalue("cluster")
        point_kinetic_at(emulator, kubeconfig, monkeypatch)
        # the Job on fake GCS; the slice's hosts meet in a shared directory (KINETIC_OUTPUT_DIR)
        base = request.getfixturevalue("gcs_bucket") if backend == "gke" else f"file://{tmp_path}"
        monkeypatch.setenv("KINETIC_BASE_URI", f"{base}/kinetic")
    _inject(step, backend, monkeypatch)

    dr = kn_unwatched.DAGS[backend].test()

    assert ti_states(dr) == {TASK: "failed"}
    kind, message = (job_env / f"{TASK}.txt").read_text().split("\n", 1)
    assert kind.endswith("InjectedFault") and message == f"injected fault at {step}"  # the error itself
    record = _store_record(dr)
    job = JobRef.from_dict(record["job"])
    _eventually_none_live(job, emulator)
    assert record["phase"] == "cancelled", record["phase"]
    reason = record["cancelled"]["reason"]
    assert record["cancelled"]["by"] == "worker"
    assert reason.startswith(
        f"the worker failed before it could watch the job: InjectedFault: injected fault at {step} (while "
    ), reason
    (entry,) = record["jobs"]  # what the Kinetic view lists: this job, cancelled, and why
    assert entry["phase"] == "cancelled" and entry["cancelled"]["reason"] == reason
    marker = json.loads(open_storage(job.job_uri).read_text(cancelled_marker(job)))
    assert marker["by"] == "worker" and marker["reason"] == reason  # what the watcher and CLI show
    # the cause is a field, set from the step (not read from the reason's words): the view and
    # the CLI tell a packaging failure from the worker's other failures by it
    cause = "packaging_failed" if step == "ship_payload" else "worker_failed"
    assert record["cancelled"]["cause"] == entry["cancelled"]["cause"] == marker["cause"] == cause
    # nothing the job made is deleted on the way (DESIGN: no failure path deletes files)
    if step not in ("backend_submit", "record_created", "ship_payload"):
        assert open_storage(job.job_uri).exists(job.job_uri + "/manifest.json")


def test_a_bad_poll_interval_fails_before_any_job_exists(job_env, tmp_path, monkeypatch):
    """The issue's case: a setting that does not parse names itself, and no job was created."""
    import kn_unwatched

    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    task = kn_unwatched.DAGS["local"].get_task(TASK)
    monkeypatch.setattr(task, "poll_interval", "2s")

    dr = kn_unwatched.DAGS["local"].test()

    assert ti_states(dr) == {TASK: "failed"}
    kind, message = (job_env / f"{TASK}.txt").read_text().split("\n", 1)
    assert kind.endswith("KineticSettingError"), kind
    assert "poll_interval='2s'" in message and "a number of seconds" in message, message
    assert list(tmp_path.rglob("launch.json")) == []  # no local job was ever started
