"""``kinetic-airflow image``: build and push the runner image a cluster backend uses by default.

The default ``container_image`` of a cluster job names an image in the Artifact Registry
repository kinetic's infrastructure creates (``kn-{cluster}``, in the registry location of
the cluster's zone): ``{location}-docker.pkg.dev/{project}/kn-{cluster}/kinetic-airflow-runner-
{kind}:py{X.Y}``, one per accelerator kind (CPU; GPU with CUDA JAX; TPU with ``jax[tpu]``),
for the workers' Python version. This command prints the commands that build and push it
(``docker``, or ``gcloud builds submit`` with ``--cloud-build``) and runs them with ``--run``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from kinetic_airflow.backends.gke.images import (
    EXTRA_PACKAGES,
    default_image_uri,
    python_tag,
)
from kinetic_airflow.cli.text import described
from kinetic_airflow.config import resolve_setting

__all__ = ["EXTRA_PACKAGES", "add_image_command", "default_image_uri", "run_image"]


def build_commands(kind: str, image: str, cloud_build: bool) -> list[list[str]]:
    repo = Path(__file__).resolve().parents[2]  # kinetic_airflow/cli/image.py -> the checkout
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    args = [
        "--build-arg",
        f"PYTHON_VERSION={version}",
        "--build-arg",
        f"EXTRA_PACKAGES={EXTRA_PACKAGES[kind]}",
    ]
    if cloud_build:  # docker/cloudbuild.yaml runs the same docker build on Cloud Build
        substitutions = f"_IMAGE={image},_PYTHON_VERSION={version},_EXTRA_PACKAGES={EXTRA_PACKAGES[kind]}"
        return [
            ["gcloud", "builds", "submit", str(repo), f"--config={repo / 'docker' / 'cloudbuild.yaml'}",
             f"--substitutions={substitutions}"]
        ]  # fmt: skip
    return [
        ["docker", "build", "-f", str(repo / "docker" / "Dockerfile"), *args, "-t", image, str(repo)],
        ["docker", "push", image],
    ]


def add_image_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    image = sub.add_parser(
        "image", help="build and push the runner image (prints the commands)", **described(__doc__)
    )
    image.add_argument("--kind", choices=sorted(EXTRA_PACKAGES), default="cpu")
    image.add_argument("--project", default=None, help="default: [kinetic] project")
    image.add_argument("--zone", default=None, help="default: [kinetic] zone")
    image.add_argument("--cluster", default=None, help="default: [kinetic] cluster")
    image.add_argument("--cloud-build", action="store_true", help="build with Cloud Build, not docker")
    image.add_argument("--run", action="store_true", help="run the commands instead of printing them")


def run_image(args: argparse.Namespace) -> int:
    project = args.project or resolve_setting("project")
    zone = args.zone or resolve_setting("zone")
    cluster = args.cluster or resolve_setting("cluster")
    image = default_image_uri(args.kind, project, zone, cluster)
    if not project:
        print(
            "no project: set --project or [kinetic] project (AIRFLOW__KINETIC__PROJECT) to build into "
            f"kinetic's Artifact Registry repository kn-{cluster}; showing a placeholder name.",
            file=sys.stderr,
        )
    print(f"# runner image for {args.kind} jobs on Python {python_tag()[2:]}: {image}")
    commands = build_commands(args.kind, image, args.cloud_build)
    for command in commands:
        print(shlex.join(command))
    if not args.run:
        return 0
    for command in commands:
        code = subprocess.call(command, env=os.environ)
        if code != 0:
            return code
    return 0
