"""Where a job's files live under the base URI, and how a job is named.

Every party (worker, trigger, runner, backends) derives paths from here so the
layout is written down once::

    {base}/jobs/{job_id}/manifest.json      runner settings + payload digest + client fingerprint
    {base}/jobs/{job_id}/payload.pkl        cloudpickle of callable, args, kwargs, env
    {base}/jobs/{job_id}/result.pkl         result envelope (cloudpickle)
    {base}/jobs/{job_id}/result.json        the envelope's JSON summary (no user objects)
    {base}/jobs/{job_id}/status/*.json      dispatched / started / heartbeat / finished
    {base}/jobs/{job_id}/job.log            the job's log (local backend)
    {base}/jobs/{job_id}/job.json           the job's record (the jobs CLI, gc: ``jobstore``)
    {base}/jobs/{job_id}/usage.json         chips x time of the attempt (``usage``; ``jobs show``)
    {base}/jobs/{job_id}/metrics/h{h}-{n}.json  points kinetic_airflow.report() buffered (``job.metrics``)
    {base}/outputs/{dag}/{run}/{task}/{map} KINETIC_OUTPUT_DIR: the same for every try
    {base}/cache/{sha256}/...               content-addressed volume uploads

A local job's own state directory (``local_dir``: the worker machine's pid, exit code and
log; ``backends/local``) and ``kinetic-airflow reproduce``'s local copy of a job use the
same names (``LOCAL_STATE_FILES`` and the ``*_NAME`` constants below).
    /kinetic/fuse/{sha256(uri)[:12]}        in the pod: where ``Data(uri, fuse=True)`` is mounted

Job identity is deterministic from the task instance, its try (number and Airflow's
per-try id) and the attempt within the try, so a second ``execute`` of the same try
re-finds the job instead of making another.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

from kinetic_airflow.job.storage import join_uri

__all__ = [
    "CANCEL_NAME",
    "EXIT_NAME",
    "JOB_PREFIX",
    "LAUNCH_NAME",
    "LOCAL_STATE_FILES",
    "LOG_NAME",
    "LWS_PREFIX",
    "MANIFEST_NAME",
    "MAX_JOB_ID",
    "METRICS_DIR",
    "PAYLOAD_NAME",
    "RECORD_NAME",
    "RESULT_NAME",
    "STATE_KEY",
    "SUMMARY_NAME",
    "SUPERVISOR_LOG_NAME",
    "USAGE_NAME",
    "JobIdentity",
    "JobLayout",
    "NameTooLongError",
    "check_derived_names",
    "derived_names",
    "dns_label",
    "output_dir_uri",
]

# The task_state_store key under which a task instance's current job reference is kept.
STATE_KEY = "kinetic_job"

# The name budget, in one place. Every object a real cluster derives from a job's name must
# fit the 63 characters of a DNS label / label value:
#
# * batch/v1 Job "kinetic-{id}": its pods "kinetic-{id}-xxxxx" and the Job controller's
#   ``job-name`` / ``batch.kubernetes.io/job-name`` pod labels (a label value: <= 63).
# * LeaderWorkerSet "keras-pathways-{id}" (kinetic's names, so its tools find the jobs): the LWS
#   controller (kubernetes-sigs/lws) makes a leader StatefulSet named like the LWS and a worker
#   StatefulSet "<lws>-<group>" per group; the StatefulSet controller labels each pod
#   ``controller-revision-hash=<statefulset>-<hash>`` with a hash of up to 10 characters. So the
#   tightest value is "<lws>-0-<hash10>" (one group: index 0), which leaves 35 for the job id. A
#   longer name is not refused when submitted: its pods are just never created.
LABEL_VALUE_MAX = 63
JOB_PREFIX = "kinetic-"
LWS_PREFIX = "keras-pathways-"
JOB_POD_SUFFIX = "-xxxxx"  # the Job controller's generateName suffix (5 random characters)
REVISION_HASH = "h" * 10  # StatefulSet controller-revision-hash suffix, longest form
LWS_GROUPS = 1  # one group (one slice) per LeaderWorkerSet: group index "0"
_MAX_JOB_ID = LABEL_VALUE_MAX - len(LWS_PREFIX) - len(f"-{LWS_GROUPS - 1}-{REVISION_HASH}")
MAX_JOB_ID = _MAX_JOB_ID


class NameTooLongError(ValueError):
    """A name a cluster would derive from a job is longer than Kubernetes allows."""


def derived_names(job_id: str, hosts: int = 1) -> dict[str, str]:
    """Every name and label value a real cluster derives from ``job_id``, on every backend, each
    held to 63 characters. Backends build their names from the same prefixes."""
    job = f"{JOB_PREFIX}{job_id}"
    lws = f"{LWS_PREFIX}{job_id}"
    group = LWS_GROUPS - 1
    last_worker = max(hosts, 2) - 1
    return {
        "job-id label": job_id,
        "Job name": job,
        "Job pod name (generateName + 5)": f"{job}{JOB_POD_SUFFIX}",
        "Job pod label job-name": job,
        "LeaderWorkerSet name / headless Service / pod subdomain": lws,
        "leader StatefulSet pods' controller-revision-hash": f"{lws}-{REVISION_HASH}",
        "leader pod name / hostname": f"{lws}-{group}",
        "worker StatefulSet name": f"{lws}-{group}",
        "worker StatefulSet pods' controller-revision-hash": f"{lws}-{group}-{REVISION_HASH}",
        "worker pod name / hostname": f"{lws}-{group}-{last_worker}",
        "LWS group-key source (leader name)": f"{lws}-{group}",
    }


def check_derived_names(job_id: str, hosts: int = 1) -> None:
    """Raise ``NameTooLongError`` naming each derived object whose name would not fit."""
    too_long = {
        what: name for what, name in derived_names(job_id, hosts).items() if len(name) > LABEL_VALUE_MAX
    }
    if too_long:
        listed = "; ".join(f"{what} {name!r} ({len(name)} characters)" for what, name in too_long.items())
        raise NameTooLongError(
            f"job id {job_id!r} gives Kubernetes names over {LABEL_VALUE_MAX} characters: {listed}. "
            f"Job ids are at most {MAX_JOB_ID} characters (kinetic_airflow.job.layout.MAX_JOB_ID)."
        )


def dns_label(text: str, limit: int) -> str:
    """Lowercase DNS-1123 label fragment: [a-z0-9-], no leading/trailing dash."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:limit].strip("-") or "x"


