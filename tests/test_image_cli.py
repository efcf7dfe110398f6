"""``kinetic-airflow image`` from an installed wheel: no source checkout, the packaged recipe.

The wheel is built from this checkout (``pip wheel --no-deps``), installed with ``--no-deps`` into a
fresh virtualenv with only cloudpickle besides (no Airflow: the image command needs neither it nor
the cloud libraries),
and the command runs from an empty folder with no ``PYTHONPATH``: what it stages and prints must
come from the installed package.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import cloudpickle
import pytest

from kinetic_airflow import __version__

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(built_wheel) -> Path:
    return built_wheel


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("image-venv")
    venv.EnvBuilder(with_pip=False).create(root)
    python = root / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # no checkout on the path
    subprocess.run(
        # What the command line imports besides the standard library: cloudpickle (no Airflow).
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--quiet",
            str(wheel),
            f"cloudpickle=={cloudpickle.__version__}",
        ],
        check=True,
        capture_output=True,
        env=env,
    )
    assert (root / "bin" / "kinetic-airflow").is_file()
    return root


def _clean_env(root: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHON", "KINETIC"))}
    env["PATH"] = f"{root / 'bin'}:{os.environ['PATH']}"
    env["AIRFLOW_HOME"] = str(home)  # no airflow.cfg from the test session
    return env


def _image(installed: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    workdir = tmp_path / "elsewhere"
    workdir.mkdir(exist_ok=True)
    return subprocess.run(
        [str(installed / "bin" / "kinetic-airflow"), "image", *args],
        capture_output=True,
        text=True,
        cwd=workdir,
        env=_clean_env(installed, tmp_path / "airflow-home"),
        timeout=60,
    )


def test_wheel_carries_the_runner_recipe(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("Dockerfile", "install-runner.sh", "cloudbuild.yaml"):
        assert f"kinetic_airflow/docker/{name}" in names


def test_image_builds_the_packaged_dockerfile_for_the_given_python(installed, tmp_path):
    context = tmp_path / "ctx"
    proc = _image(
        installed, tmp_path, "--kind", "tpu", "--python", "3.11", "--project", "p", "--context", str(context)
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    build = next(shlex.split(line) for line in lines if line.startswith("docker build"))
    dockerfile = Path(build[build.index("-f") + 1])
    # The Dockerfile is the staged copy of the installed package's, not a checkout's.
    assert dockerfile == context / "kinetic_airflow" / "docker" / "Dockerfile"
    site = next((installed / "lib").glob("python3.*/site-packages"))
    assert dockerfile.read_bytes() == (site / "kinetic_airflow" / "docker" / "Dockerfile").read_bytes()
    assert (context / "kinetic_airflow" / "job" / "runner.py").is_file()
    assert not list(context.rglob("__pycache__"))
    assert str(REPO) not in proc.stdout
    assert build[-1] == str(context)
    build_args = {build[i + 1] for i, part in enumerate(build) if part == "--build-arg"}
    assert "PYTHON_VERSION=3.11" in build_args
    assert "EXTRA_PACKAGES=jax[tpu] keras" in build_args
    assert f"KINETIC_AIRFLOW_VERSION={__version__}" in build_args
    tag = build[build.index("-t") + 1]
    assert tag == (f"us-docker.pkg.dev/p/kn-kinetic-cluster/kinetic-airflow-runner-tpu:{__version__}-py3.11")
    assert lines[-1] == f"docker push {tag}"
    assert "Python 3.11 (--python;" in proc.stdout


def test_gpu_image_has_the_driver_library_path_and_extra_packages(installed, tmp_path):
    extra = ["--extra-packages", "optax  orbax"]
    proc = _image(
        installed, tmp_path, "--kind", "gpu", "--python", "3.12", *extra, "--context", str(tmp_path / "ctx")
    )
    assert proc.returncode == 0, proc.stderr
    build = next(shlex.split(line) for line in proc.stdout.splitlines() if line.startswith("docker build"))
    build_args = {build[i + 1] for i, part in enumerate(build) if part == "--build-arg"}
    assert "EXTRA_PACKAGES=jax[cuda12] keras optax orbax" in build_args
    assert "LIBRARY_PATH_EXTRA=/usr/local/nvidia/lib64" in build_args
    assert build[build.index("-t") + 1].endswith(f"kinetic-airflow-runner-gpu:{__version__}-py3.12")
    dockerfile = (tmp_path / "ctx" / "kinetic_airflow" / "docker" / "Dockerfile").read_text()
    assert "LD_LIBRARY_PATH=${LIBRARY_PATH_EXTRA}" in dockerfile


def test_default_python_is_the_commands_own_and_says_so(installed, tmp_path):
    proc = _image(installed, tmp_path, "--kind", "cpu", "--context", str(tmp_path / "ctx"))
    assert proc.returncode == 0, proc.stderr
    here = subprocess.run(
        [str(installed / "bin" / "python"), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert f"# Python {here} (the Python running this command;" in proc.stdout
    assert f"PYTHON_VERSION={here}" in proc.stdout
    assert "no project" in proc.stderr  # a placeholder registry, said so


def test_bad_python_is_refused_with_the_form(installed, tmp_path):
    proc = _image(installed, tmp_path, "--kind", "tpu", "--python", "py3.11")
    assert proc.returncode != 0
    assert "--python is 'py3.11', not a Python major.minor; write it as 3.11" in proc.stderr


def test_cloud_build_uses_the_packaged_recipe(installed, tmp_path):
    context = tmp_path / "ctx"
    proc = _image(
        installed, tmp_path, "--kind", "tpu", "--python", "3.11", "--cloud-build", "--context", str(context)
    )
    assert proc.returncode == 0, proc.stderr
    (submit,) = [shlex.split(line) for line in proc.stdout.splitlines() if line.startswith("gcloud")]
    config = Path(submit[submit.index("submit") + 2].removeprefix("--config="))
    assert config == context / "kinetic_airflow" / "docker" / "cloudbuild.yaml"
    assert "kinetic_airflow/docker/Dockerfile" in config.read_text()
    assert submit[submit.index("submit") + 1] == str(context)


def test_container_image_per_accelerator_kind(monkeypatch):
    from kinetic_airflow.accelerators import parse_accelerator
    from kinetic_airflow.backends.gke.image_choice import runner_image
    from kinetic_airflow.cli.image import default_image_uri

    tpu, gpu, cpu = (parse_accelerator(a) for a in ("tpu-v6e-8t", "gpu-l4", "cpu"))
    for kind in ("", "_CPU", "_GPU", "_TPU"):
        monkeypatch.delenv(f"AIRFLOW__KINETIC__CONTAINER_IMAGE{kind}", raising=False)
        monkeypatch.delenv(f"KINETIC_CONTAINER_IMAGE{kind}", raising=False)
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    # Nothing set: each kind's own image, tagged with this release and the worker's Python.
    assert runner_image(tpu, None, "p", "europe-west4-a", "c") == (
        f"europe-docker.pkg.dev/p/kn-c/kinetic-airflow-runner-tpu:{__version__}-py{here}"
    )
    assert runner_image(gpu, None, "p", "us-central1-a", "c") == default_image_uri(
        "gpu", "p", "us-central1-a", "c"
    )
    # A global image (the README once set a CPU one) no longer shadows a kind that has its own.
    monkeypatch.setenv("AIRFLOW__KINETIC__CONTAINER_IMAGE", "reg/cpu-everywhere:1")
    monkeypatch.setenv("AIRFLOW__KINETIC__CONTAINER_IMAGE_TPU", "reg/tpu:1")
    assert runner_image(tpu) == "reg/tpu:1"
    assert runner_image(gpu) == "reg/cpu-everywhere:1"
    assert runner_image(cpu) == "reg/cpu-everywhere:1"
    # The task's container_image= wins over both.
    assert runner_image(tpu, "reg/mine:2") == "reg/mine:2"


_HIDE_GOOGLE_PROVIDER = """
import importlib.abc, sys

class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "airflow.providers.google" or name.startswith("airflow.providers.google."):
            raise ModuleNotFoundError(name)
        return None

sys.meta_path.insert(0, Hide())
from kinetic_airflow.backends.registry import get_backend
try:
    get_backend("gke")
except ModuleNotFoundError as exc:
    print(exc)
get_backend("local")
print("local ok")
"""


def test_cluster_backend_without_the_providers_names_the_extra():
    """The slim install (no google provider) runs local jobs and says what a gke job needs."""
    proc = subprocess.run(
        [sys.executable, "-c", _HIDE_GOOGLE_PROVIDER], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.strip().splitlines()[-2:]
    assert first == (
        "the gke and pathways backends: needs apache-airflow-providers-google, not installed in this "
        'Airflow environment. Install "kinetic-airflow[gke]" (or those packages) on the workers, '
        'triggerer and api-server, or use backend="local"'
    )
    assert second == "local ok"
