"""A storage outage while a task watches its job fails no task whose job succeeds.

Real storage made to fail for a while: a ``file://`` job directory made immutable
(``chattr +i``: root's writes fail with "Operation not permitted", as in the issue), a status
directory replaced by a file (reads fail with "Not a directory"), and ``gs://`` on
fake-gcs-server with 503s injected at the storage methods of the watching process for a
window (the job's own process writes its result to the real server meanwhile). The watcher
rides out an outage shorter than ``[kinetic] storage_retry_seconds``; a longer one stops the
job and fails the task naming the storage URI and the operation.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from emulated_cluster import point_kinetic_at, running_emulator
from helpers import ti_states, xcom

pytestmark = pytest.mark.timeout(300)

TASK = "until_told"


class Records(logging.Handler):
    """The messages one logger emits (the watcher's warnings), for the test to wait on."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []
        self.logger = logging.getLogger(name)

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def count(self, text: str) -> int:
        return sum(text in m for m in list(self.messages))

    def __enter__(self) -> Records:
        self.logger.addHandler(self)
        return self

    def __exit__(self, *_: object) -> None:
        self.logger.removeHandler(self)


class Breaker:
    """Breaks storage from a thread while ``dag.test()`` runs in the main one (Airflow installs
    signal handlers there). ``steps`` waits with ``until``; its errors are raised by ``join``."""

    def __init__(self, steps) -> None:
        self.done = threading.Event()  # dag.test() returned: stop waiting
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(steps,), daemon=True)
        self.thread.start()

    def _run(self, steps) -> None:
        try:
            steps(self)
        except BaseException as exc:
            self.errors.append(exc)

    def until(self, condition, what: str, timeout: float = 90) -> None:
        end = time.monotonic() + timeout
        while not condition():
            if self.done.is_set():
                raise AssertionError(f"dag.test() ended before: {what}")
            if time.monotonic() > end:
                raise AssertionError(f"never happened: {what}")
            time.sleep(0.05)

    def join(self) -> None:
        self.done.set()
        self.thread.join(60)
        if self.errors:
            raise self.errors[0]


@pytest.fixture
def outage_env(tmp_path, monkeypatch):
    flag = tmp_path / "flag"
    monkeypatch.setenv("KN_OUTAGE_FLAG", str(flag))
    out = tmp_path / "failures"
    out.mkdir()
    monkeypatch.setenv("KN_TEST_FAILURES", str(out))
    yield flag, out
    flag.write_text("stop")  # a job a failing test left behind ends


def _job_dir(root: Path) -> Path | None:
    found = sorted(root.rglob("launch.json")) if root.exists() else []
    return found[0].parent if found else None


def _log_lines(job_dir: Path) -> int:
    path = job_dir / "job.log"
    return path.read_text(errors="replace").count("\n") if path.exists() else 0


def _chattr(flag: str, *paths: Path) -> None:
    subprocess.run(["chattr", flag, *map(str, paths)], check=True)


def test_file_storage_unwritable_mid_run_fails_no_task(outage_env, tmp_path, monkeypatch):
    """The issue's case: the log cursor cannot be written while the job runs and prints."""
    import kn_outage

    flag, _ = outage_env
    root = tmp_path / "kinetic"
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{root}")
    found: dict[str, Path] = {}

    def steps(b: Breaker) -> None:
        b.until(lambda: _job_dir(root) is not None, "the job started")
        job_dir = found["job"] = _job_dir(root)
        status = job_dir / "status"
        b.until(lambda: (status / "log-cursor.json").exists(), "the watcher saved its cursor")
        _chattr("+i", job_dir, status)  # nothing can be created or replaced in them, even by root
        try:
            b.until(lambda: watch_log.count("could not save the log cursor") > 0, "a failed write")
            lines = _log_lines(job_dir)
            b.until(lambda: _log_lines(job_dir) > lines + 40, "more lines while unwritable")
        finally:
            _chattr("-i", job_dir, status)
        flag.write_text("stop")

    with Records("kinetic_airflow.watch") as watch_log:
        breaker = Breaker(steps)
        dr = kn_outage.DAGS["chatty"].test()
        breaker.join()

    job_dir = found["job"]
    status = job_dir / "status"
    assert ti_states(dr) == {TASK: "success"}
    assert xcom(dr, TASK) == "ok"
    assert watch_log.count("saved the log cursor") >= 1  # and again once storage was back
    cursor = json.loads((status / "log-cursor.json").read_text())
    assert cursor["offset"] == (job_dir / "job.log").stat().st_size  # the final cursor is current


