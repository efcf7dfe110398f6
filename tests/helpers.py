"""Helpers for reading what a dag.test() run left in the metadata DB."""

from __future__ import annotations

from typing import Any


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
