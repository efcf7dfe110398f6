"""What a cluster pod mounts besides its container: the requirements cache and gs:// FUSE data.

* The requirements cache is a hostPath folder of the node (``/var/cache/kinetic/envs``),
  mounted only into jobs that have ``requirements``: accelerator nodes run job after job,
  and a cache that outlives the pod is what makes the second job install nothing (an
  emptyDir dies with the pod; a wheelhouse in job storage would still install every time).
  GKE Autopilot refuses hostPath: set ``[kinetic] requirements_cache = emptydir`` there.
* ``Data("gs://...", fuse=True)`` is mounted lazily through the GCS FUSE CSI driver, as
  kinetic does: the pod annotation ``gke-gcsfuse/volumes: "true"`` (GKE injects the FUSE
  sidecar), one inline CSI volume per bucket prefix, read-only, through the ``kinetic``
  service account's bucket access. The function gets the mount path instead of a copy.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from kinetic_airflow.backends.base import JobRef
from kinetic_airflow.job.layout import fuse_local_path, fuse_mount_path, fuse_points_at_file

__all__ = ["ENV_CACHE_MOUNT", "PodExtras", "fuse_local_path", "fuse_mount_path", "pod_extras"]

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
        bucket, prefix = _split(uri)
        options = "implicit-dirs"
        folder = posixpath.dirname(prefix) if fuse_points_at_file(uri) else prefix
        if folder:
            options += ",only-dir=" + folder.replace(",", "\\,")
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
