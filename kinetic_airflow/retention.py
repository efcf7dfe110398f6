"""``kinetic-airflow gc``: delete old job files, and find (and on request delete) orphaned jobs.

What goes: ``{base}/jobs/{job_id}/`` of jobs whose last activity (record, markers) is older
than ``--older-than`` (default ``[kinetic] retention_days``), with the job's keras-kinetic
interop files (``{bucket}/{job_id}/``) and its local state (local jobs' pid/exit/log files,
log cursors). What stays, whatever its age:

* a live job's files: a job without an outcome whose process or pod still exists, or whose
  state cannot be told (no ``job.json`` and no outcome);
* a result a task instance still needs: any job whose ``result.pkl`` an XCom references
  (large results stay in storage and XCom holds a reference; a downstream task or a person
  loads it later), and every job of a task instance that is not finished (queued, running,
  deferred, up for retry...: a retry after an infrastructure failure returns the finished
  job's result instead of running again);
* ``KINETIC_OUTPUT_DIR`` contents (checkpoints, artifacts), unless ``--include-outputs``: then a
  task instance's output directory goes too once none of its jobs stays;
* ``cache/`` (content-addressed uploads that any later job may reuse).

Job storage is writable by more identities than Airflow (every job, CI, people), and gc does not
hold the keys that authenticate a job's manifest. So no path it deletes is taken from a stored
file: the job's directory is the one the listing found, its output directory is derived from
its identity (whose hash must be that directory's name: the layout the worker wrote) and its local
state from its job id; each is normalised (``..``, symlinks) and must lie under the store's own
``jobs/`` or ``outputs/`` prefix (or the local state root). A path that fails is refused, kept,
and reported with the reason.

XCom references and task-instance states come from Airflow's metadata DB (where
``airflow db clean`` runs, so does this); ``--skip-airflow-checks`` does without them and
keeps every job that succeeded (its result might be referenced).

Orphans are kinetic-airflow Jobs and LeaderWorkerSets still holding a pod whose task
instance no longer runs (it finished, was deleted, or moved on to a newer try): a worker
that died mid-submit, a cancel that could not reach the cluster. ``--delete-orphans`` marks
them cancelled (as ``on_kill`` does) and deletes them with their pods.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

from kinetic_airflow.backends.gke.cluster_objects import ClusterSnapshot, snapshot_key
from kinetic_airflow.backends.registry import backend_states
from kinetic_airflow.config import local_state_root
from kinetic_airflow.connections import storage_for
from kinetic_airflow.job.interop import interop_prefix
from kinetic_airflow.job.layout import output_dir_uri
from kinetic_airflow.job.states import JobStatus
from kinetic_airflow.job.storage import FileStorage, Storage, StorageError, join_uri, uri_to_local_path
from kinetic_airflow.jobstore import JobInfo, list_job_ids, load_job
from kinetic_airflow.lifecycle import _marker

__all__ = ["GcPlan", "apply_plan", "find_orphans", "make_plan", "parse_age"]

log = logging.getLogger(__name__)

REF_KEY = "__kinetic_result_ref__"
ACTIVE_TI_STATES = {
    None,
    "scheduled",
    "queued",
    "running",
    "restarting",
    "up_for_retry",
    "up_for_reschedule",
    "deferred",
    "awaiting_input",
}
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "": 86400}


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``2w`` (a bare number is days) -> seconds."""
    match = _AGE.match(str(text))
    if not match:
        raise ValueError(
            f"--older-than {text!r} is not an age: write a number and a unit, e.g. 30d, 12h, 90m, 2w "
            "(a bare number is days)"
        )
    return float(match.group(1)) * _UNIT[match.group(2)]


# What Airflow says --------------------------------------------------------------------------
@dataclass
class AirflowFacts:
    """Task-instance states and XCom result references, from the metadata DB."""

    ti_states: dict[tuple[str, str, str, int], tuple[str | None, int]] = field(default_factory=dict)
    referenced: dict[str, str] = field(default_factory=dict)  # result URI -> which XCom
    available: bool = True
    # A custom XCom backend that serializes values itself may keep them outside the metadata
    # DB (object storage), where a reference cannot be seen: then no succeeded job may go.
    xcom_elsewhere: str | None = None

    def ti(self, ti_key: str) -> tuple[str | None, int] | None:
        dag_id, run_id, rest = ti_key.split("/", 2)
        task_id, _, map_index = rest.rpartition("/")
        return self.ti_states.get((dag_id, run_id, task_id, int(map_index)))