def _path_part(text: str) -> str:
    """A readable, filesystem- and GCS-safe path segment (run ids contain ':' and '+')."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", text) or "_"


@dataclass(frozen=True)
class JobIdentity:
    """Which task instance, try and attempt a job belongs to."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1
    try_number: int = 1
    attempt: int = 1
    # Airflow's id of the try (``ti.id``, new for every try and for a recreated DAG run): a
    # recreated run's try 1 must not meet the job files of the deleted run's try 1.
    try_id: str = ""

    @property
    def ti_key(self) -> str:
        return f"{self.dag_id}/{self.run_id}/{self.task_id}/{self.map_index}"

    @property
    def job_id(self) -> str:
        parts: list[Any] = [self.dag_id, self.run_id, self.task_id, self.map_index, self.try_number]
        parts.append(self.attempt)
        if self.try_id:
            parts.append(self.try_id)
        digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:10]
        suffix = f"-{digest}-t{self.try_number}a{self.attempt}"
        if len(suffix) > _MAX_JOB_ID - 2:  # absurd try/attempt numbers: the digest still has them
            suffix = f"-{digest}"
        head = dns_label(f"{self.dag_id}-{self.task_id}", _MAX_JOB_ID - len(suffix))
        return f"{head}{suffix}"

    def labels(self) -> dict[str, str]:
        """Kubernetes-label-safe values naming the owner task instance."""
        return {
            "app": "kinetic",
            "job-id": self.job_id,
            "kinetic.airflow/dag-id": dns_label(self.dag_id, 63),
            "kinetic.airflow/task-id": dns_label(self.task_id, 63),
            "kinetic.airflow/run-id": hashlib.sha256(self.run_id.encode()).hexdigest()[:16],
            # label values must start with an alphanumeric character: "-1" is not allowed
            "kinetic.airflow/map-index": str(self.map_index) if self.map_index >= 0 else "none",
            "kinetic.airflow/try-number": str(self.try_number),
            "kinetic.airflow/attempt": str(self.attempt),
            "kinetic.airflow/ti": hashlib.sha256(self.ti_key.encode()).hexdigest()[:32],
        }

    def next_attempt(self) -> JobIdentity:
        return replace(self, attempt=self.attempt + 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobIdentity:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def output_dir_uri(base_uri: str, identity: JobIdentity) -> str:
    """Stable per task instance (not per try): training resumes from checkpoints on retry."""
    return join_uri(
        base_uri,
        "outputs",
        _path_part(identity.dag_id),
        _path_part(identity.run_id),
        _path_part(identity.task_id),
        str(identity.map_index),
    )


MANIFEST_NAME = "manifest.json"
PAYLOAD_NAME = "payload.pkl"
RESULT_NAME = "result.pkl"
SUMMARY_NAME = "result.json"
LOG_NAME = "job.log"
RECORD_NAME = "job.json"
USAGE_NAME = "usage.json"
METRICS_DIR = "metrics"
# A local job's state directory: the launch (pid), the exit record, a cancel request, the supervisor's log.
LAUNCH_NAME = "launch.json"
EXIT_NAME = "exit.json"
CANCEL_NAME = "cancel.json"
SUPERVISOR_LOG_NAME = "supervisor.log"
LOCAL_STATE_FILES = (LAUNCH_NAME, EXIT_NAME, CANCEL_NAME, LOG_NAME, SUPERVISOR_LOG_NAME)


@dataclass(frozen=True)
class JobLayout:
    """URIs of one job's files."""

    job_uri: str

    @classmethod
    def for_job(cls, base_uri: str, job_id: str) -> JobLayout:
        return cls(join_uri(base_uri, "jobs", job_id))

    @property
    def manifest(self) -> str:
        return join_uri(self.job_uri, MANIFEST_NAME)

    @property
    def payload(self) -> str:
        return join_uri(self.job_uri, PAYLOAD_NAME)

    def result(self, host: int = 0) -> str:
        return join_uri(self.job_uri, RESULT_NAME if host == 0 else f"result-host{host}.pkl")

    def result_summary(self, host: int = 0) -> str:
        return join_uri(self.job_uri, SUMMARY_NAME if host == 0 else f"result-host{host}.json")

    def status(self, marker: str, host: int = 0) -> str:
        name = marker if host == 0 else f"{marker}-host{host}"
        return join_uri(self.job_uri, "status", f"{name}.json")

    @property
    def log(self) -> str:
        return join_uri(self.job_uri, LOG_NAME)

    @property
    def record(self) -> str:
        return join_uri(self.job_uri, RECORD_NAME)

    @property
    def usage(self) -> str:
        return join_uri(self.job_uri, USAGE_NAME)

    @property
    def metrics_prefix(self) -> str:
        return join_uri(self.job_uri, METRICS_DIR)

    def metrics_chunk(self, seq: int, host: int = 0) -> str:
        """One flush of the runner's metrics buffer: written once, never rewritten (zero-padded so
        a listing sorts in write order)."""
        return join_uri(self.job_uri, METRICS_DIR, f"h{host}-{seq:06d}.json")


# In the pod: a gcsfuse volume of ``Data(uri, fuse=True)`` (the GKE backend mounts it, the runner
# finds it; both derive the path from the URI here).
FUSE_ROOT = "/kinetic/fuse"


def fuse_mount_path(uri: str) -> str:
    """Where ``Data(uri, fuse=True)``'s mount is in the pod (both sides derive it from the URI)."""
    return f"{FUSE_ROOT}/{hashlib.sha256(uri.encode()).hexdigest()[:12]}"


def fuse_points_at_file(uri: str) -> bool:
    """A URI ending in ``/``, or whose last part has no extension, is a folder; else a file
    (whose folder is mounted, so the file is at ``mount/<name>``)."""
    last = uri.rstrip("/").rsplit("/", 1)[-1]
    return not uri.endswith("/") and "." in last.lstrip(".")


def fuse_local_path(uri: str) -> str:
    """What the function receives for ``Data(uri, fuse=True)`` on a cluster."""
    mount = fuse_mount_path(uri)
    return f"{mount}/{uri.rstrip('/').rsplit('/', 1)[-1]}" if fuse_points_at_file(uri) else mount
