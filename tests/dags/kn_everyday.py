"""DAGs of tests/test_everyday_surface.py (dag.test(), local backend; storage from KINETIC_BASE_URI)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pendulum
from airflow.sdk import Param, dag, task
from kn_test_util import record_failure

from kinetic_airflow import Data

START = pendulum.datetime(2026, 1, 1, tz="UTC")


# 1. Context arguments --------------------------------------------------------------------------
@task.kinetic
def context_values(
    lr: float,
    ds=None,
    ds_nodash=None,
    logical_date=None,
    data_interval_start=None,
    data_interval_end=None,
    run_id=None,
    ts=None,
    params=None,
    dag_run=None,
    try_number=None,
) -> dict:
    return {
        "lr": lr,
        "ds": ds,
        "ds_nodash": ds_nodash,
        "logical_date": logical_date.isoformat() if logical_date else None,
        "data_interval_start": data_interval_start.isoformat() if data_interval_start else None,
        "data_interval_end": data_interval_end.isoformat() if data_interval_end else None,
        "run_id": run_id,
        "ts": ts,
        "params": params,
        "conf": dag_run.conf,
        "dag_run_id": dag_run.run_id,
        "try_number": try_number,
        "pid": os.getpid(),
    }


@dag(schedule=None, start_date=START, catchup=False, params={"scale": Param(3, type="integer")})
def kn_context():
    context_values(0.5)


# 5. The local backend's lane ------------------------------------------------------------------
@task.kinetic(accelerator="tpu-v6e-8t")
def on_a_tpu() -> int:
    return 1


@dag(schedule=None, start_date=START, catchup=False)
def kn_tpu_on_local():
    on_a_tpu()


@task.kinetic(accelerator="{{ params.acc }}", on_failure_callback=record_failure)
def templated_accelerator() -> int:
    return 1


@dag(schedule=None, start_date=START, catchup=False, params={"acc": "tpu-v9z-8"})
def kn_templated_accelerator():
    templated_accelerator()


@task.kinetic(
    volumes={"/kinetic-test-volume": Data("../data/volume_src")}, on_failure_callback=record_failure
)
def with_volume() -> list:
    return os.listdir("/kinetic-test-volume")


@dag(schedule=None, start_date=START, catchup=False)
def kn_local_volume():
    with_volume()


@task.kinetic
def relative_data(folder) -> list:
    return sorted(p.relative_to(folder).as_posix() for p in Path(folder).rglob("*") if p.is_file())


@dag(schedule=None, start_date=START, catchup=False)
def kn_relative_data():
    relative_data(Data("../data/volume_src"))  # beside this DAG file: tests/data/volume_src


@task.kinetic
def killed_hard(folder) -> None:
    """Records where its copy of the Data is, then dies as an OOM kill would (no cleanup code runs)."""
    Path(os.environ["KN_TEST_RECORD"]).write_text(folder)
    os.kill(os.getpid(), signal.SIGKILL)


@dag(schedule=None, start_date=START, catchup=False)
def kn_killed_hard():
    killed_hard(Data(str(Path(__file__).resolve().parent.parent / "data" / "volume_src")))


# 6. Tracebacks --------------------------------------------------------------------------------
def check_loss(loss: float) -> None:
    if loss != loss:
        raise ArithmeticError(f"loss is NaN after {loss!r}")  # KN-TRACEBACK-LINE


@task.kinetic
def diverges() -> None:
    check_loss(float("nan"))


@dag(schedule=None, start_date=START, catchup=False)
def kn_traceback():
    diverges()


@task.kinetic
def dies() -> None:
    print("kn-dies: last words", flush=True)
    os._exit(3)  # no result: the task's error is kinetic's, from the event


@dag(schedule=None, start_date=START, catchup=False)
def kn_dies():
    dies()


# Created here, so that each DAG's fileloc is this file (relative Data paths resolve against it).
DAGS = {
    d.dag_id: d
    for d in (
        kn_context(),
        kn_tpu_on_local(),
        kn_templated_accelerator(),
        kn_local_volume(),
        kn_relative_data(),
        kn_killed_hard(),
        kn_traceback(),
        kn_dies(),
    )
}
