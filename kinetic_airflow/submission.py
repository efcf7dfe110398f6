"""Submitting a task's job: the settings it goes with, the checks before it, what it publishes
and what it ships. The operator decides *when* (``lifecycle``); this module does each step, on
values resolved once (``Target``) and the task's public, rendered fields.

``preflight``: what ``execute`` checks and prepares after templates are rendered, before any
job exists. Parse time checks what the DAG file states (``options``); some of it is only
known when the task runs: a templated accelerator, the configured backend and base URI, the
DAG file's folder for relative ``Data`` paths, the context values the function names.
Everything there runs before the job record is written, so a mistake found there creates
nothing.

``publish_job``: the job's record in job storage (``job.json``: the jobs CLI and gc find
any job from storage alone) and keras-kinetic's handle, before the job is created.

``ship_payload``: the payload, the DAG folder's code and ``Data`` inputs, then the manifest
(last: its presence tells the runner the payload is complete).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kinetic_airflow.accelerators import AcceleratorSpec, parse_accelerator
from kinetic_airflow.capacity import Placement, check_placement, placement_of
from kinetic_airflow.config import KineticSettingError, default_base_uri, resolve_setting
from kinetic_airflow.connections import storage_for
from kinetic_airflow.context_args import context_kwargs
from kinetic_airflow.envcapture import capture_env
from kinetic_airflow.job.codebundle import code_roots, ship_code_bundle
from kinetic_airflow.job.envelope import ResultRef, is_result_ref, replace_refs
from kinetic_airflow.job.inputs import Data, data_in
from kinetic_airflow.job.integrity import manifest_text
from kinetic_airflow.job.interop import write_handle
from kinetic_airflow.job.layout import JobIdentity, JobLayout, output_dir_uri
from kinetic_airflow.job.payload import register_dag_modules_by_value, write_payload
from kinetic_airflow.job.ref import JobRef
from kinetic_airflow.job.storage import Storage
from kinetic_airflow.job.tracebacks import user_names
from kinetic_airflow.ladder import check_ladder_backend
from kinetic_airflow.options import check_rendered_options, validate_backend
from kinetic_airflow.validation import callable_name, check_backend_fits, check_base_uri, check_local_volumes

__all__ = [
    "PayloadParts",
    "RenderedTask",
    "Target",
    "check_settings",
    "machine_has",
    "preflight",
    "prepare_payload",
    "publish_job",
    "resolve_backend",
    "resolve_base_uri",
    "resolve_gcp_conn_id",
    "resolve_placement",
    "ship_payload",
    "stage_args",
    "task_spec",
]

log = logging.getLogger(__name__)


class RenderedTask(Protocol):
    """What submission reads of a task: ``KineticRunOperator``'s public fields, rendered."""

    python_callable: Callable[..., Any]
    op_args: Sequence[Any]
    op_kwargs: Mapping[str, Any]
    volumes: Mapping[str, Data]
    accelerator: str
    spot: bool
    backend: str | None
    base_uri: str | None
    project: str | None
    cluster: str | None
    gcp_conn_id: str | None


# Settings ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """Where a task's job goes, resolved once per ``execute`` (task argument > ``[kinetic]`` >
    ``KINETIC_*`` > default): the backend, the job storage and the GCP connection for it, and
    the rendered accelerator parsed (the one parse: the job reference carries this spec)."""

    backend: str
    base_uri: str
    gcp_conn_id: str | None
    spec: AcceleratorSpec


def resolve_backend(backend: str | None, spec: AcceleratorSpec, *, slices: int | None = None) -> str:
    """The backend a job runs on; ``auto`` picks Pathways for a multi-host TPU, else GKE.
    ``slices`` > 1 on pathways / auto is the internal backend ``multislice`` (a JobSet).
    ``spec`` is the task's accelerator, parsed once by the caller (``task_spec``)."""
    name = resolve_setting("backend", backend)
    validate_backend(name)
    if name == "auto":
        name = "pathways" if spec.kind == "tpu" and spec.multi_host else "gke"
    if (slices or 1) > 1:
        from kinetic_airflow.slices import check_slices  # (only for a multislice job)

        check_slices(slices, spec, name)  # the configured backend, too
        name = "multislice"
    return name


