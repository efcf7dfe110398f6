"""The one vocabulary of job states (``kinetic_airflow.job.states``) and how the others map onto it.

The lifecycle's phases and the backend's observed states keep their own (stored) strings; what a
person sees is ``JobStatus``, whose values are the strings the CLI, gc and the view always printed.
"""

from __future__ import annotations

import json

import pytest

from kinetic_airflow.backends.base import JobState
from kinetic_airflow.job.states import (
    EVENT_STATUSES,
    FINAL,
    LIVE,
    JobStatus,
    from_backend,
    from_phase,
    status_of,
)
from kinetic_airflow.jobstore import JobInfo
from kinetic_airflow.lifecycle import Phase


def test_the_values_are_the_strings_printed_and_stored_before():
    assert [s.value for s in JobStatus] == [
        "pending", "running", "succeeded", "failed", "cancelled", "lost", "unknown"
    ]  # fmt: skip
    assert str(JobStatus.RUNNING) == "running" and f"{JobStatus.LOST}" == "lost"
    assert json.dumps({"state": JobStatus.FAILED}) == '{"state": "failed"}'
    assert JobStatus.RUNNING in {"running"} and "running" in {JobStatus.RUNNING}  # --state filters
    assert LIVE | FINAL | {JobStatus.UNKNOWN} == set(JobStatus) and not LIVE & FINAL
    assert JobStatus.PENDING.live and JobStatus.LOST.final and not JobStatus.UNKNOWN.final


def test_every_phase_maps_or_leaves_it_to_the_files_and_backend():
    mapped = {phase: from_phase(phase.value) for phase in Phase}
    assert mapped == {
        Phase.RECORDED: JobStatus.PENDING,
        Phase.CREATED: JobStatus.PENDING,
        Phase.SHIPPED: JobStatus.PENDING,
        Phase.WAITING: None,
        Phase.DELIVERED: None,
        Phase.CANCELLED: JobStatus.CANCELLED,
        Phase.REUSED: JobStatus.SUCCEEDED,  # cache=True: no job ran, an earlier result was returned
    }
    assert from_phase(None) is None  # a record from before the lifecycle


@pytest.mark.parametrize(
    ("backend", "started", "finished", "shipped", "status"),
    [
        (JobState.RUNNING, False, False, True, JobStatus.RUNNING),
        (JobState.PENDING, False, False, True, JobStatus.PENDING),
        (JobState.PENDING, True, False, True, JobStatus.RUNNING),  # a host started, others pending
        (JobState.SUCCEEDED, True, True, True, JobStatus.FAILED),  # ended without a result
        (JobState.FAILED, True, False, True, JobStatus.FAILED),
        (JobState.NOT_FOUND, True, True, True, JobStatus.FAILED),
        (JobState.NOT_FOUND, True, False, True, JobStatus.LOST),
        (JobState.NOT_FOUND, False, False, True, JobStatus.LOST),  # shipped, then gone
        (JobState.NOT_FOUND, False, False, False, JobStatus.PENDING),  # still being submitted
        (None, False, False, True, JobStatus.UNKNOWN),  # not asked
    ],
)
def test_every_backend_state_maps(backend, started, finished, shipped, status):
    value = backend.value if backend else None
    assert from_backend(value, started=started, finished=finished, shipped=shipped) is status


def test_an_outcome_and_a_cancellation_come_before_the_backend():
    assert status_of(ok=True, cancelled=True, backend_state="running") is JobStatus.SUCCEEDED
    assert status_of(ok=False, cancelled=False, backend_state="running") is JobStatus.FAILED
    assert status_of(ok=None, cancelled=True, backend_state="running") is JobStatus.CANCELLED


def test_the_job_catalogue_speaks_it():
    info = JobInfo(job_id="j-1", job_uri="file:///x/j-1", markers={"started-0": {}}, backend_state="pending")
    assert info.state is JobStatus.RUNNING
    assert JobInfo(job_id="j-1", job_uri="file:///x/j-1").state is JobStatus.UNKNOWN


