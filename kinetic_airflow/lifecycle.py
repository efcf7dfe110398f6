"""The job lifecycle of one task instance: every state, every transition, and who makes it.

Several processes act on one task instance's job: the worker (``execute``,
``execute_complete``, ``on_kill``), the triggerer (the trigger, its ``on_kill``),
the API server (the listener), the job itself (the runner) and, in between,
Airflow's scheduler making new tries. They share two things: the *job record* in
``task_state_store`` (written by the worker only, never from a signal handler)
and the job's files in storage (the runner's markers, and ``status/cancelled.json``
which anyone who stops a job writes). This module is the one place that reads and
writes both, and the one place that decides what a new ``execute`` does::

    state      meaning                                        made by
    ---------  ---------------------------------------------  -------------------------------
    recorded   record saved; the job may not exist yet        worker, before creating the job
    created    the backend object exists, no payload yet      worker
    shipped    payload + manifest uploaded: the job can run   worker
    waiting    a watcher observes it (trigger or worker)      worker, before defer / wait
    delivered  execute_complete returned or raised its result worker
    cancelled  stopped on purpose (user kill/clear/mark,      operator.on_kill, trigger.on_kill,
               timeout, a replacing try, a worker error       listener, a replacing try,
               before a watcher held the job)                 the worker (until_watched)
    reused     no job: the try returned an earlier job's      worker (cache=True, result_cache)
               verified result; ``reused`` names that job
    (finished  the job ended: result.json or process exit;    runner / backend, observed only)

    recorded -> created -> shipped -> waiting -> delivered
    any state -> cancelled            waiting -> recorded (next attempt after a preemption)
    recorded -> recorded              (a second execute of the try resumes an unfinished submit)
    (none) -> reused -> reused        (a cache hit; a second execute of the try looks it up again)
    reused -> recorded                (that lookup missed: the try runs its own job after all)

The invariant all of this serves: *a job exists only while a try of its task watches it
or has delivered it.* The watcher (the trigger, or the in-worker wait) owns a job from the
moment it holds it; before that, from the backend call that creates the job to the
hand-off (``TaskDeferred``, or the in-worker wait's event), the worker owns it, inside one
``until_watched`` guard: any error there cancels the job and records why before it
propagates, so a failing worker never leaves an accelerator running for nobody.

Why a new try exists decides what it does (see ``decide``). Airflow's state store
survives clears, so the record alone would make a re-run look like a crash recovery.
Airflow itself says which it is: clearing a task instance that is not running sets
``max_tries = try_number + retries`` (``clear_task_instances``), which no retry,
crash or scheduler reset does; clearing a *running* one sets it RESTARTING and kills
the process, whose ``on_kill`` marks the job cancelled. So a user's re-run (clear
from UI, REST or CLI, backfill ``--reprocess-behavior``) runs a new job with the
current code, and an infrastructure failure (worker crash, lost heartbeat, the
executor-event race, a scheduler or triggerer restart) never runs a second copy: it
reattaches to the live job, returns the finished job's result, or — if the job
never got its payload — replaces it. A deleted and recreated DAG run starts with
no record (the store's rows are deleted with their run) and Airflow's per-try id
(``ti.id``) is part of the job id, so it cannot meet the old run's job files.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kinetic_airflow.job.layout import STATE_KEY, JobLayout
from kinetic_airflow.job.ref import JobRef
from kinetic_airflow.job.states import WORKER, Cancellation, Cause, JobStatus, status_of

__all__ = [
    "Action",
    "Decision",
    "HistoryEntry",
    "JobRecord",
    "Phase",
    "TryInfo",
    "UnwatchedJobGuard",
    "WorkerStep",
    "acancel_job",
    "after_observing",
    "cancel_job",
    "cancelled_marker",
    "decide",
    "decode_record",
    "history_entry",
    "integrity_of_job",
    "job_history",
    "job_integrity",
    "load_record",
    "record_job",
    "recorded_jobs",
    "recorded_status",
    "save_record",
    "until_watched",
]

log = logging.getLogger(__name__)

RECORD_VERSION = 2
_HISTORY_LIMIT = 100  # jobs remembered per task instance (tries x attempts)


class Phase(str, enum.Enum):
    RECORDED = "recorded"
    CREATED = "created"
    SHIPPED = "shipped"
    WAITING = "waiting"
    DELIVERED = "delivered"
    CANCELLED = "cancelled"
    REUSED = "reused"  # no job ran: an earlier job's result was reused (cache=True)


# Who may move the record from one phase to the next (the worker writes every record).
_ALLOWED: dict[Phase | None, set[Phase]] = {
    None: {Phase.RECORDED, Phase.REUSED},
    Phase.RECORDED: {Phase.RECORDED, Phase.CREATED, Phase.CANCELLED},  # again: a resumed submit
    Phase.CREATED: {Phase.SHIPPED, Phase.CANCELLED},
    Phase.SHIPPED: {Phase.WAITING, Phase.DELIVERED, Phase.CANCELLED},
    Phase.WAITING: {Phase.WAITING, Phase.DELIVERED, Phase.RECORDED, Phase.CANCELLED},
    Phase.DELIVERED: {Phase.DELIVERED},
    Phase.CANCELLED: {Phase.CANCELLED, Phase.DELIVERED},
    Phase.REUSED: {Phase.REUSED, Phase.RECORDED},
}


class Action(str, enum.Enum):
    NEW_JOB = "new_job"  # create this try's own job (cancelling ``replaces`` first, if any)
    SUBMIT = "submit"  # same try: the job was recorded but maybe never created
    SHIP = "ship"  # same try: the job exists but its payload never arrived
    WATCH = "watch"  # the recorded job is (or may be) running: wait for it
    COLLECT = "collect"  # the recorded job has ended: report its outcome, run nothing


@dataclass(frozen=True)
class TryInfo:
    """What Airflow says about the try that is executing now."""

    try_number: int
    ti_id: str = ""
    max_tries: int | None = None

    @classmethod
    def of(cls, ti: Any) -> TryInfo:
        max_tries = getattr(ti, "max_tries", None)
        return cls(
            try_number=int(ti.try_number),
            ti_id=str(getattr(ti, "id", "") or ""),
            max_tries=int(max_tries) if max_tries is not None else None,
        )


@dataclass
class Decision:
    action: Action
    reason: str
    job: JobRef | None = None  # the recorded job to act on (SUBMIT/SHIP/WATCH/COLLECT)
    replaces: JobRef | None = None  # NEW_JOB: an earlier job to stop first
    observe: bool = False  # WATCH of an earlier try's job: only if it can still deliver (after_observing)


# The record ----------------------------------------------------------------------------------
_BASE_KEYS = ("version", "phase", "job", "try_number", "ti_id", "max_tries", "deadline", "updated")
_EXTRA_KEYS = ("outcome", "usage", "cancelled", "integrity", "reused")  # what a transition may add
_KNOWN_KEYS = (*_BASE_KEYS, *_EXTRA_KEYS, "jobs")


def _refuse(key: str, value: Any, wanted: str) -> ValueError:
    return ValueError(f"the kinetic job record's {key!r} is {value!r}, not {wanted}")


def _typed(record: dict[str, Any], key: str, types: tuple[type, ...], wanted: str) -> Any:
    """``record[key]`` if it is absent, None or one of ``types`` (a bool is no number)."""
    value = record.get(key)
    if value is None or (isinstance(value, types) and not isinstance(value, bool)):
        return value
    raise _refuse(key, value, wanted)


_ENTRY_KEYS = (
    "job_id",
    "job_uri",
    "backend",
    "accelerator",
    "try_number",
    "attempt",
    "submitted_at",
    "phase",
    "outcome",
    "usage",
    "cancelled",
)


@dataclass(frozen=True)
class HistoryEntry:
    """One job a task instance ran (``JobRecord.jobs``): what the Kinetic view and the metrics read.

    Decoded from, and encoded back to, the stored object: a key that was absent stays absent,
    one this version does not know is kept (``extra``), and ``cancelled`` is a ``Cancellation``.
    """

    job_id: str
    job_uri: str | None = None
    backend: str | None = None
    accelerator: str | None = None
    try_number: int | None = None
    attempt: int | None = None
    submitted_at: float | None = None
    phase: str | None = None
    outcome: str | None = None
    usage: dict[str, Any] | None = None
    cancelled: Cancellation | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    stored: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def of(cls, job: JobRef) -> HistoryEntry:
        """A new entry for ``job`` (what ``history_entry`` has always written)."""
        identity = job.identity
        # a capacity ladder's rung (kinetic_airflow.ladder): kept beside the attempt it was
        rung = {"rung": dict(job.rung)} if job.rung else {}
        return cls(
            job_id=job.job_id,
            job_uri=job.job_uri,
            backend=job.backend,
            accelerator=job.accelerator or "cpu",
            try_number=identity.try_number if identity else None,
            attempt=identity.attempt if identity else None,
            submitted_at=job.submitted_at,
            extra=rung,
            stored=(*_ENTRY_KEYS[:7], *rung),
        )

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> HistoryEntry:
        """An entry as stored; ``ValueError`` names a field of the wrong type."""
        job_id = value.get("job_id")
        if not isinstance(job_id, str):
            raise _refuse("jobs", [value], "a list of objects with a job_id (the job history)")
        for key, types, words in (
            ("job_uri", (str,), "a string"),
            ("backend", (str,), "a string"),
            ("accelerator", (str,), "a string"),
            ("try_number", (int,), "a number"),
            ("attempt", (int,), "a number"),
            ("submitted_at", (int, float), "a time"),
            ("phase", (str,), "a string"),
            ("outcome", (str,), "a string"),
            ("usage", (dict,), "an object"),
        ):
            _typed(value, key, types, words)
        cancelled = value.get("cancelled")
        return cls(
            **{k: value.get(k) for k in _ENTRY_KEYS[:10]},
            cancelled=Cancellation.from_dict(cancelled) if cancelled is not None else None,
            extra={k: v for k, v in value.items() if k not in _ENTRY_KEYS},
            stored=tuple(value),
        )

    def to_dict(self) -> dict[str, Any]:
        """The stored object: its stored keys in order, then any a change added."""
        out: dict[str, Any] = {}
        for key in (*self.stored, *_ENTRY_KEYS):
            if key in out:
                continue
            if key in self.extra:
                out[key] = self.extra[key]
                continue
            if key not in _ENTRY_KEYS:
                continue
            value = getattr(self, key)
            if key in self.stored or value is not None:
                out[key] = value.to_dict() if isinstance(value, Cancellation) else value
        for key, value in self.extra.items():  # one a change added (``reused``)
            out.setdefault(key, value)
        return out

    def replace(self, **changes: Any) -> HistoryEntry:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class JobRecord:
    """The job record of one task instance, as the worker keeps it in ``task_state_store``.

    One decoder (``from_dict``) and one encoder (``to_dict``) for every process that reads or
    writes it. Every earlier stored form must keep decoding, and re-encoding must give back what
    was stored: a field that was absent stays absent (``keys`` remembers which were there, in
    their stored order), a key this version does not know is kept (``unknown``) and a value of
    the wrong type is refused, naming the field, rather than read as "no job".

    ``phase`` is None in the records written before the lifecycle existed (``current_phase``
    says what that means). ``jobs`` is the history (``job_history``), one ``HistoryEntry`` a job;
    ``cancelled`` says who stopped the job, why, and the ``Cause``.
    """

    job: JobRef
    phase: Phase | None = None
    version: int | None = None
    try_number: int | None = None
    ti_id: str | None = None
    max_tries: int | None = None
    deadline: float | None = None
    updated: float | None = None
    outcome: str | None = None
    usage: dict[str, Any] | None = None
    cancelled: Cancellation | None = None
    integrity: dict[str, Any] | None = None
    jobs: tuple[HistoryEntry, ...] | None = None
    # a cache hit (phase reused): the reused job, the run and task that made it, what it saved
    reused: dict[str, Any] | None = None
    unknown: dict[str, Any] = field(default_factory=dict)
    # The stored keys, in their order ((): a new record, in the usual order). Not compared: a
    # decoded record equals the one that was saved.
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @property
    def current_phase(self) -> Phase:
        """Records written before the lifecycle existed had no phase: they were written just
        before the job was created and never updated, so their job may be running."""
        return self.phase or Phase.WAITING

    @property
    def present(self) -> frozenset[str]:
        """The keys the stored form has (``"outcome" in record`` of the dict it was)."""
        return frozenset(self.to_dict())

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> JobRecord:
        """The record from its stored JSON object; ``ValueError`` names the field that is wrong."""
        job = record.get("job")
        if not isinstance(job, dict):
            raise _refuse("job", job, "an object (the job reference)")
        phase = record.get("phase")
        if phase not in (None, "") and phase not in {p.value for p in Phase}:
            raise _refuse("phase", phase, "one of " + ", ".join(p.value for p in Phase))
        jobs = record.get("jobs")
        if jobs is not None and not (isinstance(jobs, list) and all(isinstance(j, dict) for j in jobs)):
            raise _refuse("jobs", jobs, "a list of objects (the job history)")
        return cls(
            job=JobRef.from_dict(job),
            phase=Phase(phase) if phase else None,
            version=_typed(record, "version", (int,), "a number"),
            try_number=_typed(record, "try_number", (int,), "a number"),
            ti_id=_typed(record, "ti_id", (str,), "a string"),
            max_tries=_typed(record, "max_tries", (int,), "a number"),
            deadline=_typed(record, "deadline", (int, float), "a time"),
            updated=_typed(record, "updated", (int, float), "a time"),
            outcome=_typed(record, "outcome", (str,), "a string"),
            usage=_typed(record, "usage", (dict,), "an object"),
            cancelled=Cancellation.from_dict(_typed(record, "cancelled", (dict,), "an object")),
            integrity=_typed(record, "integrity", (dict,), "an object"),
            jobs=tuple(HistoryEntry.from_dict(j) for j in jobs) if jobs is not None else None,
            reused=_typed(record, "reused", (dict,), "an object"),
            unknown={key: value for key, value in record.items() if key not in _KNOWN_KEYS},
            keys=tuple(record),
        )

    def to_dict(self) -> dict[str, Any]:
        """The stored JSON object: the stored keys in their order, then any a change added."""
        values: dict[str, Any] = {
            "version": self.version,
            "phase": self.phase.value if self.phase else None,
            "job": self.job.to_dict(),
            "try_number": self.try_number,
            "ti_id": self.ti_id,
            "max_tries": self.max_tries,
            "deadline": self.deadline,
            "updated": self.updated,
            "outcome": self.outcome,
            "usage": self.usage,
            "cancelled": self.cancelled.to_dict() if self.cancelled is not None else None,
            "integrity": self.integrity,
            "jobs": [j.to_dict() for j in self.jobs] if self.jobs is not None else None,
            "reused": self.reused,
        }
        present = set(self.keys) if self.keys else {"job", *_BASE_KEYS}
        out: dict[str, Any] = {}
        for key in (*self.keys, *_KNOWN_KEYS):
            if key in out:
                continue
            if key in self.unknown:
                out[key] = self.unknown[key]
            elif key in values and (key in present or values[key] is not None):
                out[key] = values[key]
        return out

    def replace(self, **changes: Any) -> JobRecord:
        return dataclasses.replace(self, **changes)


def decode_record(value: Any) -> JobRecord | None:
    """The job record from whatever form it was read in; None when there is no job record.

    The one decoder of the record, for every reader (operator, listener, Kinetic view): the
    ``task_state_store`` client hands back the object, the ``task_state_store`` table holds
    JSON text, and some stores encode the JSON text once more (a JSON string of the JSON
    object). A reader that missed one of these forms would see no job, and a mark-failed
    would leave it running. Text that is not JSON, or a record with a wrong value, raises
    ``ValueError``: a damaged record must not pass for "no job yet" (the operator would start
    a second job).
    """
    for _ in range(3):  # object, JSON text, JSON text of JSON text
        if isinstance(value, (bytes, bytearray)):
            value = value.decode("utf-8", errors="replace")
        if not isinstance(value, str):
            break
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(
                f"the kinetic job record ({STATE_KEY!r} in task_state_store) is not JSON: {value[:200]!r}"
            ) from None
    if isinstance(value, JobRecord):
        return value
    if not (isinstance(value, dict) and isinstance(value.get("job"), dict)):
        return None  # another key's value, or no record
    return JobRecord.from_dict(value)


def record_job(record: JobRecord) -> JobRef:
    """The job a record names (``record.job``; kept for the callers that pass it as a function)."""
    return record.job


def load_record(store: Any) -> JobRecord | None:
    """The record in a task instance's ``task_state_store`` (None without a store or a record)."""
    if store is None:
        return None
    return decode_record(store.get(STATE_KEY))


