"""``@task.kinetic`` / ``kinetic_task``: the TaskFlow form of KineticRunOperator.

Validation happens when the decorator is applied, i.e. at DAG import, so a wrong
accelerator string or a classmethod shows up as a DAG import error naming the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory

from kinetic_airflow.context_args import check_context_parameters
from kinetic_airflow.operators import DEFAULT_MAP_INDEX_TEMPLATE, KineticRunOperator
from kinetic_airflow.options import validate_options
from kinetic_airflow.validation import as_function, callable_name, validate_callable

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import timedelta
    from typing import ParamSpec

    from airflow.sdk.bases.decorator import Task
    from typing_extensions import Unpack

    from kinetic_airflow.job.inputs import Data
    from kinetic_airflow.typed_args import BackendName, TaskArgs

    FParams = ParamSpec("FParams")

__all__ = ["kinetic_task"]

FReturn = TypeVar("FReturn")


class _KineticDecoratedOperator(DecoratedOperator, KineticRunOperator):
    custom_operator_name = "@task.kinetic"
    template_fields: Sequence[str] = KineticRunOperator.template_fields
    template_fields_renderers = KineticRunOperator.template_fields_renderers
    shallow_copy_attrs: Sequence[str] = ("python_callable",)

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Any = None,
        op_kwargs: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            python_callable=python_callable,
            op_args=op_args,
            op_kwargs=op_kwargs,
            kwargs_to_upstream={
                "python_callable": python_callable,
                "op_args": op_args,
                "op_kwargs": op_kwargs,
            },
            **kwargs,
        )


# Typed so that a type checker keeps the decorated function's signature (``train(lr=...)`` is
# checked against ``def train(lr: float)``) and rejects an unknown option (``accelerater=``).
# The options mirror KineticRunOperator's; tests/test_typed_api.py keeps the two in step.
@overload
def kinetic_task(python_callable: Callable[FParams, FReturn], /) -> Task[FParams, FReturn]: ...
@overload
def kinetic_task(
    python_callable: None = None,
    /,
    *,
    multiple_outputs: bool | None = None,
    accelerator: str = "cpu",
    container_image: str | None = None,
    zone: str | None = None,
    project: str | None = None,
    cluster: str | None = None,
    namespace: str | None = None,
    backend: BackendName | None = None,
    capture_env_vars: list[str] | tuple[str, ...] | None = None,
    volumes: Mapping[str, Data] | None = None,
    spot: bool = False,
    output_dir: str | None = None,
    base_uri: str | None = None,
    gcp_conn_id: str | None = None,
    kubernetes_conn_id: str | None = None,
    deferrable: bool = True,
    poll_interval: float | timedelta | None = None,
    heartbeat_seconds: float | timedelta | None = None,
    startup_timeout: float | timedelta | None = None,
    preemption_retries: int | None = None,
    container_env: Mapping[str, str] | None = None,
    pod_override: Any = None,
    requirements: str | Sequence[str] | None = None,
    use_internal_ip: bool | None = None,
    use_dns_endpoint: bool | None = None,
    impersonation_chain: str | Sequence[str] | None = None,
    capacity: str | None = None,
    max_run_duration: float | timedelta | None = None,
    local_queue: str | None = None,
    priority_class: str | None = None,
    queue_timeout: float | timedelta | None = None,
    slices: int | None = None,
    debug: bool = False,
    debug_wait: float | timedelta | None = None,
    debug_on_timeout: str | None = None,
    **kwargs: Unpack[TaskArgs],
) -> Callable[[Callable[FParams, FReturn]], Task[FParams, FReturn]]: ...
def kinetic_task(
    python_callable: Callable[..., Any] | None = None, multiple_outputs: bool | None = None, **kwargs: Any
) -> Any:
    """Run the decorated function as a kinetic job (see KineticRunOperator for the options)."""
    # Every option given, by its row of kinetic_airflow.options: a wrong value is an import
    # error even for a decorated function no DAG calls, or one only ever .expand()ed.
    validate_options(kwargs)
    # Mapped instances are labelled by Airflow from the *mapped* operator's template, so the
    # default must be given here, not in the operator's __init__ (which runs after unmapping).
    kwargs.setdefault("map_index_template", DEFAULT_MAP_INDEX_TEMPLATE)

    def decorate(fn: Callable[..., Any]) -> Any:
        validate_callable(fn)
        check_context_parameters(fn, callable_name(fn))
        return task_decorator_factory(
            python_callable=as_function(fn),
            multiple_outputs=multiple_outputs,
            decorated_operator_class=_KineticDecoratedOperator,
            **kwargs,
        )

    if python_callable is not None:
        return decorate(python_callable)
    return decorate
