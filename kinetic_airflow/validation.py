"""Parse-time checks of the callable, so mistakes are DAG import errors, not 3 a.m. failures."""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

__all__ = ["callable_name", "check_backend_fits", "validate_backend", "validate_callable", "validate_options"]


def validate_callable(fn: Any) -> None:
    if isinstance(fn, classmethod):
        raise TypeError(
            f"kinetic cannot run a classmethod object ({fn.__func__.__qualname__}): decorate a plain "
            "function, or pass the bound method (MyClass.method) after the class is defined."
        )
    if isinstance(fn, staticmethod):
        raise TypeError(
            f"kinetic cannot run a staticmethod object ({fn.__func__.__qualname__}): decorate a plain "
            "module-level function, or pass MyClass.method after the class is defined."
        )
    if hasattr(fn, "cache_info") and hasattr(fn, "cache_clear"):
        wrapped = getattr(getattr(fn, "__wrapped__", None), "__qualname__", "the function")
        raise TypeError(
            f"kinetic cannot run a functools.lru_cache/cache wrapper ({wrapped}): the cache would "
            "live in a throwaway job process and never be reused. Decorate the undecorated function "
            "and apply caching inside it if you need it."
        )
    if not callable(fn):
        raise TypeError(
            f"kinetic needs a callable (a function, lambda, functools.partial or an object with "
            f"__call__), got {type(fn).__name__}: {fn!r}"
        )


def callable_name(fn: Any) -> str:
    """A readable name for functions, partials and callable instances (used in logs and task ids)."""
    if isinstance(fn, functools.partial):
        return callable_name(fn.func)
    name = getattr(fn, "__name__", None)
    if isinstance(name, str) and name:
        return "lambda" if name == "<lambda>" else name
    return type(fn).__name__


def ensure_name(fn: Any) -> Any:
    """Give partials and callable instances a ``__name__`` (used in task ids and logs)."""
    if getattr(fn, "__name__", None):
        return fn
    try:
        fn.__name__ = callable_name(fn)
    except (AttributeError, TypeError):
        pass
    return fn


def as_function(fn: Any) -> Any:
    """A plain function for partials and callable objects, which @task's machinery requires.

    The wrapper keeps the callable's signature (for argument binding at DAG parse time)
    and calls it unchanged in the job.
    """
    if isinstance(fn, (types.FunctionType, types.MethodType)):
        return fn

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    call.__name__ = call.__qualname__ = callable_name(fn)
    call.__doc__ = getattr(fn, "__doc__", None)
    call.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    call.__annotations__ = dict(getattr(getattr(fn, "func", fn), "__annotations__", {}) or {})
    return call


def validate_backend(backend: Any) -> None:
    from kinetic_airflow.config import BACKENDS

    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")


def is_templated(value: Any) -> bool:
    return isinstance(value, str) and "{{" in value


def check_backend_fits(backend: str | None, spec: Any) -> None:
    if backend == "pathways" and spec.kind != "tpu":
        raise ValueError(
            f"backend='pathways' runs TPU slices (a LeaderWorkerSet of TPU hosts), not {spec.kind} "
            f"accelerators like {spec.text!r}: use backend='gke' (or 'auto') for CPUs and GPUs."
        )
    if backend == "gke" and spec.multi_host:
        raise ValueError(
            f"accelerator {spec.text!r} spans {spec.hosts} hosts; backend='gke' runs single-host Jobs. "
            "Multi-host TPU slices run as a LeaderWorkerSet: use backend='pathways' or backend='auto'."
        )


def validate_options(
    *,
    accelerator: Any = "cpu",
    spot: bool = False,
    backend: Any = None,
    volumes: Any = None,
    capture_env_vars: Any = None,
) -> tuple[dict[str, Any], list[str]]:
    """Every parse-time check of the job options; returns (volumes, capture patterns) normalized.

    Shared by the decorator (checked when it is applied) and the operator (checked when it is
    built), so a DAG file learns about a bad option at import either way.
    """
    from kinetic_airflow.accelerators import parse_accelerator
    from kinetic_airflow.data import validate_volumes
    from kinetic_airflow.envcapture import validate_capture_patterns

    validate_backend(backend)
    if not is_templated(accelerator):
        check_backend_fits(backend, parse_accelerator(accelerator, spot=spot or None))
    return validate_volumes(volumes), validate_capture_patterns(capture_env_vars)
