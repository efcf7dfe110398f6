"""One table of every kinetic option: its type, range and accepted forms, and the checks built from it.

Task arguments (``@task.kinetic(...)``, ``kinetic_task(...)``, ``KineticRunOperator(...)``) are
checked when the DAG file is parsed, so a wrong value is a DAG import error that names the
option, the value, what is accepted and the fix, never a truthy surprise (``spot="false"``
turning Spot on) or a bare ``ValueError`` after a job was submitted. Templated values that
contain Jinja are checked again once rendered, before any job exists (``preflight``).
``[kinetic]`` config / ``AIRFLOW__KINETIC__*`` / ``KINETIC_*`` values are strings; they are
parsed here with the same rules, and the message names where the value came from.

Accepted forms, decided once for all options:

* durations are a number of seconds (``int`` / ``float``) or a ``datetime.timedelta`` in a
  task argument, a plain number of seconds in config. Strings with units (``"2s"``) are
  refused everywhere, with the typed value to write instead; Airflow's own durations
  (``execution_timeout``, ``retry_delay``) are typed the same way.
* booleans are ``True`` / ``False`` in a task argument (a string is refused, whatever it
  says); config takes true/false, 1/0, yes/no, on/off, as Airflow's config does.
* whole numbers are ``int`` (never a ``bool``); config takes digits.

This module imports only the standard library at import time: ``config`` (and so every
Airflow process and the CLI) loads it.
"""

from __future__ import annotations

import difflib
import math
import numbers
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

