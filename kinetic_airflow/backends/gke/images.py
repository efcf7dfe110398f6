"""The runner image a cluster job uses by default, one per accelerator kind.

``{location}-docker.pkg.dev/{project}/kn-{cluster}/kinetic-airflow-runner-{kind}:py{X.Y}``, in
the Artifact Registry repository kinetic's infrastructure creates for the cluster. The
manifest names it; ``kinetic-airflow image`` builds and pushes it.
"""

from __future__ import annotations

import re
import sys

__all__ = [
    "EXTRA_PACKAGES",
    "PLACEHOLDER_REGISTRY",
    "check_image_python",
    "default_image_uri",
    "python_tag",
    "registry_location",
]

# What each kind adds to the slim runner (docker/Dockerfile's EXTRA_PACKAGES build argument).
EXTRA_PACKAGES = {"cpu": "jax", "gpu": "jax[cuda12]", "tpu": "jax[tpu]"}
PLACEHOLDER_REGISTRY = "us-docker.pkg.dev/kinetic-airflow/runner"


def registry_location(zone: str | None) -> str:
    """Artifact Registry location for a zone, as kinetic's infrastructure picks it."""
    zone = zone or "us-central1-a"
    region = zone.rsplit("-", 1)[0] if zone.count("-") >= 2 else zone
    prefix = region.split("-")[0]
    return prefix if prefix in ("us", "asia", "europe") else region


def python_tag() -> str:
    return f"py{sys.version_info[0]}.{sys.version_info[1]}"


def default_image_uri(kind: str, project: str | None, zone: str | None, cluster: str | None) -> str:
    name = f"kinetic-airflow-runner-{kind}:{python_tag()}"
    if project and cluster:
        return f"{registry_location(zone)}-docker.pkg.dev/{project}/kn-{cluster}/{name}"
    return f"{PLACEHOLDER_REGISTRY}/{name}"  # no project configured: a name to replace


def check_image_python(image: str) -> None:
    """Refuse, before anything is created, an image whose tag names another Python than the worker's.

    cloudpickle needs the same major.minor on both sides; the runner would find out only after
    the pod got its accelerator and pulled the image. Images built from ``docker/`` carry the
    version in their tag (``...:py3.11``); other tags are checked by the runner at start.
    """
    found = re.search(r":(?:.*[^0-9])?py(\d+)\.(\d+)(?![0-9])", image)
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if found and f"{found.group(1)}.{found.group(2)}" != here:
        raise ValueError(
            f"container_image {image!r} is built for Python {found.group(1)}.{found.group(2)} but this "
            f"Airflow worker runs Python {here}: cloudpickle needs the same major.minor version on both "
            f"sides. Use an image built for Python {here} (docker/: --build-arg PYTHON_VERSION={here}), "
            "or run the workers on the image's Python."
        )
