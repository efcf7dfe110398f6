"""What the Kinetic view shows, read from Airflow's metadata DB and the jobs' JSON files.

The job record in ``task_state_store`` (key ``kinetic_job``, written by the worker) names
a task instance's current job and every job it ran (``lifecycle.job_history``); the
task instance row adds its Airflow state and map label, and the record's entries carry each
ended attempt's outcome and chip-hours (``kinetic_airflow.usage``). Live facts come from the
job's own JSON files: ``status/progress.json`` (the watcher's state changes) and
``result.json`` (the result summary: type, repr, error). Nothing here unpickles anything:
the api-server never loads a payload or a result.

A job's ``state`` is its status in the one vocabulary (``job.states.status_of``), the word the
jobs CLI prints for the same job; the view adds ``stage`` (what a live job is doing) and
``ending`` (how it ended, finer than its state), read from fields, never from log prose.

Files of a job that has ended do not change, so they are cached in this process.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kinetic_airflow.connections import storage_for
from kinetic_airflow.job.layout import STATE_KEY, JobLayout, output_dir_uri
from kinetic_airflow.job.states import (
    EVENT_PREEMPTED,
    EVENT_SUCCESS,
    Cancellation,
    Cause,
    JobStatus,
    Stage,
    status_of,
)
from kinetic_airflow.job.tracebacks import clean_remote_traceback, type_name, user_summary
from kinetic_airflow.lifecycle import HistoryEntry, JobRecord, Phase, decode_record, recorded_jobs
from kinetic_airflow.result_cache import reuse_words
from kinetic_airflow.usage import ended_usage

__all__ = ["JobView", "TaskRow", "device_of", "job_details", "rows_of", "run_costs", "task_rows"]

log = logging.getLogger(__name__)

_FINAL_CACHE: OrderedDict[str, dict[str, Any]] = OrderedDict()
_LIVE_CACHE: dict[str, tuple[float, dict[str, Any]]] = {}
_LIVE_SECONDS = 2.0
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 5000
_READERS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kinetic-view")


def _read_json(storage: Any, uri: str, check: Any = None) -> dict[str, Any] | None:
    """A job's JSON file, bounded in bytes and depth (``Storage.read_json_or_none``); one that
    cannot be read, or whose values are not as kinetic-airflow writes them (``check`` names
    the wrong fields), is ``{"unreadable": why}``: that job's row says so, the page stays."""
    try:
        value = storage.read_json_or_none(uri)
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"{uri} is not a JSON object")
        wrong = check(value) if check is not None and value is not None else []
        if wrong:
            raise ValueError(f"{uri}: {', '.join(wrong)} not as kinetic-airflow writes them")
        return value
    except Exception as exc:  # one unreadable job must not blank the page
        log.warning("kinetic view: could not read %s: %s", uri, exc)
        return {"unreadable": str(exc)}


def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e11


def _wrong_progress(progress: dict[str, Any]) -> list[str]:
    """The fields of a progress record the page could not show (``progress.ProgressTracker``)."""
    times, texts = ("time", "since", "running_since"), ("job_id", "state", "text", "node", "outcome")
    wrong = [k for k in times if progress.get(k) is not None and not _is_time(progress[k])]
    wrong += [k for k in texts if not isinstance(progress.get(k, ""), str)]
    history = progress.get("history", [])
    if not isinstance(history, list) or not all(
        isinstance(h, dict) and _is_time(h.get("time")) and isinstance(h.get("state"), str)
        and isinstance(h.get("text", ""), str) for h in history
    ):  # fmt: skip
        wrong.append("history")
    return wrong


def _wrong_summary(summary: dict[str, Any]) -> list[str]:
    """The fields of a result summary the page could not show (``job.envelope``)."""
    text = ("phase", "error_type", "error_message", "traceback", "value_type", "value_repr")
    wrong = [k for k in text if summary.get(k) is not None and not isinstance(summary[k], str)]
    if summary.get("ok") not in (None, True, False):
        wrong.append("ok")
    timings = summary.get("timings")
    if timings is not None and not (
        isinstance(timings, dict) and all(isinstance(v, (int, float)) for v in timings.values())
    ):
        wrong.append("timings")
    return wrong


