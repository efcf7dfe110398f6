"""``@task.kinetic`` / ``kinetic_task``: the TaskFlow form of KineticRunOperator.

Validation happens when the decorator is applied, i.e. at DAG import, so a wrong
accelerator string or a classmethod shows up as a DAG import error naming the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory

from kinetic_airflow.context_args import check_context_parameters
from kinetic_airflow.operators import DEFAULT_MAP_INDEX_TEMPLATE, KineticRunOperator, check_task_options
from kinetic_airflow.validation import as_function, callable_name, validate_callable

if TYPE_CHECKING:
    from typing import ParamSpec

    from airflow.sdk.bases.decorator import Task
    from typing_extensions import Unpack

    from kinetic_airflow.typed_args import TaskWithOptions

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
# checked against ``def train(lr: float)``) and rejects an unknown option (``accelerater=``): the
# options are the option table's TypedDict (kinetic_airflow.options.TaskOptions), as the
# operator's are.
@overload
def kinetic_task(python_callable: Callable[FParams, FReturn], /) -> Task[FParams, FReturn]: ...
@overload
def kinetic_task(
    python_callable: None = None,
    /,
    *,
    multiple_outputs: bool | None = None,
    **kwargs: Unpack[TaskWithOptions],
) -> Callable[[Callable[FParams, FReturn]], Task[FParams, FReturn]]: ...
def kinetic_task(
    python_callable: Callable[..., Any] | None = None, multiple_outputs: bool | None = None, **kwargs: Any
) -> Any:
    """Run the decorated function as a kinetic job (see KineticRunOperator for the options)."""
    # Every option given, by its row of kinetic_airflow.options: a wrong value is an import
    # error even for a decorated function no DAG calls, or one only ever .expand()ed.
    check_task_options(kwargs)
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