def test_gcs_outage_while_the_job_ends_fails_no_task(outage_env, tmp_path, monkeypatch, gcs_bucket):
    """503s from GCS to the watching process while the job ends and writes its result."""
    import kn_outage
    from google.api_core import exceptions as gexc

    from kinetic_airflow.job.storage import GCSStorage

    flag, _ = outage_env
    monkeypatch.setenv("KINETIC_BASE_URI", f"{gcs_bucket}/kinetic")
    local = tmp_path / "local-jobs"
    monkeypatch.setenv("KINETIC_LOCAL_STATE_DIR", str(local))
    outage = threading.Event()
    refused: list[str] = []

    def unavailable(original):
        def call(self, uri, *args, **kwargs):
            if outage.is_set():
                refused.append(uri)
                raise gexc.ServiceUnavailable(f"injected outage: GCS answers 503 for {uri}")
            return original(self, uri, *args, **kwargs)

        return call

    monkeypatch.setattr(GCSStorage, "read_bytes", unavailable(GCSStorage.read_bytes))
    monkeypatch.setattr(GCSStorage, "write_bytes", unavailable(GCSStorage.write_bytes))

    def steps(b: Breaker) -> None:
        b.until(lambda: _job_dir(local) is not None and _log_lines(_job_dir(local)) > 5, "job running")
        outage.set()
        try:
            flag.write_text("stop")  # the job ends and its result goes to GCS (the job's process)
            b.until(lambda: watch_log.count("could not read the result summary") > 0, "a failed read")
            seen = len(refused)
            b.until(lambda: len(refused) > seen + 2, "reads retried during the outage")
        finally:
            outage.clear()

    with Records("kinetic_airflow.watch") as watch_log:
        breaker = Breaker(steps)
        dr = kn_outage.DAGS["chatty"].test()
        breaker.join()

    assert ti_states(dr) == {TASK: "success"}
    assert xcom(dr, TASK) == "ok"
    assert any(uri.endswith("/result.json") for uri in refused)
    assert watch_log.count("storage is back") >= 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_emulator(tmp_path_factory) as running:
        yield running


def test_an_outage_past_the_bound_stops_the_job_and_names_the_storage(
    outage_env, cluster, tmp_path, monkeypatch
):
    """Heartbeat reads of a silent GKE job fail for real (its status directory is now a file)."""
    import kn_outage
    import kubernetes.client

    _, out = outage_env
    emulator, kubeconfig = cluster
    point_kinetic_at(emulator, kubeconfig, monkeypatch)
    root = tmp_path / "kinetic"
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{root}")
    # A beat at the start and the next in 15 s (heartbeat_seconds must stay below the timeout),
    # read after 5 s of silence: the 2 s bound runs out long before the next beat is due.
    monkeypatch.setenv("KINETIC_HEARTBEAT_SECONDS", "15")
    monkeypatch.setenv("KINETIC_HEARTBEAT_TIMEOUT", "20")
    monkeypatch.setenv("KINETIC_STORAGE_RETRY_SECONDS", "2")
    heartbeats = lambda: list(root.rglob("status/heartbeat.json"))  # noqa: E731
    found: dict[str, Path] = {}

    def steps(b: Breaker) -> None:
        b.until(lambda: bool(heartbeats()), "the job's runner beats")
        status = found["status"] = heartbeats()[0].parent
        os.rename(status, status.with_name("status.away"))
        status.write_text("a file where the status directory was")

    breaker = Breaker(steps)
    dr = kn_outage.DAGS["silent"].test()
    breaker.join()
    status = found["status"]
    job_id = status.parent.name

    assert ti_states(dr) == {TASK: "failed"}
    kind, message = (out / f"{TASK}.txt").read_text().split("\n", 1)
    assert kind == "kinetic_airflow.results.KineticJobError", kind
    heartbeat_uri = f"file://{status}/heartbeat.json"
    assert "longer than [kinetic] storage_retry_seconds=2: could not read the heartbeat at " in message
    assert heartbeat_uri in message and "NotADirectoryError" in message, message
    assert "The job was stopped" in message
    batch = kubernetes.client.BatchV1Api(emulator.api_client())
    end = time.monotonic() + 45
    while True:  # the Job is deleted at once; its pod's process stops within its grace period
        left = [
            j.metadata.name for j in batch.list_namespaced_job("default").items if job_id in j.metadata.name
        ]
        left += [p["pod"] for p in emulator.processes() if job_id in p["pod"]]
        if not left or time.monotonic() > end:
            break
        time.sleep(0.3)
    assert left == [], f"the job runs on with nobody watching: {left}"