def read_record_from_db(dag_id: str, run_id: str, task_id: str, map_index: int) -> JobRecord | None:
    """The record of a task instance read straight from the metadata DB, for the processes that
    have no task instance's store in hand (the listener in the scheduler, the CLI)."""
    # Airflow start-up cost: its models load when used, not when this module is imported.
    from airflow.models.task_state_store import TaskStateStoreModel as Store
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        value = session.scalar(
            select(Store.value).where(
                Store.dag_id == dag_id,
                Store.run_id == run_id,
                Store.task_id == task_id,
                Store.map_index == map_index,
                Store.key == STATE_KEY,
            )
        )
    return decode_record(value)


def save_record(
    store: Any,
    phase: Phase,
    *,
    job: JobRef,
    now: TryInfo,
    deadline: float | None,
    previous: JobRecord | None = None,
    outcome: str | None = None,
    usage: dict[str, Any] | None = None,
    cancelled: Cancellation | None = None,
    integrity: dict[str, Any] | None = None,
    reused: dict[str, Any] | None = None,
) -> JobRecord:
    """Write the record in ``phase``; refuses transitions the table above does not allow.

    Without a store (no ``task_state_store``) nothing persists, so there is nothing to keep
    consistent: the record is only handed back.
    """
    earlier = previous if previous is not None else load_record(store)
    # ``integrity`` (kinetic_airflow.integrity): the job's key and payload digest. It lives in the
    # record only (the metadata DB), never in ``job`` (the reference trigger kwargs carry).
    if integrity is None:  # the job's key (and payload digest) stay with its record
        integrity = job_integrity(earlier, job.job_id) or None
    extra = {"outcome": outcome, "usage": usage, "cancelled": cancelled, "reused": reused}
    record = JobRecord(
        job=job,
        phase=phase,
        version=RECORD_VERSION,
        try_number=now.try_number,
        ti_id=now.ti_id,
        max_tries=now.max_tries,
        deadline=deadline,
        updated=time.time(),
        **extra,
        integrity=integrity,
        jobs=tuple(job_history(earlier, job, phase, {k: v for k, v in extra.items() if v is not None})),
    )
    if store is None:
        return record
    before = previous.current_phase if previous and previous.job.job_id == job.job_id else None
    if phase not in _ALLOWED[before]:
        was = before.value if before else "no record"
        raise RuntimeError(f"kinetic job record: {was} -> {phase.value} is not a lifecycle transition")
    store.set(STATE_KEY, record.to_dict())
    return record


