"""The option table: every kinetic option and ``[kinetic]`` setting is spelled here, and only here.

A row says what an option accepts (its type, kind, range and accepted forms), its built-in
default and what it does. Everything else is read from the table: the parse-time checks below,
the parsing of ``[kinetic]`` / ``AIRFLOW__KINETIC__*`` / ``KINETIC_*`` strings (``parse_setting``,
used by ``config``), the provider's ``[kinetic]`` config section (``provider_config``, read by
``get_provider_info``), ``KineticRunOperator``'s signature and attributes and its template fields,
``@task.kinetic``'s typed keywords (``TaskOptions``) and the docs' reference
(``reference_markdown``). Adding an option is a row here plus the code that uses it.

Task options are the fields of the ``TaskOptions`` TypedDict, each ``Annotated`` with its row:
a type checker reads the type (``**kwargs: Unpack[...]`` in the operator's and the decorator's
signatures), this module reads the row. Settings that exist only in ``[kinetic]`` are rows of
``_SETTINGS``.

Task arguments are checked when the DAG file is parsed, so a wrong value is a DAG import error
that names the option, the value, what is accepted and the fix, never a truthy surprise
(``spot="false"`` turning Spot on) or a bare ``ValueError`` after a job was submitted. Templated
values that contain Jinja are checked again once rendered, before any job exists. Configured
values are strings, parsed with the same rules; the message names where the value came from.

Accepted forms, decided once for all options:

* durations are a number of seconds (``int`` / ``float``) or a ``datetime.timedelta`` in a
  task argument, a plain number of seconds in config. Strings with units (``"2s"``) are
  refused everywhere, with the typed value to write instead.
* booleans are ``True`` / ``False`` in a task argument (a string is refused, whatever it
  says); config takes the words ``parse_bool`` reads (true/false, 1/0, yes/no, on/off, t/f, y/n).
* whole numbers are ``int`` (never a ``bool``); config takes digits.

Layering: this module imports nothing of the package at import time, and inside functions only
the checkers below it (accelerators, capacity, slices, envcapture, validation, ``job``);
``config`` imports it. The annotations are evaluated (no ``from __future__ import annotations``)
because the rows live inside them.
"""

import dataclasses
import difflib
import inspect
import math
import numbers
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypedDict

# The job reads these defaults too, for a manifest without them (stdlib-only module).
from kinetic_airflow.job.debugging import DEFAULT_ON_TIMEOUT as DEBUG_ON_TIMEOUT
from kinetic_airflow.job.debugging import DEFAULT_WAIT_SECONDS as DEBUG_WAIT_SECONDS

if TYPE_CHECKING:
    from kinetic_airflow.job.inputs import Data

__all__ = [
    "OPTIONS",
    "BackendName",
    "KineticOptionError",
    "KineticSettingError",
    "OptionSpec",
    "TaskOptions",
    "check_option",
    "check_options",
    "check_rendered_options",
    "closest_setting",
    "is_deferred",
    "parse_bool",
    "parse_setting",
    "provider_config",
    "reference_markdown",
    "task_option_names",
    "task_parameters",
    "validate_backend",
    "validate_options",
]


class KineticOptionError(TypeError, ValueError):
    """A wrong option value. Both a ``TypeError`` and a ``ValueError``, so a caller that
    catches either (as Airflow's DAG import and user code do) sees it; the message names the
    option, the value, what is accepted and the fix."""


class KineticSettingError(KineticOptionError):
    """A configured value that does not parse: names the option, where it came from, the form."""


@dataclass(frozen=True)
class OptionSpec:
    """One row: what one option accepts, its default and what it does.

    ``accepts`` is the human form of the rule (shown in every error); ``example`` a correct
    task argument, ``setting_example`` a correct ``[kinetic]`` value; ``doc`` what the option
    does (the docs' reference and the ``[kinetic]`` description); ``default`` the built-in
    default (for a ``[kinetic]`` setting, the value when nothing is configured; None: unset or
    derived, as ``doc`` says). ``minimum`` with ``above`` (strictly more) bounds numbers;
    ``choices`` an enum. ``task`` / ``config``: given as a task argument / read from
    ``[kinetic]`` and the environment. ``templated``: one of the operator's ``template_fields``.
    ``type``: a task option's Python type (from ``TaskOptions``).
    """

    name: str
    kind: str
    accepts: str
    example: str = ""
    doc: str = ""
    default: Any = None
    setting_example: str = ""
    minimum: float | None = None
    above: bool = False
    choices: tuple[str, ...] = ()
    task: bool = True
    config: bool = False
    templated: bool = False
    optional: bool = True
    aliases: Mapping[str, str] = field(default_factory=dict)
    type: Any = None
    sensitive: bool = False  # a secret: Airflow masks it and reads its _CMD / _SECRET forms

    @property
    def parameter_default(self) -> Any:
        """A task argument's default: None (the ``[kinetic]`` value) for an option that is also a
        setting, else the built-in default."""
        return None if self.config else self.default


def _row(kind: str, accepts: str, example: str = "", **kw: Any) -> OptionSpec:
    """A row whose name is its key (a ``TaskOptions`` field or a ``_SETTINGS`` entry)."""
    return OptionSpec("", kind, accepts, example, **kw)


_A_BOOL = "True or False (a Python bool)"
_SECONDS = "a number of seconds (int or float) or a datetime.timedelta"
_MORE_THAN_0 = {"minimum": 0, "above": True}
_BACKEND_ALIASES = {
    "gcp": "gke",
    "google": "gke",
    "gcloud": "gke",
    "kubernetes": "gke",
    "k8s": "gke",
    "cloud": "gke",
    "lws": "pathways",
    "leaderworkerset": "pathways",
    "multihost": "pathways",
    "process": "local",
    "subprocess": "local",
    "laptop": "local",
}
# The backends a task may name: the type a type checker holds a DAG to, and the table's choices.
BackendName = Literal["local", "gke", "pathways", "auto"]


