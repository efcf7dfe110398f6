"""DAGs for test_storage_outage.py: jobs that run until $KN_OUTAGE_FLAG exists (or 120 s)."""

from __future__ import annotations

import os
import time

import pendulum
from airflow.sdk import dag, task
from kn_test_util import record_failure

START = pendulum.datetime(2026, 1, 1, tz="UTC")


def _until_told(every: float | None) -> None:
    """Print a line every ``every`` seconds (None: once) until the test says stop."""
    flag = os.environ["KN_OUTAGE_FLAG"]
    print("running until told", flush=True)
    deadline = time.time() + 120
    line = 0
    while not os.path.exists(flag) and time.time() < deadline:
        time.sleep(every or 0.1)
        if every:
            line += 1
            print(f"line {line}", flush=True)


def outage_dag(name: str, backend: str, every: float | None):
    @task.kinetic(backend=backend, on_failure_callback=record_failure)
    def until_told() -> str:
        _until_told(every)
        return "ok"

    @dag(dag_id=f"kn_outage_{name}", schedule=None, start_date=START, catchup=False)
    def kn_outage():
        until_told()

    return kn_outage()


DAGS = {
    "chatty": outage_dag("chatty", "local", every=0.05),  # a log batch (and cursor write) per look
    "silent": outage_dag("silent", "gke", every=None),  # the watcher reads heartbeats instead
}
