"""The example DAGs in dags/ run as they are on the local backend (each in its own Airflow home)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def example_env(tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("example-home")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "KINETIC_BASE_URI": f"file://{home}/kinetic",
    }
    subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], env=env, check=True,
                   capture_output=True)  # fmt: skip
    return env


@pytest.mark.parametrize(
    ("dag_file", "expected"),
    [
        ("quickstart.py", "report -> pi is about 3.14"),
        ("nightly_training.py", "best learning rate"),
        ("parameter_sweep.py", "1. width=32 depth=3"),
        ("multihost.py", "mean over 1 hosts: 2.9994"),  # the emulator runs it on 4: test_pathways
    ],
)
def test_example_dag_runs(example_env, dag_file, expected):
    proc = subprocess.run(
        [sys.executable, str(REPO / "dags" / dag_file)], env=example_env, capture_output=True, text=True
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert expected in output, output[-3000:]
    assert ": success" in proc.stdout
