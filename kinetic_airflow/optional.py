"""Which optional Airflow providers are installed, asked before code that needs one runs.

``pip install kinetic-airflow`` is the slim install (the local backend); the cluster backends
talk to GKE and Kubernetes through the google and cncf.kubernetes providers' hooks, which the
``gke`` extra brings (the official Airflow image and Cloud Composer already have them). Asking
first turns a deep ``ModuleNotFoundError`` into a message that names the extra to install.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re

__all__ = ["AIRFLOW_FLOOR", "require_airflow", "require_providers"]

# The oldest Airflow whose APIs kinetic-airflow stands on, as pyproject.toml declares it
# (``apache-airflow>=3.3``): ``task_state_store`` (the job record that survives retries and clears,
# new in 3.3.0: no ``airflow/models/task_state_store.py`` in apache-airflow-core 3.2.2) and
# ``BaseTrigger.on_kill`` (a cleared or marked deferred task stops its job, new in 3.3.0).
# scripts/test-airflow-floor.sh runs the dag.test() tier on exactly this release.
AIRFLOW_FLOOR = (3, 3, 0)

_PROVIDERS = {
    "google": "apache-airflow-providers-google",
    "cncf.kubernetes": "apache-airflow-providers-cncf-kubernetes",
}


def require_providers(*names: str, needed_for: str = "the gke and pathways backends") -> None:
    """Raise a clear error when an Airflow provider a cluster backend uses is not installed."""
    missing = []
    for name in names or tuple(_PROVIDERS):
        try:
            found = importlib.util.find_spec(f"airflow.providers.{name}") is not None
        except ModuleNotFoundError:  # no airflow.providers namespace at all
            found = False
        if not found:
            missing.append(_PROVIDERS[name])
    if missing:
        raise ModuleNotFoundError(
            f"{needed_for}: needs {' and '.join(missing)}, not installed in this Airflow environment. "
            'Install "kinetic-airflow[gke]" (or those packages) on the workers, triggerer and '
            'api-server, or use backend="local"'
        )


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string (``3.3.0rc1`` -> (3, 3, 0)); no packaging needed."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def require_airflow(installed: str | None = None) -> None:
    """Refuse, with the reason and the fix, an Airflow older than the one the provider needs.

    pip will not install kinetic-airflow beside an older Airflow, but an image built with
    ``--no-deps`` or a constraints file pinned low would otherwise import fine and fail later and
    far away (no job record: a retry would start a second job instead of reattaching).
    """
    if installed is None:
        try:
            installed = importlib.metadata.version("apache-airflow-core")
        except importlib.metadata.PackageNotFoundError:
            import airflow  # an Airflow installed without its distribution metadata (a source tree)

            installed = getattr(airflow, "__version__", "0")
    if _release(installed) < AIRFLOW_FLOOR:
        floor = ".".join(map(str, AIRFLOW_FLOOR))
        raise ImportError(
            f"kinetic-airflow needs Apache Airflow {floor} or newer (its job record lives in "
            f"task_state_store, and a cleared deferred task stops its job through BaseTrigger.on_kill, "
            f"both new in 3.3.0); this environment has Airflow {installed}. "
            f'Upgrade Airflow (pip install "apache-airflow>={floor}"), or use kinetic-airflow only on '
            "deployments that run 3.3 or newer"
        )
