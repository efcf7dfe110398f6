"""Waiting costs nothing: what observing a running job costs, and how fast an ended one is seen.

Real parts only: job storage on fake-gcs-server with its access log (every request it
serves is counted), the cluster emulator as a separate process (so every thread in
this process is kinetic's or the test's), the watcher exactly as the trigger runs it.
These are behaviour checks — no request while a job runs, an ended job seen without
waiting for a poll, threads that do not grow with the number of jobs — not timings;
bench/trigger_bench.py measures the rates.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cloudpickle
import pytest
from components.emulator_process import EmulatorProcess
from jobkit import gke_job, key_of, make_job

from kinetic_airflow.backends.gke.watch_cache import reset_shared_state
from kinetic_airflow.backends.registry import get_backend
from kinetic_airflow.job.layout import JobIdentity, JobLayout
from kinetic_airflow.job.ref import JobRef
from kinetic_airflow.job.storage import uri_to_local_path
from kinetic_airflow.testing.gcs import FakeGCS
from kinetic_airflow.watch import JobWatcher

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def counted_gcs(tmp_path_factory):
    server = FakeGCS(access_log=tmp_path_factory.mktemp("gcs") / "access.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def emulator(tmp_path_factory, counted_gcs):
    with EmulatorProcess(tmp_path_factory.mktemp("emu"), env=counted_gcs.environ()) as emulator:
        yield emulator
    reset_shared_state()


@pytest.fixture
def cluster_env(emulator, counted_gcs, monkeypatch, request):
    reset_shared_state()
    for key, value in {**counted_gcs.environ(), **emulator.airflow_env()}.items():
        monkeypatch.setenv(key, value)
    bucket = counted_gcs.create_bucket(
        "kn-" + "".join(c for c in request.node.name.lower() if c.isalnum())[:30]
    )
    monkeypatch.setenv("KINETIC_BASE_URI", f"{bucket}/kinetic")
    return counted_gcs


def _chatty(lines: int, pause: float) -> str:
    for n in range(lines):
        print(f"line {n}", flush=True)
        time.sleep(pause)
    return "done"


def _quick() -> str:
    return "quick"


def _watcher(ref, storage, shown, progress: list[str] | None = None, **kwargs) -> JobWatcher:
    """``shown`` gets the job's log lines; its progress lines go to ``progress``."""
    progress = progress if progress is not None else []
    backend = get_backend(ref.backend)
    return JobWatcher(ref, storage, backend, emit_log=shown.append, emit_progress=progress.append, **kwargs)


def test_a_running_job_costs_no_storage_request_and_its_end_one(cluster_env):
    gcs = cluster_env
    # The runner beats once at start; a long period keeps its own writes out of the window.
    _, ref, storage = gke_job("chatty", _chatty, [40, 0.25], manifest={"heartbeat_seconds": 3600})
    ref = ref.replace(heartbeat_timeout=300.0)
    shown: list[str] = []

    async def scenario() -> tuple[dict, list, list]:
        watcher = _watcher(ref, storage, shown, poll_interval=0.2)
        waiting = asyncio.ensure_future(watcher.wait())
        while sum(line.startswith("line ") for line in shown) < 5:  # running, and observed
            assert not waiting.done(), waiting.result()
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # past the first heartbeat look
        before = len(gcs.requests())
        while sum(line.startswith("line ") for line in shown) < 25:  # 20 more lines, ~5 s, 25 polls
            await asyncio.sleep(0.05)
        during = gcs.requests()[before:]
        event = await waiting
        return event, during, gcs.requests()

    event, during, everything = asyncio.run(scenario())
    assert event["status"] == "success", event
    assert during == [], during  # not one storage request while the job ran
    result_reads = [r for r in everything if r.method == "GET" and "result.json" in r.path]
    assert 1 <= len(result_reads) <= 2, result_reads  # read once it ended (again after the drain)
    assert [line for line in shown if line.startswith("line ")] == [f"line {n}" for n in range(40)]