_RESULT_URI = re.compile(r"(?:gs|file)://[^\s'\"\\]+?/result\.pkl")


def _refs_in(value: Any, depth: int = 0) -> list[str]:
    """Result URIs a stored XCom value references, in any form it was stored in: the JSON
    object, the JSON text of it (``XComModel.set`` encodes it again), nested in other values,
    or inside text that is not JSON at all (a repr): there, anything that names a result."""
    if isinstance(value, str):
        if REF_KEY not in value:
            return []
        try:
            decoded = json.loads(value)
        except ValueError:
            return _RESULT_URI.findall(value)
        return _refs_in(decoded, depth + 1) if depth < 4 else _RESULT_URI.findall(value)
    if isinstance(value, dict):
        found = [value[REF_KEY]] if isinstance(value.get(REF_KEY), str) else []
        return found + [u for v in value.values() for u in _refs_in(v, depth)]
    if isinstance(value, list):
        return [u for v in value for u in _refs_in(v, depth)]
    return []


def _xcom_stored_elsewhere() -> str | None:
    """The configured XCom backend, if it serializes values itself (and so may store them
    outside the ``xcom`` table, as common.io's object-storage backend does past its threshold)."""
    # Airflow start-up cost: only when gc asks the metadata DB (not for --help).
    from airflow.configuration import conf
    from airflow.sdk.bases.xcom import BaseXCom

    backend = conf.getimport("core", "xcom_backend", fallback=None)
    if backend is None or backend is BaseXCom:
        return None
    if getattr(backend, "serialize_value", None) is getattr(BaseXCom, "serialize_value", None):
        return None  # a subclass that stores what BaseXCom stores: in the table gc reads
    return f"{backend.__module__}.{backend.__qualname__}"


def airflow_facts(dag_ids: set[str]) -> AirflowFacts:
    # Airflow start-up cost: only when gc asks the metadata DB (not for --help).
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import String, cast, select

    facts = AirflowFacts(xcom_elsewhere=_xcom_stored_elsewhere())
    with create_session() as session:
        if dag_ids:
            rows = session.execute(
                select(
                    TaskInstance.dag_id,
                    TaskInstance.run_id,
                    TaskInstance.task_id,
                    TaskInstance.map_index,
                    TaskInstance.state,
                    TaskInstance.try_number,
                ).where(TaskInstance.dag_id.in_(sorted(dag_ids)))
            )
            for dag_id, run_id, task_id, map_index, state, try_number in rows:
                state = getattr(state, "value", state)
                facts.ti_states[(dag_id, run_id, task_id, int(map_index))] = (state, int(try_number or 0))
        rows = session.execute(
            select(
                XComModel.dag_id, XComModel.run_id, XComModel.task_id, XComModel.key, XComModel.value
            ).where(cast(XComModel.value, String).like(f"%{REF_KEY}%"))
        )
        for dag_id, run_id, task_id, key, value in rows:
            for uri in _refs_in(value):
                facts.referenced.setdefault(uri, f"XCom {key!r} of {dag_id}/{run_id}/{task_id}")
    return facts


# The plan -----------------------------------------------------------------------------------
@dataclass
class JobVerdict:
    """What gc does with one job's files, and why (not lifecycle.Decision: that is the operator's)."""

    info: JobInfo
    delete: bool
    reason: str


@dataclass
class Orphan:
    obj: Any  # cluster_objects.ClusterObject
    snapshot: Any
    reason: str


@dataclass
class GcPlan:
    base_uri: str
    older_than: float
    jobs: list[JobVerdict] = field(default_factory=list)
    outputs: list[tuple[str, str]] = field(default_factory=list)  # (output dir URI, why)
    # Paths a job's files named or led to that lie outside the store's own prefixes: never deleted.
    refused: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    orphans: list[Orphan] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def to_delete(self) -> list[JobVerdict]:
        return [d for d in self.jobs if d.delete]


