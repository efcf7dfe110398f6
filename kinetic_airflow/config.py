"""Settings resolution: task argument > ``[kinetic]`` config > ``KINETIC_*`` env > default.

The settings, their defaults and how their text parses are rows of the option table
(``kinetic_airflow.options``); this module decides only where a value comes from.

One place decides precedence so that a single setting (say
``AIRFLOW__KINETIC__BACKEND=gke``) flips a whole deployment, while a task can
still override it. ``KINETIC_*`` names match Keras kinetic's own variables
(``KINETIC_PROJECT``, ``KINETIC_ZONE``, ...), so a laptop set up for
``@kinetic.run`` works unchanged.
"""

from __future__ import annotations

import configparser
import logging
import os
import warnings
from typing import Any

from kinetic_airflow.options import OPTIONS, KineticSettingError, closest_setting, parse_setting, setting_text

__all__ = [
    "BACKENDS",
    "DEFAULTS",
    "KineticSettingError",
    "default_base_uri",
    "local_state_root",
    "resolve_setting",
    "unknown_settings",
]

log = logging.getLogger(__name__)

# Built-in defaults, from the option table. None means "derived" (see default_base_uri) or "unset".
DEFAULTS: dict[str, Any] = {name: spec.default for name, spec in OPTIONS.items() if spec.config}

BACKENDS: tuple[str, ...] = OPTIONS["backend"].choices

_ENV_PREFIX = "AIRFLOW__KINETIC__"
_warned_unknown = False


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
    if isinstance(default, float):
        try:
            return float(written) == default
        except ValueError:
            return False
    if isinstance(default, bool):
        return written.strip().lower() == setting_text(default)
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
    _warn_unknown_settings()
    sources = (
        (_airflow_conf_get(key), f"[kinetic] {key} (AIRFLOW__KINETIC__{key.upper()})"),
        (os.environ.get(f"KINETIC_{key.upper()}"), f"KINETIC_{key.upper()}"),
    )
    for value, source in sources:
        if value not in (None, ""):
            return parse_setting(key, value, source, default)
    return default


def unknown_settings() -> list[str]:
    """One message per ``[kinetic]`` key that is not a setting (airflow.cfg or
    ``AIRFLOW__KINETIC__*``): Airflow keeps any key, so a typo would otherwise be ignored in silence.
    Each names the key, where it was set and the closest setting."""
    found: dict[str, str] = {}
    for variable in os.environ:
        if not variable.startswith(_ENV_PREFIX):
            continue
        key = variable[len(_ENV_PREFIX) :].lower()
        for suffix in ("_cmd", "_secret"):  # Airflow's forms of a value read from a command / backend
            if key.endswith(suffix) and key[: -len(suffix)] in DEFAULTS:
                key = key[: -len(suffix)]
        if key not in DEFAULTS:
            found.setdefault(key, variable)
    conf = _conf()
    try:
        written = configparser.ConfigParser.options(conf, "kinetic") if conf is not None else []
    except Exception:  # no [kinetic] section, or a conf that is not a ConfigParser
        written = []
    for key in written:
        if key not in DEFAULTS:
            found.setdefault(key, f"[kinetic] {key} in airflow.cfg")
    messages = []
    for key, where in sorted(found.items()):
        meant = closest_setting(key)
        hint = (
            f"did you mean {meant} ({_ENV_PREFIX}{meant.upper()})?"
            if meant
            else "the settings are listed by `airflow config list --section kinetic`."
        )
        messages.append(f"{where}: {key!r} is not a kinetic setting and is ignored; {hint}")
    return messages


def _warn_unknown_settings() -> None:
    """Report unknown ``[kinetic]`` keys once per process: in the task log when a task resolves
    its settings, and as a warning of the DAG file being parsed (Airflow records those)."""
    global _warned_unknown
    if _warned_unknown:
        return
    _warned_unknown = True
    for message in unknown_settings():
        log.warning("%s", message)
        warnings.warn(message, UserWarning, stacklevel=3)


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