def test_the_event_statuses_are_named():
    assert EVENT_STATUSES == {"success", "failed", "preempted", "timeout"}


def test_every_progress_stage_is_a_status_but_finished_which_its_outcome_tells():
    from kinetic_airflow.job.states import Stage

    assert [s.value for s in Stage] == [
        "queued", "launching", "creating_pod", "waiting_for_node", "pulling_image", "starting",
        "pending", "running", "heartbeat_stale", "preempted", "finished",
    ]  # fmt: skip
    assert {s for s in Stage if s.status is None} == {Stage.FINISHED}
    assert Stage.WAITING_FOR_NODE.status is JobStatus.PENDING and Stage.STARTING.status is JobStatus.RUNNING
    assert json.dumps({"state": Stage.PULLING_IMAGE}) == '{"state": "pulling_image"}'  # progress.json
    assert Stage.RUNNING in {"running"} and f"{Stage.HEARTBEAT_STALE}" == "heartbeat_stale"


def test_the_task_log_and_the_view_speak_the_stages():
    from kinetic_airflow.backends.base import BackendStatus
    from kinetic_airflow.job.ref import JobRef
    from kinetic_airflow.job.states import Stage
    from kinetic_airflow.progress import progress_of
    from kinetic_airflow.ui.app import _STATES

    job = JobRef.from_dict(
        {"job_id": "kn-x", "job_uri": "file:///tmp/jobs/kn-x", "backend": "local", "accelerator": "cpu"}
    )
    seen = progress_of(BackendStatus(JobState.PENDING, reason="Launching"), job)
    assert seen is not None and seen.state is Stage.LAUNCHING
    # the view filters on the one vocabulary; a live job's stage is its row's ``stage``
    assert _STATES == tuple(s.value for s in JobStatus)


def test_a_cancellation_carries_its_cause_and_the_status_follows_it():
    from kinetic_airflow.job.states import Cancellation, Cause
    from kinetic_airflow.lifecycle import WorkerStep

    packaging = Cancellation.now("worker", "any words at all", Cause.PACKAGING_FAILED)
    assert Cancellation.from_dict(json.loads(json.dumps(packaging.to_dict()))) == packaging
    assert status_of(ok=None, cancelled=packaging) is JobStatus.FAILED
    stopped = Cancellation.now("kinetic-airflow jobs cancel (ana@laptop)", "wrong data")
    assert status_of(ok=None, cancelled=stopped) is JobStatus.CANCELLED
    # written before the cause existed: the worker's own stop is a worker failure, kept as stored
    old = {"by": "worker", "reason": "its payload could not be built or uploaded", "time": 1.5}
    decoded = Cancellation.from_dict(old)
    assert decoded.cause is Cause.WORKER_FAILED and decoded.to_dict() == old
    assert Cancellation.from_dict({"by": "listener", "reason": "r"}).cause is Cause.STOPPED
    assert Cancellation.from_dict({"unreadable": "boom"}) is None
    # the worker's step decides the cause; its words are only the reason's
    assert WorkerStep.SHIPPING.cause is Cause.PACKAGING_FAILED
    assert {step.cause for step in WorkerStep if step is not WorkerStep.SHIPPING} == {Cause.WORKER_FAILED}


def test_a_job_nobody_watches_is_lost_once_shipped_and_failed_before():
    assert status_of(ok=None, cancelled=None, watched=False, shipped=True) is JobStatus.LOST
    assert status_of(ok=None, cancelled=None, watched=False, started=True) is JobStatus.LOST
    assert status_of(ok=None, cancelled=None, watched=False) is JobStatus.FAILED
    assert status_of(ok=True, cancelled=None, watched=False) is JobStatus.SUCCEEDED  # its result first
    assert status_of(ok=None, cancelled=None, outcome="success", watched=False) is JobStatus.SUCCEEDED
    assert status_of(ok=None, cancelled=None, outcome="preempted") is JobStatus.FAILED