def task_spec(op: RenderedTask) -> AcceleratorSpec:
    """The task's rendered accelerator (with ``spot=True`` forcing Spot), parsed: the one parse
    of a run, which ``Target`` and then the job reference carry to the backend."""
    return parse_accelerator(op.accelerator, spot=op.spot or None)


def resolve_base_uri(base_uri: str | None, backend: str, project: str | None, cluster: str | None) -> str:
    base = resolve_setting("base_uri", base_uri)
    if base:
        return base.rstrip("/")
    return default_base_uri(backend, resolve_setting("project", project), resolve_setting("cluster", cluster))


def resolve_gcp_conn_id(gcp_conn_id: str | None) -> str | None:
    return gcp_conn_id or resolve_setting("gcp_conn_id")


_PLACEMENT_SETTINGS = ("capacity", "max_run_duration", "local_queue", "priority_class")


def resolve_placement(op: Any, spec: AcceleratorSpec) -> Placement:
    """The capacity and Kueue queue of a cluster job (task argument > ``[kinetic]`` > default),
    checked with its accelerator; an error names the settings that came from config."""
    values: dict[str, Any] = {}
    configured = []
    for name in _PLACEMENT_SETTINGS:
        given = getattr(op, name, None)
        values[name] = resolve_setting(name, given)
        if given is None and values[name] is not None:
            configured.append(f"[kinetic] {name}")
    placement = placement_of(
        values["capacity"], values["max_run_duration"], values["local_queue"], values["priority_class"]
    )
    check_placement(placement, spec, where="from " + ", ".join(configured) if configured else "")
    return placement


# Before any job exists --------------------------------------------------------------------------
def preflight(op: RenderedTask, context: Any) -> Target:
    """Check the rendered task and resolve where its job goes; adds the context arguments the
    function names to ``op.op_kwargs`` and anchors relative ``Data`` paths at the DAG file."""
    check_rendered_options(op)  # templated options, as rendered: the same table as at parse time
    spec = task_spec(op)  # rendered by now; checked as the option table checks it, parsed once
    backend = resolve_backend(op.backend, spec, slices=getattr(op, "slices", None))
    check_settings(op, backend)
    check_backend_fits(backend, spec)
    check_ladder_backend(getattr(op, "ladder", None), backend)  # [kinetic] backend=local: no ladder
    target = Target(
        backend,
        resolve_base_uri(op.base_uri, backend, op.project, op.cluster),
        resolve_gcp_conn_id(op.gcp_conn_id),
        spec,
    )
    base_uri = target.base_uri
    check_base_uri(base_uri, where="the task's base_uri / [kinetic] base_uri")
    if backend == "local":
        check_local_volumes(op.volumes)
        _warn_without_accelerator(spec)
    else:
        resolve_placement(op, spec)  # a capacity GKE or Kueue would refuse, before any job exists
    dag = context.get("dag")
    dag_file = getattr(dag, "fileloc", None) if dag is not None else None
    if dag_file:
        _anchor_relative_data(op, os.path.dirname(os.path.abspath(dag_file)))
    if base_uri.startswith("gs://"):
        storage_for(base_uri, target.gcp_conn_id)  # credentials are checked here, with how to fix them
    extra = context_kwargs(op.python_callable, op.op_args, op.op_kwargs, context)
    if extra:
        op.op_kwargs = {**extra, **dict(op.op_kwargs)}
    return target


# The settings execute and the wait read, each resolved once here (task argument > [kinetic] >
# KINETIC_* > default) so a configured value that does not parse fails the task before any
# job exists, naming the variable, instead of after the job was submitted.
_RUN_SETTINGS = (
    "poll_interval",
    "heartbeat_seconds",
    "log_max_lines",
    "xcom_max_bytes",
    "wait_before_defer",
    "min_deferral_seconds",
    "resume_margin_seconds",
    "watch_deferring_process",
    "preemption_retries",
    "kinetic_interop",
)
_CLUSTER_SETTINGS = (
    "namespace",
    "startup_timeout",
    "heartbeat_timeout",
    "requirements_cache",
    "queue_timeout",
)