class TaskOptions(TypedDict, total=False):
    """The task options of ``KineticRunOperator`` and ``@task.kinetic``, in the signature's order:
    each field's type is what a type checker holds a DAG to, its ``Annotated`` row the rest."""

    accelerator: Annotated[
        str | list[str | tuple[str, float | timedelta]],
        _row(
            "accelerator",
            "a kinetic accelerator string such as 'cpu', 'gpu-l4', 'tpu-v6e-8t' or 'tpu-v5e-4:spot', or a "
            "list of them (a capacity ladder, each item a string or a pair (string, time to start))",
            'accelerator="gpu-l4"',
            doc="The hardware the job runs on, in kinetic's strings (`cpu`, `gpu-l4`, `tpu-v6e-8`, "
            "a `:spot` suffix); checked at DAG import against the GKE catalog. A list is a capacity "
            "ladder: each accelerator is tried in turn, the next when one has not started within its "
            "time to start (how-to/capacity-ladder.md).",
            default="cpu",
            templated=True,
            optional=False,
        ),
    ]
    container_image: Annotated[
        str | None,
        _row(
            "text",
            "an image reference (str)",
            'container_image="us-docker.pkg.dev/p/r/kinetic:py3.11"',
            doc="Runner image for cluster jobs of every accelerator kind without its own "
            "container_image_KIND (default: the image `kinetic-airflow image --kind KIND` pushes, "
            "tagged with this provider's version and the workers' Python).",
            setting_example="us-docker.pkg.dev/p/r/kinetic-airflow-runner-cpu:0.1.0-py3.11",
            config=True,
            templated=True,
        ),
    ]
    zone: Annotated[
        str | None,
        _row(
            "text",
            "a GKE location (str)",
            'zone="us-central1-a"',
            doc="Cluster location.",
            default="us-central1-a",
            setting_example="us-central1-a",
            config=True,
            templated=True,
        ),
    ]
    project: Annotated[
        str | None,
        _row(
            "text",
            "a GCP project id (str)",
            'project="my-project"',
            doc="GCP project of the cluster and bucket.",
            setting_example="my-project",
            config=True,
            templated=True,
        ),
    ]
    cluster: Annotated[
        str | None,
        _row(
            "text",
            "a GKE cluster name (str)",
            'cluster="kinetic-cluster"',
            doc="GKE cluster name.",
            default="kinetic-cluster",
            setting_example="kinetic-cluster",
            config=True,
            templated=True,
        ),
    ]
    namespace: Annotated[
        str | None,
        _row(
            "namespace",
            "a Kubernetes namespace: lowercase letters, digits and '-', at most 63 characters",
            'namespace="ml-jobs"',
            doc="Kubernetes namespace of jobs.",
            default="default",
            setting_example="ml",
            config=True,
            templated=True,
        ),
    ]
    backend: Annotated[
        BackendName | None,
        _row(
            "enum",
            "one of local, gke, pathways, auto (local: a process on this machine; gke: a Kubernetes Job "
            "on GKE; pathways: a multi-host TPU slice; auto: pathways for multi-host TPUs, else gke)",
            'backend="gke"',
            doc="Where jobs run: local, gke, pathways or auto.",
            default="local",
            setting_example="gke",
            choices=typing.get_args(BackendName),
            config=True,
            aliases=_BACKEND_ALIASES,
        ),
    ]
    capture_env_vars: Annotated[
        list[str] | tuple[str, ...] | None,
        _row(
            "patterns",
            "a list of worker variable names or wildcard patterns",
            'capture_env_vars=["WANDB_API_KEY", "MYAPP_*"]',
            doc="Worker environment variables (names or wildcards) sent to the job.",
        ),
    ]
    volumes: Annotated[
        Mapping[str, "Data"] | None,
        _row(
            "volumes",
            "a dict of absolute mount path -> kinetic_airflow.Data",
            'volumes={"/data": Data("gs://bucket/ds")}',
            doc="Data made available at these paths before the function runs (cluster backends).",
        ),
    ]
    spot: Annotated[
        bool,
        _row(
            "bool",
            _A_BOOL,
            "spot=True",
            doc="Run on Spot VMs (as the accelerator's `:spot` suffix).",
            default=False,
            optional=False,
        ),
    ]
    output_dir: Annotated[
        str | None,
        _row(
            "location",
            "a URI (gs://bucket/path, file:///path) or an absolute path",
            'output_dir="gs://bucket/runs/exp1"',
            doc="`KINETIC_OUTPUT_DIR` for the function (default: a directory stable per task instance, "
            "the same across retries).",
            templated=True,
        ),
    ]
    base_uri: Annotated[
        str | None,
        _row(
            "base_uri",
            "gs://bucket/prefix or file:///absolute/path",
            'base_uri="gs://bucket/kinetic"',
            doc="Where job files live: gs://bucket/prefix or file:///path. Default: a local cache "
            "directory for local, gs://{project}-kn-{cluster}-jobs otherwise.",
            setting_example="gs://my-bucket/kinetic",
            config=True,
            templated=True,
        ),
    ]
    gcp_conn_id: Annotated[
        str | None,
        _row(
            "text",
            "an Airflow connection id (str)",
            'gcp_conn_id="google_cloud_default"',
            doc="Airflow GCP connection for storage and GKE (default google_cloud_default when "
            "defined, else ambient credentials).",
            setting_example="google_cloud_default",
            config=True,
        ),
    ]
    kubernetes_conn_id: Annotated[
        str | None,
        _row(
            "text",
            "an Airflow connection id (str)",
            'kubernetes_conn_id="kubernetes_default"',
            doc="Kubernetes connection for clusters other than GKE (default: GKE through the GCP "
            "connection).",
            setting_example="kubernetes_default",
            config=True,
        ),
    ]
    deferrable: Annotated[
        bool,
        _row(
            "bool",
            _A_BOOL,
            "deferrable=False",
            doc="Wait for the job in the triggerer (True) or in the worker (False).",
            default=True,
            optional=False,
        ),
    ]
    poll_interval: Annotated[
        float | timedelta | None,
        _row(
            "duration",
            _SECONDS + ", more than 0",
            "poll_interval=5",
            doc="Seconds between job status checks.",
            default=2.0,
            setting_example="5",
            config=True,
            **_MORE_THAN_0,
        ),
    ]
    heartbeat_seconds: Annotated[
        float | timedelta | None,
        _row(
            "duration",
            _SECONDS + ", more than 0",
            "heartbeat_seconds=30",
            doc="Seconds between the runner's heartbeats.",
            default=30.0,
            setting_example="30",
            config=True,
            **_MORE_THAN_0,
        ),
    ]
    startup_timeout: Annotated[
        float | timedelta | None,
        _row(
            "duration",
            _SECONDS + ", more than 0",
            "startup_timeout=timedelta(minutes=30)",
            doc="Cluster backends: seconds a job may stay unschedulable before failing (room for "
            "accelerator node scale-up).",
            default=1800.0,
            setting_example="1800",
            config=True,
            **_MORE_THAN_0,
        ),
    ]
    preemption_retries: Annotated[
        int | None,
        _row(
            "count",
            "a whole number (int), 0 or more",
            "preemption_retries=3",
            doc="Cluster backends: resubmissions of a preempted job, not counted as Airflow retries.",
            default=3,
            setting_example="3",
            minimum=0,
            config=True,
        ),
    ]
    stop_grace_seconds: Annotated[
        float | timedelta | None,
        _row(
            "duration",
            _SECONDS + ", 0 or more",
            "stop_grace_seconds=60",
            doc="Seconds a job asked to stop (cancel, execution_timeout, mark failed, preemption) "
            "gives its function to save a checkpoint (kinetic_airflow.stop_requested(), on_stop "
            "hooks) before it ends; the backend kills it 10 s after that.",
            default=30.0,
            setting_example="60",
            minimum=0,
            config=True,
        ),
    ]
    container_env: Annotated[
        Mapping[str, str] | None,
        _row(
            "env",
            "a dict of environment variable name -> string value",
            'container_env={"KERAS_BACKEND": "jax"}',
            doc="Plain (non-secret) environment variables for the job's container.",
            templated=True,
        ),
    ]
    pod_override: Annotated[
        Any,
        _row(
            "pod_override",
            "a dict in Kubernetes' JSON shape or a kubernetes.client.V1Pod",
            'pod_override={"metadata": {"labels": {"team": "ml"}}}',
            doc="Cluster backends: merged over the generated pod (Kubernetes field names); the "
            "`[kinetic]` value (JSON) applies to every cluster job, before the task's own.",
            setting_example='{"spec": {"imagePullSecrets": [{"name": "regcred"}]}}',
            config=True,
        ),
    ]
    requirements: Annotated[
        str | Sequence[str] | None,
        _row(
            "requirements",
            "a requirement string or requirements file path, or a list of them",
            'requirements=["scikit-learn>=1.4"]',
            doc="Packages the job needs beyond its image: requirement strings and/or paths of "
            "requirements files (default: a requirements.txt or pyproject.toml beside the DAG file or "
            "at the bundle root). Installed by the runner into an environment cached by their hash.",
        ),
    ]
    use_internal_ip: Annotated[
        bool | None,
        _row(
            "bool",
            _A_BOOL,
            "use_internal_ip=True",
            doc="GKE: reach the control plane on its private endpoint "
            "(private_cluster_config.private_endpoint): for Airflow inside the cluster's VPC or a "
            "Composer 3 network attachment.",
            default=False,
            setting_example="true",
            config=True,
        ),
    ]
    use_dns_endpoint: Annotated[
        bool | None,
        _row(
            "bool",
            _A_BOOL,
            "use_dns_endpoint=True",
            doc="GKE: reach the control plane on its DNS endpoint "
            "(control_plane_endpoints_config.dns_endpoint_config.endpoint).",
            default=False,
            setting_example="true",
            config=True,
        ),
    ]
    impersonation_chain: Annotated[
        str | Sequence[str] | None,
        _row(
            "impersonation",
            "a service account email or a list of them (config: comma separated)",
            'impersonation_chain="kinetic@my-project.iam.gserviceaccount.com"',
            doc="GKE: service account(s) to impersonate for the GKE and Kubernetes API calls; the "
            "last one is the identity used, the ones before it delegates. Job storage keeps the "
            "connection's own identity.",
            setting_example="kinetic-airflow@my-project.iam.gserviceaccount.com",
            config=True,
            templated=True,
        ),
    ]
    # Capacity and Kueue (kinetic_airflow.capacity: the labels, taints and GKE's limits)
    capacity: Annotated[
        str | list[str | tuple[str, float | timedelta]] | None,
        _row(
            "capacity",
            "on-demand, spot, flex-start, queued, reservation:<name>, reservation:<project>/<name> "
            "or any-reservation, or (a task argument) a list of them: a capacity ladder, each item a "
            "string or a pair (string, time to start)",
            'capacity="flex-start"',
            doc="Cluster backends: where the nodes come from: on-demand, spot, flex-start (Dynamic "
            "Workload Scheduler), queued (queued provisioning through Kueue; needs local_queue), "
            "reservation:<name>, reservation:<project>/<name> or any-reservation (default on-demand). "
            "A list is a capacity ladder, e.g. `[('spot', timedelta(minutes=20)), 'on-demand']`: a rung "
            "that has not started within its time to start (default startup_timeout) is withdrawn "
            "and the next is submitted in the same try (how-to/capacity-ladder.md).",
            setting_example="flex-start",
            config=True,
        ),
    ]
    rung_after_preemption: Annotated[
        Literal["first", "same"],
        _row(
            "enum",
            "'first' or 'same'",
            'rung_after_preemption="same"',
            doc="Capacity ladder: the rung a preempted job resubmits on: `first` (the first rung "
            "again: Spot capacity may be back) or `same` (the rung it was preempted on).",
            default="first",
            choices=("first", "same"),
        ),
    ]
    max_run_duration: Annotated[
        float | timedelta | None,
        _row(
            "duration",
            _SECONDS + ", more than 0, at most 7 days (flex-start and queued capacity)",
            "max_run_duration=timedelta(hours=12)",
            doc="Flex-start or queued capacity: seconds the job's VMs may run, at most 604800 "
            "(7 days, GKE's limit; default GKE's).",
            setting_example="43200",
            config=True,
            **_MORE_THAN_0,
        ),
    ]
    local_queue: Annotated[
        str | None,
        _row(
            "kueue_name",
            "the name of a Kueue LocalQueue in the job's namespace",
            'local_queue="team-a"',
            doc="The Kueue LocalQueue that admits the job (`kueue.x-k8s.io/queue-name`); the task "
            "log shows its place in the queue while Kueue holds it.",
            setting_example="team-a",
            config=True,
        ),
    ]
    priority_class: Annotated[
        str | None,
        _row(
            "kueue_name",
            "the name of a Kueue WorkloadPriorityClass",
            'priority_class="high"',
            doc="The Kueue WorkloadPriorityClass of the job.",
            setting_example="high",
            config=True,
        ),
    ]
    queue_timeout: Annotated[
        float | timedelta | None,
        _row(
            "duration",
            _SECONDS + ", more than 0 (how long a job may wait in its Kueue queue)",
            "queue_timeout=timedelta(hours=2)",
            doc="Seconds a job may wait in its Kueue queue before the task fails (default no bound); "
            "startup_timeout counts from admission.",
            setting_example="7200",
            config=True,
            **_MORE_THAN_0,
        ),
    ]
    # Multislice TPU (backends.gke.multislice): checked with the accelerator and backend
    slices: Annotated[
        int | None,
        _row(
            "count",
            "a whole number (int), 1 or more: how many multi-host TPU slices train together",
            "slices=2",
            doc="How many multi-host TPU slices train together (multislice).",
            minimum=1,
        ),
    ]
    # Reusing a result (kinetic_airflow.result_cache): checked together in validate_options
    cache: Annotated[
        bool,
        _row(
            "bool",
            _A_BOOL,
            "cache=True",
            doc="Reuse the result of an earlier successful job whose function code, arguments (as "
            "shipped), DAG code, requirements, image, backend, accelerator and cache_version are the "
            "same, instead of launching a job; the task log, XCom `kinetic_cache` and the Kinetic view "
            'name the reused job. A run triggered with conf `{"kinetic_fresh_run": true}` runs '
            "fresh (how-to/cache.md).",
            default=False,
            optional=False,
        ),
    ]
    cache_version: Annotated[
        str | None,
        _row(
            "text",
            "a non-empty string (str), with cache=True",
            'cache_version="2"',
            doc="Part of the cache key: change it to stop reusing results made before (e.g. the data "
            "behind a path changed while the arguments did not).",
        ),
    ]
    # Remote debugging (kinetic_airflow.job.debugging): checked together in validate_options
    debug: Annotated[
        bool,
        _row(
            "bool",
            _A_BOOL,
            "debug=True",
            doc="Start debugpy in the job (host 0) and wait for a debugger before the function runs; "
            "`kinetic-airflow jobs debug JOB_ID` connects your editor (how-to/debug.md).",
            default=False,
            optional=False,
        ),
    ]
    debug_wait: Annotated[
        float | timedelta | None,
        _row(
            "duration",
            _SECONDS + ", more than 0: how long a debug=True job waits for a debugger",
            "debug_wait=timedelta(minutes=10)",
            doc="How long a debug=True job waits for a debugger before debug_on_timeout applies.",
            default=DEBUG_WAIT_SECONDS,
            **_MORE_THAN_0,
        ),
    ]
    debug_on_timeout: Annotated[
        str | None,
        _row(
            "enum",
            "fail (the job fails before the function runs) or run (it runs without a debugger)",
            'debug_on_timeout="run"',
            doc="What a debug=True job does when no debugger attached within debug_wait.",
            default=DEBUG_ON_TIMEOUT,
            choices=("fail", "run"),
        ),
    ]


