"""The job lifecycle's rules on their own, and the watcher on a real local job.

The scheduler-driven scenarios (clears, backfills, crashes, the executor-event race)
are in test_lifecycle_components.py; this file pins the decision table they rest on
and the watcher's log handling, which need no Airflow.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import cloudpickle
import pytest
from jobkit import key_of, make_job

from kinetic_airflow.backends.gke.classify import classify
from kinetic_airflow.backends.local import LocalBackend
from kinetic_airflow.job.layout import STATE_KEY, JobIdentity
from kinetic_airflow.job.ref import JobRef
from kinetic_airflow.job.states import JobStatus
from kinetic_airflow.job.storage import open_storage, uri_to_local_path
from kinetic_airflow.lifecycle import (
    Action,
    JobRecord,
    Phase,
    TryInfo,
    after_observing,
    cancel_job,
    decide,
    decode_record,
    recorded_status,
    save_record,
)
from kinetic_airflow.watch import JobWatcher

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Store:
    """The part of Airflow's task_state_store the lifecycle uses (get/set of JSON values)."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}

    def get(self, key: str) -> object:
        return self.values.get(key)

    def set(self, key: str, value: object) -> None:
        self.values[key] = json.loads(json.dumps(value))


def _job(try_number: int = 1, try_id: str = "ti-1") -> JobRef:
    identity = JobIdentity("d", "r", "t", -1, try_number, try_id=try_id)
    return JobRef(
        job_id=identity.job_id,
        backend="local",
        identity=identity,
        job_uri="file:///x/" + identity.job_id,
    )


def _record(
    phase: Phase, *, try_number: int = 1, ti_id: str = "ti-1", max_tries: int = 0, **extra
) -> JobRecord:
    store = Store()
    job = _job(try_number, ti_id)
    previous = None
    for step in (Phase.RECORDED, Phase.CREATED, Phase.SHIPPED, Phase.WAITING, Phase.DELIVERED):
        if phase is Phase.CANCELLED and step is Phase.SHIPPED:
            break
        previous = save_record(
            store,
            step,
            job=job,
            now=TryInfo(try_number, ti_id, max_tries),
            deadline=None,
            previous=previous,
            **(extra if step is Phase.DELIVERED else {}),
        )
        if step is phase:
            return previous
    return save_record(
        store,
        Phase.CANCELLED,
        job=job,
        now=TryInfo(try_number, ti_id, max_tries),
        deadline=None,
        previous=previous,
    )


def test_first_execute_runs_a_new_job():
    assert decide(None, TryInfo(1, "ti-1", 0)).action is Action.NEW_JOB


@pytest.mark.parametrize(
    ("phase", "action"),
    [
        (Phase.RECORDED, Action.SUBMIT),
        (Phase.CREATED, Action.SHIP),
        (Phase.SHIPPED, Action.WATCH),
        (Phase.WAITING, Action.WATCH),
        (Phase.DELIVERED, Action.COLLECT),
        (Phase.CANCELLED, Action.COLLECT),
    ],
)
def test_a_second_execute_of_the_same_try_finishes_what_the_first_left(phase, action):
    decision = decide(_record(phase, outcome="success"), TryInfo(1, "ti-1", 0))
    assert decision.action is action
    assert not decision.observe and decision.replaces is None


@pytest.mark.parametrize("phase", [p for p in Phase if p is not Phase.REUSED])  # reused: no job to stop
def test_a_clear_always_runs_a_new_job_and_stops_the_old_one(phase):
    # clear_task_instances sets max_tries = try_number + retries: 1 + 0 here, where it was 0.
    decision = decide(_record(phase, outcome="success"), TryInfo(2, "ti-2", 1))
    assert decision.action is Action.NEW_JOB
    assert "cleared" in decision.reason
    assert decision.replaces is not None and decision.replaces.job_id == _job().job_id


