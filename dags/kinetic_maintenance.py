"""Daily retention for kinetic job storage, from the Airflow side: ``kinetic-airflow gc``.

Deletes job files older than ``[kinetic] retention_days`` (30 if unset) — never a live job's,
never a result an XCom still references, never ``KINETIC_OUTPUT_DIR`` — and deletes orphaned
Jobs / LeaderWorkerSets (their task instance no longer runs). Trigger it with
``{"dry_run": true}`` to see the plan in the task log first.

The command runs as a subprocess of the task and reads Airflow's metadata DB (as ``airflow db
clean`` does), so the worker needs the DB connection; where workers have none, run the same
command from the scheduler host's cron, or use the GCS lifecycle rule in the README.

    python dags/kinetic_maintenance.py       # one run now, with dag.test()
"""

from __future__ import annotations

import shlex
import sys

import pendulum
from airflow.sdk import dag, task


@dag(
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["kinetic", "maintenance"],
    params={"dry_run": False, "delete_orphans": True, "include_outputs": False},
)
def kinetic_maintenance():
    @task.bash
    def kinetic_gc(params=None) -> str:
        from kinetic_airflow.config import resolve_setting

        days = resolve_setting("retention_days")
        days = 30 if days is None else days  # 0 is a valid setting: everything that has ended
        command = [sys.executable, "-m", "kinetic_airflow.cli", "gc", "--older-than", f"{float(days):g}d"]
        if params.get("dry_run"):
            command.append("--dry-run")
        if params.get("delete_orphans"):
            command.append("--delete-orphans")
        if params.get("include_outputs"):
            command.append("--include-outputs")
        return shlex.join(command)

    kinetic_gc()


maintenance = kinetic_maintenance()

if __name__ == "__main__":
    run = maintenance.test()
    print(f"kinetic_maintenance: {run.state}")
