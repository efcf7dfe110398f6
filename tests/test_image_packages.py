"""The runner images' package sets resolve against the package index, before anyone builds one.

``kinetic-airflow image --kind K`` installs the runner's own requirements (pyproject's ``runner``
extra, the same pins kinetic_airflow/docker/install-runner.sh installs) plus ``EXTRA_PACKAGES[K]``
into ``python:X.Y-slim`` on x86_64 Linux. A pin that cannot be met, or an extra that no longer
brings its accelerator's runtime (``jax[tpu]`` without libtpu), would otherwise show only in a
failed image build on someone's cloud account. uv resolves each set for the image's platform from
wheel metadata alone (seconds; pip's ``--dry-run`` downloads the CUDA wheels whole), without
installing anything.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from kinetic_airflow.backends.gke.images import EXTRA_PACKAGES

ROOT = Path(__file__).resolve().parent.parent
UV = Path(sys.executable).with_name("uv")
# python:X.Y-slim (Debian 12 or newer: glibc 2.36 or newer) on GKE's x86_64 nodes (TPU VMs, GPU
# node pools). The platform matters: libtpu's wheels are manylinux_2_31, so resolved for an older
# glibc, jax[tpu] silently falls back to a jax of 2025 (0.5.2) instead of failing.
PLATFORM = "x86_64-manylinux_2_36"
# What the kind must bring at run time, beyond jax and keras.
RUNTIME = {"cpu": set(), "gpu": {"jax-cuda12-plugin", "jax-cuda12-pjrt"}, "tpu": {"libtpu"}}


def _runner_requirements() -> list[str]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return list(extras["runner"])


def _resolve(requirements: list[str], python: str, tmp_path: Path) -> dict[str, str]:
    reqs = tmp_path / "requirements.in"
    reqs.write_text("\n".join(requirements) + "\n")
    quiet = ["--quiet", "--no-header", "--no-annotate", "--no-build"]
    target = ["--python-version", python, "--python-platform", PLATFORM]
    done = subprocess.run(
        [str(UV), "pip", "compile", str(reqs), *quiet, *target],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{requirements} does not resolve for Python {python}:\n{done.stderr}"
    pins = {}
    for line in done.stdout.splitlines():
        match = re.match(r"([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if match:
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def test_install_runner_installs_the_runner_extra():
    """The image's install script and pyproject's runner extra name the same requirements."""
    script = (ROOT / "kinetic_airflow/docker/install-runner.sh").read_text()
    for requirement in _runner_requirements():
        assert f'"{requirement}"' in script, f"install-runner.sh does not install {requirement}"


@pytest.mark.parametrize("python", ["3.11", "3.12"])
@pytest.mark.parametrize("kind", sorted(EXTRA_PACKAGES))
def test_the_image_package_set_resolves(kind, python, tmp_path):
    pins = _resolve(_runner_requirements() + EXTRA_PACKAGES[kind].split(), python, tmp_path)
    for name in {"cloudpickle", "google-cloud-storage", "jax", "jaxlib", "keras"} | RUNTIME[kind]:
        assert name in pins, f"the {kind} image for Python {python} would lack {name}: {sorted(pins)}"
    assert pins["jax"] == pins["jaxlib"], f"jax {pins['jax']} beside jaxlib {pins['jaxlib']}"
    if kind != "cpu":
        # The runner's own requirements must not hold the accelerator's jax back behind what its
        # extra alone gets. Not behind the CPU image's: jax is released first and its CUDA plugin
        # and libtpu follow, so for a while after a jax release `jax[cuda12]` alone resolves to
        # the one before it (seen with jax 0.12.1: 0.12.0.1 for Python 3.12), and the images then
        # differ by upstream's release order, not by anything kinetic pins.
        alone = _resolve(EXTRA_PACKAGES[kind].split(), python, tmp_path)
        assert pins["jax"] == alone["jax"], (
            f"{kind} image: jax {pins['jax']}; {EXTRA_PACKAGES[kind]!r} alone: jax {alone['jax']}"
        )
    if kind == "gpu":
        assert pins["jax-cuda12-plugin"] == pins["jax"], "the CUDA plugin must match jax's release"
