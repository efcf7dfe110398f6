"""DAGs for the remote-debugging tests (tests/test_debug.py): a ``debug=True`` job whose function
has a local variable for a debugger to read at a breakpoint.

``BREAK_LINE`` is the line of ``return total + 1``: the test sets its breakpoint there and
expects ``total == 42`` (``n=6``).
"""

from __future__ import annotations

from pathlib import Path

import pendulum
from airflow.sdk import dag, task

START = pendulum.datetime(2026, 1, 1, tz="UTC")


def debug_dag(backend: str, accelerator: str = "cpu", name: str | None = None):
    @task.kinetic(backend=backend, accelerator=accelerator, debug=True, debug_wait=300)
    def stepped(n: int) -> int:
        total = n * 7
        return total + 1  # kn-debug: breakpoint

    @dag(dag_id=f"kn_debug_{name or backend}", schedule=None, start_date=START, catchup=False)
    def kn_debug():
        stepped(6)

    return kn_debug()


def unattended_dag(backend: str, on_timeout: str):
    """Nobody attaches: after ``debug_wait`` the job fails, or runs, as ``debug_on_timeout`` says."""

    @task.kinetic(backend=backend, debug=True, debug_wait=3, debug_on_timeout=on_timeout)
    def alone() -> str:
        return "ran without a debugger"

    @dag(dag_id=f"kn_debug_alone_{on_timeout}", schedule=None, start_date=START, catchup=False)
    def kn_debug_alone():
        alone()

    return kn_debug_alone()


BREAK_LINE = next(
    number
    for number, line in enumerate(Path(__file__).read_text().splitlines(), start=1)
    if line.rstrip().endswith("# kn-debug: breakpoint")
)

DAGS = {
    d.dag_id: d
    for d in (
        debug_dag("local"),
        debug_dag("gke"),
        debug_dag("auto", accelerator="tpu-v6e-16", name="pathways"),  # a 4-host LeaderWorkerSet
        unattended_dag("local", "fail"),
        unattended_dag("local", "run"),
    )
}
