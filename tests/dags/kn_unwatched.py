"""DAGs for test_unwatched_jobs.py: one long job per backend, for faults injected in the worker.

The job runs until $KN_UNWATCHED_FLAG exists (or 300 s), so a job that a failing worker left
running is still running when the test counts live jobs.
"""

from __future__ import annotations

import os
import time

import pendulum
from airflow.sdk import dag, task
from kn_test_util import record_failure

START = pendulum.datetime(2026, 1, 1, tz="UTC")

BACKENDS = {"local": "cpu", "gke": "cpu", "pathways": "tpu-v6e-8"}  # pathways: a 2-host slice


def unwatched_dag(backend: str, accelerator: str):
    @task.kinetic(backend=backend, accelerator=accelerator, on_failure_callback=record_failure)
    def runs_until_told() -> str:
        flag = os.environ["KN_UNWATCHED_FLAG"]
        print("running until told", flush=True)
        deadline = time.time() + 300
        while not os.path.exists(flag) and time.time() < deadline:
            time.sleep(0.1)
        return "told"

    @dag(dag_id=f"kn_unwatched_{backend}", schedule=None, start_date=START, catchup=False)
    def kn_unwatched():
        runs_until_told()

    return kn_unwatched()


DAGS = {backend: unwatched_dag(backend, accelerator) for backend, accelerator in BACKENDS.items()}
