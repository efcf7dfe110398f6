"""Backends: where a job runs. ``get_backend`` maps a JobRef's backend name to its implementation."""

from __future__ import annotations

from kinetic_airflow.backends.base import Backend, BackendStatus, JobRef, JobState

__all__ = ["Backend", "BackendStatus", "JobRef", "JobState", "get_backend", "require_providers"]

_PROVIDERS = {
    "google": "apache-airflow-providers-google",
    "cncf.kubernetes": "apache-airflow-providers-cncf-kubernetes",
}


def require_providers(*names: str, needed_for: str = "the gke and pathways backends") -> None:
    """Raise a clear error when an Airflow provider a cluster backend uses is not installed.

    ``pip install kinetic-airflow`` is the slim install (the local backend); the cluster backends
    talk to GKE and Kubernetes through the google and cncf.kubernetes providers' hooks, which the
    ``gke`` extra brings (the official Airflow image and Cloud Composer already have them).
    """
    import importlib.util

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


def get_backend(name: str) -> Backend:
    if name == "local":
        from kinetic_airflow.backends.local import LocalBackend

        return LocalBackend()
    if name in ("gke", "pathways"):
        require_providers()
    if name == "gke":
        from kinetic_airflow.backends.gke.backend import GKEBackend

        return GKEBackend()
    if name == "pathways":
        from kinetic_airflow.backends.gke.pathways import PathwaysBackend

        return PathwaysBackend()
    raise ValueError(f"unknown backend {name!r}: use 'local', 'gke', 'pathways' or 'auto'")
