"""DAGs for the integrity tests (tests/test_integrity.py): one per backend, each small.

One DAG per backend and kind (built at import, so dag.test() finds them when it parses this
file): ``DAGS[(kind, backend)]``. ``produce`` returns bytes, which XCom cannot carry: XCom gets a
reference to the stored envelope, loaded downstream by a plain task and by a kinetic job.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import dag, task

from kinetic_airflow import load_result

START = pendulum.datetime(2026, 1, 1, tz="UTC")


def _accelerator(backend: str) -> str:
    return "tpu-v6e-16" if backend == "pathways" else "cpu"


def kn_integrity_single(backend: str):
    accelerator = _accelerator(backend)

    @task.kinetic(backend=backend, accelerator=accelerator)
    def compute(x: int) -> dict:
        return {"x": x * 2, "host": os.environ.get("KINETIC_HOST_INDEX")}

    @dag(dag_id=f"kn_integrity_single_{backend}", start_date=START, schedule=None, catchup=False)
    def single():
        compute(21)

    return single()


def kn_integrity_failure(backend: str):
    """Every host but 0 raises (multi-host: host 1 is the one reported)."""
    accelerator = _accelerator(backend)

    @task.kinetic(backend=backend, accelerator=accelerator, retries=0)
    def fails() -> None:
        host = int(os.environ.get("KINETIC_HOST_INDEX") or 0)
        if backend != "pathways" or host == 1:
            raise ValueError(f"host {host} fails on purpose")
        import time

        time.sleep(60)  # the other hosts wait to be stopped

    @dag(dag_id=f"kn_integrity_failure_{backend}", start_date=START, schedule=None, catchup=False)
    def failure():
        fails()

    return failure()


def kn_integrity_downstream(backend: str):
    accelerator = _accelerator(backend)

    @task.kinetic(backend=backend, accelerator=accelerator)
    def produce() -> bytes:
        return b"weights" * 10

    @task
    def load_plain(ref) -> int:
        return len(load_result(ref))

    @task.kinetic(backend=backend, accelerator=accelerator)
    def load_in_job(value: bytes) -> int:
        return len(value)

    @dag(dag_id=f"kn_integrity_downstream_{backend}", start_date=START, schedule=None, catchup=False)
    def downstream():
        ref = produce()
        load_plain(ref)
        load_in_job(ref)

    return downstream()


DAGS = {
    (kind, backend): build(backend)
    for kind, build in (
        ("single", kn_integrity_single),
        ("failure", kn_integrity_failure),
        ("downstream", kn_integrity_downstream),
    )
    for backend in ("local", "gke", "pathways")
}
for (_kind, _backend), _dag in DAGS.items():
    globals()[_dag.dag_id] = _dag
