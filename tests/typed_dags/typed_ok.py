"""A small DAG that uses kinetic-airflow's typed API as documented: mypy finds no error in it."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag

from kinetic_airflow import Data, KineticRunOperator, kinetic_task


@kinetic_task(accelerator="gpu-l4", retries=2, capture_env_vars=["WANDB_*"])
def train(lr: float, data: str, ds: str | None = None) -> dict[str, float]:
    return {"loss": lr * 2}


@kinetic_task
def report(metrics: dict[str, float]) -> str:
    return str(metrics)


def evaluate(path: str) -> float:
    return 0.5


@dag(start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), schedule=None)
def typed_ok() -> None:
    metrics = train(lr=1e-3, data="gs://bucket/ds")
    report(metrics)  # type: ignore[arg-type]  # an XComArg for a dict: as with Airflow's own @task
    train.partial(data="gs://bucket/ds").expand(lr=[1e-3, 3e-4])
    KineticRunOperator(
        task_id="evaluate",
        python_callable=evaluate,
        op_args=[Data("gs://bucket/ckpt")],
        accelerator="tpu-v6e-8t",
        retries=1,
        pool="tpus",
    )


typed_ok()
