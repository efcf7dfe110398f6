"""When a deferred task may resume without falling into Airflow's executor-event race.

Airflow 3.3 fails a resumed task if the scheduler reads the *deferring* process's exit event
(state ``success``, same try number) after it has queued the resumed workload: the event's
``change_state`` drops the resumed key from the executor's ``running`` set, so
``_process_executor_events`` sees a queued task the executor no longer has ("finished with
state success, but the task instance's state attribute is queued") and fails it. Read from
apache-airflow-core 3.3.2:

* the deferring process sends ``DeferTask``; its supervisor sets the task DEFERRED;
* the process exits; the supervisor reaps it in ``_monitor_subprocess`` (at once when the
  exit is already reapable as its sockets close, otherwise only after its ``select`` times out:
  ``[workers] min_heartbeat_interval``, 5 s; measured: 0.2-1.6 s or 5-6 s after deferral);
* ``supervise`` returns (after any remote log upload) and the executor's worker posts the
  ``success`` event; the scheduler reads it at its next executor heartbeat, one loop later.

Nothing of that is written where a triggerer can read it, but when the triggerer shares the
deferring process's host and PID namespace, ``/proc`` shows it:

* under LocalExecutor, the read itself: the worker retitles itself once it has posted the event,
  and the pipe it posts into empties when the scheduler has read it (``local_executor_watch``);
  a finished job's event is held until then, and no longer;
* under any other executor on that host (Celery on one machine), the reaping: the deferring
  process's entry lasts (as a zombie) until its supervisor has waited for it; the event is held
  until then plus ``resume_margin_seconds`` (the executor's post and one scheduler loop).

Anywhere else the fixed bound ``min_deferral_seconds`` from the deferral stays.

Linux ``/proc`` only, standard library only: the triggerer imports this on its event loop.
"""

from __future__ import annotations

import asyncio
import enum
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from kinetic_airflow import procfs
from kinetic_airflow.local_executor_watch import LocalExecutorWorker

__all__ = [
    "DeferringProcess",
    "ProcessState",
    "ResumeWindow",
]

_PROC = procfs.PROC
_REAP_POLL_SECONDS = 0.25  # 1,000 triggers deferred at once read /proc 4,000 times a second, briefly
# A deferring process that outlives this is stuck in its own teardown (a listener, a log upload);
# Airflow's task_success_overtime (20 s) kills such a process well before it.
_REAP_WAIT_LIMIT_SECONDS = 300.0
_READ_POLL_SECONDS = 0.05  # only between a job's end and the scheduler's read: a second at most
_UNSEEN_READ_SECONDS = 15.0  # the bound for kwargs without not_before (min_deferral_seconds' default)


class ProcessState(enum.Enum):
    """What the triggerer can see of the process that deferred the task."""

    REAPED = "reaped"  # its supervisor has waited for it: its exit event is on its way
    SELF = "self"  # the trigger runs in the process that deferred (dag.test): no executor, no race
    ALIVE = "alive"  # still running, or exited and not yet waited for (a zombie)
    UNOBSERVABLE = "unobservable"  # another host or PID namespace, or no /proc


