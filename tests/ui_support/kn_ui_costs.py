"""A DAG whose one kinetic job runs until a person stops it: tests/test_ui_components.py marks the
deferred task failed and reads what the Kinetic view says the stopped job ran (its run time and
chip-hours: the trigger stopped it, and no worker counted it)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pendulum
from airflow.sdk import dag, task


@task.kinetic(backend="local", retries=0)
def held() -> str:
    gate = Path(os.environ["KN_UI_RELEASE"] + ".held")  # never written: only a stop ends it
    print("held: running until stopped", flush=True)
    while not gate.exists():
        time.sleep(0.2)
    return "released"


START = pendulum.datetime(2026, 1, 1, tz="UTC")


@dag(schedule=None, start_date=START, catchup=False, tags=["kinetic-ui-test"])
def kn_ui_costs():
    held()


kn_ui_costs()
