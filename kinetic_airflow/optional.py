"""Which optional Airflow providers are installed, asked before code that needs one runs.

``pip install kinetic-airflow`` is the slim install (the local backend); the cluster backends
talk to GKE and Kubernetes through the google and cncf.kubernetes providers' hooks, which the
``gke`` extra brings (the official Airflow image and Cloud Composer already have them). Asking
first turns a deep ``ModuleNotFoundError`` into a message that names the extra to install.
"""

from __future__ import annotations

import importlib.util

__all__ = ["require_providers"]

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
