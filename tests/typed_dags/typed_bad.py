"""Mistakes a type checker must catch in kinetic-airflow's typed API (tests/test_typed_api.py)."""

from __future__ import annotations

from kinetic_airflow import KineticRunOperator, kinetic_task


@kinetic_task(accelerater="gpu-l4")  # BAD: unknown option
def misspelled(x: int) -> int:
    return x


@kinetic_task(accelerator="gpu-l4")
def train(lr: float) -> float:
    return lr


def run() -> None:
    train(lr=0.1, epochs=3)  # BAD: train() has no parameter epochs
    train(rate=0.1)  # BAD: wrong parameter name
    KineticRunOperator(task_id="t", python_callable=print, acelerator="cpu")  # BAD: unknown option
    KineticRunOperator(task_id="t", python_callable=print, retries="two")  # BAD: wrong type
    KineticRunOperator(task_id="t", python_callable=print, spot="false")  # BAD: a str for a bool
    KineticRunOperator(task_id="t", python_callable=print, poll_interval="2s")  # BAD: a str for seconds
    KineticRunOperator(task_id="t", python_callable=print, backend="gcp")  # BAD: not a backend name
    KineticRunOperator(task_id="t", python_callable=print, container_env={"N": 4})  # BAD: a value not a str


@kinetic_task(capture_env_vars="WANDB_API_KEY")  # BAD: a str for a list of names
def one_name(x: int) -> int:
    return x
