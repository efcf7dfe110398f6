"""``kinetic-airflow image``: build and push the runner image a cluster backend uses by default.

The image is built from the installed package: the Dockerfile and its install script ship
inside it (``kinetic_airflow/docker/``), and the command stages a build context holding the
installed ``kinetic_airflow`` folder, so no source checkout is needed.

The default ``container_image`` of a cluster job names an image in the Artifact Registry
repository kinetic's infrastructure creates (``kn-{cluster}``, in the registry location of
the cluster's zone): ``{location}-docker.pkg.dev/{project}/kn-{cluster}/kinetic-airflow-runner-
{kind}:{version}-py{X.Y}``, one per accelerator kind (cpu: JAX on CPU and keras; gpu: CUDA
JAX and keras, with the loader path of the driver libraries GKE mounts; tpu: JAX with libtpu
and keras), tagged with this provider's version and the workers' Python. A new provider
release therefore names a new image: a node never keeps running a stale runner under a
reused tag. ``[kinetic] container_image_{kind}`` or ``container_image`` names another image.

``--python`` is the Python major.minor of the Airflow workers (cloudpickle needs the same one in
the job). Default: ``[kinetic] worker_python`` if set, else the Python running this command,
which is the workers' when the command runs in the Airflow image; on a laptop with another
Python, pass ``--python``.

The command prints the build and push (``docker``, or ``gcloud builds submit`` with
``--cloud-build``) and runs them with ``--run``.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kinetic_airflow import __version__
from kinetic_airflow.backends.gke.images import (
    EXTRA_PACKAGES,
    LIBRARY_PATH,
    default_image_uri,
    this_python,
)
from kinetic_airflow.cli.text import described
from kinetic_airflow.config import resolve_setting

__all__ = [
    "EXTRA_PACKAGES",
    "add_image_command",
    "default_image_uri",
    "packaged_docker_dir",
    "run_image",
    "stage_build_context",
]

_PYTHON_VERSION = re.compile(r"^3\.\d{1,2}$")
# kinetic_airflow/cli/image.py -> the kinetic_airflow package folder
_PACKAGE = Path(__file__).resolve().parents[1]


def packaged_docker_dir() -> Path:
    """The Dockerfile, install script and Cloud Build recipe inside the installed package."""
    return _PACKAGE / "docker"


def stage_build_context(target: Path) -> Path:
    """Copy the installed ``kinetic_airflow`` folder into ``target`` (the build context).

    The image gets exactly the code of the package this command belongs to, whether it was
    installed from a wheel or is a source checkout; caches are left out.
    """
    package = _PACKAGE
    if not (package / "docker" / "Dockerfile").is_file():
        raise FileNotFoundError(
            f"{package / 'docker' / 'Dockerfile'} is missing: this kinetic-airflow installation does not "
            "carry its runner recipe. Reinstall the package (pip install --force-reinstall kinetic-airflow)."
        )
    target.mkdir(parents=True, exist_ok=True)
    dest = target / "kinetic_airflow"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(package, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


def build_commands(
    kind: str, image: str, python: str, extra: str, context: Path, cloud_build: bool
) -> list[list[str]]:
    dockerfile = "kinetic_airflow/docker/Dockerfile"
    values = {
        "PYTHON_VERSION": python,
        "EXTRA_PACKAGES": extra,
        "LIBRARY_PATH_EXTRA": LIBRARY_PATH[kind],
        "KINETIC_AIRFLOW_VERSION": __version__,
    }
    if cloud_build:  # the packaged cloudbuild.yaml runs the same docker build on Cloud Build
        substitutions = ",".join([f"_IMAGE={image}", *(f"_{k}={v}" for k, v in values.items())])
        return [
            ["gcloud", "builds", "submit", str(context),
             f"--config={context / 'kinetic_airflow' / 'docker' / 'cloudbuild.yaml'}",
             f"--substitutions={substitutions}"]
        ]  # fmt: skip
    args = [part for key, value in values.items() for part in ("--build-arg", f"{key}={value}")]
    return [
        ["docker", "build", "-f", str(context / dockerfile), *args, "-t", image, str(context)],
        ["docker", "push", image],
    ]


def add_image_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    image = sub.add_parser(
        "image", help="build and push the runner image (prints the commands)", **described(__doc__)
    )
    image.add_argument("--kind", choices=sorted(EXTRA_PACKAGES), default="cpu")
    image.add_argument(
        "--python",
        default=None,
        help="the Airflow workers' Python major.minor, e.g. 3.11 (default: [kinetic] worker_python, "
        "else the Python running this command)",
    )
    image.add_argument(
        "--extra-packages",
        default="",
        help="more pip requirements for the image, space separated (added to the kind's set)",
    )
    image.add_argument("--project", default=None, help="default: [kinetic] project")
    image.add_argument("--zone", default=None, help="default: [kinetic] zone")
    image.add_argument("--cluster", default=None, help="default: [kinetic] cluster")
    image.add_argument("--tag", default=None, help="full image name to build (default: kinetic's name)")
    image.add_argument(
        "--context",
        default=None,
        help="folder to stage the build context in (default: a new temporary folder)",
    )
    image.add_argument("--cloud-build", action="store_true", help="build with Cloud Build, not docker")
    image.add_argument("--run", action="store_true", help="run the commands instead of printing them")


def _python_version(args: argparse.Namespace) -> tuple[str, str]:
    """The image's Python and where that choice came from."""
    if args.python:
        value, source = str(args.python), "--python"
    elif resolve_setting("worker_python"):
        value, source = str(resolve_setting("worker_python")), "[kinetic] worker_python"
    else:
        value, source = this_python(), "the Python running this command"
    if not _PYTHON_VERSION.match(value):
        raise SystemExit(
            f"kinetic-airflow image: {source} is {value!r}, not a Python major.minor; write it as 3.11 "
            "(the Python version of the Airflow workers)"
        )
    return value, source


def run_image(args: argparse.Namespace) -> int:
    python, source = _python_version(args)
    project = args.project or resolve_setting("project")
    zone = args.zone or resolve_setting("zone")
    cluster = args.cluster or resolve_setting("cluster")
    image = args.tag or default_image_uri(args.kind, project, zone, cluster, python)
    if not project and not args.tag:
        print(
            "no project: set --project or [kinetic] project (AIRFLOW__KINETIC__PROJECT) to build into "
            f"kinetic's Artifact Registry repository kn-{cluster}; showing a placeholder name.",
            file=sys.stderr,
        )
    extra = " ".join([EXTRA_PACKAGES[args.kind], *args.extra_packages.split()])
    temporary = args.context is None
    context = stage_build_context(Path(args.context or tempfile.mkdtemp(prefix="kinetic-runner-image-")))
    print(f"# runner image for {args.kind} jobs, kinetic-airflow {__version__}: {image}")
    print(f"# Python {python} ({source}; it must be the Airflow workers' Python)")
    print(
        f"# packages: {extra}"
        + (f"; LD_LIBRARY_PATH={LIBRARY_PATH[args.kind]}" if LIBRARY_PATH[args.kind] else "")
    )
    print(f"# build context: {context} (the installed package, staged from {packaged_docker_dir().parent})")
    commands = build_commands(args.kind, image, python, extra, context, args.cloud_build)
    for command in commands:
        print(shlex.join(command))
    if not args.run:
        return 0
    try:
        for command in commands:
            code = subprocess.call(command, env=os.environ)
            if code != 0:
                return code
    finally:
        if temporary:
            shutil.rmtree(context, ignore_errors=True)
    return 0
