"""Test session setup: a throwaway AIRFLOW_HOME with a migrated SQLite DB, and fixtures.

Environment is set at import time because Airflow reads its configuration when
first imported, which happens while test modules are collected.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
_HOME = tempfile.mkdtemp(prefix="kinetic-airflow-tests-")
sys.path.insert(0, str(TESTS / "dags"))
os.environ["AIRFLOW_HOME"] = _HOME
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(TESTS / "dags")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__ALLOWED_DESERIALIZATION_CLASSES"] = "airflow.* kinetic_airflow.*"
os.environ["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "INFO"
os.environ["KINETIC_POLL_INTERVAL"] = "0.3"
os.environ["KINETIC_HEARTBEAT_SECONDS"] = "1"
# dag.test() runs no executor, so Airflow's executor-event race (which wait_before_defer and
# min_deferral_seconds keep kinetic tasks out of) cannot happen here: defer at once, so that these
# tests go through the trigger, and resume at once. The real-components tier runs the defaults.
os.environ["KINETIC_WAIT_BEFORE_DEFER"] = "0"
os.environ["KINETIC_MIN_DEFERRAL_SECONDS"] = "0"
os.environ["KINETIC_LOCAL_STATE_DIR"] = os.path.join(_HOME, "local-jobs")
os.environ.pop("KINETIC_BASE_URI", None)

pytest_plugins = ["kinetic_airflow.testing.gcs"]


def airflow_bin() -> str:
    return str(Path(sys.executable).parent / "airflow")


@pytest.fixture(scope="session", autouse=True)
def airflow_db() -> str:
    subprocess.run([airflow_bin(), "db", "migrate"], check=True, capture_output=True, env=os.environ)
    return _HOME


@pytest.fixture(params=["file", "gs"])
def base_uri(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Job storage for a test, on local disk or in fake GCS; set as KINETIC_BASE_URI."""
    if request.param == "file":
        uri = f"file://{tmp_path}/kinetic"
    else:
        uri = request.getfixturevalue("gcs_bucket") + "/kinetic"
    monkeypatch.setenv("KINETIC_BASE_URI", uri)
    return uri


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory) -> Path:
    """This checkout as the wheel a user installs (``pip wheel --no-deps``), built once a session.

    Built from a copy of the package's sources: setuptools keeps a ``build/`` folder beside the
    sources and would put files deleted since an earlier build into the wheel.
    """
    import shutil

    out = tmp_path_factory.mktemp("wheel")
    src = tmp_path_factory.mktemp("wheel-src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(TESTS.parent / name, src / name)
    shutil.copytree(
        TESTS.parent / "kinetic_airflow",
        src / "kinetic_airflow",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("kinetic_airflow-*.whl")
    return built
