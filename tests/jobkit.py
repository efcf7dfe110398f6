"""Build a job in storage without Airflow, the way the operator does, for runner-level tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from kinetic_airflow.job.integrity import KEY_ENV, manifest_text, new_key
from kinetic_airflow.job.layout import JobLayout
from kinetic_airflow.job.payload import write_payload
from kinetic_airflow.job.storage import open_storage

# Each job's key, as the worker would keep it in the job record (job URI -> key).
KEYS: dict[str, str] = {}


def key_of(job_uri: str) -> str:
    """The key of a job made here (a new one for a job URI not seen yet)."""
    return KEYS.setdefault(job_uri.rstrip("/"), new_key())


def make_job(
    base_uri: str,
    fn: Any,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    job_id: str = "job-1",
    manifest_overrides: dict | None = None,
) -> JobLayout:
    layout = JobLayout.for_job(base_uri, job_id)
    storage = open_storage(base_uri)
    fields = write_payload(storage, layout.payload, fn, list(args), kwargs or {})
    manifest = {**fields, "job_id": job_id, "attempt": 1, "heartbeat_seconds": 1}
    manifest.update(manifest_overrides or {})
    storage.write_text(layout.manifest, manifest_text(manifest, key_of(layout.job_uri)))
    return layout


def run_runner(layout: JobLayout, python: str = sys.executable, timeout: float = 120, env=None):
    """The runner as a job's process runs it, with the job's key in its environment."""
    env = {**(env if env is not None else os.environ), KEY_ENV: key_of(layout.job_uri)}
    proc = subprocess.run(
        [python, "-m", "kinetic_airflow.runner", "--job-uri", layout.job_uri],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    summary = open_storage(layout.job_uri).read_text_or_none(layout.result_summary())
    return proc, (json.loads(summary) if summary else None)


def gke_job(
    task_id: str,
    fn: Any,
    args: list,
    *,
    backend: str = "gke",
    accelerator: str = "cpu",
    operator_kwargs: dict[str, Any] | None = None,
    **ref_fields: Any,
) -> tuple[Any, dict, Any]:
    """A cluster job as the operator makes it (ref, payload, manifest, Job or LeaderWorkerSet)
    without Airflow running it.

    Uses the kinetic settings of the environment (KINETIC_BASE_URI, KINETIC_KUBERNETES_CONN_ID, ...).
    Returns (operator, job ref, storage); one job per call (the run id is random).
    """
    import uuid

    from kinetic_airflow.backends.registry import get_backend
    from kinetic_airflow.connections import storage_for
    from kinetic_airflow.job.layout import JobIdentity
    from kinetic_airflow.job.ref import JobRef
    from kinetic_airflow.operators import KineticRunOperator

    op = KineticRunOperator(
        task_id=task_id,
        python_callable=fn,
        op_args=args,
        backend=backend,
        accelerator=accelerator,
        **(operator_kwargs or {}),  # e.g. local_queue="team-a"
    )
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    ref = op._job_ref(JobIdentity("d", run_id, task_id), backend, os.environ["KINETIC_BASE_URI"])
    manifest = ref_fields.pop("manifest", {})  # manifest overrides, e.g. heartbeat_seconds
    ref = JobRef.from_dict({**ref.to_dict(), **ref_fields})  # e.g. active_deadline_seconds=3
    storage = storage_for(ref.job_uri)
    layout = JobLayout(ref.job_uri)
    fields = write_payload(storage, layout.payload, fn, list(args), {})
    key = key_of(ref.job_uri)
    storage.write_text(layout.manifest, manifest_text({**fields, "job_id": ref.job_id, **manifest}, key))
    get_backend(backend).submit(ref, job_key=key)
    return op, ref, storage
