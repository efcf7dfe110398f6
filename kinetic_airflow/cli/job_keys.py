"""A job's key for tools outside a task (the jobs CLI, reproduce): read from its job record.

The key lives only in the job record in Airflow's metadata DB (``task_state_store``) and in
the job itself, never in job storage (README, "Security model"), so a tool that unpickles
something from storage (``jobs result --load``) or runs a stored payload (``reproduce``) needs
the metadata DB to check it first. The task instance to look in is named by the job's
``job.json`` (which a bucket writer could change): that is safe, because the record found must
name this very job id, and the key of any other job does not verify this one's objects.
"""

from __future__ import annotations

import logging
from typing import Any

from kinetic_airflow.job.layout import JobIdentity
from kinetic_airflow.lifecycle import job_integrity, read_record_from_db

__all__ = ["NO_KEY_HELP", "recorded_integrity"]

log = logging.getLogger(__name__)

NO_KEY_HELP = (
    "its key is kept in the job record in Airflow's metadata DB (task_state_store), which this command "
    "reads with this machine's Airflow configuration (AIRFLOW_HOME / AIRFLOW__DATABASE__SQL_ALCHEMY_CONN). "
    "Run it where Airflow's metadata DB is reachable; a job whose task instance was cleared or deleted "
    "since has no key any more, and its stored objects cannot be trusted"
)


def recorded_integrity(identity: JobIdentity | None, job_id: str) -> tuple[dict[str, Any], str]:
    """``({"key", "payload_sha256", ...}, "")``, or ``({}, why not)`` when there is no key to be had."""
    if identity is None:
        return {}, "the job's job.json names no task instance"
    try:
        record = read_record_from_db(identity.dag_id, identity.run_id, identity.task_id, identity.map_index)
    except ValueError as exc:  # a damaged record: say so
        return {}, str(exc)
    except Exception as exc:  # no Airflow here, or no DB: say so, never guess
        return {}, f"the metadata DB could not be read ({type(exc).__name__}: {exc})"
    if record is None:
        return {}, (
            f"this Airflow's metadata DB holds no job record for {identity.ti_key} (is this the "
            "environment of the Airflow that ran it? AIRFLOW__DATABASE__SQL_ALCHEMY_CONN names the DB)"
        )
    found = job_integrity(record, job_id)
    if not found.get("key"):
        return {}, f"the job record of {identity.ti_key} names no key for job {job_id}"
    return found, ""
