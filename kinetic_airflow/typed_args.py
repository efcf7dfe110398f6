"""The keyword arguments of ``KineticRunOperator`` and ``kinetic_task``, as TypedDicts for
``**kwargs: Unpack[...]``: the task options (``kinetic_airflow.options.TaskOptions``, the option
table) and the arguments Airflow's BaseOperator takes.

Typed this way a type checker knows every argument they accept, so ``accelerater="gpu-l4"`` is an
error instead of passing silently. ``tests/test_typed_api.py`` checks the BaseOperator keys
against BaseOperator's signature, so an Airflow upgrade that adds an argument is noticed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, MutableMapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Required, TypedDict

from kinetic_airflow.options import BackendName, TaskOptions

if TYPE_CHECKING:
    from airflow.sdk import DAG, Context, TaskGroup

__all__ = ["BackendName", "OperatorArgs", "OperatorOptions", "TaskArgs", "TaskOptions", "TaskWithOptions"]

_Callback = Callable[["Context"], None]


class _CommonArgs(TypedDict, total=False):
    """BaseOperator's arguments except ``task_id`` and ``multiple_outputs``."""

    owner: str
    email: str | Sequence[str] | None
    email_on_retry: bool
    email_on_failure: bool
    retries: int | None
    retry_delay: timedelta | float
    retry_exponential_backoff: float
    max_retry_delay: timedelta | float | None
    retry_policy: Any
    start_date: datetime | None
    end_date: datetime | None
    depends_on_past: bool
    ignore_first_depends_on_past: bool
    wait_for_past_depends_before_skipping: bool
    wait_for_downstream: bool
    dag: DAG | None
    params: MutableMapping[str, Any] | None
    default_args: dict[str, Any] | None
    priority_weight: int
    weight_rule: Any
    queue: str
    pool: str | None
    pool_slots: int
    sla: timedelta | None
    execution_timeout: timedelta | None
    on_execute_callback: _Callback | Collection[_Callback] | None
    on_failure_callback: _Callback | list[_Callback] | None
    on_success_callback: _Callback | Collection[_Callback] | None
    on_retry_callback: _Callback | list[_Callback] | None
    on_skipped_callback: _Callback | Collection[_Callback] | None
    pre_execute: _Callback | None
    post_execute: Callable[[Context, Any], None] | None
    trigger_rule: str
    resources: dict[str, Any] | None
    run_as_user: str | None
    map_index_template: str | None
    max_active_tis_per_dag: int | None
    max_active_tis_per_dagrun: int | None
    executor: str | None
    executor_config: dict[str, Any] | None
    do_xcom_push: bool
    inlets: Any | None
    outlets: Any | None
    task_group: TaskGroup | None
    doc: str | None
    doc_md: str | None
    doc_json: str | None
    doc_yaml: str | None
    doc_rst: str | None
    task_display_name: str | None
    logger_name: str | None
    allow_nested_operators: bool
    render_template_as_native_obj: bool | None


class TaskArgs(_CommonArgs, total=False):
    """``kinetic_task(**kwargs)``: the task id defaults to the function's name; ``multiple_outputs``
    is an argument of its own."""

    task_id: str


class OperatorArgs(_CommonArgs, total=False):
    """What ``KineticRunOperator(**kwargs)`` passes to BaseOperator."""

    task_id: Required[str]
    multiple_outputs: bool


class OperatorOptions(OperatorArgs, TaskOptions, total=False):
    """``KineticRunOperator(**kwargs)``: the task options and BaseOperator's arguments."""


class TaskWithOptions(TaskArgs, TaskOptions, total=False):
    """``kinetic_task(**kwargs)``: the task options and BaseOperator's arguments."""
