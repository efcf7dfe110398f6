"""Quickstart: one function runs as a kinetic job and its return value flows on through XCom.

On the default ``local`` backend the job is a local process; set
``AIRFLOW__KINETIC__BACKEND=gke`` (and a bucket and cluster) and the same DAG runs
``estimate_pi`` on GKE instead. Run it directly for a local end-to-end check::

    python dags/quickstart.py
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task


@task.kinetic(accelerator="cpu")
def estimate_pi(samples: int, seed: int = 0) -> dict:
    """Runs inside the job: stdlib only, so any runner image can run it."""
    import os
    import random

    rng = random.Random(seed)
    inside = sum(1 for _ in range(samples) if rng.random() ** 2 + rng.random() ** 2 <= 1.0)
    print(f"job {os.environ.get('KINETIC_JOB_ID')}: {inside}/{samples} points inside the circle")
    return {"pi": 4.0 * inside / samples, "samples": samples, "job_pid": os.getpid()}


@task
def report(estimate: dict) -> str:
    line = f"pi is about {estimate['pi']:.4f} ({estimate['samples']} samples, job pid {estimate['job_pid']})"
    print(line)
    return line


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False, tags=["kinetic"])
def kinetic_quickstart():
    report(estimate_pi(200_000, seed=7))


quickstart_dag = kinetic_quickstart()


if __name__ == "__main__":
    import os

    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    run = quickstart_dag.test()
    print(f"\nDAG run {run.run_id}: {run.state}")
    with create_session() as session:
        for task_id in ("estimate_pi", "report"):
            row = session.scalars(
                XComModel.get_many(
                    run_id=run.run_id, dag_ids=run.dag_id, task_ids=task_id, key="return_value"
                )
            ).first()
            print(f"  {task_id} -> {XComModel.deserialize_value(row) if row else None}")
    print(f"  job files under {os.environ.get('KINETIC_BASE_URI', '[kinetic] base_uri')}")
    raise SystemExit(0 if run.state == "success" else 1)