__all__ = [
    "OPTIONS",
    "KineticOptionError",
    "KineticSettingError",
    "OptionSpec",
    "check_option",
    "check_options",
    "check_rendered_options",
    "is_deferred",
    "parse_setting",
    "task_option_names",
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
    """What one option accepts.

    ``accepts`` is the human form of the rule (shown in every error); ``example`` a correct
    task argument; ``minimum`` with ``above`` (strictly more) bounds numbers; ``choices`` an
    enum. ``task`` / ``config``: given as a task argument / read from ``[kinetic]`` and the
    environment. ``templated``: one of the operator's ``template_fields``.
    """

    name: str
    kind: str
    accepts: str
    example: str
    minimum: float | None = None
    above: bool = False
    choices: tuple[str, ...] = ()
    task: bool = True
    config: bool = False
    templated: bool = False
    optional: bool = True
    aliases: Mapping[str, str] = field(default_factory=dict)


_A_BOOL = "True or False (a Python bool)"
_SECONDS = "a number of seconds (int or float) or a datetime.timedelta"
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


def _spec(name: str, kind: str, accepts: str, example: str, **kw: Any) -> tuple[str, OptionSpec]:
    return name, OptionSpec(name, kind, accepts, example, **kw)


def _config_seconds(name: str) -> tuple[str, OptionSpec]:
    """A [kinetic]-only wait or bound in seconds, 0 (none) or more: the guard's and the retries'."""
    return _spec(name, "duration", "a number of seconds, 0 or more", "", minimum=0, task=False, config=True)


# The table. Order: the operator's signature, then settings that exist only in [kinetic].
OPTIONS: dict[str, OptionSpec] = dict(
    [
        _spec(
            "accelerator",
            "accelerator",
            "a kinetic accelerator string such as 'cpu', 'gpu-l4', 'tpu-v6e-8t' or 'tpu-v5e-4:spot'",
            'accelerator="gpu-l4"',
            templated=True,
            optional=False,
        ),
        _spec(
            "container_image",
            "text",
            "an image reference (str)",
            'container_image="us-docker.pkg.dev/p/r/kinetic:py3.11"',
            config=True,
            templated=True,
        ),
        _spec("zone", "text", "a GKE location (str)", 'zone="us-central1-a"', config=True, templated=True),
        _spec(
            "project", "text", "a GCP project id (str)", 'project="my-project"', config=True, templated=True
        ),
        _spec(
            "cluster",
            "text",
            "a GKE cluster name (str)",
            'cluster="kinetic-cluster"',
            config=True,
            templated=True,
        ),
        _spec(
            "namespace",
            "namespace",
            "a Kubernetes namespace: lowercase letters, digits and '-', at most 63 characters",
            'namespace="ml-jobs"',
            config=True,
            templated=True,
        ),
        _spec(
            "backend",
            "enum",
            "one of local, gke, pathways, auto (local: a process on this machine; gke: a Kubernetes Job "
            "on GKE; pathways: a multi-host TPU slice; auto: pathways for multi-host TPUs, else gke)",
            'backend="gke"',
            choices=("local", "gke", "pathways", "auto"),
            config=True,
            aliases=_BACKEND_ALIASES,
        ),
        _spec(
            "capture_env_vars",
            "patterns",
            "a list of worker variable names or wildcard patterns",
            'capture_env_vars=["WANDB_API_KEY", "MYAPP_*"]',
        ),
        _spec(
            "volumes",
            "volumes",
            "a dict of absolute mount path -> kinetic_airflow.Data",
            'volumes={"/data": Data("gs://bucket/ds")}',
        ),
        _spec("spot", "bool", "True or False (a Python bool)", "spot=True", optional=False),
        _spec(
            "output_dir",
            "location",
            "a URI (gs://bucket/path, file:///path) or an absolute path",
            'output_dir="gs://bucket/runs/exp1"',
            templated=True,
        ),
        _spec(
            "base_uri",
            "base_uri",
            "gs://bucket/prefix or file:///absolute/path",
            'base_uri="gs://bucket/kinetic"',
            config=True,
            templated=True,
        ),
        _spec(
            "gcp_conn_id",
            "text",
            "an Airflow connection id (str)",
            'gcp_conn_id="google_cloud_default"',
            config=True,
        ),
        _spec(
            "kubernetes_conn_id",
            "text",
            "an Airflow connection id (str)",
            'kubernetes_conn_id="kubernetes_default"',
            config=True,
        ),
        _spec("deferrable", "bool", "True or False (a Python bool)", "deferrable=False", optional=False),
        _spec(
            "poll_interval",
            "duration",
            _SECONDS + ", more than 0",
            "poll_interval=5",
            minimum=0,
            above=True,
            config=True,
        ),
        _spec(
            "heartbeat_seconds",
            "duration",
            _SECONDS + ", more than 0",
            "heartbeat_seconds=30",
            minimum=0,
            above=True,
            config=True,
        ),
        _spec(
            "startup_timeout",
            "duration",
            _SECONDS + ", more than 0",
            "startup_timeout=timedelta(minutes=30)",
            minimum=0,
            above=True,
            config=True,
        ),
        _spec(
            "preemption_retries",
            "count",
            "a whole number (int), 0 or more",
            "preemption_retries=3",
            minimum=0,
            config=True,
        ),
        _spec(
            "container_env",
            "env",
            "a dict of environment variable name -> string value",
            'container_env={"KERAS_BACKEND": "jax"}',
            templated=True,
        ),
        _spec(
            "pod_override",
            "pod_override",
            "a dict in Kubernetes' JSON shape or a kubernetes.client.V1Pod",
            'pod_override={"metadata": {"labels": {"team": "ml"}}}',
            config=True,
        ),
        _spec(
            "requirements",
            "requirements",
            "a requirement string or requirements file path, or a list of them",
            'requirements=["scikit-learn>=1.4"]',
        ),
        _spec("use_internal_ip", "bool", _A_BOOL, "use_internal_ip=True", config=True),
        _spec("use_dns_endpoint", "bool", _A_BOOL, "use_dns_endpoint=True", config=True),
        _spec(
            "impersonation_chain",
            "impersonation",
            "a service account email or a list of them (config: comma separated)",
            'impersonation_chain="kinetic@my-project.iam.gserviceaccount.com"',
            config=True,
            templated=True,
        ),
        # Capacity and Kueue (kinetic_airflow.capacity: the labels, taints and GKE's limits)
        _spec(
            "capacity",
            "capacity",
            "on-demand, spot, flex-start, queued, reservation:<name>, reservation:<project>/<name> "
            "or any-reservation",
            'capacity="flex-start"',
            config=True,
        ),
        _spec(
            "max_run_duration",
            "duration",
            _SECONDS + ", more than 0, at most 7 days (flex-start and queued capacity)",
            "max_run_duration=timedelta(hours=12)",
            minimum=0,
            above=True,
            config=True,
        ),
        _spec(
            "local_queue",
            "kueue_name",
            "the name of a Kueue LocalQueue in the job's namespace",
            'local_queue="team-a"',
            config=True,
        ),
        _spec(
            "priority_class",
            "kueue_name",
            "the name of a Kueue WorkloadPriorityClass",
            'priority_class="high"',
            config=True,
        ),
        _spec(
            "queue_timeout",
            "duration",
            _SECONDS + ", more than 0 (how long a job may wait in its Kueue queue)",
            "queue_timeout=timedelta(hours=2)",
            minimum=0,
            above=True,
            config=True,
        ),
        # Multislice TPU (backends.gke.multislice): checked with the accelerator and backend
        _spec(
            "slices",
            "count",
            "a whole number (int), 1 or more: how many multi-host TPU slices train together",
            "slices=2",
            minimum=1,
        ),
        # Remote debugging (kinetic_airflow.job.debugging): checked together in validate_options
        _spec("debug", "bool", _A_BOOL, "debug=True", optional=False),
        _spec(
            "debug_wait",
            "duration",
            _SECONDS + ", more than 0: how long a debug=True job waits for a debugger (default 600)",
            "debug_wait=timedelta(minutes=10)",
            minimum=0,
            above=True,
        ),
        _spec(
            "debug_on_timeout",
            "enum",
            "fail (the job fails before the function runs; the default) or run (it runs without a debugger)",
            'debug_on_timeout="run"',
            choices=("fail", "run"),
        ),
        # [kinetic] settings that are not task arguments
        _spec(
            "heartbeat_timeout",
            "duration",
            "a number of seconds, more than 0",
            "",
            minimum=0,
            above=True,
            task=False,
            config=True,
        ),
        _spec("xcom_max_bytes", "count", "a whole number, 0 or more", "", minimum=0, task=False, config=True),
        _spec("log_max_lines", "count", "a whole number, 0 or more", "", minimum=0, task=False, config=True),
        _spec("local_python", "text", "the path of a Python interpreter", "", task=False, config=True),
        _spec("local_state_dir", "text", "a directory path", "", task=False, config=True),
        _spec("service_account", "text", "a Kubernetes service account name", "", task=False, config=True),
        _config_seconds("wait_before_defer"),
        _spec(
            "metrics_interval",
            "duration",
            "a number of seconds, more than 0",
            "",
            minimum=0,
            above=True,
            task=False,
            config=True,
        ),
        _config_seconds("storage_retry_seconds"),
        _config_seconds("resume_margin_seconds"),
        _config_seconds("min_deferral_seconds"),
        _spec(
            "runner_python",
            "text",
            "an interpreter name or path in the runner image",
            "",
            task=False,
            config=True,
        ),
        _spec(
            "retention_days",
            "count",
            "a whole number of days, 0 or more",
            "",
            minimum=0,
            task=False,
            config=True,
        ),
        _spec("kinetic_interop", "bool", "true or false", "", task=False, config=True),
        _spec("watch_deferring_process", "bool", "true or false", "", task=False, config=True),
        # The runner image per accelerator kind (a CPU image cannot run a TPU or GPU job); they win
        # over container_image, a task's container_image= wins over both.
        *(
            _spec(f"container_image_{kind}", "text", "an image reference (str)", "", task=False, config=True)
            for kind in ("cpu", "gpu", "tpu")
        ),
        _spec(
            "worker_python",
            "text",
            "the Airflow workers' Python major.minor, such as 3.11",
            "",
            task=False,
            config=True,
        ),
        _spec(
            "requirements_cache",
            "enum",
            "hostpath (a node folder every job on the node reuses) or emptydir (per pod; GKE Autopilot)",
            "",
            choices=("hostpath", "emptydir"),
            task=False,
            config=True,
        ),
    ]
)


def task_option_names() -> tuple[str, ...]:
    """The options a task takes (``KineticRunOperator``'s, ``kinetic_task``'s)."""
    return tuple(name for name, spec in OPTIONS.items() if spec.task)


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


_TRUE_WORDS = ("true", "t", "yes", "y", "on", "1")
_FALSE_WORDS = ("false", "f", "no", "n", "off", "0")


def _check_bool(spec: OptionSpec, value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    fix = None
    if isinstance(value, str) and value.strip().lower() in _TRUE_WORDS + _FALSE_WORDS:
        fix = f"{spec.name}={value.strip().lower() in _TRUE_WORDS}"
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


def _check_accelerator(spec: OptionSpec, value: Any, where: str) -> str:
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
    # Start-up cost: config loads this module everywhere (stdlib only at import).
    from kinetic_airflow.backends.gke.pod_override import normalize_pod_override

    if isinstance(value, str):  # JSON text is the config's form; a task passes the dict itself
        raise _fail(spec, where, value, "is a string; a task argument takes the dict itself")
    try:
        return normalize_pod_override(value, source=where)
    except ValueError as exc:  # PodOverrideError names the field; add what a right one looks like
        raise type(exc)(f"{exc}. A pod override looks like {spec.example}") from None


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
    from kinetic_airflow.validation import check_gke_access  # validation imports this module

    try:
        check_gke_access(impersonation_chain=value)
    except (TypeError, ValueError) as exc:
        raise KineticOptionError(str(exc)) from None
    return value if isinstance(value, str) else list(value)


def _check_capacity(spec: OptionSpec, value: Any, where: str) -> str:
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
    """``backend`` is one of ``config.BACKENDS`` (None: not given); a typo gets a "did you mean"."""
    if backend is None:
        return
    check_option("backend", backend, where=where)


def validate_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """Every parse-time check of the job options given in ``values``; returns them checked and
    normalized (durations in seconds, lists, dicts), other keys left out.

    Each option is checked by its row of the option table above, then
    the options are checked together (the accelerator fits the backend; no volumes on the
    local backend). Shared by the decorator (checked when it is applied) and the operator
    (checked when it is built), so a DAG file learns about a bad option at import either way.
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
    accelerator = checked.get("accelerator", "cpu")
    backend = checked.get("backend")
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
    return checked


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
        if value.lower() in _TRUE_WORDS:
            return True
        if value.lower() in _FALSE_WORDS:
            return False
        raise fail("is not a boolean", "true or false")
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