def _job_files(job: HistoryEntry, gcp_conn_id: str | None, watched: bool) -> dict[str, Any]:
    """progress / summary (and, for a job nobody watches any more, its start and cancel markers).

    A live job costs one read (its progress); the result summary is read once the progress
    or the record says it ended, and a job whose outcome is recorded is cached for good. A job
    that no task watches (``watched`` False: its task instance ended, or moved on to another
    job) without having delivered its outcome costs two reads more: whether it started, and
    who cancelled it and why. Reads are shared for a few seconds between viewers, so many open
    pages cost no more.
    """
    job_id = job.job_id
    now = time.monotonic()
    key = f"{job_id}|{watched}"
    with _CACHE_LOCK:
        cached = _FINAL_CACHE.get(job_id)
        if cached is None:
            fresh = _LIVE_CACHE.get(key)
            if fresh is not None and now - fresh[0] < _LIVE_SECONDS:
                cached = fresh[1]
    if cached is not None:
        return cached
    uri = job.job_uri or ""
    storage = storage_for(uri, gcp_conn_id)
    layout = JobLayout(uri)
    files: dict[str, Any] = {"progress": _read_json(storage, layout.status("progress"), _wrong_progress)}
    recorded = job.usage is not None  # the outcome reached Airflow: nothing about the job changes now
    cancelled = job.phase == Phase.CANCELLED.value
    ended = recorded or (files["progress"] or {}).get("outcome") or cancelled or not watched
    files["summary"] = _read_json(storage, layout.result_summary(), _wrong_summary) if ended else None
    failed = recorded and job.outcome not in (EVENT_SUCCESS, EVENT_PREEMPTED)
    if (cancelled or failed or not (recorded or watched)) and job.cancelled is None:
        # who stopped it and why (newer workers put it in the record's history themselves)
        files["cancelled"] = _read_json(storage, layout.status("cancelled"))
    if not (recorded or watched) and files["summary"] is None:
        files["started"] = _read_json(storage, layout.status("started"))
    with _CACHE_LOCK:
        if recorded:
            _FINAL_CACHE[job_id] = files
            _LIVE_CACHE.pop(key, None)
            while len(_FINAL_CACHE) > _CACHE_SIZE:
                _FINAL_CACHE.popitem(last=False)
        else:
            _LIVE_CACHE[key] = (now, files)
            for stale in [k for k, (t, _) in _LIVE_CACHE.items() if now - t >= _LIVE_SECONDS]:
                del _LIVE_CACHE[stale]
    return files


def _type_name(name: str | None) -> str | None:
    return type_name(name)


# Task-instance states in which a try may still watch its job (or start watching it).
ACTIVE_TI_STATES = frozenset(
    {
        None,
        "scheduled",
        "queued",
        "running",
        "restarting",
        "deferred",
        "up_for_retry",  # after a worker crash the next try reattaches to the job
        "up_for_reschedule",
        "awaiting_input",
    }
)
_UNSHIPPED = (Phase.RECORDED.value, Phase.CREATED.value)  # the job never got its payload


def _stage(progress: dict[str, Any]) -> Stage | None:
    """What the watcher last told of a live job (``progress.json``); None before it told anything,
    or for a word this version does not know."""
    try:
        return Stage(progress["state"])
    except (KeyError, ValueError):
        return None


def _cancellation(entry: HistoryEntry, files: dict[str, Any]) -> Cancellation | None:
    """Who stopped the job, why and the cause: from the record's history (newer workers), else
    from ``status/cancelled.json``."""
    return entry.cancelled or Cancellation.from_dict(files.get("cancelled"))


UNREADABLE = "unreadable"  # the ending of a job whose files are not as kinetic-airflow writes them
REUSED = "reused"  # the ending of a try that reused an earlier job's result (cache=True)