@pytest.mark.parametrize("backend", ["gke", "local"])
def test_an_ended_job_is_seen_without_waiting_for_a_poll(cluster_env, tmp_path, backend):
    """With an hour between polls the watcher still returns: the end wakes it."""
    if backend == "gke":
        _, ref, storage = gke_job("quick", _quick, [])
    else:
        base = f"file://{tmp_path}"
        make_job(base, _quick, job_id="quick")
        ref = JobRef.from_dict(
            {
                "backend": "local",
                "job_id": "quick",
                "job_uri": f"{base}/jobs/quick",
                "local_dir": uri_to_local_path(f"{base}/jobs/quick"),
                "python": sys.executable,
                "identity": JobIdentity("d", "r", "quick").to_dict(),
            }
        )
        from kinetic_airflow.job.storage import open_storage

        storage = open_storage(base)
        get_backend("local").submit(ref, job_key=key_of(ref.job_uri))
    shown: list[str] = []
    event = asyncio.run(_watcher(ref, storage, shown, poll_interval=3600).wait())
    assert event["status"] == "success", event
    # the event names the outcome; the value's repr stays in result.json (events are kept small)
    summary = json.loads(storage.read_text(JobLayout(ref.job_uri).result_summary()))
    assert summary["value_repr"] == "'quick'"
    assert event["summary"]["ok"] is True and "value_repr" not in event["summary"]


def test_threads_do_not_grow_with_the_number_of_jobs(cluster_env):
    """Twelve jobs whose logs stream at once: the triggerer's thread count stays where one job puts it."""

    async def watch_all(count: int) -> tuple[list[dict], int]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=4))
        jobs = [
            gke_job(f"many{count}", _chatty, [24, 0.25], manifest={"heartbeat_seconds": 3600})
            for _ in range(count)
        ]
        shown = [[] for _ in jobs]
        watchers = [
            _watcher(ref, storage, shown[i], poll_interval=0.5) for i, (_, ref, storage) in enumerate(jobs)
        ]
        tasks = [asyncio.ensure_future(w.wait()) for w in watchers]
        peak = 0
        while not all(t.done() for t in tasks):
            if all(any(line.startswith("line ") for line in s) for s in shown):  # all streaming
                peak = max(peak, threading.active_count())
            await asyncio.sleep(0.1)
        return [t.result() for t in tasks], peak

    baseline = threading.active_count()
    one_events, one_peak = asyncio.run(watch_all(1))
    many_events, many_peak = asyncio.run(watch_all(12))
    assert {e["status"] for e in one_events + many_events} == {"success"}
    assert one_peak and many_peak, (one_peak, many_peak)
    # Kinetic's own threads: the namespace's two watch threads and the bounded executor (4),
    # whatever the number of jobs. One thread per followed log would add eleven here.
    assert many_peak <= baseline + 2 + 4 + 2, (baseline, one_peak, many_peak)
    assert many_peak <= one_peak + 4, (one_peak, many_peak)


def test_log_cursor_is_shared_at_a_bounded_rate(cluster_env):
    """A chatty job writes its cursor to job storage at most once a minute (and when it ends);
    the copy on this machine's disk is written after every batch."""
    gcs = cluster_env
    _, ref, storage = gke_job("cursor", _chatty, [30, 0.2], manifest={"heartbeat_seconds": 3600})
    shown: list[str] = []
    progress: list[str] = []
    before = len(gcs.requests())
    event = asyncio.run(_watcher(ref, storage, shown, progress, poll_interval=0.2).wait())
    assert event["status"] == "success"
    writes = [r for r in gcs.requests()[before:] if r.method == "POST" and "upload" in r.path]
    cursor = json.loads(storage.read_text(f"{ref.job_uri}/status/log-cursor.json"))
    assert cursor["offset"] == len(shown)  # GKE offsets count lines
    # The job is shorter than a minute: one shared write, at its end (the job's own marker
    # writes — started, heartbeat, result, finished — come from the pod, not the watcher).
    # ... plus one small write per change of state (progress.json): a few, not one per line.
    assert progress[-1] == "[kinetic] finished: succeeded", progress
    assert 2 <= len(progress) <= 4, progress
    assert len(writes) <= 1 + 5 + len(progress), writes
    assert not list(Path(_local_root()).glob(f"log-cursors/{ref.job_id}-*.json"))  # cleaned at the end


