"""What a cluster pod mounts besides its container: the requirements cache and gs:// FUSE data.

* The requirements cache is a hostPath folder of the node (``/var/cache/kinetic/envs``),
  mounted only into jobs that have ``requirements``: accelerator nodes run job after job,
  and a cache that outlives the pod is what makes the second job install nothing (an
  emptyDir dies with the pod; a wheelhouse in job storage would still install every time).
  GKE Autopilot refuses writable hostPath volumes, so ``[kinetic] requirements_cache = auto``
  (the default) uses an emptyDir on a cluster the GKE API calls Autopilot
  (``Cluster.autopilot.enabled``); a cluster reached through a Kubernetes connection has no
  GKE API to ask, so set ``emptydir`` for an Autopilot one.
* ``Data("gs://...", fuse=True)`` is mounted lazily through the GCS FUSE CSI driver, as
  kinetic does: the pod annotation ``gke-gcsfuse/volumes: "true"`` (GKE injects the FUSE
  sidecar), one inline CSI volume per bucket prefix, read-only, through the ``kinetic``
  service account's bucket access. The function gets the mount path instead of a copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kinetic_airflow.backends.base import JobRef
from kinetic_airflow.job.inputs import check_fuse_folder, fuse_folder
from kinetic_airflow.job.layout import fuse_local_path, fuse_mount_path

__all__ = [
    "ENV_CACHE_MOUNT",
    "PodExtras",
    "RequirementsCacheError",
    "fuse_local_path",
    "fuse_mount_path",
    "pod_extras",
    "requirements_cache_for",
]

ENV_CACHE_HOST_PATH = "/var/cache/kinetic/envs"
ENV_CACHE_MOUNT = "/kinetic/envs"
FUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
FUSE_ANNOTATION = "gke-gcsfuse/volumes"


@dataclass
class PodExtras:
    annotations: dict[str, str] = field(default_factory=dict)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


class RequirementsCacheError(ValueError):
    """The requirements cache asked for cannot work on this cluster; names the setting."""


def requirements_cache_for(setting: Any, cluster: dict[str, Any] | None, job: JobRef | None = None) -> str:
    """``hostpath`` or ``emptydir`` for ``[kinetic] requirements_cache`` on ``cluster``.

    ``auto`` (also when unset) is an emptyDir on GKE Autopilot, whose admission (GKE Warden's
    ``autogke-no-write-mode-hostpath``) refuses writable hostPath volumes, and the node's
    hostPath elsewhere. An explicit ``hostpath`` on Autopilot is refused here, before a Job
    whose pod the cluster would refuse is created.
    """
    mode = str(setting or "auto").strip().lower()
    autopilot = bool((cluster or {}).get("autopilot"))
    if mode == "auto":
        return "emptydir" if autopilot else "hostpath"
    if mode == "hostpath" and autopilot and (job is None or job.requirements):
        raise RequirementsCacheError(
            f"[kinetic] requirements_cache = hostpath, but GKE cluster {(cluster or {}).get('name')!r} "
            "is Autopilot, which refuses writable hostPath volumes (GKE Warden: "
            "autogke-no-write-mode-hostpath); set [kinetic] requirements_cache = auto or emptydir "
            "(AIRFLOW__KINETIC__REQUIREMENTS_CACHE)"
        )
    return mode


def _split(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri.removeprefix("gs://").partition("/")
    return bucket, prefix.strip("/")


def pod_extras(job: JobRef, env_cache: str = "hostpath") -> PodExtras:
    extras = PodExtras()
    if job.requirements:
        source: dict[str, Any] = (
            {"hostPath": {"path": ENV_CACHE_HOST_PATH, "type": "DirectoryOrCreate"}}
            if env_cache == "hostpath"
            else {"emptyDir": {}}
        )
        extras.volumes.append({"name": "kinetic-envs", **source})
        extras.mounts.append({"name": "kinetic-envs", "mountPath": ENV_CACHE_MOUNT})
        extras.env["KINETIC_ENV_CACHE"] = ENV_CACHE_MOUNT
    for index, uri in enumerate(sorted(set(job.fuse_data or []))):
        bucket, _ = _split(uri)
        check_fuse_folder(uri)  # Data() refused it at parse time; a reference built otherwise too
        options = "implicit-dirs"
        folder = fuse_folder(uri)
        if folder:
            options += ",only-dir=" + folder
        name = f"gcs-fuse-{index}"
        extras.volumes.append(
            {
                "name": name,
                "csi": {
                    "driver": FUSE_DRIVER,
                    "readOnly": True,
                    "volumeAttributes": {"bucketName": bucket, "mountOptions": options},
                },
            }
        )
        extras.mounts.append({"name": name, "mountPath": fuse_mount_path(uri), "readOnly": True})
        extras.annotations[FUSE_ANNOTATION] = "true"
    return extras
