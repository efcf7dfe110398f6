"""A GKE task whose kubernetes_conn_id is mistyped: no job can be created through it."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task


@task.kinetic(backend="gke", kubernetes_conn_id="kubernetes_defualt")
def train(x: int) -> int:
    return x


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def kn_bad_conn():
    train(1)


kn_bad_conn()
