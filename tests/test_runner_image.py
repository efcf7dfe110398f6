"""The runner image's install steps in a plain virtualenv: no Airflow, and jobs still run."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import cloudpickle
import pytest
from jobkit import make_job, run_runner

REPO = Path(__file__).resolve().parent.parent

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # this module is not in the image


class Point:
    def __init__(self, x):
        self.x = x


def _job(n):
    import platform

    return {"n": n, "point": Point(n).x, "python": platform.python_version()}


@pytest.fixture(scope="module")
def runner_venv(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runner-venv")
    venv.EnvBuilder(with_pip=True).create(root)
    env = {**os.environ, "PATH": f"{root / 'bin'}:{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    subprocess.run(
        ["sh", str(REPO / "kinetic_airflow/docker/install-runner.sh"), str(REPO)], check=True, env=env
    )
    return root


def _clean_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHON"))}
    env["PATH"] = f"{root / 'bin'}:{os.environ['PATH']}"
    return env


def test_image_environment_has_no_airflow(runner_venv):
    python = str(runner_venv / "bin/python")
    out = subprocess.run(
        [
            python,
            "-c",
            "import importlib.util as u; "
            "print(u.find_spec('airflow'), u.find_spec('cloudpickle') is not None)",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=_clean_env(runner_venv),
    ).stdout.split()
    assert out == ["None", "True"]
    dockerfile = (REPO / "kinetic_airflow/docker/Dockerfile").read_text()
    assert "install-runner.sh" in dockerfile  # the Dockerfile runs the same steps as this test


@pytest.mark.parametrize("scheme", ["file", "gs"])
def test_runner_runs_jobs_without_airflow(runner_venv, scheme, tmp_path, request):
    base = f"file://{tmp_path}" if scheme == "file" else request.getfixturevalue("gcs_bucket") + "/img"
    layout = make_job(base, _job, (7,))
    env = _clean_env(runner_venv)
    if scheme == "gs":
        env["STORAGE_EMULATOR_HOST"] = os.environ["STORAGE_EMULATOR_HOST"]
    proc, summary = run_runner(layout, python=str(runner_venv / "bin/python"), env=env)
    assert proc.returncode == 0, proc.stderr
    assert summary["ok"] is True
    assert summary["value_repr"].startswith("{'n': 7, 'point': 7")