def check_settings(op: RenderedTask, backend: str) -> None:
    """Resolve (and so check) every setting the job will use; cross-check the heartbeat pair."""
    names = _RUN_SETTINGS + (_CLUSTER_SETTINGS if backend != "local" else ())
    values = {name: resolve_setting(name, getattr(op, name, None)) for name in names}
    if backend != "local" and values["heartbeat_seconds"] >= values["heartbeat_timeout"]:
        raise KineticSettingError(
            f"heartbeat_seconds={values['heartbeat_seconds']:g} is not less than [kinetic] heartbeat_timeout="
            f"{values['heartbeat_timeout']:g}: every running job would look lost between two heartbeats. "
            "Lower heartbeat_seconds or raise heartbeat_timeout (AIRFLOW__KINETIC__HEARTBEAT_TIMEOUT)."
        )


def machine_has(kind: str) -> bool:
    """Whether this machine has a GPU / TPU a local job could use."""
    if kind == "gpu":
        return shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidia0")
    if kind == "tpu":
        return any(os.path.exists(p) for p in ("/dev/accel0", "/dev/vfio/0")) or bool(
            os.environ.get("TPU_ACCELERATOR_TYPE")
        )
    return True


def _warn_without_accelerator(spec: Any) -> None:
    if spec.kind == "cpu" or machine_has(spec.kind):
        return
    log.warning(
        "accelerator=%r asks for %s, but this task runs on the local backend and this machine has no "
        "%s: the function runs on this machine's CPU. Set backend='gke' / 'auto' (or "
        "AIRFLOW__KINETIC__BACKEND) to run on the accelerator, or accelerator='cpu' to silence this.",
        spec.text,
        spec.kind.upper(),
        spec.kind.upper(),
    )


def _anchor_relative_data(op: RenderedTask, folder: str) -> None:
    """``Data("./dataset")`` means the dataset beside the DAG file, not in the worker's cwd."""
    for data in data_in(op.op_args, op.op_kwargs, op.volumes):
        if data.is_remote or "://" in data.source:
            continue
        source = os.path.expanduser(data.source)
        if not os.path.isabs(source):
            data.source = os.path.normpath(os.path.join(folder, source))


# Publishing -------------------------------------------------------------------------------------
def publish_job(storage: Storage, ref: JobRef, func_name: str) -> None:
    """Worker, before the job is created: its record in job storage, and kinetic's handle.

    Neither may fail the task: a job without them runs the same, it is only harder to find.
    """
    created = float(ref.submitted_at or time.time())
    record = {"version": 1, "job": ref.to_dict(), "callable": func_name, "created": created}
    try:
        storage.write_text(JobLayout(ref.job_uri).record, json.dumps(record, sort_keys=True, default=str))
    except Exception as exc:
        log.warning("could not write the job record of %s: %s", ref.job_id, exc)
    if not resolve_setting("kinetic_interop"):  # a bool: the option table parsed the config's text
        return
    try:
        uri = write_handle(storage, ref, func_name, created)
        if uri:
            log.info("kinetic's own tools see this job: handle at %s", uri)
    except Exception as exc:
        log.warning(
            "could not write kinetic's handle of %s (kinetic's CLI will skip it): %s", ref.job_id, exc
        )


# Shipping ---------------------------------------------------------------------------------------
def stage_args(
    op_args: Sequence[Any], op_kwargs: Mapping[str, Any], storage: Storage, base_uri: str
) -> tuple[list[Any], dict[str, Any]]:
    """Stage ``Data`` arguments and turn upstream result references into loadable refs."""

    def convert(value: Any) -> Any:
        value = replace_refs(value, lambda r: ResultRef.from_xcom(r) if is_result_ref(r) else r)
        return value.stage(storage, base_uri) if isinstance(value, Data) else value

    return [convert(a) for a in op_args], {k: convert(v) for k, v in op_kwargs.items()}


