"""DAGs for tests/test_option_values.py: templated options checked after rendering, configured
values checked before any job, and option values in each accepted form, run end to end."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import dag, task
from kn_test_util import record_failure

from kinetic_airflow import KineticRunOperator

START = pendulum.datetime(2026, 1, 1, tz="UTC")


@task.kinetic(accelerator="{{ params.accelerator }}", on_failure_callback=record_failure)
def bad_accelerator():
    return 1


@task.kinetic(namespace="{{ params.ns }}", on_failure_callback=record_failure)
def bad_namespace():
    return 1


@task.kinetic(output_dir="{{ params.out }}", on_failure_callback=record_failure)
def bad_output_dir():
    return 1


@task.kinetic(accelerator="{{ params.good }}", spot=False, poll_interval=0.3)
def good():
    return 7


@dag(
    schedule=None,
    start_date=START,
    params={"accelerator": "tpu-v6e-8tt", "ns": "Not_A_Namespace", "out": "relative/dir", "good": "cpu"},
)
def kn_rendered_options():
    bad_accelerator()
    bad_namespace()
    bad_output_dir()
    good()


@task.kinetic(on_failure_callback=record_failure)
def uses_the_config():
    return 1


@dag(schedule=None, start_date=START)
def kn_configured_options():
    uses_the_config()


@task.kinetic(
    backend="gke",
    accelerator="cpu",
    spot=False,
    poll_interval=timedelta(milliseconds=300),
    startup_timeout=timedelta(minutes=5),
    preemption_retries=0,
    container_env={"MODE": "on-demand"},
    capture_env_vars=("KN_OPTION_*",),
)
def on_demand() -> str:
    import os

    return f"{os.environ['MODE']} {os.environ.get('KN_OPTION_FLAVOUR')}"


@task.kinetic(backend="gke", accelerator="cpu", spot=True, heartbeat_seconds=1)
def on_spot() -> str:
    return "spot"


def classic() -> str:
    return "classic"


@dag(schedule=None, start_date=START)
def kn_option_forms():
    on_demand()
    on_spot()
    KineticRunOperator(
        task_id="classic_on_demand",
        python_callable=classic,
        backend="gke",
        spot=False,
        deferrable=False,
        poll_interval=0.3,
        startup_timeout=300,
    )


DAGS = {d.dag_id: d for d in (kn_rendered_options(), kn_configured_options(), kn_option_forms())}