def _setting(kind: str, accepts: str, doc: str, example: str, **kw: Any) -> OptionSpec:
    """A row of a setting that exists only in ``[kinetic]`` (not a task argument)."""
    return _row(kind, accepts, doc=doc, setting_example=example, task=False, config=True, **kw)


def _seconds_setting(doc: str, example: str, **kw: Any) -> OptionSpec:
    """A [kinetic]-only wait or bound in seconds, 0 (none) or more."""
    return _setting("duration", "a number of seconds, 0 or more", doc, example, minimum=0, **kw)


# Settings that exist only in [kinetic] / AIRFLOW__KINETIC__* / KINETIC_*.
_SETTINGS: dict[str, OptionSpec] = {
    "heartbeat_timeout": _setting(
        "duration",
        "a number of seconds, more than 0",
        "A running job whose runner heartbeat is older than this is treated as lost.",
        "300",
        default=300.0,
        **_MORE_THAN_0,
    ),
    "xcom_max_bytes": _setting(
        "count",
        "a whole number, 0 or more",
        "Results larger than this stay in storage; XCom gets a reference.",
        "1048576",
        default=262144,
        minimum=0,
    ),
    "log_max_lines": _setting(
        "count",
        "a whole number, 0 or more",
        "Job log lines copied into the task log per job.",
        "10000",
        default=10000,
        minimum=0,
    ),
    "local_python": _setting(
        "text",
        "the path of a Python interpreter",
        "Interpreter for local jobs (default: the worker's).",
        "/usr/bin/python3",
    ),
    "local_state_dir": _setting(
        "text",
        "a directory path",
        "Where local jobs keep pid/exit/log files when storage is gs:// "
        "(default ~/.cache/kinetic-airflow/local).",
        "/var/lib/kinetic",
    ),
    # Reusing a result (kinetic_airflow.result_cache): entries signed with it
    "cache_signing_key": _setting(
        "text",
        "a secret string of 32 characters or more (e.g. the output of `openssl rand -hex 32`)",
        "Signs the result cache's entries (cache=True, how-to/cache.md) with an HMAC: when set, an entry "
        "without its signature (written before it was set, or changed by someone who may edit Airflow "
        "Variables) is not used. Give it through AIRFLOW__KINETIC__CACHE_SIGNING_KEY_SECRET (a secrets "
        "backend) or _CMD rather than in airflow.cfg; every worker needs the same one.",
        "(a secret: 64 hex digits)",
        sensitive=True,
    ),
    "service_account": _setting(
        "text",
        "a Kubernetes service account name",
        "Kubernetes service account of job pods.",
        "kinetic",
        default="kinetic",
    ),
    "wait_before_defer": _seconds_setting(
        "Seconds a task waits in the worker for its job before deferring: a short job then costs one "
        "task process instead of two and no resume latency.",
        "5",
        default=5.0,
    ),
    "metrics_interval": _setting(
        "duration",
        "a number of seconds, more than 0",
        "Seconds between a job's writes of the metrics kinetic_airflow.report() buffered: at most one "
        "storage write per interval, whatever the report rate.",
        "5",
        default=5.0,
        **_MORE_THAN_0,
    ),
    "storage_retry_seconds": _seconds_setting(
        "How long a task watching its job retries failing job storage (reads of the result, heartbeat "
        "and markers; a bucket's 5xx, a network blip, a read-only disk) before it stops the job and "
        "fails. Writes of the log cursor and progress are best-effort and never fail a task.",
        "600",
        default=180.0,
    ),
    "resume_margin_seconds": _seconds_setting(
        "A deferred task's completion is held until the process that deferred it has exited plus "
        "this margin: the executor reports that exit and the scheduler reads it within one loop, "
        "away from Airflow's executor-event race.",
        "2",
        default=2.0,
    ),
    "min_deferral_seconds": _seconds_setting(
        "Where the triggerer cannot see the process that deferred a task (another host or PID "
        "namespace), its completion is held until it has been deferred this long (default: 2 x "
        "[workers] min_heartbeat_interval + 5 s), so Airflow has processed the deferring process's "
        "exit before the task resumes.",
        "15",
    ),
    "runner_python": _setting(
        "text",
        "an interpreter name or path in the runner image",
        "Interpreter in the runner image.",
        "python3",
        default="python",
    ),
    "retention_days": _setting(
        "count",
        "a whole number of days, 0 or more",
        "Default age for `kinetic-airflow gc` and the kinetic_maintenance DAG: job files older than "
        "this many days are deleted (never a live job's, never a result an XCom still references). "
        "Unset: gc needs --older-than.",
        "30",
        minimum=0,
    ),
    "kinetic_interop": _setting(
        "bool",
        "true or false",
        "Write keras-kinetic's handle.json (and its result.pkl) for cluster jobs in a kinetic bucket "
        "({project}-kn-{cluster}-jobs), so `kinetic jobs list` sees them.",
        "true",
        default=True,
    ),
    "watch_deferring_process": _setting(
        "bool",
        "true or false",
        "Hold a deferred task's completion until the process that deferred it has exited, seen "
        "through /proc when the triggerer shares its host and PID namespace; false always holds for "
        "min_deferral_seconds.",
        "true",
        default=True,
    ),
    # The runner image per accelerator kind (a CPU image cannot run a TPU or GPU job); they win
    # over container_image, a task's container_image= wins over both.
    **{
        f"container_image_{kind}": _setting(
            "text",
            "an image reference (str)",
            f"Runner image for {kind.upper()} jobs; wins over container_image (a task's "
            "container_image= wins over both).",
            f"us-docker.pkg.dev/p/r/kinetic-airflow-runner-{kind}:0.1.0-py3.11",
        )
        for kind in ("cpu", "gpu", "tpu")
    },
    "worker_python": _setting(
        "text",
        "the Airflow workers' Python major.minor, such as 3.11",
        "The Airflow workers' Python major.minor, for the images `kinetic-airflow image` builds "
        "(default: the Python running the command).",
        "3.11",
    ),
    "requirements_cache": _setting(
        "enum",
        "auto (emptydir on GKE Autopilot, else hostpath), hostpath (a node folder every job on "
        "the node reuses) or emptydir (per pod)",
        "Where cluster nodes cache the environments of requirements=: hostpath (a node folder every "
        "job on the node reuses), emptydir (per pod) or auto (emptydir on GKE Autopilot, which "
        "refuses writable hostPath volumes; hostpath elsewhere).",
        "auto",
        default="auto",
        choices=("auto", "hostpath", "emptydir"),
    ),
}


