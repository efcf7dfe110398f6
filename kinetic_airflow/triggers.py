"""KineticJobTrigger: waits for a job in the triggerer without holding a worker slot.

It only observes (backend status, the runner's markers and result summary in
storage, the job log) and yields exactly one event. Its kwargs are stored as
plain JSON in the metadata DB and logged, so they hold the job reference (its
JSON form, ``JobRef.to_dict``), connection *ids* and public settings only, never a
token or a key. Rebuilt from those kwargs after a triggerer restart (a row an older
version wrote included: ``JobRef.from_dict`` reads every earlier form), ``run``
simply observes again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from kinetic_airflow.job.ref import JobRef
from kinetic_airflow.resume_window import DeferringProcess, ResumeWindow

if TYPE_CHECKING:
    from kinetic_airflow.watch import JobWatcher

__all__ = ["KineticJobTrigger"]


class KineticJobTrigger(BaseTrigger):
    def __init__(
        self,
        job: dict[str, Any],
        poll_interval: float = 2.0,
        deadline: float | None = None,
        gcp_conn_id: str | None = None,
        log_max_lines: int = 10000,
        not_before: float | None = None,
        storage_retry_seconds: float | None = None,
        deferred_by: dict[str, Any] | None = None,
        resume_margin: float = 2.0,
    ) -> None:
        super().__init__()
        self.job = JobRef.from_dict(job)  # decoded once: the kwargs hold the JSON form
        self.poll_interval = poll_interval
        self.deadline = deadline
        self.gcp_conn_id = gcp_conn_id
        self.log_max_lines = log_max_lines
        self.not_before = not_before
        self.storage_retry_seconds = storage_retry_seconds
        self.deferred_by = deferred_by  # the process that deferred the task (resume_window)
        self.resume_margin = resume_margin

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "kinetic_airflow.triggers.KineticJobTrigger",
            {
                "job": self.job.to_dict(),
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "gcp_conn_id": self.gcp_conn_id,
                "log_max_lines": self.log_max_lines,
                "not_before": self.not_before,
                "storage_retry_seconds": self.storage_retry_seconds,
                "deferred_by": self.deferred_by,
                "resume_margin": self.resume_margin,
            },
        )

    def _watcher(self) -> JobWatcher:
        """Built in a worker thread: opening gs:// storage looks up the GCP connection, a
        synchronous supervisor call that must not run on the triggerer's event loop."""
        # Imported here, in that thread: Airflow imports this module on the triggerer's event
        # loop, where importing the watcher, storage clients and backends would block every trigger.
        from kinetic_airflow.backends.registry import get_backend
        from kinetic_airflow.connections import storage_for
        from kinetic_airflow.watch import JobWatcher

        return JobWatcher(
            self.job,
            storage_for(self.job.job_uri, self.gcp_conn_id),
            get_backend(self.job.backend),
            poll_interval=self.poll_interval,
            deadline=self.deadline,
            log_max_lines=self.log_max_lines,
            emit_log=lambda line: self.log.info("%s", line),  # a multi-host job's lines carry [hN]
            storage_retry_seconds=self.storage_retry_seconds,
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # Airflow's executor-event race (resume_window): resuming the task before the scheduler
        # has processed the exit of the process that deferred it fails the task. Watched from
        # here, while the job runs, so a job that outlasts that exit is not held at all.
        deferred_by = DeferringProcess.from_dict(self.deferred_by)
        window = ResumeWindow(deferred_by, not_before=self.not_before, margin=self.resume_margin)
        self.log.info(
            "watching kinetic job %s at %s; %s", self.job.job_id, self.job.job_uri, window.describe()
        )
        window.start()
        try:
            watcher = await asyncio.to_thread(self._watcher)
            event = await watcher.wait()
            await window.wait(self.log.info, self.job.job_id)
        finally:
            window.stop()
        yield TriggerEvent(event)

    async def on_kill(self) -> None:
        """The user marked the deferred task failed/success or cleared it: stop the job."""
        self.log.info("task was stopped by the user; cancelling kinetic job %s", self.job.job_id)
        await asyncio.to_thread(self._cancel)

    def _cancel(self) -> None:
        # In a worker thread, imports included (see ``_watcher``).
        from kinetic_airflow.backends.registry import get_backend
        from kinetic_airflow.connections import storage_for
        from kinetic_airflow.lifecycle import cancel_job

        cancel_job(
            self.job,
            storage_for(self.job.job_uri, self.gcp_conn_id),
            get_backend(self.job.backend),
            by="trigger.on_kill",
            reason="the task was cleared or marked by a user while deferred",
        )