def _reused(entry: HistoryEntry) -> dict[str, Any] | None:
    """The earlier job a try reused (``result_cache``), from the record's history; None otherwise."""
    reused = entry.extra.get("reused")
    return reused if isinstance(reused, dict) and entry.phase == Phase.REUSED.value else None


def _unreadable(entry: HistoryEntry, files: dict[str, Any]) -> str | None:
    """Why the job's progress or summary cannot be read, when its record does not tell how it
    ended either (a forged or damaged file: the row says so, the rest of the page is drawn)."""
    if entry.outcome or entry.usage is not None:
        return None
    for name in ("summary", "progress"):
        why = (files.get(name) or {}).get("unreadable")
        if why:
            return f"{UNREADABLE}: its {name} file cannot be read: {why}"
    return None


def _status(entry: HistoryEntry, files: dict[str, Any], watched: bool) -> JobStatus:
    """The job's status in the one vocabulary (``job.states.status_of``), from what the view
    knows: the result summary, the cancellation, the outcome its watcher saw, whether a try
    still watches it, and (for a live job) the watcher's last stage instead of its backend."""
    if _unreadable(entry, files):
        return JobStatus.UNKNOWN
    summary = user_summary(files.get("summary")) or {}
    progress = files.get("progress") or {}
    ok = summary.get("ok")
    return status_of(
        ok=ok if isinstance(ok, bool) else None,
        cancelled=_cancellation(entry, files) or entry.phase == Phase.CANCELLED.value,
        outcome=entry.outcome or progress.get("outcome"),
        watched=watched,
        started=bool(files.get("started") or progress.get("running_since")),
        shipped=entry.phase not in _UNSHIPPED,
        stage=_stage(progress) or Stage.PENDING,
    )


def _cancel_words(cancel: Cancellation) -> tuple[str, str]:
    """(words, ending) of a job stopped on purpose or by its failing worker, from its cause."""
    if cancel.cause is Cause.STOPPED:
        return f"cancelled by {cancel.by}: {cancel.reason}", "cancelled"
    if cancel.cause is Cause.PACKAGING_FAILED:
        return f"failed while packaging: {cancel.reason}", "failed_while_packaging"
    return f"failed before its job started: {cancel.reason}", "failed_before_start"


def _ending(
    entry: HistoryEntry, files: dict[str, Any], status: JobStatus, watched: bool, ti_state: str | None
) -> tuple[str, str]:
    """(what it is doing or how it ended, ending) of one job, for people.

    ``ending`` is "" while the job is live, else one of succeeded, failed, preempted, cancelled,
    failed_while_packaging, failed_before_start, reused (no job ran: the try returned an earlier
    job's result, ``cache=True``) and orphaned (a job whose task ended, or moved on
    to another job, without its outcome: nobody watches it). Every branch reads a field (the
    result summary, the cancellation's cause, the record's phase and outcome), never prose; or
    unreadable (its files are not as kinetic-airflow writes them, and its record tells no outcome).
    """
    reused = _reused(entry)
    if reused is not None:  # no job ran: the try returned an earlier job's result (cache=True)
        return reuse_words(reused), REUSED
    unreadable = _unreadable(entry, files)
    if unreadable:
        return unreadable, UNREADABLE
    summary = user_summary(files.get("summary")) or {}
    progress = files.get("progress") or {}
    outcome = entry.outcome or progress.get("outcome")
    if outcome == EVENT_PREEMPTED:
        return progress.get("text") or "preempted", "preempted"
    if outcome == "withdrawn":  # a capacity ladder's rung that did not start in its time
        return f"withdrawn: {progress.get('text') or 'it did not start in its time'}", "withdrawn"
    delivered = entry.usage is not None or entry.phase == Phase.DELIVERED.value
    ended = f"its task instance is {ti_state or 'gone'}"
    if summary.get("ok") is not None:  # the job's own ending beats any later cancel
        if summary["ok"] is True:
            doing = f"returned {_type_name(summary.get('value_type')) or 'a value'}"
        else:
            doing = f"{_type_name(summary.get('error_type'))}: {summary.get('error_message')}"
        if delivered or watched:
            return doing, status.value
        return f"{doing}, but {ended} and never received it", "orphaned"
    cancel = _cancellation(entry, files)
    if cancel is not None:
        return _cancel_words(cancel)
    if entry.phase == Phase.CANCELLED.value:
        return "cancelled (no record of who stopped it or why)", "cancelled"
    if delivered and outcome:
        return progress.get("text") or outcome, status.value
    if watched:
        return progress.get("text") or outcome or "submitted; not observed yet", ""
    # Nobody watches it: its task instance ended (or runs another job) without its outcome.
    if entry.phase in _UNSHIPPED:
        return f"failed before its job started: {ended}, and the job never got its payload", (
            "failed_before_start"
        )
    stop = f"stop it: kinetic-airflow jobs cancel {entry.job_id}"
    if files.get("started") or progress.get("running_since"):
        return f"{ended} without its outcome; the job started and may still run ({stop})", "orphaned"
    why = f"{ended}, and its job had not started; nobody watches it, and it may still start ({stop})"
    return why, "orphaned"


