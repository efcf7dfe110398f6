"""When a LocalExecutor's scheduler has read the exit event of a task process it supervised.

This is what closes Airflow's executor-event race exactly (``resume_window``). Read from
apache-airflow-core 3.3.0-3.3.2, ``executors/local_executor.py`` and ``jobs/scheduler_job_runner.py``:

* a LocalExecutor worker process runs the workload's supervisor in itself, titled
  ``airflow worker -- LocalExecutor: <workload>``; the task process is its child;
* when the supervisor returns, the worker puts the ``success`` event on ``result_queue``, a
  ``multiprocessing.SimpleQueue`` (written straight into its pipe, no feeder thread), and only
  then retitles itself ``... <idle>`` (or the next workload's name);
* the scheduler's ``LocalExecutor.sync`` reads that pipe until it is empty, in the executor
  heartbeat; the same scheduler loop then processes the events, before its next
  ``_do_scheduling`` could queue the resumed task.

So once the worker's title has changed and, after that, the pipes it shares with the scheduler
hold nothing unread, the event has been read and the resumed task cannot fall into the race.
The title itself is never stored (another executor's command line may carry a secret): only
its digest travels in the trigger's kwargs.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

from kinetic_airflow import procfs

__all__ = ["LocalExecutorWorker"]

# local_executor._get_executor_process_title_prefix: "airflow worker -- LocalExecutor[ [team]]:"
_TITLE_PREFIX = "airflow worker -- LocalExecutor"


@dataclass(frozen=True)
class LocalExecutorWorker:
    """The LocalExecutor worker that supervises this task process, as it was at deferral."""

    pid: int
    start_ticks: int
    title_digest: str

    @classmethod
    def parent_of_this_process(cls, proc: str = procfs.PROC) -> LocalExecutorWorker | None:
        """This process's supervisor when it is a LocalExecutor worker, else None."""
        parent = os.getppid()
        title = procfs.command_line(parent, proc)
        ticks = procfs.start_ticks(parent, proc)
        if not title or not title.startswith(_TITLE_PREFIX) or ticks is None:
            return None
        return cls(pid=parent, start_ticks=ticks, title_digest=_digest(title))

    @classmethod
    def from_dict(cls, value: Any) -> LocalExecutorWorker | None:
        if not isinstance(value, dict):
            return None
        try:
            return cls(
                pid=int(value["pid"]),
                start_ticks=int(value["start_ticks"]),
                title_digest=str(value["title_digest"]),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def posted(self, proc: str = procfs.PROC) -> bool:
        """Whether the worker has put the workload's end event on its result queue: it has
        retitled itself, or it is gone (then no event will come)."""
        if procfs.start_ticks(self.pid, proc) != self.start_ticks:
            return True
        title = procfs.command_line(self.pid, proc)
        return title is None or _digest(title) != self.title_digest

    def unread_events(self, proc: str = procfs.PROC) -> int | None:
        """Bytes the scheduler has not yet read from the queues it shares with this worker
        (0: every event posted so far has been read), or None where they cannot be seen.

        The worker holds both ends of two pipes, the activity and the result queue; both are
        counted, as nothing tells them apart. The activity queue is empty but for a moment
        (the executor never sends more workloads than it has workers free).
        """
        if procfs.start_ticks(self.pid, proc) != self.start_ticks:
            return 0  # the worker is gone: nothing of its is left to read
        pipes = procfs.pipes_held_both_ways(self.pid, proc)
        if not pipes:
            return None
        total = 0
        for path in pipes:
            unread = procfs.unread_bytes(path)
            if unread is None:
                return None
            total += unread
        return total


def _digest(title: str) -> str:
    return hashlib.sha256(title.encode("utf-8", "replace")).hexdigest()[:32]