def job_integrity(record: JobRecord | None, job_id: str) -> dict[str, Any]:
    """``{"job_id", "key", "payload_sha256"}`` of job ``job_id`` from its record; {} when the record
    has none (the CLI knows only a job's id, from storage)."""
    return integrity_of_job(record.integrity if record else None, job_id)


def integrity_of_job(integrity: Any, job_id: str) -> dict[str, Any]:
    """``integrity`` if it is job ``job_id``'s (a record's, or a worker's memory of it), else {}."""
    if isinstance(integrity, dict) and integrity.get("job_id") == job_id:
        return integrity
    return {}


def job_history(
    earlier: JobRecord | None, job: JobRef, phase: Phase, extra: dict[str, Any]
) -> list[HistoryEntry]:
    """Every job this task instance ran (all tries and attempts, newest last), for the Kinetic
    view: the record itself names only the current one, and the store survives clears."""
    jobs = list((earlier.jobs if earlier else None) or ())
    at = next((i for i, j in enumerate(jobs) if j.job_id == job.job_id), None)
    if at is None:
        jobs.append(history_entry(job))
        at = len(jobs) - 1
    changes = {key: extra[key] for key in ("outcome", "usage", "cancelled") if key in extra}
    if extra.get("reused") is not None:  # the view reads it from the entry (HistoryEntry.extra)
        changes["extra"] = {**jobs[at].extra, "reused": extra["reused"]}
    jobs[at] = jobs[at].replace(phase=phase.value, **changes)
    return jobs[-_HISTORY_LIMIT:]