def device_of(backend: str | None, accelerator: str) -> str:
    """Where the job really ran: the local backend runs any accelerator string on this
    machine's CPU (a ``tpu-v6e-8t`` sweep on a laptop holds no TPU chip)."""
    return "local CPU" if backend == "local" else accelerator


@dataclass(frozen=True)
class JobView:
    """One job a task instance ran, as the view shows it (``to_dict``: its JSON in the REST API).

    ``state`` is the job's status in the one vocabulary (``job.states.JobStatus``, as the jobs
    CLI says it); ``stage`` what a live job is doing (``job.states.Stage``, "" once it ended or
    before its watcher said); ``ending`` how it ended, finer than its state (see ``_ending``).
    """

    job_id: str
    job_uri: str | None
    backend: str | None
    accelerator: str
    device: str
    try_number: int | None
    attempt: int | None
    state: str
    stage: str
    doing: str
    ending: str
    node: str
    submitted_at: float | None
    started_at: float | None
    finished_at: float | None
    duration_seconds: float | None
    queue_seconds: float | None
    chips: int | None
    spot: bool | None
    chip_hours: float | None
    result: dict[str, Any] | None
    history: list[dict[str, Any]]
    # a capacity ladder's rung (1-based), how many rungs, and the capacity it asked for; None without one
    rung: int | None = None
    rungs: int | None = None
    capacity: str | None = None
    # cache=True: the job whose result this try reused, its run and task, what it saved
    reused: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _usage_from_files(entry: HistoryEntry, files: dict[str, Any]) -> dict[str, Any]:
    """An ended attempt no worker counted (its task was marked failed or cleared while deferred:
    the trigger stopped the job): from the runner's start to who stopped it, as its files say."""
    progress = files.get("progress") or {}
    started = (files.get("started") or {}).get("time")
    started = started if _is_time(started) else progress.get("running_since")
    cancel = _cancellation(entry, files)
    ended = cancel.time if cancel is not None else None
    ended = ended if _is_time(ended) else (progress.get("time") if progress.get("outcome") else None)
    return ended_usage(entry.backend, entry.accelerator, started, ended)


