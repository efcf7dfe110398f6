"""What keras-kinetic's own tools need to see kinetic-airflow jobs.

keras-kinetic 0.0.4 (``kinetic/jobs.py``) finds jobs by their Kubernetes labels
(``app=kinetic`` / ``app=kinetic-pathways`` and ``job-id``, which our Jobs and
LeaderWorkerSets carry) and then reads ``gs://{project}-kn-{cluster}-jobs/{job_id}/handle.json``
(``kinetic.utils.storage.download_handle``); ``JobHandle.result()`` reads
``gs://{bucket_name}/{job_id}/result.pkl``, a cloudpickled
``{"success", "result", "exception", "traceback"}`` dict. kinetic-airflow keeps its own
files under ``{base_uri}/jobs/{job_id}/``, so when the job bucket *is* kinetic's bucket
(``gs://{project}-kn-{cluster}-jobs``, the default base URI of the cluster backends) the
worker also writes ``{bucket}/{job_id}/handle.json`` before it creates the job, and the
runner writes ``{bucket}/{job_id}/result.pkl`` in kinetic's format when it has a result.
kinetic ignores the extra ``kinetic_airflow`` key of the handle.

``kinetic jobs result`` / ``cleanup`` delete ``{bucket}/{job_id}/`` (only these two
interop files) and the Kubernetes object; kinetic-airflow's own files are not under that
prefix, so nothing a task instance needs is lost.

Standard library + cloudpickle only: the runner imports this module inside the job.
"""

from __future__ import annotations

import datetime
import io
import json
import re
import sys
from typing import Any

import cloudpickle

from kinetic_airflow.job.ref import JobRef, K8sFields

__all__ = [
    "HANDLE_NAME",
    "handle_uri",
    "interop_prefix",
    "kinetic_bucket",
    "kinetic_handle",
    "write_handle",
    "write_kinetic_result",
]

HANDLE_NAME = "handle.json"
_BUCKET = re.compile(
    r"^gs://(?P<bucket>(?P<project>[a-z0-9][-a-z0-9.]*?)-kn-(?P<cluster>[-a-z0-9]+)-jobs)(/|$)"
)


def kinetic_bucket(base_uri: str, cluster: str | None = None) -> dict[str, str] | None:
    """``{"bucket", "project", "cluster"}`` when ``base_uri`` is in a kinetic job bucket, else None."""
    match = _BUCKET.match(base_uri or "")
    if not match:
        return None
    bucket = match.group("bucket")
    project, name = match.group("project"), match.group("cluster")
    if cluster and bucket.endswith(f"-kn-{cluster}-jobs"):  # a project name may itself hold "-kn-"
        project, name = bucket[: -len(f"-kn-{cluster}-jobs")], cluster
    return {"bucket": bucket, "project": project, "cluster": name}


def interop_prefix(base_uri: str, job_id: str) -> str | None:
    """``gs://{bucket}/{job_id}``: where kinetic looks for this job's handle and result."""
    found = kinetic_bucket(base_uri)
    return f"gs://{found['bucket']}/{job_id}" if found else None


def handle_uri(base_uri: str, job_id: str) -> str | None:
    prefix = interop_prefix(base_uri, job_id)
    return f"{prefix}/{HANDLE_NAME}" if prefix else None


def _job_uri_to_interop(job_uri: str) -> str | None:
    """``gs://b/prefix/jobs/{id}`` -> ``gs://b/{id}`` for a kinetic bucket."""
    base, _, job_id = job_uri.rstrip("/").rpartition("/")
    if not base.endswith("/jobs"):
        return None
    return interop_prefix(base[: -len("/jobs")], job_id)


