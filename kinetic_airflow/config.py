"""Settings resolution: task argument > ``[kinetic]`` config > ``KINETIC_*`` env > default.

One place decides precedence so that a single setting (say
``AIRFLOW__KINETIC__BACKEND=gke``) flips a whole deployment, while a task can
still override it. ``KINETIC_*`` names match Keras kinetic's own variables
(``KINETIC_PROJECT``, ``KINETIC_ZONE``, ...), so a laptop set up for
``@kinetic.run`` works unchanged.
"""

from __future__ import annotations

import configparser
import os
from typing import Any

from kinetic_airflow.options import KineticSettingError, parse_setting

__all__ = ["DEFAULTS", "KineticSettingError", "default_base_uri", "local_state_root", "resolve_setting"]

# Built-in defaults. None means "derived" (see default_base_uri) or "unset".
DEFAULTS: dict[str, Any] = {
    "backend": "local",
    "base_uri": None,
    "project": None,
    "zone": "us-central1-a",
    "cluster": "kinetic-cluster",
    "namespace": "default",
    "container_image": None,
    # Per accelerator kind (None: container_image, else the kind's image kinetic-airflow image builds).
    "container_image_cpu": None,
    "container_image_gpu": None,
    "container_image_tpu": None,
    # The workers' Python for `kinetic-airflow image` (None: the Python running the command).
    "worker_python": None,
    "gcp_conn_id": None,  # None: google_cloud_default if defined, else ambient credentials
    "kubernetes_conn_id": None,
    "service_account": "kinetic",
    # GKE control-plane access, spelled as the google provider's GKE operators spell them:
    # the private endpoint (an Airflow inside the VPC, Composer 3), the DNS endpoint, and the
    # service accounts to impersonate for the GKE and Kubernetes API calls.
    "use_internal_ip": False,
    "use_dns_endpoint": False,
    "impersonation_chain": None,
    "poll_interval": 2.0,
    "heartbeat_seconds": 30.0,
    # How often a job writes the points kinetic_airflow.report() buffered (one object per interval).
    "metrics_interval": 5.0,
    "xcom_max_bytes": 262144,
    "log_max_lines": 10000,
    "local_python": None,
    "local_state_dir": None,
    # Cluster backends. The startup timeout allows for TPU/GPU node pool scale-up (often 5-15 min).
    "startup_timeout": 1800.0,
    "heartbeat_timeout": 300.0,
    "preemption_retries": 3,
    # A job that ends within this many seconds is awaited in the worker instead of deferring: one
    # task process instead of two, and no resume latency (README, "Short jobs").
    "wait_before_defer": 5.0,
    # Airflow's executor-event race (resume_window.py): a deferred task's event is held until the
    # process that deferred it has been reaped, plus this margin (the executor's post and one
    # scheduler loop)...
    "resume_margin_seconds": 2.0,
    # False: never look for that process, always hold for min_deferral_seconds.
    "watch_deferring_process": True,
    # ...or, where the triggerer cannot see that process, until the task has been deferred this
    # long. None: twice [workers] min_heartbeat_interval plus 5 s, past its exit report.
    "min_deferral_seconds": None,
    # How long a watcher retries failing job storage before it gives the job up (watch.py).
    "storage_retry_seconds": 180.0,
    "runner_python": "python",
    # Operating it (README, "Operating kinetic jobs"): kinetic-airflow gc's default age; a pod
    # override (JSON) for every cluster job; handle.json for keras-kinetic's own tools.
    "retention_days": None,
    "pod_override": None,
    "kinetic_interop": True,
    # Where a cluster node keeps the environments of requirements= (backends/gke/volumes.py):
    # "hostpath" (reused by every job on the node), "emptydir" (per pod) or "auto": emptydir on
    # GKE Autopilot, which refuses writable hostPath volumes, hostpath elsewhere.
    "requirements_cache": "auto",
    # Where a cluster job's nodes come from and which Kueue queue admits it (README, "Capacity"):
    # on-demand unless set; no queue; no run limit beyond GKE's own; no bound on the queue wait.
    "capacity": None,
    "max_run_duration": None,
    "local_queue": None,
    "priority_class": None,
    "queue_timeout": None,
}

