"""Pod log streams survive what a real API server and network do to them, and lose no line.

The cluster emulator holds the kubelet's and API server's rules (its README): a reconnect
gets only the current rotated log file; ``sinceTime`` reaches the kubelet in whole seconds;
and it can make open streams half-open (connected, silent) or end them cleanly while the
container still runs. A job prints numbered lines while all three happen to its stream;
the task log (the watcher's lines, as the trigger emits them) must hold each line exactly
once, in order. Before resuming by time, each of these lost lines or hung until the job
ended.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import cloudpickle
import pytest
from emulated_cluster import point_kinetic_at, running_emulator
from jobkit import gke_job

from kinetic_airflow.backends.gke import logstream
from kinetic_airflow.backends.gke.logstream import PodLogStream
from kinetic_airflow.backends.registry import get_backend
from kinetic_airflow.watch import JobWatcher

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(300)
LINES = 60


def _numbered(count: int, pause: float) -> int:
    for n in range(count):
        print(f"line {n}", flush=True)
        time.sleep(pause)
    return count


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    with running_emulator(tmp_path_factory) as pair:
        yield pair


def _faults_while_printing(cluster, shown: list[str], done: threading.Event) -> list[str]:
    """Rotate the log, end the stream early, make it half-open: each after more lines arrived."""
    applied: list[str] = []

    def pod_name() -> str:
        pods = cluster.list_objects("pods", "default")
        return pods[0]["metadata"]["name"]

    def when(count: int) -> bool:
        while not done.is_set():
            if sum(1 for line in shown if line.startswith("line ")) >= count:
                return True
            time.sleep(0.05)
        return False

    def run() -> None:
        steps = [
            (10, "rotate", lambda: cluster.rotate_container_log("default", pod_name())),
            (20, "end", cluster.end_log_streams),
            (30, "stall", cluster.stall_log_streams),
            (
                40,
                "rotate+end",
                lambda: (cluster.rotate_container_log("default", pod_name()), cluster.end_log_streams()),
            ),
        ]
        for count, name, fault in steps:
            if not when(count):
                return
            fault()
            applied.append(name)

    threading.Thread(target=run, daemon=True).start()
    return applied


def test_rotation_early_end_and_half_open_streams_lose_no_line(emulator, tmp_path, monkeypatch) -> None:
    cluster, kubeconfig = emulator
    point_kinetic_at(cluster, kubeconfig, monkeypatch)
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}")
    monkeypatch.setattr(logstream, "IDLE_RECONNECT_SECONDS", 1.5)  # the half-open stream's limit
    _, ref, storage = gke_job("numbered", _numbered, [LINES, 0.15])
    shown: list[str] = []
    done = threading.Event()
    applied = _faults_while_printing(cluster, shown, done)
    watcher = JobWatcher(ref, storage, get_backend("gke"), poll_interval=0.3, emit_log=shown.append)
    try:
        event = asyncio.run(watcher.wait())
    finally:
        done.set()
    assert event["status"] == "success", event
    assert applied == ["rotate", "end", "stall", "rotate+end"]
    assert [line for line in shown if line.startswith("line ")] == [f"line {n}" for n in range(LINES)]


def test_a_stream_holds_only_the_lines_not_yet_consumed() -> None:
    stream = PodLogStream(None, "default", "p", "c")  # type: ignore[arg-type]
    for n in range(1000):
        stream._accept(f"2026-12-01T10:00:{n // 100:02d}.{n:09d}Z line {n}".encode())
        if n % 100 == 99:
            lines = stream.read_from(n - 99)
            assert lines == [f"line {i}" for i in range(n - 99, n + 1)]
            stream.release(n + 1)
            assert len(stream._held) == 0
    assert stream.received == 1000
    stream.release(1005)  # an earlier trigger showed lines this stream has not received yet
    for n in range(1000, 1010):
        stream._accept(f"2026-12-01T10:00:59.{n:09d}Z line {n}".encode())
    assert stream.read_from(1005) == [f"line {i}" for i in range(1005, 1010)]
    assert len(stream._held) == 5


def test_a_reconnect_skips_what_it_sends_again_but_not_repeated_lines() -> None:
    stream = PodLogStream(None, "default", "p", "c")  # type: ignore[arg-type]
    first = [b"2026-12-01T10:00:01.5Z same", b"2026-12-01T10:00:01.5Z same", b"2026-12-01T10:00:02.1Z last"]
    assert [stream._accept(raw) for raw in first] == [True, True, True]  # a line printed twice is kept twice
    assert stream._path().endswith("&sinceTime=2026-12-01T10:00:02Z")
    again = [b"2026-12-01T10:00:01.5Z same", b"2026-12-01T10:00:02.1Z last", b"2026-12-01T10:00:02.7Z new"]
    assert [stream._accept(raw) for raw in again] == [False, False, True]
    assert stream.read_from(0) == ["same", "same", "last", "new"]
