"""``get_backend``: a job's backend name (``JobRef["backend"]``) to its implementation."""

from __future__ import annotations

from kinetic_airflow.backends.base import Backend
from kinetic_airflow.backends.local import LocalBackend

__all__ = ["get_backend"]


def get_backend(name: str) -> Backend:
    if name == "local":
        return LocalBackend()
    if name == "gke":
        # The cluster backends are imported when a job names one: they load the Kubernetes client.
        from kinetic_airflow.backends.gke.backend import GKEBackend

        return GKEBackend()
    if name == "pathways":
        # (as for "gke")
        from kinetic_airflow.backends.gke.pathways import PathwaysBackend

        return PathwaysBackend()
    raise ValueError(f"unknown backend {name!r}: use 'local', 'gke', 'pathways' or 'auto'")
