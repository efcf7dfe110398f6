"""The one vocabulary of job states a person sees (task log, Kinetic view, jobs CLI, gc).

Two parties know something about a job, each in its own words, and both stay as they are
because they are stored or spoken by other programs:

* the job record's lifecycle phase (``kinetic_airflow.lifecycle.Phase``: what the worker did:
  recorded, created, shipped, waiting, delivered, cancelled);
* the backend's observation (``kinetic_airflow.backends.base.JobState``: not_found, pending,
  running, succeeded, failed: what the process or pod is doing).

``JobStatus`` is what the job *is*, derived from those and from the job's files::

    status     from the files / record              from the backend (no outcome in storage)
    ---------  -----------------------------------  -----------------------------------------
    pending    phase recorded, created or shipped   pending and not started; not_found before
                                                    anything was shipped
    running    -                                    running; pending once started
    succeeded  result.json ok                       -
    failed     result.json not ok; a finished       failed or succeeded without a result;
               marker without a result              not_found after a finished marker
    cancelled  status/cancelled.json; phase         -
               cancelled
    lost       no try watches it any more (the view)    not_found once started or shipped
    unknown    -                                    not asked (no job.json to reach it with)

A job stopped on purpose is ``cancelled``; one the worker stopped because it failed before a
watcher held the job (``Cause``) is ``failed``: the cause is a field of the cancellation
(``Cancellation``), written by whoever stopped the job, never read back from its prose.

Every value is the string stored and printed today (job listings, the CLI's JSON, the view),
so nothing that reads them changes. The watcher's event ``status`` is another, smaller
vocabulary (how a wait ended, in trigger events): its strings are named here too.

Nothing here imports Airflow or anything outside ``kinetic_airflow.job``: the phase and backend
state arrive as their string values.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "EVENT_FAILED",
    "EVENT_PREEMPTED",
    "EVENT_STATUSES",
    "EVENT_SUCCESS",
    "EVENT_TIMEOUT",
    "FINAL",
    "LIVE",
    "Cancellation",
    "Cause",
    "JobStatus",
    "Stage",
    "from_backend",
    "from_phase",
    "status_of",
]


class _Word(str, enum.Enum):
    """A state's value is the plain string it replaces: printed, stored and hashed as that."""

    def __str__(self) -> str:
        return self.value

    def __hash__(self) -> int:  # found in a set of the plain strings (``--state running``)
        return str.__hash__(self)


class JobStatus(_Word):
    """What a job is, as a person reads it (its value is what is printed and stored)."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"
    UNKNOWN = "unknown"

    @property
    def live(self) -> bool:
        return self in LIVE

    @property
    def final(self) -> bool:
        return self in FINAL


LIVE = frozenset({JobStatus.PENDING, JobStatus.RUNNING})  # its files are in use
FINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.LOST})

# The lifecycle's phases that say what the job is without asking anyone else; the others
# (waiting, delivered) leave it to the job's files and its backend.
_PHASE_STATUS = {
    "recorded": JobStatus.PENDING,  # the job may not exist yet
    "created": JobStatus.PENDING,  # it exists but has no payload
    "shipped": JobStatus.PENDING,  # it can run: the backend says whether it does
    "cancelled": JobStatus.CANCELLED,
    "reused": JobStatus.SUCCEEDED,  # no job ran: an earlier job's verified result was returned
}


def from_phase(phase: str | None) -> JobStatus | None:
    """The status a lifecycle phase alone implies; None where the files and backend decide."""
    return _PHASE_STATUS.get(phase or "")


def from_backend(backend_state: str | None, *, started: bool, finished: bool, shipped: bool) -> JobStatus:
    """The status of a job with no outcome in storage, from what its backend observes.

    ``started``/``finished``: the runner's markers exist; ``shipped``: its manifest exists.
    A job the backend no longer knows is ``lost`` once it had anything to run (it will never
    write a result) and ``pending`` before (it is still being submitted).
    """
    if backend_state == "running":
        return JobStatus.RUNNING
    if backend_state == "pending":
        return JobStatus.RUNNING if started else JobStatus.PENDING
    if backend_state in ("failed", "succeeded"):  # ended without a result: a failure
        return JobStatus.FAILED
    if backend_state == "not_found":
        if finished:
            return JobStatus.FAILED
        return JobStatus.LOST if started or shipped else JobStatus.PENDING
    return JobStatus.UNKNOWN


class Cause(_Word):
    """Why a job was stopped: stored in the cancellation (record and ``status/cancelled.json``)."""

    STOPPED = "stopped"  # on purpose: a person, Airflow (kill, timeout, clear), a newer try
    WORKER_FAILED = "worker_failed"  # the worker failed before a watcher held the job
    PACKAGING_FAILED = "packaging_failed"  # ... while building or uploading the payload

    @property
    def failure(self) -> bool:
        """The job did not fail, its task did: the job is shown ``failed``, not ``cancelled``."""
        return self is not Cause.STOPPED


# Who stops a job when its worker failed before a watcher held it (``lifecycle.until_watched``).
WORKER = "worker"


@dataclass(frozen=True)
class Cancellation:
    """Who stopped a job, why (``reason``: prose for people) and the ``cause`` (for programs).

    One encoder and one decoder for the three places it is kept: the job record, its history
    entries and ``status/cancelled.json``. A cancellation written before ``cause`` existed
    decodes by who wrote it: the worker's own stop is ``worker_failed``, any other ``stopped``.
    """

    by: str
    reason: str
    time: float | None = None
    cause: Cause = Cause.STOPPED
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # a newer version's
    # the stored keys, in order (() when made here): what was stored is what is written back
    stored: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def now(cls, by: str, reason: str, cause: Cause = Cause.STOPPED) -> Cancellation:
        return cls(by=by, reason=reason, time=time.time(), cause=cause)

    @classmethod
    def from_dict(cls, value: Any) -> Cancellation | None:
        """The cancellation in ``value``; None for anything that is not one (an unreadable
        marker, a damaged entry): a job whose cancel cannot be read is shown by its other facts."""
        if not isinstance(value, Mapping) or "unreadable" in value:
            return None
        by = str(value.get("by") or "someone unknown")
        when = value.get("time")
        try:
            cause = Cause(value["cause"])
        except (KeyError, ValueError):  # before ``cause``, or a newer version's word
            cause = Cause.WORKER_FAILED if by == WORKER else Cause.STOPPED
        return cls(
            by=by,
            reason=str(value.get("reason") or "no reason recorded"),
            time=float(when) if isinstance(when, (int, float)) and not isinstance(when, bool) else None,
            cause=cause,
            extra={k: v for k, v in value.items() if k not in _CANCELLATION_KEYS},
            stored=tuple(value),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form; a decoded one gives back its stored keys (and their values, when
        this version read them as they were)."""
        own = {"by": self.by, "reason": self.reason, "time": self.time, "cause": self.cause.value}
        if not self.stored:
            return own
        return {key: self.extra[key] if key in self.extra else own[key] for key in self.stored}