def history_entry(job: JobRef) -> HistoryEntry:
    """What the history keeps of a job (the Kinetic view and the metrics read these few fields)."""
    return HistoryEntry.of(job)


def recorded_jobs(record: JobRecord) -> list[HistoryEntry]:
    """The jobs of a record, its current one last with the record's phase and outcome (records
    written before the history existed name only the current job)."""
    extra = {key: getattr(record, key) for key in ("outcome", "usage", "cancelled") if key in record.present}
    return job_history(record, record.job, record.current_phase, extra)


def recorded_status(record: JobRecord) -> JobStatus | None:
    """The status of a record's job from the record alone (``job.states.status_of``): final once
    its outcome was delivered or it was cancelled; None while its files and backend decide."""
    phase = record.current_phase
    if phase is Phase.REUSED:
        return status_of(ok=True, cancelled=None)
    if phase not in (Phase.DELIVERED, Phase.CANCELLED):
        return None
    return status_of(
        ok=None,
        cancelled=record.cancelled or phase is Phase.CANCELLED,
        outcome=record.outcome or "failed",  # delivered without an outcome: from before outcomes
    )


# Cancellation --------------------------------------------------------------------------------
def cancelled_marker(job: JobRef) -> str:
    return JobLayout(job.job_uri).status("cancelled")