def _verdict(info: JobInfo, facts: AirflowFacts | None, cutoff: float) -> JobVerdict:
    # Liveness first: a live job is kept whatever its age (a quiet long job may look old).
    if info.state.live:
        return JobVerdict(info, False, f"live ({info.state}): its files are in use")
    if info.state is JobStatus.UNKNOWN:
        return JobVerdict(info, False, "no job.json and no outcome: cannot tell whether it still runs")
    last = info.last_activity
    if last is None:
        return JobVerdict(info, False, "no timestamps in its files: kept")
    if last > cutoff:
        return JobVerdict(info, False, "newer than the cutoff")
    layout_results = [u for u in facts.referenced if u.startswith(info.job_uri + "/")] if facts else []
    if layout_results:
        return JobVerdict(info, False, f"its result is referenced by {facts.referenced[layout_results[0]]}")
    if facts is not None and facts.xcom_elsewhere and info.state is JobStatus.SUCCEEDED:
        return JobVerdict(
            info,
            False,
            f"succeeded, and XCom values are stored by {facts.xcom_elsewhere}, where gc cannot look "
            "for references to its result",
        )
    identity = info.identity
    if facts is None:
        if info.state is JobStatus.SUCCEEDED:
            return JobVerdict(info, False, "succeeded, and without Airflow's DB its result may be referenced")
    elif identity is not None:
        ti = facts.ti(identity.ti_key)
        if ti is not None and ti[0] in ACTIVE_TI_STATES:
            return JobVerdict(info, False, f"its task instance is {ti[0] or 'not yet scheduled'}")
    return JobVerdict(info, True, f"{info.state}, last activity {_days(time.time() - last)} ago")


def _days(seconds: float) -> str:
    return f"{seconds / 86400:.1f}d" if seconds >= 86400 else f"{seconds / 3600:.1f}h"


def make_plan(
    storage: Storage,
    base_uri: str,
    older_than: float,
    *,
    facts: AirflowFacts | None,
    include_outputs: bool = False,
    clusters: list[tuple[dict[str, Any], str]] | None = None,
    orphan_grace: float = 600.0,
    now: float | None = None,
) -> GcPlan:
    now = time.time() if now is None else now
    plan = GcPlan(base_uri=base_uri, older_than=older_than)
    infos = [
        load_job(storage, join_uri(base_uri, "jobs", job_id)) for job_id in list_job_ids(storage, base_uri)
    ]
    backend_states(infos)
    if facts is not None and not facts.ti_states and infos:
        dag_ids = {i.identity.dag_id for i in infos if i.identity}
        facts.ti_states = airflow_facts(dag_ids).ti_states if dag_ids else {}
    cutoff = now - older_than
    plan.jobs = [_verdict(info, facts, cutoff) for info in infos]
    for decision in plan.to_delete:
        why = _outside_store(base_uri, "jobs", decision.info.job_uri)
        if why:
            decision.delete, decision.reason = False, f"refused: {why}"
            plan.refused.append((decision.info.job_uri, why))
    if facts is not None and facts.xcom_elsewhere:
        plan.notes.append(
            f"[core] xcom_backend is {facts.xcom_elsewhere}: XCom values may live outside the metadata "
            "DB, so every succeeded job is kept (its result may be referenced)"
        )
    if include_outputs:
        plan.outputs = _outputs_to_delete(storage, base_uri, plan, facts)
    plan.orphans = find_orphans(infos, facts, clusters or [], orphan_grace, now, plan.notes)
    return plan