def _local_root() -> str:
    from kinetic_airflow.config import resolve_setting

    return resolve_setting("local_state_dir")


def _quiet(seconds: float) -> str:
    print("go", flush=True)
    time.sleep(seconds)
    print("end", flush=True)
    return "quiet"


def test_a_quiet_running_job_does_not_wake_its_watcher(cluster_env):
    """No timer: while nothing about the job changes, the watcher sleeps (a poller would look
    thirty times in these six seconds at poll_interval=0.2)."""
    _, ref, storage = gke_job("quiet", _quiet, [6.0], manifest={"heartbeat_seconds": 3600})
    ref = ref.replace(heartbeat_timeout=300.0)
    shown: list[str] = []
    watcher = _watcher(ref, storage, shown, poll_interval=0.2)
    looks: list[list[str]] = []
    status_of = watcher.backend.astatus

    async def counted_status(job):
        looks.append(list(shown))
        return await status_of(job)

    watcher.backend.astatus = counted_status
    event = asyncio.run(watcher.wait())
    assert event["status"] == "success", event
    assert [line for line in shown if line in ("go", "end")] == ["go", "end"], shown
    during = [seen for seen in looks if seen and seen[-1] == "go"]
    assert 1 <= len(during) <= 2, len(during)  # the look that showed "go" (and one spurious wake)


def test_the_heartbeat_is_read_only_while_the_log_is_silent(cluster_env):
    """A log that flows vouches for the process; a silent one gets its heartbeat read."""
    gcs = cluster_env

    def heartbeat_reads(fn, args) -> int:
        _, ref, storage = gke_job("beat", fn, args, manifest={"heartbeat_seconds": 0.5})
        ref = ref.replace(heartbeat_timeout=2.0)  # a look after 0.5 s of silence
        shown: list[str] = []

        async def scenario() -> int:
            waiting = asyncio.ensure_future(_watcher(ref, storage, shown, poll_interval=0.2).wait())
            while not any(line.startswith(("line", "go")) for line in shown):  # the function runs
                assert not waiting.done(), waiting.result()
                await asyncio.sleep(0.05)
            before = len(gcs.requests())
            while not any(line.startswith(("line 19", "end")) for line in shown):
                await asyncio.sleep(0.05)
            reads = [r for r in gcs.requests()[before:] if r.method == "GET" and "heartbeat" in r.path]
            event = await waiting
            assert event["status"] == "success", event
            return len(reads)

        return asyncio.run(scenario())

    assert heartbeat_reads(_chatty, [20, 0.1]) == 0  # a line every 0.1 s for 2 s
    assert heartbeat_reads(_quiet, [3.0]) >= 3  # silent for 3 s: a look every 0.5 s


def test_reading_a_missing_file_costs_one_request(cluster_env):
    """google-cloud-storage 3.x would GET the bucket in the background after each 404 (and on
    first use); kinetic's clients have that cache off, so a 404 is one request."""
    from kinetic_airflow.connections import storage_for

    gcs = cluster_env
    base = __import__("os").environ["KINETIC_BASE_URI"]
    storage = storage_for(base)
    before = len(gcs.requests())
    for n in range(4):
        assert storage.read_text_or_none(f"{base}/missing-{n}.json") is None
    time.sleep(1.0)  # the library's checks run in background threads: give them time to show
    seen = [(r.method, r.path.split("?")[0]) for r in gcs.requests()[before:]]
    assert len(seen) == 4 and all("missing-" in path for _, path in seen), seen