def _job_view(
    entry: HistoryEntry, files: dict[str, Any], watched: bool = True, ti_state: str | None = None
) -> JobView:
    status = _status(entry, files, watched)
    doing, ending = _ending(entry, files, status, watched, ti_state)
    usage = entry.usage or (_usage_from_files(entry, files) if ending and ending != UNREADABLE else {})
    accelerator = entry.accelerator or "cpu"
    local = entry.backend == "local"
    progress = files.get("progress") or {}
    stage = _stage(progress)
    summary = user_summary(files.get("summary")) or {}
    timings = summary.get("timings") or {}
    return JobView(
        job_id=entry.job_id,
        job_uri=entry.job_uri,
        backend=entry.backend,
        accelerator=accelerator,
        device=device_of(entry.backend, accelerator),
        try_number=entry.try_number,
        attempt=entry.attempt,
        state=status.value,
        stage=stage.value if stage is not None and status.live else "",
        doing=doing,
        ending=ending,
        node=progress.get("node") or "",
        submitted_at=entry.submitted_at,
        started_at=usage.get("started_at") or progress.get("running_since"),
        finished_at=usage.get("finished_at"),
        duration_seconds=usage.get("run_seconds", timings.get("total")),
        queue_seconds=usage.get("queue_seconds"),
        # a local run holds no accelerator, whatever string it was given (records written
        # before usage knew that say otherwise): no chips, no chip-hours; its wall time stays
        chips=0 if local else usage.get("chips"),
        spot=False if local else usage.get("spot"),
        chip_hours=(0.0 if usage else None) if local else usage.get("chip_hours"),
        result={
            "ok": summary.get("ok"),
            "value_type": _type_name(summary.get("value_type")),
            "value_repr": (summary.get("value_repr") or "")[:500],
            "error_type": _type_name(summary.get("error_type")),
            "error_message": (summary.get("error_message") or "")[:2000],
            "phase": summary.get("phase"),
            # the user's frames, as the task log shows them before the task's error
            "traceback": clean_remote_traceback(summary["traceback"]) if summary.get("traceback") else "",
        }
        if summary
        else None,
        history=progress.get("history") or [],
        **_rung_of(entry, usage),
        reused=_reused(entry),
    )


def _rung_of(entry: HistoryEntry, usage: dict[str, Any]) -> dict[str, Any]:
    """A capacity ladder's rung of an attempt (``kinetic_airflow.ladder``): from its history entry,
    the capacity from its usage; nothing for a job of a task without a ladder."""
    rung = entry.extra.get("rung")
    if not isinstance(rung, dict) or not isinstance(rung.get("rung"), int):
        return {}
    return {
        "rung": rung["rung"],
        "rungs": rung.get("of") if isinstance(rung.get("of"), int) else None,
        "capacity": usage.get("capacity") if isinstance(usage.get("capacity"), str) else None,
    }


def _records(
    session: Any,
    *,
    dag_ids: Iterable[str] | None,
    dag_id: str | None = None,
    run_id: str | None = None,
    task_id: str | None = None,
    map_index: int | None = None,
    limit: int = 500,
) -> list[tuple[Any, Any]]:
    # Airflow start-up cost: its models load when used, not when the plugin is registered.
    from airflow.models.dagrun import DagRun
    from airflow.models.task_state_store import TaskStateStoreModel as Store
    from airflow.models.taskinstance import TaskInstance as TI
    from sqlalchemy import and_, select

    query = (
        select(Store, TI, DagRun.logical_date, DagRun.run_after)
        .join(
            TI,
            and_(
                TI.dag_id == Store.dag_id,
                TI.run_id == Store.run_id,
                TI.task_id == Store.task_id,
                TI.map_index == Store.map_index,
            ),
        )
        .join(DagRun, DagRun.id == Store.dag_run_id)
        .where(Store.key == STATE_KEY)
    )
    if dag_ids is not None:
        query = query.where(Store.dag_id.in_(list(dag_ids)))
    for column, value in ((Store.dag_id, dag_id), (Store.run_id, run_id), (Store.task_id, task_id)):
        if value is not None:
            query = query.where(column == value)
    if map_index is not None:
        query = query.where(Store.map_index == map_index)
    query = query.order_by(DagRun.run_after.desc(), Store.task_id, Store.map_index).limit(limit)
    return list(session.execute(query).all())


def _record_of(store: Any) -> JobRecord | None:
    try:
        return decode_record(store.value)  # the record's one decoder (a bad job reference too)
    except ValueError as exc:  # one damaged record must not blank the page
        log.warning("kinetic view: %s/%s/%s: %s", store.dag_id, store.run_id, store.task_id, exc)
        return None


