"""TaskFlow context arguments: ``def train(lr, ds=None, params=None)`` gets the run's values.

A plain ``@task`` passes Airflow's context values to the parameters its function names;
``@task.virtualenv`` passes the serializable ones. A kinetic function runs in another
process (often on another machine), so it gets what can travel as plain data: dates,
ids, params and a snapshot of the DAG run (``dag_run.conf``). Live objects (``ti``,
``dag``, ``task``, ``var``, ``conn``, ...) cannot be pickled into a job, so naming one
is refused when the DAG file is parsed.

The values are resolved in the Airflow worker when the task runs and travel as ordinary
keyword arguments in the payload: the runner knows nothing about them. Arguments the DAG
passes explicitly win. Standard library only (``DagRunInfo`` is unpickled in the job).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TRAVELLING_KEYS", "DagRunInfo", "check_context_parameters", "context_kwargs"]

# Context keys whose values are plain data (strings, datetimes, dicts, numbers).
TRAVELLING_KEYS = frozenset(
    {
        "data_interval_end",
        "data_interval_start",
        "dag_run",  # as a DagRunInfo snapshot
        "ds",
        "ds_nodash",
        "expanded_ti_count",
        "logical_date",
        "map_index_template",
        "params",
        "partition_date",
        "partition_key",
        "prev_data_interval_end_success",
        "prev_data_interval_start_success",
        "prev_end_date_success",
        "prev_start_date_success",
        "run_id",
        "task_instance_key_str",
        "task_reschedule_count",
        "test_mode",
        "try_number",
        "ts",
        "ts_nodash",
        "ts_nodash_with_tz",
    }
)

# What to say instead, for the live objects people most often reach for.
_INSTEAD = {
    "ti": "use run_id, try_number, task_instance_key_str or params; push extra XComs from a plain "
    "@task downstream of this one",
    "task_instance": "use run_id, try_number, task_instance_key_str or params",
    "dag": "pass what you need from the DAG as an argument (e.g. train(dag_id='{{ dag.dag_id }}'))",
    "task": "pass what you need from the task as an argument",
    "var": "pass the value as a templated argument, e.g. train(lr='{{ var.value.lr }}')",
    "conn": "read the connection inside a plain @task and pass only non-secret fields",
    "macros": "render what you need into an argument, e.g. train(day='{{ macros.ds_add(ds, 1) }}')",
}


def _airflow_context_keys() -> frozenset[str]:
    try:
        # Airflow start-up cost: loaded when called, not when this module is imported.
        from airflow.sdk.definitions.context import KNOWN_CONTEXT_KEYS
    except ImportError:  # the runner, without Airflow: nothing to check there
        return TRAVELLING_KEYS
    return frozenset(KNOWN_CONTEXT_KEYS)


@dataclass(frozen=True)
class DagRunInfo:
    """What a kinetic function gets for a ``dag_run`` parameter: the run's plain data."""

    run_id: str
    dag_id: str
    conf: dict[str, Any] = field(default_factory=dict)
    run_type: str | None = None
    logical_date: Any = None
    data_interval_start: Any = None
    data_interval_end: Any = None
    run_after: Any = None
    start_date: Any = None

    @classmethod
    def of(cls, dag_run: Any) -> DagRunInfo:
        def get(name: str) -> Any:
            return getattr(dag_run, name, None)

        run_type = get("run_type")
        return cls(
            run_id=str(get("run_id")),
            dag_id=str(get("dag_id")),
            conf=dict(get("conf") or {}),
            run_type=getattr(run_type, "value", run_type),
            logical_date=get("logical_date"),
            data_interval_start=get("data_interval_start"),
            data_interval_end=get("data_interval_end"),
            run_after=get("run_after"),
            start_date=get("start_date"),
        )


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C callables have none
        return None


def _named_parameters(fn: Callable[..., Any]) -> list[str]:
    sig = _signature(fn)
    if sig is None:
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in sig.parameters.values() if p.kind in kinds]


def check_context_parameters(fn: Callable[..., Any], name: str | None = None) -> None:
    """Parse time: refuse parameters named after context values that cannot travel to a job."""
    known = _airflow_context_keys()
    live = [p for p in _named_parameters(fn) if p in known and p not in TRAVELLING_KEYS]
    if not live:
        return
    label = name or getattr(fn, "__name__", "the function")
    first = live[0]
    hint = _INSTEAD.get(first, "pass the value you need as an ordinary (templated) argument")
    raise TypeError(
        f"{label}() names the Airflow context value {first!r}"
        + (f" (and {', '.join(repr(p) for p in live[1:])})" if len(live) > 1 else "")
        + f": it is a live object of the Airflow worker and cannot travel to a kinetic job. Instead, {hint}. "
        f"Context values a kinetic function can name: {', '.join(sorted(TRAVELLING_KEYS))}."
    )


def _bound_names(fn: Callable[..., Any], args: Any, kwargs: Mapping[str, Any]) -> set[str]:
    sig = _signature(fn)
    if sig is None:
        return set(kwargs)
    try:
        return set(sig.bind_partial(*list(args), **dict(kwargs)).arguments)
    except TypeError:
        return set(kwargs)


def _value(key: str, context: Mapping[str, Any]) -> Any:
    value = context.get(key)
    if key == "try_number" and value is None and context.get("ti") is not None:
        return context["ti"].try_number  # Airflow 3.3 keeps it on the task instance only
    if key == "dag_run" and value is not None:
        return DagRunInfo.of(value)
    if key == "params" and value is not None:
        return {k: value[k] for k in value}  # ParamsDict -> plain dict of resolved values
    return value


def context_kwargs(
    fn: Callable[..., Any], args: Any, kwargs: Mapping[str, Any], context: Mapping[str, Any]
) -> dict[str, Any]:
    """Worker side: the context values the function names and the DAG did not pass itself."""
    bound = _bound_names(fn, args, kwargs)
    return {
        key: _value(key, context)
        for key in _named_parameters(fn)
        if key in TRAVELLING_KEYS and key not in bound and (key in context or key == "try_number")
    }