def _outputs_to_delete(
    storage: Storage, base_uri: str, plan: GcPlan, facts: AirflowFacts | None
) -> list[tuple[str, str]]:
    """Output dirs (under the base URI) of task instances none of whose jobs stays.

    The directory is derived from the job's identity, never read from its manifest (which a
    bucket writer can change: gc does not hold the key that authenticates it). The identity
    counts only if it hashes to the job's own directory name, and the directory it gives must
    lie under ``{base}/outputs/`` once normalised; a manifest naming another directory under
    ``outputs/`` is refused and reported, one naming a directory elsewhere is the user's own
    ``output_dir`` and left alone."""
    kept_tis = {d.info.identity.ti_key for d in plan.jobs if not d.delete and d.info.identity}
    outputs_root = join_uri(base_uri, "outputs")
    out: dict[str, str] = {}
    for decision in plan.to_delete:
        info = decision.info
        identity = info.identity
        named = (info.manifest or {}).get("output_dir")
        if identity is None or not named or identity.ti_key in kept_tis:
            continue
        if not isinstance(named, str):
            plan.refused.append((repr(named)[:200], f"the manifest of {info.job_id} names no path"))
            continue
        if not _textually_under(named, outputs_root):
            continue  # a user-given output_dir is the user's
        if identity.job_id != info.job_id:
            plan.refused.append(
                (named, f"the identity in {info.job_id}'s files is not this job's (it names job "
                 f"{identity.job_id}): its output directory is not derived from it")
            )  # fmt: skip
            continue
        derived = output_dir_uri(base_uri, identity)
        why = _outside_store(base_uri, "outputs", derived)
        if why:
            plan.refused.append((derived, why))
            continue
        if named.rstrip("/") != derived:
            plan.refused.append(
                (named, f"the manifest of {info.job_id} names it, but its task instance's output "
                 f"directory is {derived}: not deleted")
            )  # fmt: skip
            continue
        if facts is not None:
            ti = facts.ti(identity.ti_key)
            if ti is not None and ti[0] in ACTIVE_TI_STATES:
                continue
        out[derived] = f"KINETIC_OUTPUT_DIR of {identity.ti_key} (none of its jobs stays)"
    return sorted(out.items())


def _textually_under(uri: str, root: str) -> bool:
    return uri.startswith(root.rstrip("/") + "/")


def _outside_store(base_uri: str, prefix: str, uri: str) -> str | None:
    """Why ``uri`` is not a proper sub-path of ``{base_uri}/{prefix}/`` once normalised, or None.

    ``file://``: ``..`` segments and symlinks resolved (``realpath``) on both sides. ``gs://``:
    object names are literal, but a name with ``.``/``..``/empty segments or another bucket is
    refused all the same (a tool copying the store to disk would resolve them)."""
    root = join_uri(base_uri, prefix)
    if uri.startswith("gs://") and root.startswith("gs://"):
        parts = uri[len("gs://") :].split("/")
        if any(p in ("", ".", "..") for p in parts[1:]):
            return f"{uri} has '.', '..' or empty segments: it is not a path gc made"
        if not _textually_under(uri, root):
            return f"{uri} is not under the job store's {root}/"
        return None
    if uri.startswith("gs://") or root.startswith("gs://"):
        return f"{uri} is not under the job store's {root}/"
    try:
        path, top = uri_to_local_path(uri), uri_to_local_path(root)
    except StorageError as exc:
        return str(exc)
    real, real_top = os.path.realpath(path), os.path.realpath(top)
    if os.path.commonpath([real, real_top]) != real_top or real == real_top:
        return f"{uri} resolves to {real}, outside the job store's {real_top}/"
    return None


def find_orphans(
    infos: list[JobInfo],
    facts: AirflowFacts | None,
    clusters: list[tuple[dict[str, Any], str]],
    grace: float,
    now: float,
    notes: list[str],
) -> list[Orphan]:
    """kinetic-airflow cluster objects holding pods for a task instance that no longer runs."""
    if facts is None:
        return []
    seen: dict[str, tuple[dict[str, Any], str]] = {}
    for cluster, namespace in clusters:
        seen.setdefault(snapshot_key(cluster, namespace), (cluster, namespace))
    for info in infos:
        ref = info.ref
        k8s = ref.k8s if ref is not None else None
        if k8s is not None and k8s.cluster:
            seen.setdefault(snapshot_key(k8s.cluster, k8s.namespace), (k8s.cluster, k8s.namespace))
    orphans: list[Orphan] = []
    for cluster, namespace in seen.values():
        try:
            snapshot = ClusterSnapshot(cluster, namespace)
        except Exception as exc:
            notes.append(f"could not list kinetic's objects in namespace {namespace}: {exc}")
            continue
        dag_ids = {o.task_instance.split("/", 1)[0] for o in snapshot.objects.values() if o.task_instance}
        missing = dag_ids - {k[0] for k in facts.ti_states}
        if missing:
            facts.ti_states.update(airflow_facts(missing).ti_states)
        for obj in snapshot.objects.values():
            reason = _orphan_reason(obj, facts, grace, now)
            if reason:
                orphans.append(Orphan(obj, snapshot, reason))
    return orphans


