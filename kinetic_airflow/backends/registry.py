"""``get_backend``: a job's backend name (``JobRef.backend``) to its implementation;
``backend_states``: what the backends say of the catalogue's jobs that have no outcome yet."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kinetic_airflow.backends.base import Backend
from kinetic_airflow.backends.local import LocalBackend
from kinetic_airflow.jobstore import JobInfo
from kinetic_airflow.optional import require_providers

__all__ = ["backend_states", "get_backend"]


def get_backend(name: str) -> Backend:
    if name == "local":
        return LocalBackend()
    if name in ("gke", "pathways", "multislice"):
        require_providers()
    if name == "gke":
        # Start-up cost: a cluster backend (and its Kubernetes client) loads only when a job names one.
        from kinetic_airflow.backends.gke.backend import GKEBackend

        return GKEBackend()
    if name == "pathways":
        # (as for "gke")
        from kinetic_airflow.backends.gke.pathways import PathwaysBackend

        return PathwaysBackend()
    if name == "multislice":  # slices > 1 on pathways / auto (submission.resolve_backend)
        # (as for "gke")
        from kinetic_airflow.backends.gke.multislice import MultisliceBackend

        return MultisliceBackend()
    raise ValueError(f"unknown backend {name!r}: use 'local', 'gke', 'pathways' or 'auto'")


def backend_states(infos: Iterable[JobInfo]) -> None:
    """Ask each job's backend about the jobs that have no outcome in storage yet.

    Cluster jobs are looked up with one list of kinetic's Jobs / LeaderWorkerSets and pods
    per cluster and namespace, not a request per job.
    """
    snapshots: dict[str, Any] = {}
    for info in infos:
        ref = info.ref
        if ref is None or info.summary is not None or info.cancelled is not None:
            continue
        try:
            if ref.backend == "local":
                status = get_backend("local").status(ref)
            else:
                # Start-up cost: as in get_backend, the cluster code loads only for a cluster job.
                from kinetic_airflow.backends.gke.cluster_objects import snapshot_for

                status = snapshot_for(snapshots, ref).status_of(ref)
        except Exception as exc:
            info.backend_message = f"could not ask the {ref.backend} backend: {exc}"
            continue
        info.backend_state = status.state.value
        info.backend_message = status.message