_CANCELLATION_KEYS = ("by", "reason", "time", "cause")


def status_of(
    *,
    ok: bool | None,
    cancelled: Cancellation | bool | None,
    backend_state: str | None = None,
    started: bool = False,
    finished: bool = False,
    shipped: bool = False,
    outcome: str | None = None,
    stage: Stage | None = None,
    watched: bool | None = None,
) -> JobStatus:
    """A job's status, from whatever its reader knows of it, in this order:

    * its result (``ok``; None without one);
    * a cancellation: ``failed`` when its cause is a failure of the worker, else ``cancelled``;
    * ``outcome``: how a watcher's wait ended (an event status, as the record or
      ``progress.json`` keeps it): ``succeeded`` for success, else ``failed``;
    * ``watched`` False: no try watches it any more, so nobody will deliver its outcome: ``lost``
      once it was shipped or started, ``failed`` before (its task failed while submitting it);
    * its backend (``backend_state``, asked by the CLI and gc) or, where nobody asks the backend
      (the view), the watcher's last ``stage``.
    """
    if ok is not None:
        return JobStatus.SUCCEEDED if ok else JobStatus.FAILED
    if cancelled:
        failure = isinstance(cancelled, Cancellation) and cancelled.cause.failure
        return JobStatus.FAILED if failure else JobStatus.CANCELLED
    if outcome:
        return JobStatus.SUCCEEDED if outcome == EVENT_SUCCESS else JobStatus.FAILED
    if watched is False:
        return JobStatus.LOST if started or shipped else JobStatus.FAILED
    if backend_state is None and stage is not None:
        return stage.status or JobStatus.PENDING
    return from_backend(backend_state, started=started, finished=finished, shipped=shipped)


class Stage(_Word):
    """What a live job is doing right now: the task log's progress lines, ``status/progress.json``
    and the view's finer states (``kinetic_airflow.progress`` says when each is told)."""

    QUEUED = "queued"  # held by Kueue
    LAUNCHING = "launching"
    CREATING_POD = "creating_pod"
    WAITING_FOR_NODE = "waiting_for_node"
    PULLING_IMAGE = "pulling_image"
    STARTING = "starting"  # multi-host: some hosts run, others start
    PENDING = "pending"  # pending for a reason not named above
    RUNNING = "running"
    HEARTBEAT_STALE = "heartbeat_stale"
    PREEMPTED = "preempted"  # a new attempt follows
    FINISHED = "finished"

    @property
    def status(self) -> JobStatus | None:
        """The job's status at this stage; None for ``finished``, which its outcome tells."""
        return _STAGE_STATUS.get(self)


_STAGE_STATUS = {
    **dict.fromkeys(
        (
            Stage.QUEUED,
            Stage.LAUNCHING,
            Stage.CREATING_POD,
            Stage.WAITING_FOR_NODE,
            Stage.PULLING_IMAGE,
            Stage.PENDING,
        ),
        JobStatus.PENDING,
    ),
    # preempted: the attempt is gone, the job (the next attempt) goes on
    **dict.fromkeys(
        (Stage.STARTING, Stage.RUNNING, Stage.HEARTBEAT_STALE, Stage.PREEMPTED), JobStatus.RUNNING
    ),
}


# How a watcher's wait ended: the ``status`` of its event (trigger events, execute_complete).
EVENT_SUCCESS = "success"
EVENT_FAILED = "failed"
EVENT_PREEMPTED = "preempted"  # a new attempt of the same try follows
EVENT_TIMEOUT = "timeout"
EVENT_STATUSES = frozenset({EVENT_SUCCESS, EVENT_FAILED, EVENT_PREEMPTED, EVENT_TIMEOUT})
