"""Helpers for reading what a dag.test() run left in the metadata DB."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

_GREP_FILES = """
import sys
needle = sys.argv[1].encode()
found = []
for path in sys.argv[2:]:
    try:
        with open(path, "rb") as f:
            if needle in f.read():
                found.append(path)
    except FileNotFoundError:
        pass
print("\\n".join(found))
"""


# The storage and backend variants as a diagonal. conftest's ``base_uri`` fixture runs a test on
# file:// and on fake GCS, and the modules' ``backend`` fixtures run it on the local backend and on
# the cluster emulator: four runs of a DAG where the storage code and the backend code each differ
# in two. A test marked ``backend_and_storage`` runs twice, each backend on the storage it is used
# with (local on disk, a cluster on GCS); ``on_storage("gs")`` pins a test whose subject is not the
# storage to one of them. Whatever truly differs by storage keeps a test of its own on each
# (tests/test_units.py, test_e2e_dag.py, test_gc.py's listing and deleting, the bad-input tests).
backend_and_storage = pytest.mark.parametrize(
    ("backend", "base_uri"), [("local", "file"), ("gke", "gs")], indirect=True
)


def on_storage(*kinds: str) -> pytest.MarkDecorator:
    """Run a ``base_uri`` test on these storages only ("file", "gs") instead of both."""
    return pytest.mark.parametrize("base_uri", kinds, indirect=True)


def machine_cache(name: str) -> Path:
    """A directory that outlives the run, for caches that only make a second run on this machine
    faster (mypy's): ``$XDG_CACHE_HOME/kinetic-airflow-tests/<name>`` (``~/.cache`` by default).

    Never for state a test reads as a result: a fresh machine (CI) has none of it and must pass.
    """
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kinetic-airflow-tests"
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def metadata_db_files_containing(needle: str) -> list[str]:
    """Which of the SQLite metadata DB's files (the DB, its write-ahead log) contain ``needle``.

    Read by another process, never by this one: this process holds SQLite connections to the
    DB, and on Linux closing *any* file descriptor of a file drops all of the process's POSIX
    locks on it, SQLite's included. The next other process to disconnect (a CLI run in a
    subprocess) then takes itself for the last connection, checkpoints and deletes
    ``airflow.db-wal``, and this process goes on writing into the deleted log, unseen by every
    other process (what made gc miss XCom references after this module's tests).
    """
    db = os.path.join(os.environ["AIRFLOW_HOME"], "airflow.db")
    paths = [db, db + "-wal"]
    out = subprocess.run(
        [sys.executable, "-c", _GREP_FILES, needle, *paths], capture_output=True, text=True, check=True
    ).stdout
    return [line for line in out.splitlines() if line]


def xcom(dag_run: Any, task_id: str, map_index: int = -1, key: str = "return_value") -> Any:

    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(
                run_id=dag_run.run_id,
                dag_ids=dag_run.dag_id,
                task_ids=task_id,
                map_indexes=map_index,
                key=key,
            )
        ).first()
        if row is None:
            raise AssertionError(f"no XCom {key!r} for {task_id}[{map_index}]")
        return XComModel.deserialize_value(row)


def _task_instances(dag_run: Any) -> list[tuple[str, int, str, int]]:
    """(task_id, map_index, state, try_number) of every task instance of the run."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        tis = session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == dag_run.dag_id, TaskInstance.run_id == dag_run.run_id
            )
        ).all()
        return [
            (ti.task_id, ti.map_index, str(getattr(ti.state, "value", ti.state)), ti.try_number) for ti in tis
        ]


def ti_states(dag_run: Any) -> dict[str, str]:
    return {
        (task_id if map_index < 0 else f"{task_id}[{map_index}]"): state
        for task_id, map_index, state, _ in _task_instances(dag_run)
    }


def ti_try_numbers(dag_run: Any) -> dict[str, int]:
    return {task_id: tries for task_id, _, _, tries in _task_instances(dag_run)}


def dag_runs_in_metastore(dag: Any, run_ids: list[str], ti_states: dict[str, str]) -> None:
    """Real DAG runs of ``dag`` in the metadata DB, cheaply: no task runs.

    One ``dag.test()`` with every task marked success writes the DAG and its version (a
    task instance needs both); the runs are then made by the scheduler's own DAG object
    (``create_dagrun``: the run, its task instances), their task instances set to
    ``ti_states`` (task id -> state) with try 1.
    """
    import datetime

    from airflow.models.dagbag import DBDagBag
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType
    from sqlalchemy import select

    dag.test(mark_success_pattern=".*")
    start = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=30)  # after start_date
    with create_session() as session:
        scheduler_dag = DBDagBag().get_latest_version_of_dag(dag.dag_id, session=session)
        for i, run_id in enumerate(run_ids):
            when = start + datetime.timedelta(minutes=i)
            scheduler_dag.create_dagrun(
                run_id=run_id,
                logical_date=when,
                data_interval=(when, when),
                run_after=when,
                run_type=DagRunType.MANUAL,
                triggered_by=DagRunTriggeredByType.TEST,
                state=DagRunState.SUCCESS,
                start_date=when,
                session=session,
            )
        session.flush()
        tis = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag.dag_id, TaskInstance.run_id.in_(run_ids))
        )
        for ti in tis:
            ti.state = ti_states[ti.task_id]
            ti.try_number = 1
    missing = set(run_ids) - {run_id for (run_id,) in _rows_with_tis(dag.dag_id, run_ids)}
    if missing:
        raise AssertionError(f"no task instances made for {len(missing)} runs, e.g. {min(missing)}")


def _rows_with_tis(dag_id: str, run_ids: list[str]) -> list[tuple[str]]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        query = select(TaskInstance.run_id).where(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id.in_(run_ids)
        )
        return list(session.execute(query.distinct()).all())