def _marker(by: str, reason: str, cause: Cause = Cause.STOPPED) -> str:
    return json.dumps(Cancellation.now(by, reason, cause).to_dict())


def cancel_job(
    job: JobRef, storage: Any, backend: Any, *, by: str, reason: str, cause: Cause = Cause.STOPPED
) -> None:
    """Mark the job cancelled in its storage, then stop it. Safe to call twice or on an ended job.

    The marker goes first: whoever looks next (a new try, the watcher) must see that the job
    was stopped on purpose even if stopping it takes a while or this process dies meanwhile.
    ``cause`` says whether it was stopped on purpose or because its worker failed (the job is
    then shown ``failed``). Nothing is deleted: payload, logs and any result stay where they are.
    """
    try:
        storage.write_text(cancelled_marker(job), _marker(by, reason, cause))
    except Exception as exc:  # stopping the job matters more than the marker
        log.warning("could not write the cancelled marker of job %s: %s", job.job_id, exc)
    backend.cancel(job)


async def acancel_job(
    job: JobRef, storage: Any, backend: Any, *, by: str, reason: str, cause: Cause = Cause.STOPPED
) -> None:
    """``cancel_job`` for the triggerer's event loop (both storages and backends block)."""
    await asyncio.to_thread(cancel_job, job, storage, backend, by=by, reason=reason, cause=cause)


