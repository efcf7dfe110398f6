"""A plain @task downstream of a kinetic result kept in storage gets the value with the XCom backend.

Airflow resolves ``[core] xcom_backend`` once, when its XCom module is first imported, so each
case runs ``dag.test()`` in a process of its own with the setting in its environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Two whole DAG runs, each in a new Python process that imports Airflow.
pytestmark = pytest.mark.timeout(600)

DAGS = Path(__file__).parent / "dags"
_SCRIPT = """
import kn_xcom
run = kn_xcom.kn_xcom_value().test()
print("STATES", sorted((ti.task_id, ti.state) for ti in run.get_task_instances()))
"""


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(DAGS), os.environ.get("PYTHONPATH", "")]),
            "KINETIC_BASE_URI": f"file://{tmp_path}/kinetic",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=500,
    )


def test_a_plain_task_gets_the_value_with_the_backend(tmp_path):
    proc = _run(tmp_path, AIRFLOW__CORE__XCOM_BACKEND="kinetic_airflow.xcom.KineticXComBackend")
    out = proc.stdout + proc.stderr
    assert "STATES [('mean_weight', 'success'), ('weights', 'success')]" in out, out[-4000:]
    assert "Returned value was: 4.5" in out, out[-4000:]


def test_without_it_the_reference_says_what_it_is(tmp_path):
    proc = _run(tmp_path)
    out = proc.stdout + proc.stderr
    assert "STATES [('mean_weight', 'failed'), ('weights', 'success')]" in out, out[-4000:]
    # the kinetic task's log names both ways a plain task gets the value
    assert "kinetic_airflow.load_result(value)" in out
    assert "xcom_backend = kinetic_airflow.xcom.KineticXComBackend" in out