def _created(obj: Any) -> float | None:
    try:
        return datetime.datetime.fromisoformat(obj.created.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _orphan_reason(obj: Any, facts: AirflowFacts, grace: float, now: float) -> str | None:
    if not obj.ours or not obj.task_instance:
        return None  # keras-kinetic's own jobs are kinetic's business
    holds_pods = obj.status.state.value in ("pending", "running") or (
        obj.kind == "LeaderWorkerSet" and any(p.get("status", {}).get("phase") != "Failed" for p in obj.pods)
    )
    if not holds_pods:
        return None  # a finished Job holds nothing; its TTL removes it
    created = _created(obj)
    if created is not None and now - created < grace:
        return None  # its task instance may not show it yet (a try just starting)
    ti = facts.ti(obj.task_instance)
    if ti is None:
        return f"no task instance {obj.task_instance} in Airflow (deleted run or DAG)"
    state, try_number = ti
    if state not in ACTIVE_TI_STATES:
        return f"its task instance {obj.task_instance} is {state}"
    if try_number > obj.try_number:
        return f"its task instance {obj.task_instance} is on try {try_number}, this is try {obj.try_number}"
    return None


# Doing it -----------------------------------------------------------------------------------
def _delete_prefix(storage: Storage, uri: str) -> None:
    if isinstance(storage, FileStorage):
        shutil.rmtree(uri_to_local_path(uri), ignore_errors=True)
        return
    bucket, _, prefix = uri[len("gs://") :].partition("/")
    client = storage.client  # type: ignore[attr-defined]
    blobs = list(client.list_blobs(bucket, prefix=prefix.rstrip("/") + "/"))
    for blob in blobs:
        try:
            blob.delete()
        except Exception as exc:  # already gone (another gc, kinetic's cleanup)
            if "404" not in str(exc) and "Not Found" not in str(exc):
                raise


def _local_inside(path: str, root: str) -> bool:
    real = os.path.realpath(path)
    return real != root and os.path.commonpath([real, root]) == root


def apply_plan(storage: Storage, plan: GcPlan, *, delete_orphans: bool) -> dict[str, int]:
    done = {"jobs": 0, "outputs": 0, "orphans": 0}
    root = os.path.realpath(local_state_root())
    for decision in plan.to_delete:
        info = decision.info
        _delete_prefix(storage, info.job_uri)
        prefix = interop_prefix(plan.base_uri, info.job_id)
        if prefix:
            _delete_prefix(storage, prefix)
        # The local state directory the operator gives a job (``{root}/{job_id}``), never the one
        # job.json names: that file is in job storage, where anyone with write access can edit it.
        local_dir = os.path.join(root, info.job_id)
        if os.path.isdir(local_dir) and _local_inside(local_dir, root):
            shutil.rmtree(local_dir, ignore_errors=True)
        cursors = os.path.join(root, "log-cursors")
        if os.path.isdir(cursors):
            for name in os.listdir(cursors):
                if name.startswith(info.job_id + "-"):
                    os.unlink(os.path.join(cursors, name))
        done["jobs"] += 1
    for uri, _ in plan.outputs:
        if _outside_store(plan.base_uri, "outputs", uri):
            continue  # make_plan refused it already; a plan built elsewhere gets the same check
        _delete_prefix(storage, uri)
        done["outputs"] += 1
    if delete_orphans:
        for orphan in plan.orphans:
            _stop_orphan(orphan)
            done["orphans"] += 1
    return done


def _stop_orphan(orphan: Orphan) -> None:
    """Mark it cancelled (so a watcher or a later try sees why) and delete it with its pods."""
    job_uri = orphan.obj.annotations.get("kinetic.airflow/job-uri")
    if job_uri:
        try:
            storage_for(job_uri).write_text(
                f"{job_uri}/status/cancelled.json",
                _marker("kinetic-airflow gc --delete-orphans", orphan.reason),
            )
        except Exception as exc:
            log.warning("could not mark %s cancelled: %s", orphan.obj.name, exc)
    orphan.snapshot.delete(orphan.obj)