def test_a_retry_after_an_infrastructure_failure_reuses_the_earlier_job():
    for phase in (Phase.SHIPPED, Phase.WAITING):
        decision = decide(_record(phase, max_tries=2), TryInfo(2, "ti-2", 2))
        assert decision.action is Action.WATCH and decision.observe
        assert (
            after_observing(decision, finished_ok=True, live=False, cancelled=False).action is Action.COLLECT
        )
        assert after_observing(decision, finished_ok=False, live=True, cancelled=False).action is Action.WATCH
        assert (
            after_observing(decision, finished_ok=False, live=False, cancelled=False).action is Action.NEW_JOB
        )
        assert (
            after_observing(decision, finished_ok=False, live=True, cancelled=True).action is Action.NEW_JOB
        )
    # Delivered, and yet a new try without a clear (the executor-event race after delivery).
    delivered = decide(_record(Phase.DELIVERED, max_tries=2, outcome="success"), TryInfo(2, "ti-2", 2))
    assert delivered.action is Action.COLLECT


def test_a_job_that_never_got_its_payload_is_replaced():
    for phase in (Phase.RECORDED, Phase.CREATED):
        decision = decide(_record(phase, max_tries=1), TryInfo(2, "ti-2", 1))
        assert decision.action is Action.NEW_JOB and decision.replaces is not None
        assert "never got its payload" in decision.reason


def test_a_retry_after_the_function_failed_runs_a_new_job():
    decision = decide(_record(Phase.DELIVERED, max_tries=1, outcome="failed"), TryInfo(2, "ti-2", 1))
    assert decision.action is Action.NEW_JOB and decision.replaces is None


def test_a_record_of_another_incarnation_is_not_reused():
    # Same try number, another Airflow try id: the record cannot be this try's.
    assert decide(_record(Phase.WAITING), TryInfo(1, "ti-other", 0)).action is Action.NEW_JOB
    assert decide(_record(Phase.WAITING, try_number=3), TryInfo(1, "ti-x", 0)).action is Action.NEW_JOB


def test_job_ids_differ_per_airflow_try_id():
    a = JobIdentity("d", "r", "t", -1, 1, try_id="0190-a")
    b = JobIdentity("d", "r", "t", -1, 1, try_id="0190-b")
    assert a.job_id != b.job_id
    assert a.next_attempt().try_id == a.try_id and a.next_attempt().attempt == 2


def test_transitions_outside_the_table_are_refused():
    store = Store()
    job = _job()
    with pytest.raises(RuntimeError, match="not a lifecycle transition"):
        save_record(store, Phase.SHIPPED, job=job, now=TryInfo(1, "ti-1", 0), deadline=None)
    recorded = _record(Phase.RECORDED)
    again = save_record(
        store, Phase.RECORDED, job=job, now=TryInfo(1, "ti-1", 0), deadline=None, previous=recorded
    )
    assert again.phase is Phase.RECORDED  # a second execute resuming an unfinished submit
    delivered = _record(Phase.DELIVERED, outcome="success")
    with pytest.raises(RuntimeError, match="delivered -> waiting"):
        save_record(
            store, Phase.WAITING, job=job, now=TryInfo(1, "ti-1", 0), deadline=None, previous=delivered
        )


# GKE status --------------------------------------------------------------------------------------
def test_a_job_being_deleted_is_not_running():
    job = {"metadata": {"name": "kinetic-x", "deletionTimestamp": "2026-12-01T00:00:00Z"}, "status": {}}
    pod = {"metadata": {"name": "kinetic-x-abcde"}, "status": {"phase": "Running"}}
    status = classify(job, [pod])
    assert status.state.terminal and status.reason == "Cancelled"


# The watcher on a real local job ---------------------------------------------------------------
def _print_lines(count: int) -> None:
    for n in range(count):
        print(f"line {n}", flush=True)


