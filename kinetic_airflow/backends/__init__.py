"""Backends: where a job runs. ``get_backend`` maps a JobRef's backend name to its implementation."""

from __future__ import annotations

from kinetic_airflow.backends.base import Backend, BackendStatus, JobRef, JobState

__all__ = ["Backend", "BackendStatus", "JobRef", "JobState", "get_backend"]


def get_backend(name: str) -> Backend:
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
