"""``get_backend``: a job's backend name (``JobRef["backend"]``) to its implementation."""

from __future__ import annotations

from kinetic_airflow.backends.base import Backend

__all__ = ["get_backend"]


def get_backend(name: str) -> Backend:
    # Each backend is imported when a job names it: the GKE ones load the Kubernetes client.
    if name == "local":
        from kinetic_airflow.backends.local import LocalBackend

        return LocalBackend()
    if name == "gke":
        from kinetic_airflow.backends.gke.backend import GKEBackend

        return GKEBackend()
    if name == "pathways":
        from kinetic_airflow.backends.gke.pathways import PathwaysBackend

        return PathwaysBackend()
    raise ValueError(f"unknown backend {name!r}: use 'local', 'gke', 'pathways' or 'auto'")
