"""The protocol every backend (local process, GKE Job, Pathways LeaderWorkerSet) speaks.

A job is named by a ``JobRef`` (``kinetic_airflow.job.ref``: typed, frozen; its JSON form
travels in trigger kwargs, events and ``task_state_store``, so it never holds a secret). Backends only
create, observe and delete; what a job *returned* is read from storage by the
watcher, which is why status here is about the process/pod, not the result.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Any

from kinetic_airflow.job.ref import JobRef

__all__ = ["QUEUE_LOOK_SECONDS", "Backend", "BackendStatus", "JobRef", "JobState"]

# How often a queued job's queue state (a Kueue Workload) is read, by the backend and so by the
# watcher's wake-ups (nothing watches Workloads): a new position or the admission shows within
# this, and a queue of forty jobs costs eight reads a second at most.
QUEUE_LOOK_SECONDS = 5.0


class JobState(str, enum.Enum):
    NOT_FOUND = "not_found"
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED)


@dataclass
class BackendStatus:
    state: JobState
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)


class Backend:
    """Subclasses implement the sync methods; the async ones default to a worker thread."""

    name: str = ""
    # True when ``await_change`` returns on every change that matters (state, new log lines),
    # so a watcher may sleep until its next duty instead of its poll interval.
    notifies: bool = False

    def submit(self, job: JobRef, *, env: dict[str, str] | None = None, job_key: str | None = None) -> None:
        """Start the job. Idempotent: a job that already exists under this name is adopted.

        ``job_key``: the job's key (``kinetic_airflow.integrity``), handed to the runner out of band
        (never through job storage, never in ``job``, which trigger kwargs carry).
        """
        raise NotImplementedError

    def status(self, job: JobRef) -> BackendStatus:
        raise NotImplementedError

    def cancel(self, job: JobRef) -> None:
        """Stop the job and everything it started; a no-op for a finished or missing job."""
        raise NotImplementedError

    def read_log(self, job: JobRef, offset: int) -> tuple[str, int]:
        """Log text from ``offset`` (bytes, or lines where the backend says so) on, and the new offset."""
        return "", offset

    def full_log_hint(self, job: JobRef) -> str:
        """Where a person finds the job's whole log (named when the task log is capped)."""
        return job.job_uri + "/job.log"

    def log_complete(self, job: JobRef) -> bool:
        """True once everything the (finished) job logged can be read with ``read_log``."""
        return True

    async def astatus(self, job: JobRef) -> BackendStatus:
        return await asyncio.to_thread(self.status, job)

    async def acancel(self, job: JobRef) -> None:
        await asyncio.to_thread(self.cancel, job)

    async def aread_log(self, job: JobRef, offset: int) -> tuple[str, int]:
        return await asyncio.to_thread(self.read_log, job, offset)

    async def alog_complete(self, job: JobRef) -> bool:
        return await asyncio.to_thread(self.log_complete, job)

    def output_ended(self, job: JobRef) -> bool:
        """Whether the job's (single) process has closed its output while the backend may not yet
        say that it ended. Where this can be told (a pod's followed log ends when the container
        exits; its Job is complete only after the kubelet and the Job controller have synced,
        a second or more on a real cluster), the watcher reads the result summary at once."""
        return False

    async def await_change(self, job: JobRef, timeout: float) -> None:
        """Return when the job may have changed (ended, been deleted), or after ``timeout``.

        Backends that learn about changes (a watch, a process exit) return early; this is what
        lets the watcher see a finished job at once without polling storage.
        """
        await asyncio.sleep(timeout)

    async def arelease(self, job: JobRef) -> None:
        """The attempt has ended and its outcome is decided: free what it still holds.

        A finished Job holds nothing (its TTL cleans it up later, keeping its logs meanwhile);
        a LeaderWorkerSet's hosts wait after their run until the group is deleted.
        """

    def close(self) -> None:
        """Release what observing jobs opened (log streams); the watcher calls it when done."""