# The worker's ownership of a job it has not handed to a watcher yet -----------------------------
WORKER_FAILED = "the worker failed before it could watch the job"
ON_KILL_BY = "operator.on_kill"
ON_KILL_REASON = "the task was killed (timeout, SIGTERM, a user)"


class WorkerStep(str, enum.Enum):
    """The worker's steps between creating a job and handing it to a watcher. Each value is the
    words of the cancel reason; ``cause`` is what programs read (the view, the CLI), so rewording
    a step changes no state."""

    RECORDING = "recording the job"
    PUBLISHING = "publishing the job's description"
    CREATING = "creating the job"
    RECORDING_CREATED = "recording the job as created"
    SHIPPING = "shipping the payload"
    RECORDING_SHIPPED = "recording the job as shipped"
    RECORDING_WAITING = "recording the job as waiting"
    PUSHING_LINKS = "pushing the job's links"
    STARTING_WATCH = "starting to watch the job in the worker"
    WATCHING = "watching the job in the worker"
    BUILDING_TRIGGER = "building the trigger"
    DEFERRING = "deferring to the triggerer"

    @property
    def cause(self) -> Cause:
        return Cause.PACKAGING_FAILED if self is WorkerStep.SHIPPING else Cause.WORKER_FAILED


class UnwatchedJobGuard:
    """What ``until_watched`` knows: the job, the step the worker is at (``WorkerStep``: the
    reason's words and the cause), and which exceptions Airflow follows with the operator's
    ``on_kill`` (which stops the job).

    ``job`` is the reference as the worker holds it now: the reference is frozen, so a worker
    that stamps it (``submitted_at`` when it submits) hands the guard the stamped copy, which is
    the one a cancelled record must name."""

    def __init__(self, job: JobRef) -> None:
        self.job = job
        self.step = WorkerStep.CREATING
        self.on_kill_follows: tuple[type[BaseException], ...] = ()


