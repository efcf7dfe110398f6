"""REST helpers shared by the real-components test modules: parse checks, triggering, job cleanup."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from urllib.parse import quote

from components.airflow_services import AirflowServices, ServiceError, process_alive

__all__ = ["kill_leftover_jobs", "parsed", "run_path", "task_instances", "trigger"]


def parsed(services: AirflowServices, dag_id: str) -> bool:
    """True once ``dag_id`` is parsed; import errors fail at once instead of timing out."""
    errors = services.api("GET", "/api/v2/importErrors")["import_errors"]
    if errors:  # the DAG folder holds only the test's files
        raise ServiceError(f"DAG import errors: {json.dumps(errors, indent=2)}")
    return services.api("GET", f"/api/v2/dags/{dag_id}")["dag_id"] == dag_id


def kill_leftover_jobs(kinetic_root: Path) -> None:
    """A failed test may leave a detached local job process (its own session) behind: kill its group."""
    for launch in kinetic_root.glob("jobs/*/launch.json"):
        with contextlib.suppress(ValueError, OSError, KeyError):
            pid = int(json.loads(launch.read_text())["pid"])
            if process_alive(pid):
                os.killpg(pid, signal.SIGKILL)


def run_path(dag_id: str, run_id: str) -> str:
    return f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}"


def task_instances(services: AirflowServices, dag_id: str, run_id: str) -> list[dict]:
    """Every task instance of a run (mapped ones too) as the REST API lists them."""
    return services.api("GET", f"{run_path(dag_id, run_id)}/taskInstances?limit=1000")["task_instances"]


def trigger(services: AirflowServices, dag_id: str) -> str:
    """Unpause ``dag_id`` and start a manual run of it; returns the run id."""
    services.api("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
    run = services.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": {}})
    return run["dag_run_id"]