def test_a_job_that_waits_for_a_node_says_so_once_then_runs(cluster_env, emulator):
    """While a task is deferred its log says what the job waits for: one line per change of
    state (not per look), and the same changes in status/progress.json for the Kinetic view."""
    emulator.admin.delay_scheduling(4.0)  # the node pool "scales up" for 4 s
    _, ref, storage = gke_job("scaleup", _quick, [])
    shown: list[str] = []
    progress: list[str] = []
    event = asyncio.run(_watcher(ref, storage, shown, progress, poll_interval=0.2).wait())
    assert event["status"] == "success"
    states = [line.split(" ", 2)[1] for line in progress]
    assert progress[0].startswith("[kinetic] waiting for a node with room for it (scale-up): 0/")  # cpu
    assert "Insufficient cpu" in progress[0], progress
    assert states.count("waiting") == 1, progress  # the emulator re-reports it: said once
    running = [line for line in progress if line.startswith("[kinetic] running on node gke-")]
    assert len(running) == 1, progress
    assert progress[-1] == "[kinetic] finished: succeeded"
    assert progress.index(running[0]) > 0
    record = json.loads(storage.read_text(f"{ref.job_uri}/status/progress.json"))
    assert record["history"][0]["state"] == "waiting_for_node"
    assert record["state"] == "finished" and record["running_since"] >= record["history"][0]["time"]
    assert record["node"].startswith("gke-")


class _CountingExecutor(ThreadPoolExecutor):
    """A default executor that adds up how long its threads are occupied (thread-seconds)."""

    def __init__(self, max_workers: int) -> None:
        super().__init__(max_workers=max_workers)
        self._count_lock = threading.Lock()
        self.busy_seconds = 0.0
        self.calls = 0

    def submit(self, fn, /, *args, **kwargs):
        def counted():
            start = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                with self._count_lock:
                    self.busy_seconds += time.monotonic() - start
                    self.calls += 1

        return super().submit(counted)


def _refused_listings(records) -> list:
    return [r for r in records if r.method == "GET" and r.path.endswith("/jobs") and r.status == 429]


def _direct_job_reads(records) -> list:
    return [r for r in records if r.method == "GET" and "/jobs/" in r.path and not r.watch]