@dataclass(frozen=True)
class DeferringProcess:
    """The process that deferred a task, named so another process on its host can find it.

    The boot id and PID namespace tell whether a reader shares that host and namespace; the
    start time (clock ticks since boot) tells the process from a later one reusing its PID.
    ``worker`` is its LocalExecutor worker, through which the scheduler's read of the exit
    event itself can be seen (``local_executor_watch``); None under any other executor.
    """

    pid: int
    start_ticks: int
    boot_id: str
    pid_namespace: str
    worker: LocalExecutorWorker | None = None

    @classmethod
    def this_process(cls, proc: str = _PROC) -> DeferringProcess | None:
        """This process, or None where ``/proc`` does not say enough to find it again."""
        pid = os.getpid()
        start = procfs.start_ticks(pid, proc)
        boot_id = procfs.boot_id(proc)
        namespace = procfs.pid_namespace(proc)
        if start is None or not boot_id or not namespace:
            return None
        return cls(
            pid=pid,
            start_ticks=start,
            boot_id=boot_id,
            pid_namespace=namespace,
            worker=LocalExecutorWorker.parent_of_this_process(proc),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, value: Any) -> DeferringProcess | None:
        """Decoded from trigger kwargs; None for anything else (kwargs of an older version).
        Kwargs written before ``worker`` existed decode without one."""
        if not isinstance(value, dict):
            return None
        try:
            return cls(
                pid=int(value["pid"]),
                start_ticks=int(value["start_ticks"]),
                boot_id=str(value["boot_id"]),
                pid_namespace=str(value["pid_namespace"]),
                worker=LocalExecutorWorker.from_dict(value.get("worker")),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def state(self, proc: str = _PROC) -> ProcessState:
        same_host = procfs.boot_id(proc) == self.boot_id
        if not same_host or procfs.pid_namespace(proc) != self.pid_namespace:
            return ProcessState.UNOBSERVABLE
        if self.pid == os.getpid():
            return ProcessState.SELF
        if procfs.start_ticks(self.pid, proc) != self.start_ticks:
            return ProcessState.REAPED  # gone, or the PID now belongs to a later process
        return ProcessState.ALIVE  # running, or a zombie ("Z") its supervisor has not waited for


class ResumeWindow:
    """Watches, from the trigger's start, for the window to close; holds the event until then.

    Started when the trigger starts (usually a second after the deferral), so the reaping and,
    under LocalExecutor, the scheduler's read are seen as they happen, typically while the job
    still runs: a job that ends later pays nothing.
    ``not_before`` (deferral time + ``min_deferral_seconds``) is the bound used when the
    deferring process cannot be observed.
    """

    def __init__(
        self,
        deferred_by: DeferringProcess | None,
        *,
        not_before: float | None,
        margin: float,
        proc: str = _PROC,
    ) -> None:
        self._process = deferred_by
        self._not_before = not_before
        self._margin = margin
        self._proc = proc
        self._reaped_at: float | None = None  # monotonic, when first seen reaped
        self._watch: asyncio.Task[None] | None = None
        self._read_watch: asyncio.Task[None] | None = None
        self._read_seen = False  # the scheduler has read the deferring process's exit event
        self._gave_up = False
        self.state = deferred_by.state(proc) if deferred_by is not None else ProcessState.UNOBSERVABLE
        if self.state is ProcessState.REAPED:
            self._reaped_at = time.monotonic()

    def describe(self) -> str:
        """How this task will resume, for the trigger's first log line."""
        if self.state is ProcessState.SELF:
            return "the task resumes when its job ends"
        if self.state is ProcessState.UNOBSERVABLE:
            return (
                "the task resumes no sooner than min_deferral_seconds after deferring (this "
                "triggerer cannot see the process that deferred it)"
            )
        pid = self._process.pid if self._process is not None else "?"
        if self._process is not None and self._process.worker is not None:
            return (
                "the task resumes once the scheduler has read the exit of the process that deferred "
                f"it (pid {pid}, run by LocalExecutor worker {self._process.worker.pid})"
            )
        return f"the task resumes once the process that deferred it (pid {pid}) has exited"

    def start(self) -> None:
        """Begin watching (on the running loop) for the reaping and, under LocalExecutor, for the
        scheduler's read; a no-op when there is nothing to watch."""
        if self.state is ProcessState.ALIVE and self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_reaping())
        elif self.state is ProcessState.REAPED:
            self._start_read_watch()

    def stop(self) -> None:
        for task in (self._watch, self._read_watch):
            if task is not None:
                task.cancel()

    async def _watch_reaping(self) -> None:
        assert self._process is not None
        give_up = time.monotonic() + _REAP_WAIT_LIMIT_SECONDS
        while self._process.state(self._proc) is ProcessState.ALIVE:
            if time.monotonic() > give_up:
                self._gave_up = True
                break
            await asyncio.sleep(_REAP_POLL_SECONDS)
        self._reaped_at = time.monotonic()
        if not self._gave_up:
            self._start_read_watch()

    def _start_read_watch(self) -> None:
        worker = self._process.worker if self._process is not None else None
        if worker is not None and self._read_watch is None:
            self._read_watch = asyncio.get_running_loop().create_task(self._watch_read(worker))

    async def _watch_read(self, worker: LocalExecutorWorker) -> None:
        """Note the scheduler's read while the job still runs, so a job ending later resumes at
        once. Read then, not only at the job's end: by then the worker may supervise another task
        whose event sits unread in the same pipe, which nothing tells from this one's, and the
        hold would wait a scheduler loop for nothing. Once seen, a read stays true."""
        bound = self._read_bound()
        while time.time() < bound:
            read = self._read(worker)
            if read is not False:
                self._read_seen = bool(read)
                return
            await asyncio.sleep(_REAP_POLL_SECONDS)

    def _read_bound(self) -> float:
        return self._not_before if self._not_before is not None else time.time() + _UNSEEN_READ_SECONDS

    def _read(self, worker: LocalExecutorWorker) -> bool | None:
        """Whether the scheduler has read the deferring process's exit event: True, False (not
        yet: unposted, or posted and unread), None where the worker's queues cannot be seen."""
        if not worker.posted(self._proc):
            return False
        unread = worker.unread_events(self._proc)
        return None if unread is None else unread == 0

    async def wait(self, log: Callable[[str], None], job_id: str) -> None:
        """Return once the task can resume safely (see the module docstring)."""
        if self.state is ProcessState.SELF:
            return
        if self.state is ProcessState.UNOBSERVABLE:
            hold = (self._not_before or 0) - time.time()
            if hold > 0:
                log(
                    f"job {job_id} ended; resuming the task in {hold:.1f}s (Airflow's executor-event "
                    "race; this triggerer cannot see the process that deferred it)"
                )
                await asyncio.sleep(hold)
            return
        if self._reaped_at is None:
            pid = self._process.pid if self._process is not None else "?"
            log(
                f"job {job_id} ended; resuming the task once the process that deferred it (pid {pid}) "
                "has exited (Airflow's executor-event race)"
            )
            self.start()
            assert self._watch is not None
            await self._watch
        if self._gave_up:
            pid = self._process.pid if self._process is not None else "?"
            log(
                f"the process that deferred the task (pid {pid}) has not exited in "
                f"{_REAP_WAIT_LIMIT_SECONDS:.0f}s; resuming anyway"
            )
            return
        assert self._reaped_at is not None
        if self._read_seen:
            return
        if self._process is not None and self._process.worker is not None:
            if await self._scheduler_read(self._process.worker, log, job_id):
                return
        hold = self._reaped_at + self._margin - time.monotonic()
        if hold > 0:
            log(
                f"job {job_id} ended; resuming the task in {hold:.1f}s, once the exit of the process "
                "that deferred it has reached the scheduler"
            )
            await asyncio.sleep(hold)

    async def _scheduler_read(
        self, worker: LocalExecutorWorker, log: Callable[[str], None], job_id: str
    ) -> bool:
        """Wait until the LocalExecutor's scheduler has read the deferring process's exit event
        (``local_executor_watch``); False, at once, where its queues cannot be seen.

        Bounded by the fixed bound (``not_before``): a scheduler that has not read its
        worker's queue by then is past Airflow's own heartbeat limits, and waiting on would
        only keep the task from its result.
        """
        bound = self._read_bound()
        said = False
        while True:
            read = self._read(worker)
            if read is None:
                return False
            if read:
                if said:
                    log(f"the scheduler has read the exit of the process that deferred job {job_id}'s task")
                return True
            if time.time() >= bound:
                log(
                    f"the scheduler has not read the exit of the process that deferred job {job_id}'s "
                    "task by the fixed bound (min_deferral_seconds); resuming the task now"
                )
                return True
            if not said:
                log(
                    f"job {job_id} ended; resuming the task once the scheduler has read the exit of "
                    "the process that deferred it (Airflow's executor-event race)"
                )
                said = True
            await asyncio.sleep(_READ_POLL_SECONDS)
