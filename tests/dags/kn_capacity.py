"""DAGs for tests/test_capacity.py: jobs that ask for flex-start, a reservation and Spot."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import dag, task

START = pendulum.datetime(2026, 1, 1, tz="UTC")


@task.kinetic(backend="gke", accelerator="gpu-l4", capacity="flex-start", max_run_duration=timedelta(hours=2))
def on_flex_start() -> str:
    return "flex-start ok"


@task.kinetic(backend="gke", accelerator="gpu-l4", capacity="reservation:l4-reserved")
def on_reservation() -> str:
    return "reservation ok"


@task.kinetic(backend="gke", accelerator="cpu", capacity="spot")
def on_spot() -> str:
    return "spot ok"


@dag(schedule=None, start_date=START, catchup=False)
def kn_capacity():
    on_flex_start()
    on_reservation()
    on_spot()


@task.kinetic(backend="gke", accelerator="gpu-l4", capacity="queued")
def queued_without_a_queue() -> str:
    return "never runs"


@dag(schedule=None, start_date=START, catchup=False)
def kn_capacity_refused():
    queued_without_a_queue()


kn_capacity()
kn_capacity_refused()


@dag(schedule=None, start_date=START, catchup=False)
def kn_flex_start_waits():
    on_flex_start()


kn_flex_start_waits()
