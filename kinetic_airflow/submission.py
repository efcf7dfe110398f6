"""What ``execute`` checks and prepares after templates are rendered, before any job exists.

Parse time checks what the DAG file states (``validation``); some of it is only known when
the task runs: a templated accelerator, the configured backend and base URI, the DAG file's
folder for relative ``Data`` paths, the context values the function names. Everything here
runs before the job record is written, so a mistake found here creates nothing.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import TYPE_CHECKING, Any

from kinetic_airflow.accelerators import parse_accelerator
from kinetic_airflow.config import KineticSettingError, resolve_setting
from kinetic_airflow.context_args import context_kwargs
from kinetic_airflow.job.inputs import data_in
from kinetic_airflow.options import check_rendered_options
from kinetic_airflow.validation import check_backend_fits, check_base_uri, check_local_volumes

if TYPE_CHECKING:
    from kinetic_airflow.operators import KineticRunOperator

__all__ = ["check_settings", "machine_has", "preflight"]

log = logging.getLogger(__name__)


def preflight(op: KineticRunOperator, context: Any) -> None:
    check_rendered_options(op)  # templated options, as rendered: the same table as at parse time
    backend = op._backend_name()
    check_settings(op, backend)
    spec = parse_accelerator(op.accelerator, spot=op.spot or None)  # rendered by now
    check_backend_fits(backend, spec)
    base_uri = op._base_uri(backend)
    check_base_uri(base_uri, where="the task's base_uri / [kinetic] base_uri")
    if backend == "local":
        check_local_volumes(op.volumes)
        _warn_without_accelerator(spec)
    dag = context.get("dag")
    dag_file = getattr(dag, "fileloc", None) if dag is not None else None
    if dag_file:
        _anchor_relative_data(op, os.path.dirname(os.path.abspath(dag_file)))
    if base_uri.startswith("gs://"):
        op._storage(base_uri)  # credentials are checked here, with a message that says how to fix them
    extra = context_kwargs(op.python_callable, op.op_args, op.op_kwargs, context)
    if extra:
        op.op_kwargs = {**extra, **dict(op.op_kwargs)}


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
    "preemption_retries",
    "kinetic_interop",
)
_CLUSTER_SETTINGS = ("namespace", "startup_timeout", "heartbeat_timeout", "requirements_cache")


def check_settings(op: KineticRunOperator, backend: str) -> None:
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


def _anchor_relative_data(op: KineticRunOperator, folder: str) -> None:
    """``Data("./dataset")`` means the dataset beside the DAG file, not in the worker's cwd."""
    for data in data_in(op.op_args, op.op_kwargs, op.volumes):
        if data.is_remote or "://" in data.source:
            continue
        source = os.path.expanduser(data.source)
        if not os.path.isabs(source):
            data.source = os.path.normpath(os.path.join(folder, source))