BACKENDS = ("local", "gke", "pathways", "auto")


def _conf() -> Any:
    try:
        # Airflow start-up cost: loaded when called, not when this module is imported.
        from airflow.sdk.configuration import conf
    except ImportError:  # triggerer / scheduler side, or no task-sdk
        try:
            from airflow.configuration import conf  # type: ignore[no-redef]
        except ImportError:
            return None
    return conf


def _set_in_airflow_config(conf: Any, key: str) -> bool:
    """Whether a user set ``[kinetic] key`` (env var, airflow.cfg), not just the provider's default.

    The provider declares its defaults (so ``airflow config list`` shows them), which makes
    ``conf.get`` always answer; a ``KINETIC_*`` variable must still win over a default.
    """

    env = f"AIRFLOW__KINETIC__{key.upper()}"
    if any(os.environ.get(env + suffix) for suffix in ("", "_CMD", "_SECRET")):
        return True
    try:
        if not configparser.ConfigParser.has_option(conf, "kinetic", key):
            return False
        # Airflow writes every declared default into a newly generated airflow.cfg: a value equal
        # to the built-in default is that default, not a user's setting (KINETIC_* still wins).
        written = configparser.ConfigParser.get(conf, "kinetic", key, raw=True)
        return not _is_declared_default(key, written)
    except Exception:
        return False


def _is_declared_default(key: str, written: str) -> bool:
    default = DEFAULTS.get(key)
    if default is None:
        return written.strip() == ""
    if isinstance(default, bool):
        return written.strip().lower() == str(default).lower()
    if isinstance(default, float):
        try:
            return float(written) == default
        except ValueError:
            return False
    return written.strip() == str(default)


def _airflow_conf_get(key: str) -> str | None:
    conf = _conf()
    if conf is None or not _set_in_airflow_config(conf, key):
        return None
    try:
        value = conf.get("kinetic", key, fallback=None)
    except Exception:
        return None
    return value if value not in (None, "") else None


def resolve_setting(key: str, explicit: Any = None) -> Any:
    """The effective value of ``key``; ``explicit`` (a task argument) wins when not None.

    A configured value is parsed and checked by the option table (``kinetic_airflow.options``):
    a wrong one raises :class:`KineticSettingError` naming the variable it came from.
    """
    default = DEFAULTS.get(key)
    if explicit is not None:
        return explicit
    sources = (
        (_airflow_conf_get(key), f"[kinetic] {key} (AIRFLOW__KINETIC__{key.upper()})"),
        (os.environ.get(f"KINETIC_{key.upper()}"), f"KINETIC_{key.upper()}"),
    )
    for value, source in sources:
        if value not in (None, ""):
            return parse_setting(key, value, source, default)
    return default


def local_state_root() -> str:
    """Where this machine keeps kinetic's local state (local jobs' pid/exit/log files, log cursors)."""
    return resolve_setting("local_state_dir") or os.path.join(
        os.path.expanduser("~"), ".cache", "kinetic-airflow", "local"
    )


def default_base_uri(backend: str, project: str | None, cluster: str) -> str:
    """Local runs keep job files on disk; cluster runs use kinetic's per-cluster bucket."""
    if backend == "local":
        root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return "file://" + os.path.join(root, "kinetic-airflow")
    if not project:
        raise ValueError(
            f"backend {backend!r} needs a job bucket: set base_uri='gs://bucket/prefix' on the task, "
            "[kinetic] base_uri / AIRFLOW__KINETIC__BASE_URI, or a project (project=..., "
            "[kinetic] project or KINETIC_PROJECT) to use kinetic's bucket gs://{project}-kn-{cluster}-jobs"
        )
    return f"gs://{project}-kn-{cluster}-jobs"