# The steps before the job exists on its backend (a failure there may have created nothing).
_BEFORE_CREATED = frozenset({WorkerStep.RECORDING, WorkerStep.PUBLISHING, WorkerStep.CREATING})


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextlib.contextmanager
def until_watched(
    job: JobRef,
    *,
    store: Any,
    now: TryInfo,
    deadline: float | None,
    cancel: Callable[..., None],
) -> Iterator[UnwatchedJobGuard]:
    """Own ``job`` from its creation until a watcher holds it; on any error, stop it first.

    Wrap everything from the backend call that creates the job to the hand-off: ``TaskDeferred``
    (the trigger holds the job now) passes through untouched, and so does a normal exit (the
    in-worker wait returned the job's ending). Any other exception — a bad setting, a storage
    error while shipping, a record that cannot be written, a trigger that cannot be built —
    would otherwise leave the job running with no task watching it (on GKE, an accelerator
    billed for nothing, shown as live for ever): ``cancel(job, by=, reason=)`` (the usual
    cancel path: the marker, then the backend) stops it, the record is moved to cancelled with
    who and why, and the original error propagates. Cancelling a job that was never created,
    or has ended, does nothing, so the guard may start just before the creating call.
    """
    guard = UnwatchedJobGuard(job)
    try:
        yield guard
    except BaseException as exc:
        # Airflow start-up cost: loaded when called, not when this module is imported.
        from airflow.sdk.exceptions import TaskDeferred

        if isinstance(exc, TaskDeferred):
            raise
        by, reason = WORKER, f"{WORKER_FAILED}: {_error_text(exc)} (while {guard.step.value})"
        cause = guard.step.cause
        if isinstance(exc, guard.on_kill_follows):
            # Airflow's execution_timeout in the worker's own wait: Airflow calls on_kill next,
            # which stops the job (a task killed while it waits in the worker); record that.
            by, reason, cause = ON_KILL_BY, ON_KILL_REASON, Cause.STOPPED
        else:
            log.error("kinetic job %s: %s; cancelling the job", guard.job.job_id, reason)
            try:
                cancel(guard.job, by=by, reason=reason, cause=cause)
            except Exception as cancel_exc:
                if guard.step in _BEFORE_CREATED and _error_text(cancel_exc) == _error_text(exc):
                    # The creating call and the cancel failed alike (a connection that is not
                    # defined, credentials that do not work): nothing reached the cluster.
                    log.error(
                        "kinetic job %s was not created: the same error stopped its creation",
                        guard.job.job_id,
                    )
                else:
                    log.error(
                        "could not cancel kinetic job %s (%s): it may still be running. Stop it "
                        "with `kinetic-airflow jobs cancel %s`.",
                        guard.job.job_id,
                        _error_text(cancel_exc),
                        guard.job.job_id,
                    )
        try:
            _record_cancelled(store, guard.job, now, deadline, Cancellation.now(by, reason, cause))
        except Exception as record_exc:
            log.error("could not record kinetic job %s as cancelled: %s", guard.job.job_id, record_exc)
        raise


def _record_cancelled(
    store: Any, job: JobRef, now: TryInfo, deadline: float | None, cancelled: Cancellation
) -> None:
    """Move this job's record to cancelled, from whatever phase the store holds now (the step
    that failed may have been a record write). Another job's record is left alone."""
    if store is None:
        return
    record = load_record(store)
    if record is None or record.job.job_id != job.job_id:
        return
    if record.current_phase in (Phase.DELIVERED, Phase.CANCELLED):
        return
    save_record(
        store,
        Phase.CANCELLED,
        job=job,
        now=now,
        deadline=deadline,
        previous=record,
        cancelled=cancelled,
    )


