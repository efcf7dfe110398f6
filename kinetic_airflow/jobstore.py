"""Job storage as a catalogue: every job's record, and what state it is in.

The worker writes ``{job_uri}/job.json`` (``submission.publish_job``: backend, accelerator,
cluster endpoint, namespace, identity; public data only, as in trigger kwargs) before it
creates the job, so the jobs CLI and retention can find and reach any job from storage
alone, with the same connections as the operator. Jobs written before ``job.json``
existed are still listed from their manifest (without the cluster, so without a live
backend state).

A job's state (``kinetic_airflow.job.states.JobStatus``), from its files and (while it has no
outcome) its backend (``backends.registry.backend_states``)::

    pending    created, not started (scheduling, pulling, waiting for its payload)
    running    the backend says so
    succeeded  result.json says ok
    failed     result.json says not ok, or the process/pod ended without a result
    cancelled  status/cancelled.json (on_kill, a clear, a timeout, ``jobs cancel``)
    lost       started, but neither its process/pod nor a result exists any more
    unknown    no record to ask the backend with, and no outcome in storage
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from kinetic_airflow.job.layout import RECORD_NAME, JobIdentity, JobLayout
from kinetic_airflow.job.ref import JobRef, JobRefError
from kinetic_airflow.job.states import FINAL, LIVE, Cancellation, JobStatus, status_of
from kinetic_airflow.job.storage import FileStorage, Storage, UnreadableObject, join_uri, uri_to_local_path
from kinetic_airflow.job.tracebacks import user_summary

__all__ = [
    "RECORD_NAME",
    "JobInfo",
    "list_job_ids",
    "load_job",
    "read_json_object",
    "record_uri",
]

log = logging.getLogger(__name__)

LIVE_STATES = LIVE  # kept for the callers that import these names from here
FINAL_STATES = FINAL


def record_uri(job_uri: str) -> str:
    return JobLayout(job_uri).record


def list_job_ids(storage: Storage, base_uri: str) -> list[str]:
    """The job ids under ``{base_uri}/jobs/`` (one listing, not one per file)."""
    jobs = join_uri(base_uri, "jobs")
    if isinstance(storage, FileStorage):
        path = uri_to_local_path(jobs)
        try:
            return sorted(e for e in os.listdir(path) if os.path.isdir(os.path.join(path, e)))
        except FileNotFoundError:
            return []
    bucket, _, prefix = jobs[len("gs://") :].partition("/")
    prefix = prefix.rstrip("/") + "/"
    iterator = storage.client.list_blobs(bucket, prefix=prefix, delimiter="/")  # type: ignore[attr-defined]
    for _page in iterator.pages:
        pass
    return sorted(p[len(prefix) :].strip("/") for p in iterator.prefixes)


def read_json_object(storage: Storage, uri: str) -> dict[str, Any] | None:
    """A JSON object stored at ``uri``; None when absent, empty, not JSON or not an object, or
    larger or deeper than anything kinetic-airflow writes (``Storage.read_json_or_none``)."""
    try:
        value = storage.read_json_or_none(uri)
    except UnreadableObject as exc:
        log.warning("ignoring %s", exc)
        return None
    return value if isinstance(value, dict) else None


@dataclass
class JobInfo:
    """What storage (and the backend) say about one job."""

    job_id: str
    job_uri: str
    record: dict[str, Any] | None = None
    manifest: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    markers: dict[str, dict[str, Any]] = field(default_factory=dict)
    backend_state: str | None = None  # JobState value, when the backend was asked
    backend_message: str = ""

    @property
    def ref(self) -> JobRef | None:
        """The job's reference from ``job.json``; None without one, or with one that cannot be
        read (the job is then listed from its manifest, as a job from before ``job.json``)."""
        data = (self.record or {}).get("job")
        if data is None:
            return None
        try:
            return JobRef.from_dict(data)
        except JobRefError as exc:
            log.warning("ignoring the job record of %s: %s", self.job_uri, exc)
            return None

    @property
    def identity(self) -> JobIdentity | None:
        ref = self.ref
        if ref is not None and ref.identity is not None:
            return ref.identity
        data = (self.manifest or {}).get("identity")
        if not data:
            return None
        try:  # the manifest is in job storage: a forged one must not stop the listing or gc
            identity = JobIdentity.from_dict(data)
        except (TypeError, AttributeError):
            identity = None
        ints = (identity.map_index, identity.try_number, identity.attempt) if identity else ()
        strs = (identity.dag_id, identity.run_id, identity.task_id, identity.try_id) if identity else ()
        if identity is None or not all(type(v) is int for v in ints) or not all(type(v) is str for v in strs):
            log.warning("ignoring the malformed identity in the manifest of %s", self.job_uri)
            return None
        return identity

    @property
    def backend(self) -> str:
        ref = self.ref
        return (ref.backend if ref else None) or (self.manifest or {}).get("backend") or "?"

    @property
    def accelerator(self) -> str:
        ref = self.ref
        if ref is None:
            return "?"
        return ref.accelerator or ("cpu" if ref.backend == "local" else "?")

    @property
    def created(self) -> float | None:
        for value in (
            (self.record or {}).get("created"),
            (self.manifest or {}).get("created"),
            (self.markers.get("dispatched") or {}).get("time"),
        ):
            if value:
                return float(value)
        return None

    @property
    def last_activity(self) -> float | None:
        """The newest time any party recorded for the job (its age for retention)."""
        times = [t for t in (self.created,) if t]
        times += [float(m["time"]) for m in self.markers.values() if isinstance(m.get("time"), (int, float))]
        return max(times) if times else None

    @property
    def cancelled(self) -> dict[str, Any] | None:
        return self.markers.get("cancelled")

    @property
    def state(self) -> JobStatus:
        """What the job is (``kinetic_airflow.job.states``): its result, a cancellation, its backend."""
        return status_of(
            ok=bool(self.summary.get("ok")) if self.summary is not None else None,
            # who stopped it, and whether its worker failed (then: failed, as the view says)
            cancelled=Cancellation.from_dict(self.cancelled) or self.cancelled is not None,
            backend_state=self.backend_state,
            started=any(name.startswith("started") for name in self.markers),
            finished=any(name.startswith("finished") for name in self.markers),
            shipped=self.manifest is not None,
        )

    @property
    def task_instance(self) -> str:
        identity = self.identity
        if identity is None:
            return "?"
        index = f"[{identity.map_index}]" if identity.map_index >= 0 else ""
        return f"{identity.dag_id}/{identity.run_id}/{identity.task_id}{index}"


def load_job(storage: Storage, job_uri: str) -> JobInfo:
    """Read a job's record, manifest, result summary and markers (no user objects)."""
    job_uri = job_uri.rstrip("/")
    layout = JobLayout(job_uri)
    info = JobInfo(job_id=job_uri.rsplit("/", 1)[-1], job_uri=job_uri)
    info.record = read_json_object(storage, record_uri(job_uri))
    info.manifest = read_json_object(storage, layout.manifest)
    info.summary = user_summary(read_json_object(storage, layout.result_summary()))
    for uri in storage.list(join_uri(job_uri, "status")):
        name = uri.rsplit("/", 1)[-1]
        if name.endswith(".json"):
            marker = read_json_object(storage, uri)
            if marker is not None:
                info.markers[name[: -len(".json")]] = marker
    return info
