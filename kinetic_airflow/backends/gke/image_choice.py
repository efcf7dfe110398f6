"""Which runner image a cluster job runs: the task's, the configured one for its kind, or the default.

Apart from the manifest because the choice reads ``[kinetic]`` settings, which the manifest (below
the option table, through the pod override check) must not import.
"""

from __future__ import annotations

from kinetic_airflow.accelerators import AcceleratorSpec
from kinetic_airflow.backends.gke.images import default_image_uri
from kinetic_airflow.config import resolve_setting

__all__ = ["runner_image"]


def runner_image(
    spec: AcceleratorSpec,
    explicit: str | None = None,
    project: str | None = None,
    zone: str | None = None,
    cluster: str | None = None,
) -> str:
    """The image of a job with this accelerator: the task's ``container_image=``, else
    ``[kinetic] container_image_{kind}``, else ``[kinetic] container_image``, else the kind's
    default image (the one ``kinetic-airflow image --kind KIND`` builds and pushes, in kinetic's
    Artifact Registry repository of the cluster, ``kn-{cluster}``). Per kind, because a CPU
    image set for every job cannot run a TPU or GPU one."""
    return (
        explicit
        or resolve_setting(f"container_image_{spec.kind}")
        or resolve_setting("container_image")
        or default_image_uri(spec.kind, project, zone, cluster)
    )
