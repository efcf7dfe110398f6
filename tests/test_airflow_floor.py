"""The oldest Airflow kinetic-airflow declares is the one it checks for and the one CI tests.

scripts/test-airflow-floor.sh runs the dag.test() tier in a venv holding exactly that release;
these tests keep the three places (pyproject.toml, ``optional.AIRFLOW_FLOOR``, the script) in step
and check the refusal a user on an older Airflow gets.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from kinetic_airflow import optional
from kinetic_airflow.optional import AIRFLOW_FLOOR, require_airflow

ROOT = Path(__file__).resolve().parent.parent


def _declared_floor() -> tuple[int, ...]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in deps if re.match(r"apache-airflow\s*>=", d)]
    parts = tuple(int(p) for p in spec.split(">=")[1].strip().split("."))
    return parts + (0,) * (3 - len(parts))


def test_the_checked_floor_is_the_declared_one():
    assert AIRFLOW_FLOOR == _declared_floor()


def test_the_floor_script_installs_the_declared_floor():
    out = subprocess.run(
        ["bash", str(ROOT / "scripts/test-airflow-floor.sh"), "--print-version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == ".".join(map(str, AIRFLOW_FLOOR))


@pytest.mark.parametrize("old", ["3.2.2", "3.0.6", "2.11.0"])
def test_an_older_airflow_is_refused_with_the_reason_and_the_fix(old):
    with pytest.raises(ImportError) as caught:
        require_airflow(old)
    text = str(caught.value)
    assert f"Airflow {old}" in text
    assert "3.3.0 or newer" in text
    assert "task_state_store" in text
    assert 'pip install "apache-airflow>=3.3.0"' in text


@pytest.mark.parametrize("ok", ["3.3.0", "3.3.2", "3.4.0rc1", "3.3.1+composer"])
def test_the_floor_and_newer_are_accepted(ok):
    require_airflow(ok)


def test_the_installed_version_is_read_from_the_distribution(monkeypatch):
    monkeypatch.setattr(optional.importlib.metadata, "version", lambda name: "3.2.1")
    with pytest.raises(ImportError, match=r"Airflow 3\.2\.1"):
        require_airflow()


def test_the_apis_the_floor_is_chosen_for_exist_here():
    """The reason in the message must be true of the release under test (the floor in its CI job)."""
    from airflow.models.task_state_store import TaskStateStoreModel  # noqa: F401
    from airflow.triggers.base import BaseTrigger

    assert "on_kill" in vars(BaseTrigger)
    installed = importlib.metadata.version("apache-airflow-core")
    assert optional._release(installed) >= AIRFLOW_FLOOR


def test_an_old_airflow_fails_the_dag_import_not_a_later_step(tmp_path):
    """Importing the operator under an older Airflow stops there with the message (a DAG's import error)."""
    probe = (
        "import importlib.metadata as m\n"
        "real = m.version\n"
        "m.version = lambda name: '3.2.2' if name == 'apache-airflow-core' else real(name)\n"
        "import kinetic_airflow.operators\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode != 0
    assert "kinetic-airflow needs Apache Airflow 3.3.0 or newer" in done.stderr