def _local_ref(base_uri: str, job_id: str) -> JobRef:
    return JobRef(
        backend="local",
        job_id=job_id,
        job_uri=f"{base_uri}/jobs/{job_id}",
        local_dir=uri_to_local_path(f"{base_uri}/jobs/{job_id}"),
        python=sys.executable,
        identity=JobIdentity("d", "r", "t"),
    )


def _watch(ref: JobRef, **kwargs) -> tuple[dict | None, list[str]]:
    """The event and the job's log lines (its progress lines go to ``emit_progress``, if given)."""
    shown: list[str] = []
    kwargs.setdefault("emit_progress", lambda line: None)
    watcher = JobWatcher(
        ref, open_storage(ref.job_uri), LocalBackend(), poll_interval=0.1, emit_log=shown.append, **kwargs
    )
    return asyncio.run(watcher.wait()), shown


def test_a_capped_log_keeps_its_beginning_and_its_end(tmp_path):
    base = f"file://{tmp_path}"
    make_job(base, _print_lines, (500,), job_id="chatty")
    ref = _local_ref(base, "chatty")
    LocalBackend().submit(ref, job_key=key_of(ref.job_uri))
    event, shown = _watch(ref, log_max_lines=100)
    assert event["status"] == "success"
    notices = [line for line in shown if "log_max_lines=" in line or "lines left out" in line]
    job_lines = [line for line in shown if line not in notices]
    # 100 of the job's 502 lines (the runner logs one before and one after the function's 500):
    # the first 50 live, then the last 50 when it ended.
    assert len(job_lines) == 100
    assert job_lines[1:50] == [f"line {n}" for n in range(49)]
    assert job_lines[50:-1] == [f"line {n}" for n in range(451, 500)]
    assert job_lines[-1].startswith("[kinetic] finished in")
    assert len(notices) == 2
    assert "log_max_lines=100" in notices[0] and str(tmp_path / "jobs/chatty/job.log") in notices[0]
    assert notices[1] == "[kinetic] ... 402 lines left out ..."
    assert shown.index(notices[0]) == 50 and shown.index(notices[1]) == 51


def test_a_rebuilt_watcher_shows_no_line_twice(tmp_path):
    base = f"file://{tmp_path}"
    make_job(base, _print_lines, (50,), job_id="twice")
    ref = _local_ref(base, "twice")
    LocalBackend().submit(ref, job_key=key_of(ref.job_uri))
    deadline = time.monotonic() + 60
    log_path = tmp_path / "jobs/twice/exit.json"
    while not log_path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    # The first watcher gives up at once, after showing what was there (as the worker does
    # before it defers); a second one, as a rebuilt trigger, must go on after those lines.
    first_shown: list[str] = []
    watcher = JobWatcher(ref, open_storage(ref.job_uri), LocalBackend(), emit_log=first_shown.append)
    asyncio.run(watcher._load_cursor())
    asyncio.run(watcher._pump_logs())
    event, second_shown = _watch(ref)
    assert event["status"] == "success"
    assert first_shown and not set(first_shown) & set(second_shown) - {""}
    numbered = [line for line in first_shown + second_shown if line.startswith("line ")]
    assert numbered == [f"line {n}" for n in range(50)]


def test_a_cancelled_job_says_who_stopped_it(tmp_path):
    base = f"file://{tmp_path}"
    make_job(base, time.sleep, (600,), job_id="stopped")
    ref = _local_ref(base, "stopped")
    backend = LocalBackend()
    backend.submit(ref, job_key=key_of(ref.job_uri))
    cancel_job(ref, open_storage(base), backend, by="a test", reason="it had to stop")
    event, _ = _watch(ref)
    assert event["status"] == "failed" and event["cause"] == "cancelled"
    assert event["message"] == "the job was cancelled by a test: it had to stop"
    assert not (tmp_path / "jobs/stopped/result.json").exists()
    assert (tmp_path / "jobs/stopped/payload.pkl").exists()  # nothing was deleted