def _task_rows() -> dict[str, OptionSpec]:
    rows = {}
    for name, hint in TaskOptions.__annotations__.items():
        row = hint.__metadata__[0]
        rows[name] = dataclasses.replace(row, name=name, type=hint.__origin__)
    return rows


# The table: task options in the signature's order, then the settings only [kinetic] has.
OPTIONS: dict[str, OptionSpec] = {
    **_task_rows(),
    **{name: dataclasses.replace(row, name=name) for name, row in _SETTINGS.items()},
}


def task_option_names() -> tuple[str, ...]:
    """The options a task takes (``KineticRunOperator``'s, ``kinetic_task``'s), in order."""
    return tuple(name for name, spec in OPTIONS.items() if spec.task)


def templated_option_names() -> tuple[str, ...]:
    """The task options that are template fields of the operator."""
    return tuple(name for name, spec in OPTIONS.items() if spec.task and spec.templated)


_Init = typing.TypeVar("_Init", bound=Callable[..., Any])


def task_parameters(init: _Init) -> _Init:
    """``init`` (an operator's ``__init__`` taking the options as ``**kwargs``) with a signature
    that names every task option, with its type and default, before ``**kwargs``.

    Airflow reads the signature, not the code: ``default_args`` reach only named parameters, and
    ``.partial()`` / ``.expand()`` refuse names it does not list.
    """
    signature = inspect.signature(init)
    params = list(signature.parameters.values())
    head, tail = params[:-1], params[-1:]
    options = [
        inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=spec.parameter_default, annotation=spec.type
        )
        for name, spec in OPTIONS.items()
        if spec.task
    ]
    init.__signature__ = signature.replace(parameters=[*head, *options, *tail])  # type: ignore[attr-defined]
    return init


