"""The runner image a cluster job uses by default, one per accelerator kind.

``{location}-docker.pkg.dev/{project}/kn-{cluster}/kinetic-airflow-runner-{kind}:{version}-py{X.Y}``,
in the Artifact Registry repository kinetic's infrastructure creates for the cluster, tagged with
this provider's version and the workers' Python: a new release names a new image, so a node never
keeps a stale runner under a reused tag. The manifest names it; ``kinetic-airflow image`` builds
and pushes it.
"""

from __future__ import annotations

import re
import sys

from kinetic_airflow import __version__

__all__ = [
    "EXTRA_PACKAGES",
    "GKE_NVIDIA_LIBRARY_PATH",
    "LIBRARY_PATH",
    "PLACEHOLDER_REGISTRY",
    "check_image_python",
    "default_image_uri",
    "image_tag",
    "registry_location",
    "this_python",
]

# What each kind adds to the slim runner (the Dockerfile's EXTRA_PACKAGES build argument): the
# README's examples import jax and keras, so every kind has both.
EXTRA_PACKAGES = {"cpu": "jax keras", "gpu": "jax[cuda12] keras", "tpu": "jax[tpu] keras"}
# GKE's NVIDIA device plugin mounts the node's driver libraries (libcuda, libnvidia-ml) into GPU
# containers at this path; CUDA JAX finds libcuda only if it is on the loader path.
GKE_NVIDIA_LIBRARY_PATH = "/usr/local/nvidia/lib64"
LIBRARY_PATH = {"cpu": "", "gpu": GKE_NVIDIA_LIBRARY_PATH, "tpu": ""}
PLACEHOLDER_REGISTRY = "us-docker.pkg.dev/kinetic-airflow/runner"


def registry_location(zone: str | None) -> str:
    """Artifact Registry location for a zone, as kinetic's infrastructure picks it."""
    zone = zone or "us-central1-a"
    region = zone.rsplit("-", 1)[0] if zone.count("-") >= 2 else zone
    prefix = region.split("-")[0]
    return prefix if prefix in ("us", "asia", "europe") else region


def this_python() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def image_tag(python: str | None = None) -> str:
    """``{provider version}-py{X.Y}``: the runner's version and the Python it unpickles for."""
    return f"{__version__}-py{python or this_python()}"


def default_image_uri(
    kind: str, project: str | None, zone: str | None, cluster: str | None, python: str | None = None
) -> str:
    """The image ``kinetic-airflow image --kind KIND`` pushes; ``python`` defaults to this process's
    (on a worker: the workers' Python, which is what the job must run)."""
    name = f"kinetic-airflow-runner-{kind}:{image_tag(python)}"
    if project and cluster:
        return f"{registry_location(zone)}-docker.pkg.dev/{project}/kn-{cluster}/{name}"
    return f"{PLACEHOLDER_REGISTRY}/{name}"  # no project configured: a name to replace


def check_image_python(image: str) -> None:
    """Refuse, before anything is created, an image whose tag names another Python than the worker's.

    cloudpickle needs the same major.minor on both sides; the runner would find out only after
    the pod got its accelerator and pulled the image. Images built by ``kinetic-airflow image`` carry
    the version in their tag (``...:0.1.0-py3.11``); other tags are checked by the runner at start.
    """
    found = re.search(r":(?:.*[^0-9])?py(\d+)\.(\d+)(?![0-9])", image)
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if found and f"{found.group(1)}.{found.group(2)}" != here:
        raise ValueError(
            f"container_image {image!r} is built for Python {found.group(1)}.{found.group(2)} but this "
            f"Airflow worker runs Python {here}: cloudpickle needs the same major.minor version on both "
            f"sides. Use an image built for Python {here} (kinetic-airflow image --python {here}), "
            "or run the workers on the image's Python."
        )