# The decision --------------------------------------------------------------------------------
def decide(record: JobRecord | None, now: TryInfo) -> Decision:
    """What a new ``execute`` of this task instance does, from the record alone.

    WATCH of an earlier try's job is only a candidate: the caller observes that job and
    falls back to NEW_JOB when it is gone, failed or was cancelled (``after_observing``).
    """
    if record is None:
        return Decision(Action.NEW_JOB, "first job of this task instance")
    job = record.job
    phase = record.current_phase
    recorded_try = record.try_number or 0
    if phase is Phase.REUSED:
        # No job ran: nothing to reattach to or stop. A duplicate execute, a retry and a clear
        # all look the cache up again (a clear reuses too, unless the run asks for a fresh one).
        reused = (record.reused or {}).get("job_id", "an earlier job")
        return Decision(
            Action.NEW_JOB, f"try {recorded_try} reused the result of {reused}; looking the cache up again"
        )
    recorded_id = record.ti_id or ""
    same_incarnation = not recorded_id or not now.ti_id or recorded_id == now.ti_id

    if recorded_try == now.try_number and same_incarnation:
        # Another execute of this very try (a duplicate, or a crash before the try was over).
        if phase is Phase.RECORDED:
            return Decision(Action.SUBMIT, "the job was recorded but may never have been created", job)
        if phase is Phase.CREATED:
            return Decision(Action.SHIP, "the job was created but its payload never arrived", job)
        if phase in (Phase.DELIVERED, Phase.CANCELLED):
            return Decision(Action.COLLECT, f"this try's job was already {phase.value}", job)
        return Decision(Action.WATCH, "reattaching to this try's job", job)

    if recorded_try >= now.try_number:
        return Decision(
            Action.NEW_JOB,
            f"the recorded job belongs to another run of this task instance (try {recorded_try})",
        )

    earlier = f"try {recorded_try}'s job {job.job_id}"
    recorded_max = record.max_tries
    if recorded_max is not None and now.max_tries is not None and recorded_max != now.max_tries:
        return Decision(
            Action.NEW_JOB,
            f"the task instance was cleared (a re-run was asked for): running a new job instead of "
            f"reusing {earlier}",
            replaces=job,
        )
    if phase is Phase.CANCELLED:
        return Decision(Action.NEW_JOB, f"{earlier} was cancelled")
    if phase in (Phase.RECORDED, Phase.CREATED):
        return Decision(
            Action.NEW_JOB,
            f"{earlier} never got its payload (the earlier try died while submitting it); replacing it",
            replaces=job,
        )
    if phase is Phase.DELIVERED and record.outcome != "success":
        return Decision(Action.NEW_JOB, f"{earlier} failed; this retry runs a new job")
    if phase is Phase.DELIVERED:
        return Decision(
            Action.COLLECT,
            f"{earlier} already finished and delivered its result, but Airflow started this try "
            "without a clear (infrastructure failure): returning that result instead of running again",
            job,
        )
    return Decision(
        Action.WATCH,
        f"the earlier try ended without a result while {earlier} was {phase.value} (infrastructure "
        "failure): reattaching to it instead of starting a second copy",
        job,
        observe=True,
    )


def after_observing(decision: Decision, *, finished_ok: bool, live: bool, cancelled: bool) -> Decision:
    """Settle a WATCH of an earlier try's job once that job has been looked at.

    A job of this very try is always watched (the watcher reports how it ended); an
    earlier try's job is reused only while it can still give this try its result.
    """
    job = decision.job
    job_id = job.job_id if job is not None else None
    if not decision.observe:
        return decision
    if cancelled:
        return Decision(Action.NEW_JOB, f"the earlier job {job_id} was cancelled")
    if finished_ok:
        return Decision(
            Action.COLLECT,
            f"the earlier job {job_id} already finished successfully; returning its result "
            "instead of running it again (this try exists because of an infrastructure failure)",
            job,
        )
    if live:
        return decision
    return Decision(Action.NEW_JOB, f"the earlier job {job_id} failed or is gone")