# Booleans ---------------------------------------------------------------------------------------
_TRUE_WORDS = ("true", "t", "yes", "y", "on", "1")
_FALSE_WORDS = ("false", "f", "no", "n", "off", "0")


def parse_bool(text: Any) -> bool | None:
    """The one reading of a boolean written as text (config, a connection's extra): True or
    False for the words above (any case, surrounding spaces ignored), None for anything else.
    A bool is itself."""
    if isinstance(text, bool):
        return text
    word = str(text).strip().lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    return None


# [kinetic] keys ---------------------------------------------------------------------------------
def closest_setting(key: str) -> str | None:
    """The ``[kinetic]`` setting a mistyped ``key`` most likely meant (None: none is close)."""
    settings = [name for name, spec in OPTIONS.items() if spec.config]
    close = difflib.get_close_matches(key.lower(), settings, n=1, cutoff=0.6)
    return close[0] if close else None


def provider_config() -> dict[str, dict[str, Any]]:
    """The ``[kinetic]`` options as the provider declares them (``get_provider_info``'s config
    section): description, type, example and the built-in default, as Airflow shows them in
    ``airflow config list``."""
    declared = {}
    for name, spec in OPTIONS.items():
        if not spec.config:
            continue
        declared[name] = {
            "description": _with_default(spec),
            "version_added": "0.1.0",
            "type": _CONFIG_TYPES.get(spec.kind, "string"),
            "example": spec.setting_example or None,
            "default": setting_text(spec.default),
            **({"sensitive": True} if spec.sensitive else {}),
        }
    return declared


_CONFIG_TYPES = {"duration": "float", "count": "integer", "bool": "boolean"}


