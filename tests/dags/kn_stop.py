"""A task that saves a checkpoint when its job is asked to stop (issue 41 item 4), run by
tests/test_stop.py with dag.test(). Storage comes from KINETIC_BASE_URI."""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.sdk import dag, task

START = pendulum.datetime(2026, 1, 1, tz="UTC")


@task.kinetic(execution_timeout=dt.timedelta(seconds=15), stop_grace_seconds=30)
def trains_until_stopped() -> str:
    import json
    import os
    import pathlib
    import time

    import kinetic_airflow

    out = pathlib.Path(os.environ["KINETIC_OUTPUT_DIR"])
    kinetic_airflow.on_stop(lambda: kinetic_airflow.report(step=10_000, final_loss=0.5))
    step = 0
    while not kinetic_airflow.stop_requested():
        step += 1
        kinetic_airflow.report(step=step, loss=1.0 / step)
        time.sleep(0.05)
    (out / "checkpoint.json").write_text(json.dumps({"step": step}))
    return "stopped"


@dag(schedule=None, start_date=START, catchup=False)
def kn_stop_timeout():
    trains_until_stopped()


kn_stop_timeout()