def _ti_state(ti: Any) -> str | None:
    state = getattr(ti.state, "value", ti.state)
    return str(state) if state is not None else None


def _ti_fields(ti: Any, logical_date: Any, run_after: Any) -> dict[str, Any]:
    def iso(value: Any) -> str | None:
        return value.isoformat() if value is not None else None

    return {
        "dag_id": ti.dag_id,
        "run_id": ti.run_id,
        "task_id": ti.task_id,
        "map_index": ti.map_index,
        "label": ti.rendered_map_index or (f"[{ti.map_index}]" if ti.map_index >= 0 else ""),
        "ti_state": _ti_state(ti),
        "try_number": ti.try_number,
        "ti_start": iso(ti.start_date),
        "ti_end": iso(ti.end_date),
        "run_after": iso(run_after),
        "logical_date": iso(logical_date),
    }


@dataclass(frozen=True)
class TaskRow:
    """One task instance with a kinetic job, as the view lists it: the task instance, its
    current job (state, stage, doing, ending as in ``JobView``) and its attempts' sums;
    ``jobs`` (every job it ran), ``gcp_conn_id`` and ``history`` only for the task-instance tab."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    label: str
    ti_state: str | None
    try_number: int | None
    ti_start: str | None
    ti_end: str | None
    run_after: str | None
    logical_date: str | None
    job_id: str
    backend: str | None
    accelerator: str
    device: str
    state: str
    stage: str
    doing: str
    ending: str
    node: str
    attempts: int
    preemptions: int
    started_at: float | None
    duration_seconds: float | None
    chip_hours: float
    run_seconds: float  # job time: the jobs' run times added up
    # the span its jobs ran in: a DAG run's wall time spans its task instances' (run_costs)
    first_started_at: float | None
    ended_at: float | None
    queue_seconds: float | None
    spot: bool | None
    result: dict[str, Any] | None
    output_dir: str
    jobs: list[JobView] | None = None  # every job: the task-instance tab
    gcp_conn_id: str | None = None  # a connection id: where its metrics are read (tab only)
    history: list[dict[str, Any]] | None = None  # the current job's progress (tab only)

    def to_dict(self) -> dict[str, Any]:
        """The JSON the REST API serves: the tab's fields only when ``jobs`` is there."""
        out = dataclasses.asdict(self)
        if self.jobs is None:
            for key in ("jobs", "gcp_conn_id", "history"):
                del out[key]
        return out


def task_rows(session: Any, *, all_jobs: bool = False, **filters: Any) -> list[dict[str, Any]]:
    """``rows_of`` in their JSON form (what ``/kinetic/api`` serves)."""
    return [row.to_dict() for row in rows_of(session, all_jobs=all_jobs, **filters)]