def setting_text(value: Any) -> str | None:
    """A built-in default as ``[kinetic]`` text (None: unset)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def _with_default(spec: OptionSpec) -> str:
    """``doc`` with its built-in default, where the text does not say it already."""
    if spec.default is None or "(default" in spec.doc:
        return spec.doc
    return f"{spec.doc.rstrip('.')} (default {setting_text(spec.default)})."


def reference_markdown() -> str:
    """The options reference, as Markdown: the task options, then the ``[kinetic]`` settings.

    Rendered from the table, so the docs cannot drift from what the code accepts."""
    lines = [
        "## Task options",
        "",
        "Arguments of `@task.kinetic(...)`, `kinetic_task(...)` and `KineticRunOperator(...)`, "
        "checked at DAG import. A task argument wins over the `[kinetic]` setting of the same name, "
        "which wins over the `KINETIC_*` environment variable, which wins over the default.",
        "",
        "| Option | Type | Default | Accepts | Templated | `[kinetic]` | What it does |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, spec in OPTIONS.items():
        if not spec.task:
            continue
        default = _code(repr(spec.parameter_default))
        if spec.config and spec.default is not None:
            default += f" (`[kinetic]`: {_code(setting_text(spec.default))})"
        lines.append(
            f"| `{name}` | {_cell(_code(type_text(spec.type)))} | {_cell(default)} | {_cell(spec.accepts)} | "
            f"{'yes' if spec.templated else ''} | {'yes' if spec.config else ''} | {_cell(spec.doc)} |"
        )
    lines += [
        "",
        "## `[kinetic]` settings",
        "",
        "Set in `airflow.cfg` under `[kinetic]`, as `AIRFLOW__KINETIC__<NAME>`, or as `KINETIC_<NAME>`. "
        "A key that is not one of these is reported, with the closest one, when a task resolves its "
        "settings.",
        "",
        "| Setting | Environment | Type | Default | Accepts | What it does |",
        "|---|---|---|---|---|---|",
    ]
    for name, spec in OPTIONS.items():
        if not spec.config:
            continue
        env = f"`AIRFLOW__KINETIC__{name.upper()}`, `KINETIC_{name.upper()}`"
        default = _code(setting_text(spec.default)) if spec.default is not None else ""
        lines.append(
            f"| `{name}` | {env} | {_CONFIG_TYPES.get(spec.kind, 'string')} | {default} | "
            f"{_cell(_setting_accepts(spec))} | {_cell(spec.doc)} |"
        )
    return "\n".join(lines) + "\n"


def _setting_accepts(spec: OptionSpec) -> str:
    """What a ``[kinetic]`` value (text) may be, as ``parse_setting`` reads it."""
    bound = ""
    if spec.minimum is not None:
        bound = f", more than {spec.minimum:g}" if spec.above else f", {spec.minimum:g} or more"
    if spec.kind == "duration":
        return "a number of seconds, no unit" + bound
    if spec.kind == "count":
        return "a whole number" + bound
    if spec.kind == "bool":
        return "true or false (also 1/0, yes/no, on/off, t/f, y/n)"
    return spec.accepts


def _code(text: str | None) -> str:
    return f"`{text}`" if text else ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def type_text(tp: Any) -> str:
    """A type as a reader writes it: ``float | timedelta | None``, ``Mapping[str, Data]``."""
    if tp is None or tp is type(None):
        return "None"
    if isinstance(tp, typing.ForwardRef):
        return tp.__forward_arg__
    if isinstance(tp, str):
        return tp
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in args)
    if origin is Literal:
        return "Literal[" + ", ".join(repr(a) for a in args) + "]"
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else type_text(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if tp is Any:
        return "Any"
    return getattr(tp, "__name__", str(tp))


# Task arguments ---------------------------------------------------------------------------------
def check_option(name: str, value: Any, *, where: str | None = None) -> Any:
    """The checked (and normalized) value of task option ``name``.

    Durations become float seconds, ``capture_env_vars`` a list, ``container_env`` a dict.
    Raises :class:`KineticOptionError` naming the option, the value and the fix. A templated
    value (a string with ``{{``, or an XComArg) is returned as it is; ``preflight`` checks it
    again after rendering.
    """
    spec = OPTIONS[name]
    if value is None and spec.optional:
        return None
    if spec.templated and is_deferred(value):
        return value
    return _CHECKS[spec.kind](spec, value, where or name)


def check_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """``check_option`` for each task option in ``values`` (other keys are left alone)."""
    return {k: check_option(k, v) for k, v in values.items() if k in OPTIONS and OPTIONS[k].task}


def check_rendered_options(op: Any) -> None:
    """After templates are rendered: the templated options, checked as they now are.

    The accelerator is only checked to be a string here: the caller parses it right after
    (``submission.task_spec``), once, into the spec the job reference carries."""
    for name, spec in OPTIONS.items():
        if not (spec.templated and spec.task) or not hasattr(op, name):
            continue
        value = getattr(op, name)
        if value is None and spec.optional:
            continue
        if isinstance(value, str) and "{{" in value:  # rendered to text that still holds Jinja
            raise KineticOptionError(
                f"{name} (as rendered)={value!r} still holds a Jinja expression: fix the template so that "
                f"it renders to {spec.accepts}"
            )
        setattr(op, name, _RENDERED_CHECKS[spec.kind](spec, value, f"{name} (as rendered)"))


def is_deferred(value: Any) -> bool:
    """A value Airflow resolves when the task runs: Jinja text, or an XComArg / other resolvable."""
    if isinstance(value, str):
        return "{{" in value
    if isinstance(value, Mapping):
        return False
    return hasattr(value, "resolve") and hasattr(value, "iter_references")


def _fail(
    spec: OptionSpec, where: str, value: Any, problem: str, fix: str | None = None, guess: str | None = None
) -> KineticOptionError:
    """``<where>=<value> <problem>. <name> takes <accepted>; write <fix>.`` (or its example)."""
    message = f"{where}={_shown(value)} {problem}. {spec.name} takes {spec.accepts}"
    if fix:
        message += f"; write {fix}."
    elif guess:
        message += f". Did you mean {guess}?"
    else:
        message += f", e.g. {spec.example}." if spec.example else "."
    return KineticOptionError(message)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


_TYPE_WORDS = {"str": "a string", "NoneType": "None", "int": "an int"}


def _a(value: Any) -> str:
    """``a float``, ``an int``, ``a string``, ``None``: the value's type, as a message says it."""
    name = type(value).__name__
    return _TYPE_WORDS.get(name) or (f"an {name}" if name[:1] in "aeiouAEIOU" else f"a {name}")


_UNITS = {
    "ms": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
}
_WITH_UNIT = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*")


def _seconds_meant(text: str) -> float | None:
    """What a duration string was meant to say, for the fix only (``"2s"`` -> 2.0)."""
    m = _WITH_UNIT.fullmatch(text)
    if not m or m[2].lower() not in ("", *_UNITS):
        return None
    return float(m[1]) * (_UNITS[m[2].lower()] if m[2] else 1.0)


def _seconds_fix(name: str, seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{name}={seconds:g} or {name}=timedelta(minutes={seconds / 60:g})"
    return f"{name}={seconds:g} or {name}=timedelta(seconds={seconds:g})"


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _in_range(spec: OptionSpec, where: str, value: Any, number: float, fix: str | None = None) -> None:
    if spec.minimum is None:
        return
    if number < spec.minimum or (spec.above and number == spec.minimum):
        bound = f"more than {spec.minimum:g}" if spec.above else f"{spec.minimum:g} or more"
        raise _fail(spec, where, value, f"must be {bound}", fix)


def _check_duration(spec: OptionSpec, value: Any, where: str) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif _is_number(value):
        seconds = float(value)
    elif isinstance(value, str):
        meant = _seconds_meant(value)
        fix = _seconds_fix(spec.name, meant) if meant is not None else None
        raise _fail(spec, where, value, "is a string, not a duration (units in strings are not read)", fix)
    else:
        raise _fail(spec, where, value, f"is {_a(value)}, not a duration")
    if not math.isfinite(seconds):
        raise _fail(spec, where, value, "is not a finite number of seconds")
    _in_range(spec, where, value, seconds)
    return seconds


def _check_count(spec: OptionSpec, value: Any, where: str) -> int:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        _in_range(spec, where, value, int(value))
        return int(value)
    fix = None
    if _is_number(value) and math.isfinite(value) and float(value).is_integer():
        fix = f"{spec.name}={int(value)}"
    elif isinstance(value, str) and value.strip().isdigit():
        fix = f"{spec.name}={int(value.strip())}"
    raise _fail(spec, where, value, f"is {_a(value)}, not a whole number", fix)


def _check_bool(spec: OptionSpec, value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    fix = None
    if isinstance(value, str) and parse_bool(value) is not None:
        fix = f"{spec.name}={parse_bool(value)}"
    elif _is_number(value) and value in (0, 1):
        fix = f"{spec.name}={bool(value)}"
    elif value is None:
        fix = f"{spec.name}=True or {spec.name}=False"
    problem = f"is {_a(value)}, not a bool"
    if isinstance(value, str):
        problem = "is a string, not a bool (any non-empty string would count as true)"
    raise _fail(spec, where, value, problem, fix)


def _check_enum(spec: OptionSpec, value: Any, where: str) -> str:
    if isinstance(value, str) and value in spec.choices:
        return value
    if not isinstance(value, str):
        raise _fail(spec, where, value, f"is {_a(value)}, not a name")

    text = value.strip().lower()
    guess = text if text in spec.choices else spec.aliases.get(text)
    if guess is None:
        close = difflib.get_close_matches(text, spec.choices, n=1, cutoff=0.5)
        guess = close[0] if close else None
    raise _fail(
        spec,
        where,
        value,
        f"is not one of {', '.join(spec.choices)}",
        guess=f"{spec.name}={guess!r}" if guess else None,
    )


def _check_text(spec: OptionSpec, value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _fail(spec, where, value, f"is {_a(value)}, not a string")
    if not value.strip():
        raise _fail(spec, where, value, "is empty", f"{spec.name}=None (or leave it out) for the default")
    return value


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _check_namespace(spec: OptionSpec, value: Any, where: str) -> str:
    value = _check_text(spec, value, where)
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        fixed = re.sub(r"[^a-z0-9-]+", "-", value.strip().lower()).strip("-")[:63].strip("-")
        raise _fail(
            spec,
            where,
            value,
            "is not a valid Kubernetes namespace",
            f"{spec.name}={fixed!r}" if fixed else None,
        )
    return value


def _check_location(spec: OptionSpec, value: Any, where: str) -> str:
    value = _check_text(spec, value, where)
    if "://" not in value and not value.startswith("/"):
        raise _fail(
            spec,
            where,
            value,
            "is a relative path, which would land in the job's working directory and be lost",
            f'{spec.name}="gs://bucket/{value.strip("./")}"',
        )
    return value


def _check_base_uri(spec: OptionSpec, value: Any, where: str) -> str:
    value = _check_text(spec, value, where)
    # Start-up cost: config loads this module everywhere (stdlib only at import).
    from kinetic_airflow.validation import check_base_uri

    check_base_uri(value, where=where)
    return value


def _check_accelerator_text(spec: OptionSpec, value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _fail(spec, where, value, f"is {_a(value)}, not an accelerator string")
    return value


def _check_rungs(spec: OptionSpec, value: Any, where: str, check: Callable[[Any, str, str], Any]) -> list:
    """A list-form accelerator or capacity (a capacity ladder, ``kinetic_airflow.ladder``): each
    rung's value checked by ``check`` as a single value is; pairs keep their time in seconds."""
    from kinetic_airflow.ladder import LadderError, rung_items  # (stdlib only at import, as above)

    try:
        items = rung_items(spec.name, value)
    except LadderError as exc:
        raise KineticOptionError(f"{exc}. {spec.name} takes {spec.accepts}") from None
    out: list[Any] = []
    for index, (text, seconds) in enumerate(items):
        try:
            checked = check(spec, text, f"{where} rung {index + 1}")
        except KineticOptionError:
            raise
        except (TypeError, ValueError) as exc:  # the accelerator's own error: name the rung
            raise KineticOptionError(f"{where} rung {index + 1}: {exc}") from None
        out.append((checked, seconds) if seconds is not None else checked)
    return out


def _check_accelerator(spec: OptionSpec, value: Any, where: str) -> Any:
    if isinstance(value, (list, tuple)):
        return _check_rungs(spec, value, where, _check_accelerator)
    value = _check_accelerator_text(spec, value, where)
    # Start-up cost: config loads this module everywhere (stdlib only at import).
    from kinetic_airflow.accelerators import parse_accelerator

    parse_accelerator(value)  # InvalidAcceleratorError quotes the string and lists the valid ones
    return value


_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")


def _check_env(spec: OptionSpec, value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        fix = None
        if isinstance(value, str) and "=" in value:
            value_list: Any = [value]
        else:
            value_list = value
        if isinstance(value_list, (list, tuple)) and all(isinstance(v, str) and "=" in v for v in value_list):
            fix = (
                spec.name
                + "={"
                + ", ".join(f"{v.split('=', 1)[0]!r}: {v.split('=', 1)[1]!r}" for v in value_list)
                + "}"
            )
        raise _fail(spec, where, value, f"is {_a(value)}, not a dict", fix)
    for key, item in value.items():
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise _fail(
                spec,
                where,
                value,
                f"has the key {key!r}, which is not an environment variable name (letters, digits, '_', '-', "
                "'.'; not starting with a digit)",
            )
        if not isinstance(item, str):
            if isinstance(item, numbers.Number):
                text = str(item).lower() if isinstance(item, bool) else str(item)
                fix = f"{spec.name}={{..., {key!r}: {text!r}}}"
            else:
                fix = None
            raise _fail(spec, where, value, f"has {_a(item)} as the value of {key!r}, not a string", fix)
    return dict(value)


def _check_patterns(spec: OptionSpec, value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        names = [n for n in re.split(r"[\s,;]+", value.strip("[]() ")) if n.strip("'\"")]
        names = [n.strip("'\"") for n in names]
        raise _fail(
            spec,
            where,
            value,
            "is a string, not a list (keras-kinetic would read it letter by letter)",
            f"{spec.name}={names!r}" if names else None,
        )
    # Start-up cost: config loads this module everywhere (stdlib only at import).
    from kinetic_airflow.envcapture import validate_capture_patterns

    try:
        return validate_capture_patterns(value)
    except TypeError as exc:
        raise KineticOptionError(str(exc)) from None


def _check_volumes(spec: OptionSpec, value: Any, where: str) -> dict[str, Any]:
    # Start-up cost: config loads this module everywhere (stdlib only at import).
    from kinetic_airflow.job.inputs import validate_volumes

    return validate_volumes(value)


def _check_pod_override(spec: OptionSpec, value: Any, where: str) -> Any:
    """Only the form a task argument takes: the pod's shape is checked above this layer (the
    operator, with ``backends/gke/pod_override``, which knows a pod's fields)."""
    if isinstance(value, str):  # JSON text is the config's form; a task passes the dict itself
        raise _fail(spec, where, value, "is a string; a task argument takes the dict itself")
    return value


def _check_requirements(spec: OptionSpec, value: Any, where: str) -> str | list[str]:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) or not isinstance(value, (list, tuple)):
        fix = None
        if isinstance(value, Mapping):
            fix = f"{spec.name}=" + repr(
                [f"{k}{v}" if isinstance(v, str) and v[:1] in "<>=!~" else str(k) for k, v in value.items()]
            )
        raise _fail(spec, where, value, f"is {_a(value)}, not a string or a list of strings", fix)
    for item in value:
        if not isinstance(item, str):
            raise _fail(spec, where, value, f"has {item!r}, {_a(item)}, among its items, not a string")
    return list(value)


def _check_impersonation(spec: OptionSpec, value: Any, where: str) -> str | list[str]:
    # Start-up cost: config loads this module everywhere (stdlib only at import).
    from kinetic_airflow.validation import check_gke_access

    try:
        check_gke_access(impersonation_chain=value)
    except (TypeError, ValueError) as exc:
        raise KineticOptionError(str(exc)) from None
    return value if isinstance(value, str) else list(value)


def _check_capacity(spec: OptionSpec, value: Any, where: str) -> Any:
    if isinstance(value, (list, tuple)):
        return _check_rungs(spec, value, where, _check_capacity)
    # Start-up cost: config loads this module everywhere (stdlib only at import).
    from kinetic_airflow.capacity import InvalidCapacityError, parse_capacity

    try:
        return parse_capacity(value, where=where).text
    except InvalidCapacityError as exc:
        raise KineticOptionError(str(exc)) from None


def _check_kueue_name(spec: OptionSpec, value: Any, where: str) -> str:
    # Start-up cost: config loads this module everywhere (stdlib only at import).
    from kinetic_airflow.capacity import InvalidCapacityError, check_queue_name

    try:
        return check_queue_name(value, option=where)
    except InvalidCapacityError as exc:
        raise KineticOptionError(str(exc)) from None


_CHECKS: dict[str, Callable[[OptionSpec, Any, str], Any]] = {
    "impersonation": _check_impersonation,
    "accelerator": _check_accelerator,
    "text": _check_text,
    "namespace": _check_namespace,
    "enum": _check_enum,
    "patterns": _check_patterns,
    "volumes": _check_volumes,
    "bool": _check_bool,
    "location": _check_location,
    "base_uri": _check_base_uri,
    "duration": _check_duration,
    "count": _check_count,
    "env": _check_env,
    "pod_override": _check_pod_override,
    "requirements": _check_requirements,
    "capacity": _check_capacity,
    "kueue_name": _check_kueue_name,
}
# As rendered (``check_rendered_options``): the accelerator's parse is the caller's, done once.
_RENDERED_CHECKS = {**_CHECKS, "accelerator": _check_accelerator_text}


# The options together -----------------------------------------------------------------------
def validate_backend(backend: Any, where: str = "backend") -> None:
    """``backend`` is one of ``BackendName`` (None: not given); a typo gets a "did you mean"."""
    if backend is None:
        return
    check_option("backend", backend, where=where)


def validate_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """Every parse-time check of the job options given in ``values``; returns them checked and
    normalized (durations in seconds, lists, dicts), other keys left out.

    Each option is checked by its row of the option table above, then
    the options are checked together (the accelerator fits the backend; no volumes on the
    local backend). Shared by the decorator (checked when it is applied) and the operator
    (checked when it is built), so a DAG file learns about a bad option at import either way;
    the operator layer adds the pod override's shape (``operators.check_task_options``).
    """
    # Not at the top: config loads this module in every Airflow process (see the docstring).
    from kinetic_airflow.accelerators import parse_accelerator
    from kinetic_airflow.capacity import check_task_placement
    from kinetic_airflow.validation import (
        check_backend_fits,
        check_gke_access,
        check_local_volumes,
        is_templated,
    )

    checked = check_options(values)
    backend = checked.get("backend")
    rungs = _ladder(checked, backend)  # a capacity ladder: the first rung is the task's own values
    accelerator = checked.get("accelerator", "cpu")
    check_gke_access(checked.get("use_internal_ip"), checked.get("use_dns_endpoint"))
    if not is_templated(accelerator) and isinstance(accelerator, str):
        spec = parse_accelerator(accelerator, spot=checked.get("spot") or None)
        check_backend_fits(backend, spec)
        if backend != "local":  # the local backend runs the job here, whatever the cluster offers
            check_task_placement(checked, spec)
    if backend == "local":
        check_local_volumes(checked.get("volumes"))
    if (checked.get("slices") or 1) > 1:
        from kinetic_airflow.slices import check_slices  # (as above)

        check_slices(checked["slices"], accelerator, backend, spot=checked.get("spot"))
    from kinetic_airflow.job.debugging import check_debug_options  # (as above)

    check_debug_options(checked, KineticOptionError)
    if rungs is not None:
        _check_rungs_together(checked, rungs, backend)
    elif checked.get("rung_after_preemption") == "same":
        raise KineticOptionError(
            'rung_after_preemption="same" does nothing without a capacity ladder (it picks the rung a '
            "preempted job resubmits on): give capacity or accelerator as a list of rungs, e.g. "
            "capacity=['spot', 'on-demand'], or leave out rung_after_preemption"
        )
    _check_cache_options(checked)
    return checked


def _ladder(checked: dict[str, Any], backend: str | None) -> Any:
    """A capacity ladder (``kinetic_airflow.ladder``), if ``accelerator`` or ``capacity`` is a list:
    ``checked`` then names the first rung's values and ``checked["ladder"]`` holds every rung."""
    from kinetic_airflow.ladder import LadderError, check_ladder_backend, ladder_of  # (as above)

    try:
        rungs = ladder_of(checked.get("accelerator"), checked.get("capacity"))
        check_ladder_backend(rungs, backend)
    except LadderError as exc:
        raise KineticOptionError(str(exc)) from None
    if rungs is None:
        return None
    if rungs[0].accelerator is not None:
        checked["accelerator"] = rungs[0].accelerator
    if rungs[0].capacity is not None:
        checked["capacity"] = rungs[0].capacity
    if checked.get("spot") and any(r.capacity for r in rungs):
        raise KineticOptionError(
            "spot=True makes every rung of the capacity ladder Spot, so the ladder "
            f"capacity={[r.capacity for r in rungs]!r} could not fall back: drop spot=True and write "
            "'spot' as the rung that asks for it, e.g. capacity=['spot', 'on-demand']"
        )
    checked["ladder"] = rungs if len(rungs) > 1 else None
    return checked["ladder"]


def _check_rungs_together(checked: dict[str, Any], rungs: Any, backend: str | None) -> None:
    """Every rung after the first, checked with the other options as the first one was."""
    # (as above: config loads this module in every Airflow process)
    from kinetic_airflow.accelerators import parse_accelerator  # (as above)
    from kinetic_airflow.capacity import check_task_placement  # (as above)
    from kinetic_airflow.validation import check_backend_fits, is_templated  # (as above)

    for index, rung in enumerate(rungs[1:], start=2):
        accelerator = rung.accelerator or checked.get("accelerator", "cpu")
        if is_templated(accelerator) or not isinstance(accelerator, str):
            continue  # the task's own templated accelerator: checked when rendered
        spec = parse_accelerator(accelerator, spot=checked.get("spot") or None)
        try:
            check_backend_fits(backend, spec)
            if backend != "local":
                check_task_placement({**checked, "capacity": rung.capacity or checked.get("capacity")}, spec)
            if (checked.get("slices") or 1) > 1:
                from kinetic_airflow.slices import check_slices  # (as above)

                check_slices(checked["slices"], accelerator, backend, spot=checked.get("spot"))
        except (TypeError, ValueError) as exc:
            raise KineticOptionError(f"capacity ladder rung {index} ({rung.label()}): {exc}") from None


def _check_cache_options(checked: Mapping[str, Any]) -> None:
    """``cache_version`` only means something with ``cache=True``; ``debug=True`` wants its job to
    run, which a reused result would skip."""
    if checked.get("cache_version") is not None and checked.get("cache") is not True:
        raise KineticOptionError(
            f"cache_version={checked['cache_version']!r} given without cache=True does nothing (it is part "
            "of the cache key); write cache=True to reuse results, or leave out cache_version."
        )
    if checked.get("cache") is True and checked.get("debug") is True:
        raise KineticOptionError(
            "cache=True with debug=True: a reused result would skip the job you want to debug; leave out "
            "cache=True while debugging (or debug=True to reuse results)."
        )


# Configured values ------------------------------------------------------------------------------
def parse_setting(name: str, text: str, source: str, default: Any = None) -> Any:
    """A ``[kinetic]`` / environment string as the value of setting ``name``.

    ``source`` names where it came from (``[kinetic] poll_interval (AIRFLOW__KINETIC__POLL_INTERVAL)``,
    ``KINETIC_POLL_INTERVAL``); every error quotes it, the value and the form expected.
    """
    spec = OPTIONS.get(name)
    if spec is None:
        return text
    value = text.strip()

    def fail(problem: str, form: str) -> KineticSettingError:
        return KineticSettingError(f"{source}={text!r} {problem}: {name} takes {form}")

    if spec.kind == "bool":
        flag = parse_bool(value)
        if flag is None:
            raise fail("is not a boolean", "true or false")
        return flag
    if spec.kind in ("duration", "count"):
        kind = float if spec.kind == "duration" else int
        example = (
            f"{default:g}" if isinstance(default, float) else (str(default) if default is not None else "")
        )
        if spec.kind == "duration":
            form = f"a number of seconds, e.g. {example or '2'} or 0.5 (no unit)"
        else:
            form = f"a whole number, e.g. {example or '3'} (no unit)"
        try:
            number = kind(value)
        except ValueError:
            raise fail("does not parse", form) from None
        if not math.isfinite(number):
            raise fail("is not a finite number", form)
        if spec.minimum is not None and (number < spec.minimum or (spec.above and number == spec.minimum)):
            bound = f"more than {spec.minimum:g}" if spec.above else f"{spec.minimum:g} or more"
            raise fail(f"is out of range (must be {bound})", form)
        return number
    if spec.kind == "enum":
        if value in spec.choices:
            return value
        guess = spec.aliases.get(value.lower()) or (value.lower() if value.lower() in spec.choices else None)
        hint = f" (did you mean {guess}?)" if guess else ""
        raise fail(f"is not one of {', '.join(spec.choices)}{hint}", spec.accepts)
    if spec.kind == "namespace" and (len(value) > 63 or not _DNS_LABEL.fullmatch(value)):
        raise fail("is not a valid Kubernetes namespace", spec.accepts)
    if spec.kind == "base_uri":
        # Start-up cost: config loads this module everywhere (stdlib only at import).
        from kinetic_airflow.validation import check_base_uri

        check_base_uri(value, where=source)
    if spec.kind in ("capacity", "kueue_name"):
        try:
            return _CHECKS[spec.kind](spec, value, source)
        except KineticOptionError as exc:
            raise KineticSettingError(str(exc)) from None
    return value
