"""A sweep that reports metrics (kinetic_airflow.report), and a DAG scheduled on its model's Asset
that reads them from the Asset event (tests/test_metrics_airflow.py)."""

from __future__ import annotations

import json
import os

import pendulum
from airflow.sdk import Asset, dag, task

START = pendulum.datetime(2026, 1, 1, tz="UTC")
MODEL = Asset("file:///tmp/kinetic-metrics-test/model")


@task.kinetic(outlets=[MODEL])
def train(lr: float) -> str:
    import kinetic_airflow

    loss = 1.0
    for step in range(1, 51):
        loss *= 1 - lr
        kinetic_airflow.report(step=step, loss=loss, accuracy=1 - loss)
    return f"model trained at lr={lr}"


@task
def pick_best(trained: list[str], **context) -> dict:
    metrics = context["ti"].xcom_pull(task_ids="train", key="kinetic_metrics")
    rows = list(metrics)
    best = min(range(len(rows)), key=lambda i: rows[i]["loss"])
    return {"best_index": best, "losses": [r["loss"] for r in rows], "trained": len(list(trained))}


@dag(start_date=START, schedule=None, catchup=False)
def kn_metrics_sweep():
    pick_best(train.expand(lr=[0.01, 0.1, 0.05]))


@task(inlets=[MODEL])
def read_model_metrics(**context) -> dict:
    events = context["inlet_events"][MODEL]
    extra = events[-1].extra
    out = os.environ.get("KN_TEST_METRICS_OUT")
    if out:
        with open(out, "w") as fh:
            json.dump(extra, fh)
    return extra


@dag(start_date=START, schedule=[MODEL], catchup=False)
def kn_metrics_consumer():
    read_model_metrics()


kn_metrics_sweep()
kn_metrics_consumer()
