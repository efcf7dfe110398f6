"""Parse-time checks of the callable, so mistakes are DAG import errors, not 3 a.m. failures."""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

__all__ = [
    "callable_name",
    "check_backend_fits",
    "check_base_uri",
    "check_gke_access",
    "check_local_volumes",
    "validate_callable",
]


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


_SCHEMES = ("gs://", "file://")


def check_base_uri(base_uri: Any, where: str = "base_uri") -> None:
    """Job storage is gs:// or file:// (an absolute local path counts as file://)."""
    if base_uri is None or is_templated(base_uri):
        return
    if not isinstance(base_uri, str) or not (base_uri.startswith(_SCHEMES) or base_uri.startswith("/")):
        scheme = (
            base_uri.split("://", 1)[0] + "://" if isinstance(base_uri, str) and "://" in base_uri else ""
        )
        what = f"the {scheme} scheme" if scheme else "this form"
        raise ValueError(
            f"{where}={base_uri!r}: kinetic job storage does not support {what}; use gs://bucket/prefix "
            "(a GCS bucket the job can reach) or file:///absolute/path (local runs). For data that lives "
            "elsewhere, copy it in the function or pass it as Data(...)."
        )


def check_local_volumes(volumes: Any) -> None:
    """The local backend never writes outside the job's own directories (README, 'Local backend').

    A mount path is a path on the job's machine; for a local job that is the Airflow worker
    itself, where ``/data`` would be created at the host's root, merged into an existing
    ``/data`` or shared by concurrent jobs.
    """
    if not volumes:
        return
    mount = next(iter(volumes))
    data = volumes[mount]
    raise ValueError(
        f"volumes={{{mount!r}: {data!r}}}: the local backend runs the job on this machine and never "
        f"creates {mount} (or any path outside the job's own directories): it would write into the host's "
        "filesystem and clash with other jobs. Pass the Data as an argument instead, "
        f"train(data=Data({data.source!r})): the function receives the local path of its copy. Volumes "
        "work as they are on backend='gke' / 'pathways', inside the job's container."
    )


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


def check_gke_access(
    use_internal_ip: Any = None, use_dns_endpoint: Any = None, impersonation_chain: Any = None
) -> None:
    """``use_internal_ip`` / ``use_dns_endpoint`` are bools (a string "false" would be truthy) and
    exclusive; ``impersonation_chain`` is one service account email or a list of them."""
    for name, value in (("use_internal_ip", use_internal_ip), ("use_dns_endpoint", use_dns_endpoint)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(
                f"{name}={value!r} is not a bool: write {name}=True or {name}=False (or leave it out "
                f"to use [kinetic] {name})."
            )
    if use_internal_ip and use_dns_endpoint:
        raise ValueError(
            "use_internal_ip=True and use_dns_endpoint=True: choose one endpoint of the GKE control "
            "plane (the private endpoint is reachable only from the cluster's VPC; the DNS endpoint from "
            "anywhere IAM allows)."
        )
    if impersonation_chain is None or is_templated(impersonation_chain):
        return
    items = [impersonation_chain] if isinstance(impersonation_chain, str) else impersonation_chain
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise TypeError(
            f"impersonation_chain={impersonation_chain!r}: give a service account email or a list of "
            'them, e.g. impersonation_chain="kinetic@my-project.iam.gserviceaccount.com".'
        )
    bad = [i for i in items if not is_templated(i) and "@" not in i]
    if bad or not items:
        raise ValueError(
            f"impersonation_chain={impersonation_chain!r}: each entry is a service account email "
            "(name@project.iam.gserviceaccount.com); the last one is impersonated, the ones before it "
            "are delegates."
        )