def rows_of(session: Any, *, all_jobs: bool = False, **filters: Any) -> list[TaskRow]:
    """One row per task instance with a kinetic job: its current job, its attempts' sums, and
    (``all_jobs``) every job it ran."""
    decoded = [
        (ti, logical_date, run_after, record.job, recorded_jobs(record))
        for store, ti, logical_date, run_after in _records(session, **filters)
        if (record := _record_of(store)) is not None
    ]

    def watched(ti: Any, entries: list[HistoryEntry], index: int) -> bool:
        """Whether a try may still watch this job: the task instance's current job, while the
        task instance has not ended (an earlier job, or any job of an ended one, has no watcher)."""
        return index == len(entries) - 1 and _ti_state(ti) in ACTIVE_TI_STATES

    futures = {  # every job's files at once: a page of jobs costs one round trip, not one a job
        job.job_id: _READERS.submit(_job_files, job, ref.gcp_conn_id, watched(ti, entries, i))
        for ti, _ld, _ra, ref, entries in decoded
        for i, job in enumerate(entries)
    }
    out = []
    for ti, logical_date, run_after, ref, entries in decoded:
        jobs = [
            _job_view(e, futures[e.job_id].result(), watched(ti, entries, i), _ti_state(ti))
            for i, e in enumerate(entries)
        ]
        current = jobs[-1]
        out.append(
            TaskRow(
                **_ti_fields(ti, logical_date, run_after),
                job_id=current.job_id,
                backend=current.backend,
                accelerator=current.accelerator,
                device=current.device,
                state=current.state,
                stage=current.stage,
                doing=current.doing,
                ending=current.ending,
                node=current.node,
                attempts=len(jobs),
                preemptions=sum(1 for j in jobs if j.ending == EVENT_PREEMPTED),
                started_at=current.started_at,
                duration_seconds=current.duration_seconds,
                chip_hours=round(sum(j.chip_hours or 0 for j in jobs), 6),
                run_seconds=round(sum(j.duration_seconds or 0 for j in jobs), 3),
                first_started_at=min((j.started_at for j in jobs if j.started_at), default=None),
                ended_at=_ended_at(jobs),
                queue_seconds=current.queue_seconds,
                spot=current.spot,
                result=current.result if all_jobs else _brief(current.result),
                # every try and attempt shares KINETIC_OUTPUT_DIR (unless set by hand)
                output_dir=output_dir_uri(ref.base_uri or "", ref.job_identity),
                jobs=jobs if all_jobs else None,
                gcp_conn_id=ref.gcp_conn_id if all_jobs else None,
                history=current.history if all_jobs else None,
            )
        )
    return out


def _ended_at(jobs: list[JobView]) -> float | None:
    """When the last of a task instance's jobs ended; None while its current job is live."""
    if not jobs[-1].ending:
        return None
    return max(j.finished_at or 0 for j in jobs) or None


def _brief(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """A result for the jobs list: the traceback is for the task-instance tab only."""
    return {k: v for k, v in result.items() if k != "traceback"} if result else result


def run_costs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chip-hours, job time, wall time and states per DAG run (what did last night's sweep cost),
    over the rows given: the rows the page shows, so every filter applies to both tables. Job
    time sums the jobs' run times; wall time runs from the first job's start to the last one's
    end (now, while one runs): ten jobs of an hour side by side are ten hours of job time and
    one of wall time."""
    now = time.time()
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        run = runs.setdefault(
            (row["dag_id"], row["run_id"]),
            {
                "dag_id": row["dag_id"],
                "run_id": row["run_id"],
                "run_after": row["run_after"],
                "tasks": 0,
                "chip_hours": 0.0,
                "run_seconds": 0.0,  # job time: the jobs' run times summed, on an accelerator or not
                "wall_seconds": None,  # from the first job's start to the last one's end (or now)
                "_span": [None, 0.0],
                "preemptions": 0,
                "states": {},
            },
        )
        run["tasks"] += 1
        run["chip_hours"] = round(run["chip_hours"] + (row["chip_hours"] or 0), 6)
        run["run_seconds"] = round(run["run_seconds"] + (row["run_seconds"] or 0), 3)
        run["preemptions"] += row["preemptions"]
        run["states"][row["state"]] = run["states"].get(row["state"], 0) + 1
        start = row.get("first_started_at")
        if start:
            span = run["_span"]
            span[0] = start if span[0] is None else min(span[0], start)
            span[1] = max(span[1], row.get("ended_at") or now)
            run["wall_seconds"] = round(max(0.0, span[1] - span[0]), 3)
    return [{k: v for k, v in run.items() if k != "_span"} for run in runs.values()]


def job_details(
    session: Any, dag_id: str, run_id: str, task_id: str, map_index: int
) -> dict[str, Any] | None:
    """One task instance with every job it ran (the task-instance tab, its metrics)."""
    rows = task_rows(
        session,
        all_jobs=True,
        dag_ids=None,
        dag_id=dag_id,
        run_id=run_id,
        task_id=task_id,
        map_index=map_index,
    )
    return rows[0] if rows else None
