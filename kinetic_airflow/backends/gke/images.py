"""The runner image a cluster job uses by default, one per accelerator kind.

``{location}-docker.pkg.dev/{project}/kn-{cluster}/kinetic-airflow-runner-{kind}:py{X.Y}``, in
the Artifact Registry repository kinetic's infrastructure creates for the cluster. The
manifest names it; ``kinetic-airflow image`` builds and pushes it.
"""

from __future__ import annotations

import sys

__all__ = ["EXTRA_PACKAGES", "PLACEHOLDER_REGISTRY", "default_image_uri", "python_tag", "registry_location"]

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