def kinetic_handle(ref: JobRef, func_name: str, created: float) -> dict[str, Any] | None:
    """keras-kinetic's ``JobHandle`` fields (``kinetic/jobs.py``) for one kinetic-airflow job."""
    if ref.backend not in ("gke", "pathways"):
        return None  # kinetic only knows cluster jobs
    k8s = ref.k8s or K8sFields()
    cluster = k8s.cluster or {}
    found = kinetic_bucket(ref.base_uri or "", cluster.get("name"))
    if found is None:
        return None
    if ref.backend == "pathways":
        k8s_name = f"keras-pathways-{ref.job_id}"
    else:
        k8s_name = f"kinetic-{ref.job_id}"
    identity = ref.identity.to_dict() if ref.identity is not None else {}
    when = datetime.datetime.fromtimestamp(created, datetime.timezone.utc).replace(microsecond=0)
    return {
        "job_id": ref.job_id,
        "backend": ref.backend,
        "project": cluster.get("project") or found["project"],
        "cluster_name": cluster.get("name") or found["cluster"],
        "zone": cluster.get("location") or "",
        "namespace": k8s.namespace or "default",
        "bucket_name": found["bucket"],
        "k8s_name": k8s_name,
        "image_uri": k8s.image or "",
        "accelerator": ref.accelerator or "cpu",
        "func_name": func_name,
        "display_name": f"{identity.get('dag_id')}.{identity.get('task_id')}",
        "created_at": when.isoformat().replace("+00:00", "Z"),
        # ignored by kinetic (JobHandle.from_dict drops unknown keys); for people and our CLI
        "kinetic_airflow": {
            "job_uri": ref.job_uri,
            "dag_id": identity.get("dag_id"),
            "run_id": identity.get("run_id"),
            "task_id": identity.get("task_id"),
            "map_index": identity.get("map_index"),
            "try_number": identity.get("try_number"),
            "attempt": identity.get("attempt"),
        },
    }


def write_handle(storage: Any, ref: JobRef, func_name: str, created: float) -> str | None:
    """Write kinetic's handle for a cluster job in a kinetic bucket; returns its URI (or None)."""
    handle = kinetic_handle(ref, func_name, created)
    if handle is None:
        return None
    uri = f"gs://{handle['bucket_name']}/{ref.job_id}/{HANDLE_NAME}"
    storage.write_text(uri, json.dumps(handle, indent=2, sort_keys=True))
    return uri


def write_kinetic_result(storage: Any, job_uri: str, host: int, envelope: dict[str, Any]) -> str | None:
    """In the runner: the result in kinetic's own format beside kinetic's handle, if there is one.

    Host 0 writes it; another host only its own failure, and only if none is there yet. The
    exception is pickled plainly (as kinetic does), so kinetic's venv can load it without
    kinetic-airflow installed. Never raises: interop must not fail a job.
    """
    try:
        prefix = _job_uri_to_interop(job_uri)
        if prefix is None or (host != 0 and envelope.get("ok")):
            return None
        if not storage.exists(f"{prefix}/{HANDLE_NAME}"):
            return None
        exception = envelope.get("exception")
        if not envelope.get("ok") and exception is None:
            what = f"{envelope.get('error_type')}: {envelope.get('error_message')}"
            exception = RuntimeError(f"{what} (phase {envelope.get('phase')})")
        payload = {
            "success": bool(envelope.get("ok")),
            "result": envelope.get("value") if envelope.get("ok") else None,
            "exception": None if envelope.get("ok") else exception,
            "traceback": envelope.get("traceback") or None,
        }
        uri = f"{prefix}/result.pkl"
        if host == 0:
            try:  # streamed: a large result is not held twice in memory
                with storage.open_write(uri) as fh:
                    cloudpickle.dump(payload, fh)
                return uri
            except Exception as exc:  # a value or exception plain pickling cannot carry
                reason = f"it cannot be pickled for kinetic: {exc}"
        else:
            reason = ""
        buffer = io.BytesIO()
        try:
            cloudpickle.dump(payload, buffer)
        except Exception as exc:
            reason = f"it cannot be pickled for kinetic: {exc}"
        if reason:
            message = envelope.get("error_message") if not envelope.get("ok") else "the function succeeded"
            payload.update(
                success=False,
                result=None,
                exception=RuntimeError(f"{message}; the job's result is in {job_uri} ({reason})"),
            )
            buffer = io.BytesIO()
            cloudpickle.dump(payload, buffer)
        storage.write_bytes(uri, buffer.getvalue(), if_absent=host != 0)
        return uri
    except Exception as exc:
        print(f"[kinetic] could not write kinetic's result copy: {exc}", file=sys.stderr, flush=True)
        return None