def test_on_kill_has_the_driver_stop_the_job_it_watches(tmp_path):
    """The operator is the Airflow face: it keeps no job state of its own. The job a worker
    watches is its driver's (``kinetic_airflow.driver``), and ``on_kill`` stops that job."""
    from kinetic_airflow.driver import JobDriver
    from kinetic_airflow.operators import KineticRunOperator

    base = f"file://{tmp_path}"
    make_job(base, time.sleep, (600,), job_id="killed")
    ref = _local_ref(base, "killed")
    backend = LocalBackend()
    backend.submit(ref, job_key=key_of(ref.job_uri))
    op = KineticRunOperator(task_id="t", python_callable=print, backend="local")
    op.on_kill()  # no driver yet: nothing to stop, nothing fails
    driver = op._driver_for({})
    assert isinstance(driver, JobDriver) and op._driver_for({}) is driver  # one driver per operator
    driver.active_job = ref  # what the driver holds while the worker itself watches the job
    op.on_kill()
    event, _ = _watch(ref)
    assert event["status"] == "failed" and event["cause"] == "cancelled"
    assert (
        event["message"]
        == "the job was cancelled by operator.on_kill: the task was killed (timeout, SIGTERM, a user)"
    )
    assert not {"_integrity", "_active_job"} & set(vars(op))  # the job's state is the driver's


@pytest.mark.parametrize(
    ("now", "why"),
    [
        (TryInfo(1, "ti-1", 0), "a second execute of the same try"),
        (TryInfo(2, "ti-2", 1), "a clear"),
        (TryInfo(2, "ti-2", 0), "a retry"),
    ],
)
def test_a_try_that_reused_a_result_is_followed_by_another_look_at_the_cache(now, why):
    """cache=True (result_cache): a reused try ran no job, so nothing is reattached to or stopped;
    whatever makes the next execute looks the cache up again (a clear reuses too)."""
    record = save_record(
        None,
        Phase.REUSED,
        job=_job(),
        now=TryInfo(1, "ti-1", 0),
        deadline=None,
        outcome="success",
        reused={"job_id": "kinetic-earlier", "run_id": "run-0"},
    )
    decision = decide(record, now)
    assert decision.action is Action.NEW_JOB, why
    assert decision.replaces is None and decision.job is None, why
    assert "reused the result of kinetic-earlier" in decision.reason
    assert recorded_status(record) == JobStatus.SUCCEEDED


def test_a_reused_try_is_kept_in_the_record_and_its_history():
    store = Store()
    first = save_record(
        store,
        Phase.REUSED,
        job=_job(),
        now=TryInfo(1, "ti-1", 0),
        deadline=None,
        outcome="success",
        usage={"chip_hours": 0.0, "outcome": "reused"},
        reused={"job_id": "kinetic-earlier", "run_id": "run-0"},
    )
    stored = store.get(STATE_KEY)
    assert stored["phase"] == "reused" and stored["reused"]["job_id"] == "kinetic-earlier"
    assert stored["jobs"][-1]["reused"] == {"job_id": "kinetic-earlier", "run_id": "run-0"}
    decoded = decode_record(json.dumps(stored))
    assert decoded == first and decoded.to_dict() == stored
    # the same try again (a duplicate execute) may reuse again, or run its own job after a miss
    save_record(store, Phase.REUSED, job=_job(), now=TryInfo(1, "ti-1", 0), deadline=None, previous=first)
    save_record(store, Phase.RECORDED, job=_job(), now=TryInfo(1, "ti-1", 0), deadline=None, previous=first)
    with pytest.raises(RuntimeError, match="is not a lifecycle transition"):
        save_record(store, Phase.REUSED, job=_job(), now=TryInfo(1, "ti-1", 0), deadline=None,
                    previous=decode_record(store.get(STATE_KEY)))  # fmt: skip
