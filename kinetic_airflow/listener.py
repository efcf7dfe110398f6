"""Stop a task instance's job when a user marks the task failed or success.

``BaseTrigger.on_kill`` covers a deferred task whose trigger a triggerer is already
running. It misses the window before a triggerer picks the trigger up (and the
time no triggerer runs at all): the trigger row is simply deleted, and the job
would run on, holding accelerators. The API server fires this listener for every
manual state change, so it closes that gap. It reads the job reference the
operator recorded in ``task_state_store`` and cancels it in a background thread
(the API request must not wait for a job to stop). Cancelling an ended job is a
no-op, so both paths may run.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from airflow.listeners import hookimpl

from kinetic_airflow.backends.registry import get_backend
from kinetic_airflow.connections import storage_for
from kinetic_airflow.job.ref import JobRef
from kinetic_airflow.lifecycle import cancel_job, read_record_from_db, recorded_status

log = logging.getLogger(__name__)

_MANUAL = "manually set"


def _recorded_job(task_instance: Any) -> JobRef | None:
    """The job to stop: the recorded one, unless the record says it has ended (its outcome was
    delivered, or it was cancelled): an ended job keeps the state it ended in."""
    record = read_record_from_db(
        task_instance.dag_id, task_instance.run_id, task_instance.task_id, task_instance.map_index
    )
    if record is None or recorded_status(record) is not None:
        return None
    return record.job


def _cancel(job: JobRef) -> None:
    try:
        cancel_job(
            job,
            storage_for(job.job_uri, job.gcp_conn_id),
            get_backend(job.backend),
            by="listener",
            reason="its task instance was marked failed or success by a user",
        )
        log.info("cancelled kinetic job %s: its task instance was marked by a user", job.job_id)
    except Exception:
        log.exception("could not cancel kinetic job %s", job.job_id)


def stop_job_of(task_instance: Any) -> None:
    try:
        job = _recorded_job(task_instance)
    except Exception as exc:  # e.g. a process without metadata DB access: say so, do not fail
        log.warning("could not look up the kinetic job of %s: %s", task_instance, exc)
        return
    if job:
        threading.Thread(target=_cancel, args=(job,), name="kinetic-cancel", daemon=True).start()


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any = None) -> None:
    if isinstance(error, str) and _MANUAL in error:
        stop_job_of(task_instance)


@hookimpl
def on_task_instance_success(previous_state: Any, task_instance: Any) -> None:
    if previous_state is None:  # the API server's manual "mark success" passes no previous state
        stop_job_of(task_instance)
