"""``capture_env_vars``: which of the worker's environment variables travel to the job.

Wildcards are convenient (``"WANDB_*"``) but a careless ``"*"`` would ship the
worker's PATH, HOME or VIRTUAL_ENV and break the job's interpreter, so wildcards
never match process-critical names; naming one exactly still works. Names that
look like credentials draw a warning: the payload is stored in the job bucket.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
from collections.abc import Iterable, Mapping

__all__ = ["capture_env", "validate_capture_patterns"]

log = logging.getLogger(__name__)

PROCESS_CRITICAL = frozenset(
    {
        "PATH", "HOME", "PWD", "OLDPWD", "USER", "LOGNAME", "SHELL", "HOSTNAME", "TERM", "TMPDIR",
        "LANG", "LC_ALL", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE",
        "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "LD_LIBRARY_PATH", "LD_PRELOAD",
        "KERAS_BACKEND", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "XLA_FLAGS",
        "TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES", "TPU_NAME", "TPU_ACCELERATOR_TYPE",
        "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "GOOGLE_APPLICATION_CREDENTIALS",
        "STORAGE_EMULATOR_HOST",
    }
)  # fmt: skip
_CRITICAL_PREFIXES = ("AIRFLOW", "KINETIC_", "_AIRFLOW", "LC_", "TPU_", "MEGASCALE_", "LWS_")
_CREDENTIAL_LOOKING = re.compile(
    r"(TOKEN|SECRET|PASSW(OR)?D|CREDENTIAL|API_?KEY|PRIVATE_?KEY|ACCESS_?KEY|AUTH)", re.IGNORECASE
)


def _is_critical(name: str) -> bool:
    return name in PROCESS_CRITICAL or name.startswith(_CRITICAL_PREFIXES)


def validate_capture_patterns(patterns: object) -> list[str]:
    if patterns is None:
        return []
    if isinstance(patterns, str):
        patterns = [patterns]
    if isinstance(patterns, Mapping):
        names = ", ".join(repr(str(k)) for k in patterns) or "..."
        raise TypeError(
            f"capture_env_vars takes the names of the Airflow worker's variables to copy into the job, "
            f"not values: got a dict ({names}), whose values would be dropped. To capture, set the "
            f"variables on the worker and pass their names: capture_env_vars=[{names}]. To set plain "
            "values, use container_env={...} (the job container's environment on gke / pathways). "
            "For secrets such as API keys, use a Kubernetes Secret "
            "in the job's namespace (or Workload Identity) instead of shipping them in the payload."
        )
    if not isinstance(patterns, Iterable) or not all(isinstance(p, str) and p for p in patterns):
        raise TypeError(
            "capture_env_vars must be a list of variable names or wildcard patterns, "
            f"e.g. ['WANDB_API_KEY', 'MYAPP_*'], got {patterns!r}"
        )
    return list(patterns)


def capture_env(patterns: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Resolve patterns against ``environ`` (the worker's environment by default)."""
    environ = os.environ if environ is None else environ
    captured: dict[str, str] = {}
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            for name in environ:
                if fnmatch.fnmatchcase(name, pattern) and not _is_critical(name):
                    captured[name] = environ[name]
        elif pattern in environ:
            captured[pattern] = environ[pattern]
        else:
            log.warning("capture_env_vars: %s is not set on the worker; the job will not see it", pattern)
    risky = sorted(n for n in captured if _CREDENTIAL_LOOKING.search(n))
    if risky:
        log.warning(
            "capture_env_vars ships credential-looking variables %s in the job payload (stored in the "
            "job bucket, readable by whoever can read it). Prefer Workload Identity or a secret "
            "mounted in the cluster.",
            ", ".join(risky),
        )
    return captured
