"""Observe one job until it ends and describe how it ended, as one event (``JobEvent``).

Shared by the deferrable trigger and the in-worker wait (``deferrable=False``) so
both report the same outcome the same way. It only observes; the exceptions are
the deadline (``execution_timeout``), where it stops the job it was told to
watch, because Airflow does not enforce that timeout while a task is deferred,
and a storage outage longer than ``[kinetic] storage_retry_seconds``.

Storage may fail for a while (a bucket's 503s, a network blip, a file system
briefly read-only) without the job noticing; a task must not fail because its
watcher did. Reads the outcome depends on (result summary, heartbeat, cancelled
marker) are retried with back-off up to that bound; writes that only save work
(the log cursor, the progress record) are best-effort. An outage that outlasts
the bound stops the job — nobody could see how it ends — and fails the task
with the storage URI and the operation that failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kinetic_airflow.backends.base import QUEUE_LOOK_SECONDS, Backend, BackendStatus, JobRef, JobState
from kinetic_airflow.config import DEFAULTS, local_state_root
from kinetic_airflow.job.layout import JobLayout
from kinetic_airflow.job.multihost import host_label
from kinetic_airflow.job.ref import JobRefError
from kinetic_airflow.job.states import EVENT_FAILED, EVENT_PREEMPTED, EVENT_SUCCESS, EVENT_TIMEOUT, Stage
from kinetic_airflow.job.storage import Storage, StorageError, UnreadableObject, is_storage_error, parse_json
from kinetic_airflow.job.tracebacks import StreamedTracebackFilter, type_name, user_names
from kinetic_airflow.lifecycle import acancel_job, cancelled_marker
from kinetic_airflow.progress import PROGRESS_NAME, Progress, ProgressTracker
from kinetic_airflow.startup import startup_failure

__all__ = [
    "EVENT_JOB_FIELDS",
    "JobEvent",
    "JobEventError",
    "JobWatcher",
    "StorageOutage",
    "describe_failure",
    "event_job",
    "final_progress",
]

log = logging.getLogger(__name__)

_NOT_FOUND_GRACE_SECONDS = 60.0
# The longest a watcher sleeps on a backend that notifies: a net under lost notifications
# (one wake per five minutes costs nothing), not what makes it see changes.
_QUIET_LOOK_SECONDS = 300.0
_SHARED_CURSOR_SECONDS = 60.0
_DRAIN_SECONDS = 5.0
_FIRST_RETRY_SECONDS = 0.5  # storage retries back off from here...
_LONGEST_RETRY_SECONDS = 10.0  # ...doubling up to here


class StorageOutage(StorageError):
    """Job storage kept failing for longer than ``[kinetic] storage_retry_seconds``."""


def _progress(offset: Any) -> int:
    """How far a log offset has got, to pick the further of two saved cursors."""
    if isinstance(offset, dict):
        return sum(int(v) for v in offset.values())
    return int(offset or 0)


def _host_of(line: str) -> str:
    """The host a multi-host log line came from ("3" for "[h3] ..."), "" for a one-host job."""
    if line.startswith("[h"):
        end = line.find("] ", 2)
        if end > 2 and line[2:end].isdigit():
            return line[2:end]
    return ""


# What an event says of its job: the triggerer logs every event whole, so it names the job
# and where its files are, and leaves out the rest of the reference (local paths, the
# cluster's endpoint and CA, env, overrides); ``execute_complete`` has the full reference
# in the job record.
EVENT_JOB_FIELDS = (
    "job_id",
    "backend",
    "job_uri",
    "base_uri",
    "identity",
    "accelerator",
    "hosts",
    "submitted_at",
    "rung",  # a capacity ladder's rung: the driver moves on from it (kinetic_airflow.ladder)
)


def event_job(job: JobRef) -> dict[str, Any]:
    """The brief reference an event carries (its JSON form; ``JobRef.from_dict`` reads it back)."""
    return {k: v for k, v in job.to_dict().items() if k in EVENT_JOB_FIELDS}


_EVENT_KEYS = (
    "status",
    "job",
    "summary",
    "cause",
    "host",
    "other_failed_hosts",
    "where",
    "exit_code",
    "message",
    "hint",
)


class JobEventError(ValueError):
    """An event that names no job or no ending (not written by a kinetic watcher)."""


@dataclass(frozen=True)
class JobEvent:
    """How a watcher's wait for a job ended: the trigger's one event, and the in-worker wait's.

    ``status`` is one of ``job.states.EVENT_STATUSES``; ``cause`` names the failure for programs
    (``user_error``, ``exit``, ``cancelled``, ``timeout``, ...), ``message`` and ``hint`` say it
    for people. ``job`` is the brief reference (``EVENT_JOB_FIELDS``), ``summary`` the brief
    result summary (``_EVENT_SUMMARY_FIELDS``): the triggerer logs every event whole and the
    metadata DB keeps it, so it holds no log line, traceback or secret. ``to_dict`` is the JSON
    form Airflow carries (the watcher's ``wait`` returns it); ``from_dict`` is its one decoder
    (``execute_complete``); keys of a newer version are kept (``extra``).
    """

    status: str
    job: JobRef
    summary: dict[str, Any] | None = None
    cause: str | None = None
    host: int | None = None
    other_failed_hosts: list[int] | None = None
    where: str | None = None
    exit_code: int | None = None
    message: str | None = None
    hint: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def host_index(self) -> int:
        """The host whose result is reported (0 for a one-host job)."""
        return int(self.host or 0)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "job": event_job(self.job)}
        for key in _EVENT_KEYS[2:]:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out

    @classmethod
    def from_dict(cls, value: Any) -> JobEvent:
        """The event Airflow handed back; ``JobEventError`` saying what is missing otherwise."""
        if not isinstance(value, Mapping) or not isinstance(value.get("job"), Mapping):
            raise JobEventError(f"the trigger returned no usable event: {value!r}")
        status = value.get("status")
        if not isinstance(status, str):
            raise JobEventError(f"the trigger's event has no status: {value!r}")
        try:
            job = JobRef.from_dict(value["job"])
        except JobRefError as exc:
            raise JobEventError(f"the trigger's event names no job it can read: {exc}") from None
        summary = value.get("summary")
        host = value.get("host")
        exit_code = value.get("exit_code")
        others = value.get("other_failed_hosts")
        others = [h for h in others if isinstance(h, int)] if isinstance(others, list) else None
        return cls(
            status=status,
            job=job,
            summary=dict(summary) if isinstance(summary, Mapping) else None,
            cause=_text_or_none(value.get("cause")),
            host=int(host) if isinstance(host, int) and not isinstance(host, bool) else None,
            other_failed_hosts=others,
            where=_text_or_none(value.get("where")),
            exit_code=exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None,
            message=_text_or_none(value.get("message")),
            hint=_text_or_none(value.get("hint")),
            extra={k: v for k, v in value.items() if k not in _EVENT_KEYS},
        )


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def final_progress(event: JobEvent) -> Progress:
    """The last progress line of a job, from the event that ends its wait."""
    status = event.status
    if status == EVENT_SUCCESS:
        return Progress(Stage.FINISHED, "finished: succeeded", outcome=status)
    if status == EVENT_PREEMPTED:
        text = f"preempted: {event.message}; a new attempt follows"
        return Progress(Stage.PREEMPTED, text, outcome=status)
    cause = event.cause or status
    if event.summary is not None:  # the task's error shows the job's own exception, once
        return Progress(
            Stage.FINISHED, f"finished: {status} ({cause}; the task's error says why)", outcome=status
        )
    return Progress(Stage.FINISHED, f"finished: {status} ({cause}: {event.message})", outcome=status)


def describe_failure(event: JobEvent, full_log: str = "") -> str:
    """The task's error text: cause, job, hint, and where its log is.

    The job's last log lines are not repeated here: the watcher streamed them into this same
    task log just above the error (the triggerer's part is merged into the task's log view).
    """
    job = event.job
    lines = [f"kinetic job {job.job_id} ({job.backend}) failed: {event.message}"]
    if event.hint:
        lines.append(f"Hint: {event.hint}")
    where = f"; the whole log: {full_log}" if full_log else ""
    lines.append(f"The job's last log lines are just above in this task log{where}.")
    lines.append(f"Job files: {job.job_uri}")
    return "\n".join(lines)


# What an event says of a result summary: whether there is one and what kind of failure it
# records. Its message, traceback and value's repr stay in storage (``result.json``), where
# ``execute_complete`` reads them: the triggerer logs every event whole.
_EVENT_SUMMARY_FIELDS = ("ok", "phase", "error_type", "host", "attempt")
_EVENT_MESSAGE_CHARS = 300


def _short(text: str) -> str:
    """The first line of a message, at most ``_EVENT_MESSAGE_CHARS`` long."""
    first = text.splitlines()[0] if text else ""
    cut = len(first) > _EVENT_MESSAGE_CHARS or first != text.rstrip("\n")
    return (first[: _EVENT_MESSAGE_CHARS - 1] + "…") if cut else first


# A suspended Job Kueue will not run (or not run this attempt again): deleted when the task ends.
_KUEUE_ENDED = ("ProvisioningFailed", "LocalQueueMissing")


def _classify_exit(status: BackendStatus) -> tuple[str, str, str]:
    """(cause, message, hint) for a process that ended without writing a result."""
    sig = status.details.get("signal") if status.details else None
    if status.reason == "Cancelled":
        return "cancelled", "the job was cancelled", ""
    if status.reason == "ImagePullFailed":
        return (
            "image_pull",
            status.message,
            "Check the image name and tag (container_image= or [kinetic] container_image) and that the "
            "cluster's node service account may pull from the registry.",
        )
    if status.reason == "Preempted":
        return (
            "preempted",
            status.message,
            "Kueue gave the job's quota to another workload; the next attempt waits in the queue again."
            if status.details.get("evicted_by") == "kueue"
            else "The node was reclaimed (Spot preemption, maintenance or node loss).",
        )
    if status.reason == "ProvisioningFailed":
        return (
            "provisioning_failed",
            status.message,
            "GKE could not provide the nodes for this queued-provisioning request (no capacity in the "
            "zone, or a quota): retry later, use another zone or capacity=, or check "
            "`kubectl describe provisioningrequest -n <namespace>`.",
        )
    if status.reason == "KueueDeactivated":
        return (
            "kueue_deactivated",
            status.message,
            "Kueue deactivated the job's Workload and will not admit it again: see "
            "`kubectl describe workload -n <namespace>`.",
        )
    if status.reason == "Killed":  # a local job's SIGKILL while the OOM killer did not run
        return (
            "killed",
            "the job process was killed (SIGKILL) before it wrote a result",
            "The kernel's out-of-memory killer did not run while the job ran, so something outside "
            "the job killed it (kill -9, a process manager, the machine shutting down).",
        )
    if status.reason == "OOMKilled" or sig == 9 or status.exit_code == 137:
        return (
            "oom_killed" if status.reason == "OOMKilled" else "killed",
            f"the job process was killed ({status.reason or 'SIGKILL'}) before it wrote a result"
            + (f": {status.message}" if status.message else ""),
            "This is usually running out of memory: use a larger accelerator/machine or reduce the "
            "batch size.",
        )
    if sig == 15:
        return (
            "terminated",
            "the job process was terminated (SIGTERM) before it wrote a result",
            "Something stopped the job from outside (preemption, node shutdown or a cancel).",
        )
    if status.reason == "LocalQueueMissing":  # the message names the queue and those that exist
        return "local_queue_missing", status.message, ""
    if status.reason == "Lost":
        return "lost", status.message, "The machine or node running the job went away."
    if status.reason == "Forbidden":
        return (
            "forbidden",
            status.message,
            "Bind the identity Airflow uses (its Kubernetes connection or GCP service account) to the "
            "Role kinetic-airflow doctor --print-rbac prints, in the job's namespace: it grants every "
            "verb kinetic uses.",
        )
    return (
        "exit",
        f"{status.message or 'the job process failed'} without writing a result envelope",
        "The process died outside the function (a crash in a native library, os._exit, or the "
        "runner could not start): check the log lines below.",
    )


def _local_cursor_path(job: JobRef) -> Path:
    where = hashlib.sha256(job.job_uri.encode()).hexdigest()[:12]  # one job id, two storages
    return Path(local_state_root()) / "log-cursors" / f"{job.job_id}-{where}.json"


def _read_local(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _remove_local(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _write_local(path: Path, text: str) -> None:
    """Atomic small write; a cursor that cannot be kept locally only costs repeats, never the job."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        pass


class JobWatcher:
    def __init__(
        self,
        job: JobRef,
        storage: Storage,
        backend: Backend,
        *,
        poll_interval: float = 2.0,
        deadline: float | None = None,
        log_max_lines: int = 10000,
        emit_log: Callable[[str], None] | None = None,
        emit_progress: Callable[[str], None] | None = None,
        storage_retry_seconds: float | None = None,
    ) -> None:
        """``emit_log`` gets the job's own log lines; ``emit_progress`` (default: the same) the
        watcher's one line per state change (``kinetic_airflow.progress``);
        ``storage_retry_seconds`` bounds how long failing storage reads are retried."""
        self.job = job
        self.storage_retry_seconds = float(
            storage_retry_seconds if storage_retry_seconds is not None else DEFAULTS["storage_retry_seconds"]
        )
        self.cursor_write_failing = False
        self.startup_timeout = job.startup_timeout
        self.started = False  # seen running: startup_timeout no longer applies
        self.heartbeat_timeout = job.heartbeat_timeout
        self.submitted_at = float(job.submitted_at or time.time())
        self.last_heartbeat_check = 0.0
        self.last_output = time.monotonic()  # a live log vouches for a live process
        self.not_found_since: float | None = None
        self.layout = JobLayout(job.job_uri)
        self.storage = storage
        self.backend = backend
        self.poll_interval = poll_interval
        self.deadline = deadline
        self.log_max_lines = log_max_lines
        self.emit_log = emit_log or (lambda line: None)
        # Where the log was read up to: an int (bytes or lines) or, for a multi-host job, lines
        # per host ({"0": n, "3": m}); the backend defines it, the watcher only keeps it.
        self.log_offset: Any = 0
        self.saved_offset: Any = 0
        self.shared_offset: Any = 0
        self.shared_saved_at = time.monotonic()
        self._local_cursor = _local_cursor_path(job)
        # Lines shown so far and the end of a capped log held back, per host ("" for one host):
        # the cap is per host, so one chatty host cannot hide the others.
        self.lines_emitted: dict[str, int] = {}
        self.traceback_filter = StreamedTracebackFilter()
        self.held: dict[str, deque[str]] = {}
        self.hosts = int(job.hosts or 1)
        slices = int((job.k8s.slices if job.k8s is not None else None) or 1)
        self.hosts_per_slice = self.hosts // slices if slices > 1 else None  # multislice: names the slice
        self.emit_progress = emit_progress or self.emit_log
        self.progress = ProgressTracker(job, self.emit_progress, self._write_progress)
        self.stale_told = False
        self.output_end_looked = False  # the summary was read once the job's output closed

    async def _write_progress(self, text: str) -> None:
        await self.storage.awrite_text(self.layout.status(PROGRESS_NAME), text)

    async def _load_progress(self) -> None:
        """Continue the progress record of an earlier watcher (worker, then triggerer) without
        repeating the line it already wrote."""
        try:
            text = await self.storage.aread_text_or_none(self.layout.status(PROGRESS_NAME))
        except Exception as exc:
            if not (is_storage_error(exc) or isinstance(exc, UnreadableObject)):
                raise
            log.warning("could not read the progress record of job %s: %s", self.job.job_id, exc)
            return  # only costs the first progress line being said again
        with contextlib.suppress(ValueError, TypeError):  # parse_json: bounded, never RecursionError
            record = parse_json(text, self.layout.status(PROGRESS_NAME)) if text else None
            if isinstance(record, dict):
                self.progress.resume(record)

    @property
    def _cursor_uri(self) -> str:  # the shared copy
        return self.layout.status("log-cursor")

    async def _load_cursor(self) -> None:
        """Resume after the lines an earlier watcher (before a triggerer restart) already showed.

        Two copies: one on this machine's disk, written after every batch of lines (free), and
        one in job storage, written at most every ``_SHARED_CURSOR_SECONDS`` and at the end (so
        it costs at most one storage request a minute). A triggerer restarted on this machine
        resumes exactly; one that took the trigger over elsewhere may show again at most the
        last minute's lines.
        """
        try:
            shared = await self.storage.aread_text_or_none(self._cursor_uri)
        except Exception as exc:  # a lost cursor only means some lines are shown again
            if not (is_storage_error(exc) or isinstance(exc, UnreadableObject)):
                raise
            log.warning("could not read the log cursor %s: %s", self._cursor_uri, exc)
            shared = None
        # Local files in a worker thread too: on a busy disk even a rename can stall the loop.
        found = [shared, await asyncio.to_thread(_read_local, self._local_cursor)]
        for text in found:
            if text:
                try:  # a cursor someone else wrote is ignored: some lines are shown again
                    cursor = parse_json(text, self._cursor_uri)
                    if _progress(cursor.get("offset", 0)) > _progress(self.log_offset):
                        lines = cursor.get("lines", 0)
                        self.lines_emitted = dict(lines) if isinstance(lines, dict) else {"": int(lines)}
                        self.log_offset = cursor.get("offset", 0)
                except (ValueError, TypeError, AttributeError) as exc:
                    log.warning("ignoring the log cursor of job %s: %s", self.job.job_id, exc)
        self.saved_offset = self.shared_offset = self.log_offset

    async def _save_cursor(self, *, final: bool = False) -> None:
        text = json.dumps({"offset": self.log_offset, "lines": self.lines_emitted})
        if self.log_offset != self.saved_offset:
            await asyncio.to_thread(_write_local, self._local_cursor, text)
            self.saved_offset = self.log_offset
        shared_due = (
            self.layout.job_uri.startswith("file://")  # the shared copy is a local file: free
            or final
            or time.monotonic() - self.shared_saved_at >= _SHARED_CURSOR_SECONDS
        )
        if shared_due and self.log_offset != self.shared_offset:
            await self._write_cursor(text)
        if final:  # the shared copy is current: the local one has done its job
            await asyncio.to_thread(_remove_local, self._local_cursor)

    async def _write_cursor(self, text: str) -> None:
        """Best-effort: a cursor that cannot be saved only means that a watcher started after a
        triggerer restart may show some lines again. The next batch of lines tries again."""
        try:
            await self.storage.awrite_text(self._cursor_uri, text)
        except Exception as exc:
            if not is_storage_error(exc):
                raise
            if not self.cursor_write_failing:
                log.warning(
                    "could not save the log cursor %s (%s); going on without it (after a restart "
                    "some log lines may be shown again) and trying again with the next lines",
                    self._cursor_uri,
                    exc,
                )
            self.cursor_write_failing = True
            return
        if self.cursor_write_failing:
            log.info("saved the log cursor %s again", self._cursor_uri)
        self.cursor_write_failing = False
        self.shared_offset = self.log_offset
        self.shared_saved_at = time.monotonic()

    async def _read(self, uri: str, what: str) -> str | None:
        """Read ``uri`` (``what`` says what it is, for messages), or None if it does not exist.

        Storage errors are retried with back-off for up to ``storage_retry_seconds``; then
        ``StorageOutage``, naming the URI and the operation.
        """
        failing_since: float | None = None
        delay = _FIRST_RETRY_SECONDS
        while True:
            try:
                text = await self.storage.aread_text_or_none(uri)
            except Exception as exc:
                if not is_storage_error(exc):
                    raise
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                    log.warning(
                        "could not read the %s of job %s at %s (%s: %s); retrying for up to %gs "
                        "([kinetic] storage_retry_seconds)",
                        what,
                        self.job.job_id,
                        uri,
                        type(exc).__name__,
                        exc,
                        self.storage_retry_seconds,
                    )
                elapsed = now - failing_since
                if elapsed >= self.storage_retry_seconds:
                    raise StorageOutage(
                        f"the job storage kept failing for {elapsed:.0f}s, longer than [kinetic] "
                        f"storage_retry_seconds={self.storage_retry_seconds:g}: could not read the {what} "
                        f"at {uri} ({type(exc).__name__}: {exc})"
                    ) from exc
                await asyncio.sleep(min(delay, self.storage_retry_seconds - elapsed))
                delay = min(delay * 2, _LONGEST_RETRY_SECONDS)
                continue
            if failing_since is not None:
                log.info("read the %s of job %s again: storage is back", what, self.job.job_id)
            return text

    async def _pump_logs(self) -> None:
        """Show new job log lines, then save the cursor at once (see ``_load_cursor``).

        The local copy is saved after every batch, so a triggerer that dies shows again at most
        the lines of the batch it was printing (none, unless it dies inside that print).
        """
        advanced = False
        while True:
            text, new_offset = await self.backend.aread_log(self.job, self.log_offset)
            if new_offset == self.log_offset:
                break
            self.log_offset = new_offset
            self.last_output = time.monotonic()
            advanced = True
            for line in text.splitlines():
                self._show(line)
        if advanced or self.log_offset != self.shared_offset:
            await self._save_cursor()  # the shared copy may have come due since the last lines

    def _show(self, line: str) -> None:
        """The first half of the cap goes out live, the last half when the job has ended."""
        host = _host_of(line)
        shown = self.traceback_filter(line, host)  # logged once, just before the task's error
        if shown is None:
            return
        line = shown
        count = self.lines_emitted[host] = self.lines_emitted.get(host, 0) + 1
        head = self.log_max_lines - self.log_max_lines // 2
        if count <= head:
            self.emit_log(line)
            return
        if count == head + 1:
            who = f"host {host}'s" if host else "the job's"
            self.emit_log(
                f"[kinetic] {who} log is longer than [kinetic] log_max_lines={self.log_max_lines}: "
                f"the next lines are left out here and its last {self.log_max_lines // 2} lines follow "
                f"when it ends. Full log: {self.backend.full_log_hint(self.job)}"
            )
        self.held.setdefault(host, deque(maxlen=max(1, self.log_max_lines // 2))).append(line)

    def _flush_held(self) -> None:
        """After the job ended: the last lines of a capped log, with how many were left out."""
        head = self.log_max_lines - self.log_max_lines // 2
        for host, held in sorted(self.held.items()):
            skipped = self.lines_emitted.get(host, 0) - head - len(held)
            if skipped > 0:
                self.emit_log(
                    f"[kinetic] ... {skipped} lines{f' of host {host}' if host else ''} left out ..."
                )
            while held:
                self.emit_log(held.popleft())

    async def _drain(self) -> None:
        """Let a finishing process flush its last lines, then read them."""
        end = time.monotonic() + _DRAIN_SECONDS
        while time.monotonic() < end:
            if (await self.backend.astatus(self.job)).state.terminal:
                break
            await asyncio.sleep(0.2)
        end = time.monotonic() + _DRAIN_SECONDS  # a log stream may trail the process's exit
        while not await self.backend.alog_complete(self.job) and time.monotonic() < end:
            await self._pump_logs()
            await asyncio.sleep(0.1)
        await self._show_the_rest()

    async def _show_the_rest(self) -> None:
        """The log's last lines (and a capped log's held end), with the final cursor."""
        await self._pump_logs()
        await self._save_cursor(final=True)
        self._flush_held()

    async def _started_marker(self) -> bool:
        """Whether the runner's started marker is there (one too large to read is there too)."""
        try:
            return bool(await self.storage.aread_text_or_none(self.layout.status("started")))
        except UnreadableObject:
            return True

    async def _heartbeat_age(self, host: int = 0) -> float | None:
        """Seconds since a runner's last heartbeat, or None before it started beating."""
        uri = self.layout.status("heartbeat", host)
        try:
            text = await self._read(uri, "heartbeat")
            if not text:
                return None
            return time.time() - float(parse_json(text, uri).get("time", 0))
        except (ValueError, TypeError, AttributeError) as exc:  # not a heartbeat a runner wrote
            log.warning("ignoring the heartbeat of job %s: %s", self.job.job_id, exc)
            return None

    async def _stalest_heartbeat(self, status: BackendStatus) -> tuple[float | None, int]:
        """(age, host) of the oldest heartbeat among the hosts still running their function."""
        ended = {int(h) for h in status.details.get("ended_hosts") or []}
        stalest: tuple[float | None, int] = (None, 0)
        for host in range(self.hosts):
            if host in ended:
                continue  # its runner finished: it beats no more, and need not
            age = await self._heartbeat_age(host)
            if age is not None and (stalest[0] is None or age > stalest[0]):
                stalest = (age, host)
        return stalest

    async def _summary(self, host: int = 0) -> dict[str, Any] | None:
        """The result summary; one no runner wrote (too large, too deep, not a JSON object) is
        a failure of the job that names the file, not an error of the watcher."""
        uri = self.layout.result_summary(host)
        try:
            text = await self._read(uri, "result summary")
            summary = parse_json(text, uri) if text else None
            if summary is not None and not isinstance(summary, dict):
                raise UnreadableObject(f"{uri} is not a JSON object: kinetic-airflow did not write it")
        except UnreadableObject as exc:
            return {"ok": False, "phase": "verify", "host": host, "error_type": "kinetic.UnreadableResult",
                    "error_message": f"the job's result cannot be read: {exc}"}  # fmt: skip
        return summary

    def _event(self, status: str, **fields: Any) -> JobEvent:
        """The one event; the triggerer logs it whole and the metadata DB keeps it, so it is
        small: no log lines (they were streamed already) and no traceback (in ``result.json``)."""
        return JobEvent(status, self.job, **fields)

    def _result_event(
        self, summary: dict[str, Any], host: int | None = None, others: list[int] | None = None
    ) -> JobEvent:
        """``host``/``others``: on a multi-host job, the failing host reported and the other
        hosts that failed too (the lowest index is the one reported)."""
        brief = {k: summary.get(k) for k in _EVENT_SUMMARY_FIELDS if k in summary}
        if brief.get("error_type"):
            brief["error_type"] = user_names(brief["error_type"])  # a runner of an older image
        if summary.get("ok"):
            return self._event(EVENT_SUCCESS, summary=brief)
        phase = summary.get("phase")
        user = phase == "execute"
        where = ""
        extra: dict[str, Any] = {}
        if host is not None:
            where = f"{host_label(host, self.hosts_per_slice)} of {self.hosts}"
            if others:
                where += f" (also failed: hosts {', '.join(map(str, others))})"
            extra = {"host": host, "other_failed_hosts": list(others or []), "where": where}
        error = _short(str(summary.get("error_message") or ""))
        return self._event(
            EVENT_FAILED,
            summary=brief,
            cause="user_error" if user else f"{phase}_error",
            message=(f"{where}: " if where else "")
            + (
                f"{type_name(summary.get('error_type'))}: {error}"
                if user
                else f"the job failed in phase {phase!r}: {error}"
            ),
            hint="" if user else "This is a failure of the job's setup, not of your function.",
            **extra,
        )

    async def wait(self, give_up_after: float | None = None) -> dict[str, Any] | None:
        """The job's end as an event (``JobEvent``'s JSON form, which the trigger yields and
        ``execute_complete`` decodes); None if ``give_up_after`` seconds pass first.

        Event-driven: between looks it sleeps in ``backend.await_change`` (the cluster watch and
        the pod's log stream; the local supervisor's exit), and storage is read only when it
        matters — the result once the process has ended, the heartbeat only after the log has
        been silent for ``heartbeat_timeout / 4`` — so a running job costs no storage request
        per look and a finished one is seen at once. On a backend that notifies, the watcher
        sleeps until its next duty (deadline, heartbeat look, startup timeout), not a poll.
        """
        give_up_at = time.monotonic() + give_up_after if give_up_after is not None else None
        try:
            event = await self._watch(give_up_at)
        except StorageOutage as exc:
            event = await self._storage_outage_event(exc)
        finally:
            self.backend.close()
        return event.to_dict() if event is not None else None  # the form Airflow carries

    async def _storage_outage_event(self, exc: StorageOutage) -> JobEvent:
        """Nobody could tell how the job ends: stop it, and say which storage failed, and how."""
        try:
            await acancel_job(self.job, self.storage, self.backend, by="watcher", reason=str(exc))
        except Exception as cancel_exc:
            log.error(
                "could not stop job %s after the storage outage (%s): stop it with "
                "`kinetic-airflow jobs cancel %s`",
                self.job.job_id,
                cancel_exc,
                self.job.job_id,
            )
        event = self._event(
            EVENT_FAILED,
            cause="storage_error",
            message=f"{exc}. The job was stopped, since its end could not be observed",
            hint="Check that the job storage is reachable and writable from the Airflow workers and "
            "triggerer (bucket permissions, network, disk), or raise [kinetic] storage_retry_seconds "
            "to ride out longer outages.",
        )
        await self.progress.tell(final_progress(event))
        return event

    async def _watch(self, give_up_at: float | None) -> JobEvent | None:
        await self._load_cursor()
        await self._load_progress()
        while True:
            await self._pump_logs()
            status = await self.backend.astatus(self.job)
            if not (self.stale_told and status.state is JobState.RUNNING):  # stale, not back
                await self.progress.observe(status)
            event = await self._settle(status) or await self._settle_on_output_end()
            if event is not None:
                await self.backend.arelease(self.job)
                await self.progress.tell(final_progress(event))
                return event
            if self.deadline is not None and time.time() >= self.deadline:
                await acancel_job(
                    self.job,
                    self.storage,
                    self.backend,
                    by="watcher",
                    reason="the task's execution_timeout passed",
                )
                await self._drain()
                event = self._timeout_event()
                await self.progress.tell(final_progress(event))
                return event
            if give_up_at is not None and time.monotonic() >= give_up_at:
                await self._save_cursor(final=True)
                return None
            await self.backend.await_change(self.job, self._next_look(status, give_up_at))

    def _next_look(self, status: BackendStatus, give_up_at: float | None) -> float:
        """Seconds until the watcher has something to do that no notification would tell it."""
        if not self.backend.notifies:
            wait = self.poll_interval
        else:
            wait = _QUIET_LOOK_SECONDS
            now = time.monotonic()
            if status.state is JobState.RUNNING and self.heartbeat_timeout:
                wait = min(wait, self._heartbeat_look_at() - now)
            if status.state is JobState.PENDING and self.startup_timeout is not None:
                since = status.details.get("admitted_at") or self.submitted_at
                wait = min(wait, since + self.startup_timeout - time.time())
            if status.reason == "Queued":  # Kueue's Workload is read, not watched
                wait = min(wait, QUEUE_LOOK_SECONDS)
            if status.state is JobState.NOT_FOUND:
                wait = min(wait, self.poll_interval)  # gone: the grace period runs on a clock
            if self.log_offset != self.shared_offset and not self.layout.job_uri.startswith("file://"):
                wait = min(wait, self.shared_saved_at + _SHARED_CURSOR_SECONDS - now)
        if self.deadline is not None:
            wait = min(wait, self.deadline - time.time())
        if give_up_at is not None:
            wait = min(wait, give_up_at - time.monotonic())
        return max(0.05, wait)

    def _heartbeat_look_at(self) -> float:
        """When to read the heartbeat: a quarter of the timeout after the last sign of life (a
        log line, or the last heartbeat read). A pod whose log flows is not read at all."""
        return max(self.last_output, self.last_heartbeat_check) + (self.heartbeat_timeout or 0) / 4

    async def _settle(self, status: BackendStatus) -> JobEvent | None:
        """The event that ends the wait, if this status ends it."""
        if (
            status.state.terminal
            and self.hosts > 1
            and (status.state is JobState.SUCCEEDED or status.reason == "Error")
        ):
            return await self._settle_group(status)
        if status.state.terminal:
            summary = await self._summary()
            await self._drain()
            summary = summary or await self._summary()  # written just as the process ended
            if summary is not None:
                return self._result_event(summary)
            if status.reason == "DeadlineExceeded":
                return self._timeout_event()
            cancelled = await self._cancelled()
            if cancelled is not None:
                return self._cancelled_event(cancelled)
            if status.reason == "Forbidden":  # the task fails: its job must not run on unseen
                await self.backend.acancel(self.job)
            if status.details.get("evicted_by") or status.reason in _KUEUE_ENDED:
                # Kueue requeued the suspended Job: deleted, so it cannot run this attempt again
                await self.backend.acancel(self.job)
            cause, message, hint = _classify_exit(status)
            return self._event(
                EVENT_PREEMPTED if cause == "preempted" else EVENT_FAILED,
                cause=cause,
                message=message,
                hint=hint,
                exit_code=status.exit_code,
            )
        if status.state is JobState.NOT_FOUND:
            return await self._settle_not_found()
        self.not_found_since = None
        self.started = self.started or status.state is JobState.RUNNING
        # whatever keeps it pending, a job not started startup_timeout after submission is given up
        stuck = (
            None
            if self.started
            else startup_failure(self.job, status, self.startup_timeout, self.submitted_at)
        )
        if stuck is not None and await self._started_marker():
            self.started = True  # it ran before this watcher (a rebuilt trigger): not a startup problem
            stuck = None
        if stuck is not None:
            await self.backend.acancel(self.job)
            return self._event(EVENT_FAILED, cause=stuck[0], message=stuck[1], hint=stuck[2])
        if (
            status.state is JobState.RUNNING
            and self.heartbeat_timeout
            and time.monotonic() >= self._heartbeat_look_at()
        ):
            # The watch cannot tell a frozen or cut-off node from a busy one, but a log that
            # still flows can; after a quarter of the timeout of silence the runner's heartbeat
            # is read (under one read a minute by default, none while the job prints).
            self.last_heartbeat_check = time.monotonic()
            age, host = await self._stalest_heartbeat(status)
            if self.stale_told and age is not None and age <= self.heartbeat_timeout / 2:
                self.stale_told = False  # it beats again: the next look says "running" again
            if age is not None and age > self.heartbeat_timeout / 2 and not self.stale_told:
                self.stale_told = True
                who = f"host {host}'s" if self.hosts > 1 else "the runner's"
                await self.progress.tell(
                    Progress(
                        Stage.HEARTBEAT_STALE,
                        f"heartbeat stale: {who} last heartbeat is {age:.0f}s old and the log is silent "
                        f"(the job is given up as lost at {self.heartbeat_timeout:.0f}s)",
                    )
                )
            if age is not None and age > self.heartbeat_timeout:
                await self.backend.acancel(self.job)
                who = f"host {host}'s runner's" if self.hosts > 1 else "the runner's"
                return self._event(
                    EVENT_PREEMPTED,
                    cause="heartbeat_stale",
                    message=f"{who} heartbeat stopped {age:.0f}s ago while its pod still looked "
                    "alive: the node was most likely lost",
                    hint="",
                )
        return None

    async def _settle_on_output_end(self) -> JobEvent | None:
        """The result event as soon as a one-host job's output has closed with its result stored.

        The runner writes the result summary last, after the result itself, so a summary is the
        job's outcome: the backend's word that the process ended (on GKE the kubelet's status
        update, then the Job controller's batched sync: a second or more) adds only latency.
        Read once, when the output first closes; without a summary then (the process died, or
        the log stream was cut) the job's end is awaited as before. Multi-host jobs end host by host
        (``_settle_group``).
        """
        if self.hosts != 1 or self.output_end_looked or not self.backend.output_ended(self.job):
            return None
        self.output_end_looked = True
        summary = await self._summary()
        if summary is None:
            return None
        await self._show_the_rest()  # the stream has ended: every line it had is in memory
        return self._result_event(summary)

    async def _settle_group(self, status: BackendStatus) -> JobEvent:
        """All hosts ended, or some failed: every failing host's own record decides the event.

        Read only now, once the pods say so: host 0's result, and the failure record of each
        host whose runner ended with an error (non-leader hosts write only their failures).
        """
        await self._drain()
        failed = [int(h) for h in status.details.get("failed_hosts") or []]
        summaries = {h: await self._summary(h) for h in sorted({0, *failed})}
        failures = {h: s for h, s in summaries.items() if s is not None and not s.get("ok")}
        silent = [h for h in failed if summaries.get(h) is None]  # died without writing a record
        if failures:
            first = min(failures)
            others = sorted((set(failures) | set(silent)) - {first})
            return self._result_event(failures[first], host=first, others=others)
        if silent:
            codes = status.details.get("exit_codes") or {}
            return self._event(
                EVENT_FAILED,
                cause="exit",
                host=silent[0],
                other_failed_hosts=silent[1:],
                exit_code=codes.get(silent[0]),
                message=f"{host_label(silent[0], self.hosts_per_slice)} of {self.hosts} ended "
                f"(exit code {codes.get(silent[0])}) "
                "without writing a result envelope"
                + (f"; also failed: hosts {', '.join(map(str, silent[1:]))}" if silent[1:] else ""),
                hint="The process died outside the function (a crash in a native library, os._exit, "
                "or the runner could not start): check that host's log lines.",
            )
        leader = summaries.get(0)
        if leader is not None:
            return self._result_event(leader)
        return self._event(
            EVENT_FAILED,
            cause="exit",
            message="every host ended, but host 0 wrote no result envelope",
            hint="Check host 0's log lines.",
        )

    async def _settle_not_found(self) -> JobEvent | None:
        summary = await self._summary()  # ended long ago, and its Job has been cleaned up since
        if summary is not None:
            await self._drain()
            return self._result_event(summary)
        cancelled = await self._cancelled()
        if cancelled is not None:
            await self._pump_logs()
            return self._cancelled_event(cancelled)
        self.not_found_since = self.not_found_since or time.monotonic()
        if time.monotonic() - self.not_found_since > _NOT_FOUND_GRACE_SECONDS:
            return self._event(
                EVENT_FAILED,
                cause="not_found",
                message="the job does not exist (deleted, or never created)",
                hint="Clear the task to start a new job.",
            )
        return None

    def _timeout_event(self) -> JobEvent:
        """The same event (and so the same AirflowTaskTimeout) whoever enforced the timeout."""
        return self._event(
            EVENT_TIMEOUT,
            cause="timeout",
            message="the task's execution_timeout passed while the job was running; the job was stopped",
            hint="Raise execution_timeout, or make the function checkpoint to KINETIC_OUTPUT_DIR so a "
            "retry resumes.",
        )

    async def _cancelled(self) -> dict[str, Any] | None:
        """The cancelled marker (who stopped the job, and why), if someone stopped it on purpose."""
        uri = cancelled_marker(self.job)
        try:
            text = await self._read(uri, "cancelled marker")
            marker = parse_json(text, uri) if text else None
            if marker is None or isinstance(marker, dict):
                return marker
            raise UnreadableObject(f"{uri} is not a JSON object")
        except UnreadableObject as exc:  # it is there: the job was stopped, by whom is unknown
            return {"by": "someone (the cancelled marker cannot be read)", "reason": str(exc)}

    def _cancelled_event(self, marker: dict[str, Any]) -> JobEvent:
        return self._event(
            EVENT_FAILED,
            cause="cancelled",
            message=f"the job was cancelled by {marker.get('by')}: {marker.get('reason')}",
            hint="",
        )
