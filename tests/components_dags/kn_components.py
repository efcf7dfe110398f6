"""DAGs that tests/test_airflow_components.py runs through the real scheduler, workers and triggerer.

Production workers import this file as a module named
``unusual_prefix_<sha1>_kn_components``, which does not exist in the kinetic job
process, and ``kn_components_lib`` is only importable where the DAG folder is on
``sys.path``. cloudpickle pickles module-level functions and classes by
reference, so ``compute`` (a function of this file that calls ``scale`` and
``Accumulator`` from here and ``greet`` / ``Counter`` from the sibling module)
only works in the job because kinetic_airflow registers both modules to be
pickled by value. ``dag.test()`` imports the file under its plain name, which
hides the bug; only a scheduler-driven run shows it.
"""

from __future__ import annotations

import os
import time

import kn_components_lib
import pendulum
from airflow.sdk import dag, task

START = pendulum.datetime(2026, 1, 1, tz="UTC")


def scale(value: int) -> int:
    """A module-level helper of the DAG file."""
    return value * 10


class Accumulator:
    """A class defined in the DAG file."""

    def __init__(self, start: int) -> None:
        self.total = start

    def add(self, value: int) -> Accumulator:
        self.total += value
        return self


@task.kinetic
def compute(n: int) -> dict:
    import importlib.util

    lib_counter = kn_components_lib.Counter(n).step().step(by=2)
    return {
        "helper": scale(n),
        "dag_class": Accumulator(scale(n)).add(n).total,
        "lib_function": kn_components_lib.greet("kinetic"),
        "lib_class": lib_counter.value,
        # Where the code came from, as seen inside the job.
        "dag_module": scale.__module__,
        "class_module": Accumulator.__module__,
        "lib_module": kn_components_lib.Counter.__module__,
        "importable_in_job": {
            name: importlib.util.find_spec(name) is not None
            for name in (scale.__module__, "kn_components_lib")
        },
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "job_id": os.environ.get("KINETIC_JOB_ID"),
    }


@task
def check(result: dict) -> dict:
    """A plain task on the worker: sanity-check the job's value and echo it."""
    expected = {"helper": 40, "dag_class": 44, "lib_class": 7}
    wrong = {k: result.get(k) for k, v in expected.items() if result.get(k) != v}
    if wrong:
        raise ValueError(f"unexpected values from the kinetic job: {wrong}")
    return {**result, "checked_by_pid": os.getpid()}


@dag(schedule=None, start_date=START, catchup=False, tags=["kinetic-components-test"])
def kn_components():
    check(compute(4))


@task.kinetic(stop_grace_seconds=30)
def sleep_long() -> str:
    """Trains until asked to stop, then saves a checkpoint in KINETIC_OUTPUT_DIR; its stop hook
    reports last metrics. What a mark-failed must leave behind (issue 41 item 4)."""
    import json
    import pathlib

    import kinetic_airflow
    from kinetic_airflow.job.storage import uri_to_local_path

    print(f"kn-components sleeping pid={os.getpid()}", flush=True)
    kinetic_airflow.on_stop(lambda: kinetic_airflow.report(final_loss=0.5))
    step = 0
    while not kinetic_airflow.stop_requested() and step < 6000:
        step += 1
        kinetic_airflow.report(step=step, loss=1.0 / step)
        time.sleep(0.1)
    out = pathlib.Path(uri_to_local_path(os.environ["KINETIC_OUTPUT_DIR"]))
    out.mkdir(parents=True, exist_ok=True)
    (out / "checkpoint.json").write_text(json.dumps({"step": step}))
    return "stopped"


@dag(schedule=None, start_date=START, catchup=False, tags=["kinetic-components-test"])
def kn_components_cancel():
    sleep_long()


kn_components()
kn_components_cancel()
