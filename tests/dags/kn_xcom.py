"""A kinetic result too big for XCom (a numpy array), consumed by a plain @task as if it were the value."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task


@task.kinetic(backend="local")
def weights():
    import numpy

    return numpy.arange(10, dtype=float)  # not XCom-serializable: XCom gets a reference


@task
def mean_weight(w) -> float:
    return float(w.mean())


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def kn_xcom_value():
    mean_weight(weights())


kn_xcom_value()
