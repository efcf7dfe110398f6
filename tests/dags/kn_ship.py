"""DAGs for shipping what a function needs: the DAG folder's code, packages, data (issue 9)."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import dag, task

START = pendulum.datetime(2026, 1, 1, tz="UTC")
BACKEND = os.environ.get("KN_SHIP_BACKEND", "local")


@task.kinetic(backend=BACKEND)
def uses_dag_folder_package() -> str:
    import kn_shiplib  # only in the body: cloudpickle never sees it, the job must import it

    return kn_shiplib.greet("job")


@dag(schedule=None, start_date=START, catchup=False)
def kn_ship_code():
    uses_dag_folder_package()


@task.kinetic(backend=BACKEND, requirements=["kn-tiny==0.1"])
def uses_tiny(i: int) -> str:
    import kn_tiny

    return f"{kn_tiny.VALUE}-{i}"


@dag(schedule=None, start_date=START, catchup=False)
def kn_ship_requirements():
    uses_tiny.override(task_id="first")(1) >> uses_tiny.override(task_id="second")(2)


@task.kinetic(backend=BACKEND, requirements=["kn-does-not-exist==9.9"])
def needs_missing_package() -> None:
    import kn_does_not_exist  # noqa: F401


@dag(schedule=None, start_date=START, catchup=False)
def kn_ship_bad_requirements():
    needs_missing_package()


@task.kinetic(backend=BACKEND)
def imports_absent_module() -> None:
    import kn_absent_module  # noqa: F401


@dag(schedule=None, start_date=START, catchup=False)
def kn_ship_absent_module():
    imports_absent_module()


@task.kinetic(backend=BACKEND)
def shared_code(i: int) -> str:
    import kn_shiplib

    return kn_shiplib.greet(str(i))


@dag(schedule=None, start_date=START, catchup=False)
def kn_ship_many():
    shared_code.expand(i=[1, 2, 3])


@task.kinetic(backend=BACKEND)
def helper_fails() -> str:
    import kn_shiplib

    return kn_shiplib.refuse("nobody")


@dag(schedule=None, start_date=START, catchup=False)
def kn_ship_helper_fails():
    helper_fails()


kn_ship_code()
kn_ship_helper_fails()
kn_ship_requirements()
kn_ship_bad_requirements()
kn_ship_absent_module()
kn_ship_many()