@dataclass(frozen=True)
class PayloadParts:
    """What a job's payload is made of, as shipped: the DAG code archive's entry (uploaded, content
    addressed), the arguments with ``Data`` staged and upstream results as refs, the volumes staged
    and the captured environment."""

    code: dict[str, Any] | None
    args: list[Any]
    kwargs: dict[str, Any]
    volumes: dict[str, Any]
    env: dict[str, str]


def prepare_payload(
    storage: Storage,
    base_uri: str,
    python_callable: Any,
    op_args: Sequence[Any],
    op_kwargs: Mapping[str, Any],
    volumes: Mapping[str, Data],
    capture_env_vars: Any,
    dag_file: str | None,
    dags_folder: str | None,
) -> PayloadParts:
    """The steps before pickling, in one place: ``ship_payload`` ships what they give, and the
    result cache (``result_cache``) digests the same parts before any job exists. Uploads are
    content addressed (code archive, ``Data``), so doing this twice uploads nothing twice."""
    roots = [dags_folder]
    if dag_file:
        roots.append(os.path.dirname(dag_file))
    code = ship_code_bundle(storage, base_uri, *code_roots(dags_folder, dag_file))
    by_value = register_dag_modules_by_value(python_callable, roots)
    if by_value:
        log.info("pickling DAG-folder modules by value: %s", ", ".join(map(user_names, by_value)))
    args, kwargs = stage_args(op_args, op_kwargs, storage, base_uri)
    staged = {m: d.stage(storage, base_uri) for m, d in volumes.items()}
    return PayloadParts(code, args, kwargs, staged, capture_env(capture_env_vars))


def ship_payload(
    storage: Storage,
    ref: JobRef,
    identity: JobIdentity,
    *,
    python_callable: Any,
    op_args: Sequence[Any],
    op_kwargs: Mapping[str, Any],
    volumes: Mapping[str, Data],
    capture_env_vars: Any,
    output_dir: str | None,
    heartbeat_seconds: Any,
    dag_file: str | None,
    dags_folder: str | None,
    task_id: str,
    key: str,
    parts: PayloadParts | None = None,
) -> tuple[int, str, str]:
    """Upload a created job's payload, code and data, then its manifest; returns the payload's
    size, the job's ``KINETIC_OUTPUT_DIR`` and the payload's digest (for the job record).
    ``parts``: the payload already prepared (a result cache's look-up in this process)."""
    layout = JobLayout(ref.job_uri)
    if parts is None:
        parts = prepare_payload(
            storage, ref.base_uri, python_callable, op_args, op_kwargs, volumes, capture_env_vars,
            dag_file, dags_folder,
        )  # fmt: skip
    code = parts.code
    fields = write_payload(
        storage,
        layout.payload,
        python_callable,
        parts.args,
        parts.kwargs,
        env=parts.env,
        volumes=parts.volumes,
        task_label=f"task {task_id!r}",
    )
    output_dir = output_dir or output_dir_uri(ref.base_uri, identity)
    manifest = {
        **fields,
        "job_id": ref.job_id,
        "attempt": identity.attempt,
        "identity": identity.to_dict(),
        "output_dir": output_dir,
        "heartbeat_seconds": heartbeat_seconds,
        "metrics_interval": resolve_setting("metrics_interval"),
        "stop_grace_seconds": ref.stop_grace_seconds,  # job.stop: the function's grace on SIGTERM
        "callable": callable_name(python_callable),
        "created": time.time(),
        "backend": ref.backend,
        "image": ref.k8s.image if ref.k8s is not None else None,
        "code": code,
        "requirements": ref.requirements or [],
        # debug=True (job.debugging), HMAC-checked with the rest; absent otherwise, so the manifest
        # of every other job stays as it was
        **({"debug": ref.debug} if ref.debug else {}),
    }
    # The manifest goes last: its presence tells the runner the payload is complete. Its HMAC
    # under the job key vouches for the payload's digest, the code archive and the requirements.
    storage.write_text(layout.manifest, manifest_text(manifest, key))
    storage.write_text(layout.status("dispatched"), json.dumps({"time": time.time()}))
    return fields["payload_bytes"], output_dir, fields["sha256"]