def test_many_looks_before_the_watch_has_listed_wait_on_the_loop_not_in_threads(
    cluster_env, emulator, monkeypatch
):
    """A restarted triggerer: thirty triggers look at their jobs at once while the namespace's
    watch is still making its first listing (the API server throttles it with 429s for ~6 s).
    They wait for it on the event loop: the default executor stays free for a storage read or a
    token refresh (a parked thread per look would fill it for the whole relist), and every look
    is answered from the watch once it has listed, correctly. Past the timeout the looks read
    the API instead, also correctly."""
    from kinetic_airflow.backends.base import JobState
    from kinetic_airflow.backends.gke import backend as gke_backend

    backend = get_backend("gke")
    done = [gke_job(f"done{i}", _quick, [])[1] for i in range(2)]
    deadline = time.monotonic() + 90
    while any(backend.status(ref).state is not JobState.SUCCEEDED for ref in done):
        assert time.monotonic() < deadline, [backend.status(ref) for ref in done]
        time.sleep(0.3)
    emulator.admin.delay_scheduling(600)  # the others wait for a node: pending, no pod process
    waiting = [gke_job(f"wait{i}", _quick, [])[1] for i in range(28)]
    refs = done + waiting
    expected = {ref.job_id: backend.status(ref).state for ref in refs}  # what the API says
    assert list(expected.values()) == [JobState.SUCCEEDED] * 2 + [JobState.PENDING] * 28, expected

    async def look_at_all(probe_after: float) -> tuple[dict, float, float, _CountingExecutor]:
        executor = _CountingExecutor(max_workers=8)
        loop = asyncio.get_running_loop()
        loop.set_default_executor(executor)
        fresh = get_backend("gke")  # a new triggerer: no watch, no client yet
        started = time.monotonic()
        looks = [asyncio.ensure_future(fresh.astatus(ref)) for ref in refs]
        await asyncio.sleep(probe_after)
        assert not any(look.done() for look in looks), "the watch listed before the probe"
        asked = time.monotonic()
        await loop.run_in_executor(None, time.sleep, 0)  # e.g. a storage read made meanwhile
        probe_wait = time.monotonic() - asked
        statuses = await asyncio.gather(*looks)
        elapsed = time.monotonic() - started
        return (
            {r.job_id: s.state for r, s in zip(refs, statuses, strict=True)},
            elapsed,
            probe_wait,
            executor,
        )

    try:
        # 1. The listing is refused three times (Retry-After 2 s), then succeeds.
        reset_shared_state()
        mark = emulator.request_mark()
        emulator.admin.inject_api_fault("GET", r"/jobs$", status=429, count=3, retry_after=2.0)
        states, elapsed, probe_wait, executor = asyncio.run(look_at_all(probe_after=2.0))
        served = emulator.requests(since=mark)
        assert states == expected
        assert len(_refused_listings(served)) == 3, served
        assert elapsed >= 4.0, elapsed  # the looks did wait for the listing
        assert _direct_job_reads(served) == [], _direct_job_reads(served)  # answered by the watch
        assert probe_wait < 1.0, probe_wait  # a thread was free while thirty looks waited
        # Connecting thirty triggers (building the client, starting the watch) is all the threads
        # did: a thread parked per look for the ~6 s listing would be 30 x 6 = 180 thread-seconds.
        assert executor.busy_seconds < 5.0, (executor.busy_seconds, executor.calls)

        # 2. The listing keeps being refused: past the timeout each look reads the API directly.
        monkeypatch.setattr(gke_backend, "SYNC_TIMEOUT_SECONDS", 3.0)
        reset_shared_state()
        mark = emulator.request_mark()
        emulator.admin.inject_api_fault("GET", r"/jobs$", status=429, count=None, retry_after=1.0)
        states, elapsed, probe_wait, executor = asyncio.run(look_at_all(probe_after=1.5))
        served = emulator.requests(since=mark)
        assert states == expected
        assert 3.0 <= elapsed < 20.0, elapsed
        assert len({r.path for r in _direct_job_reads(served)}) == 30, _direct_job_reads(served)
        assert probe_wait < 1.0, probe_wait
    finally:
        emulator.admin.clear_faults()
        reset_shared_state()
        for ref in waiting:
            backend.cancel(ref)
        emulator.admin.delay_scheduling(0)


def test_a_watcher_cancelled_as_its_job_changes_is_cancelled(cluster_env):
    """The triggerer cancels a trigger (task cleared, triggerer stopping) in the very loop
    iteration in which a log line sets the job's change event: the cancellation must end the
    trigger. ``asyncio.wait_for`` on Python < 3.12 returned normally there instead, so of two
    hundred chatty triggers cancelled at once some ran on (bench/trigger_bench.py hung)."""
    from kinetic_airflow.backends.gke.watch_cache import wait_event

    async def helper() -> None:
        event = asyncio.Event()
        assert await wait_event(event, 0.05) is False
        event.set()
        assert await wait_event(event, 0.05) is True
        event.clear()
        waiting = asyncio.ensure_future(wait_event(event, 30))
        await asyncio.sleep(0.05)  # parked in the wait
        event.set()
        waiting.cancel()  # the same iteration
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(helper())
    _, ref, _ = gke_job("cancelled", _quick, [])
    backend = get_backend("gke")

    async def watcher_side() -> None:
        observed = await backend._aobserved(ref)
        for _ in range(50):  # until the job has gone quiet, so that nothing else wakes the wait
            waiting = asyncio.ensure_future(backend.await_change(ref, 30))
            await asyncio.sleep(0.3)
            if not waiting.done():
                break
        assert not waiting.done(), "the job kept changing"
        observed.changed.set()  # what a log line or the watch does
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.wait_for(backend.await_change(ref, 0.1), 5)  # still usable afterwards

    asyncio.run(watcher_side())
