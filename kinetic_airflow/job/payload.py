"""Build the job payload: cloudpickle of the callable, its arguments and captured env.

Why pickling needs care here: production Airflow imports DAG files as modules
named ``unusual_prefix_<sha1>_<file>`` that do not exist in the job's image, and
helper modules beside the DAG file are not installed there either. cloudpickle
pickles module-level functions and classes *by reference*, so the job would fail
with ModuleNotFoundError. We register those modules to be pickled by value.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import sysconfig
import time
from collections.abc import Iterable
from typing import IO, Any

import cloudpickle

from kinetic_airflow import __version__
from kinetic_airflow.job.envelope import FORMAT_VERSION
from kinetic_airflow.job.tracebacks import FilenamePickler

__all__ = ["PayloadError", "fingerprint", "payload_digest", "register_dag_modules_by_value", "write_payload"]

_SLICE = 8 * 1024 * 1024


class PayloadError(TypeError):
    """The function or one of its arguments cannot be shipped to the job."""


def fingerprint() -> dict[str, Any]:
    """What the runner checks against itself: Python and cloudpickle (pickles), the provider's
    release and the job files' format (``envelope.FORMAT_VERSION``)."""
    return {
        "python": platform.python_version(),
        "cloudpickle": cloudpickle.__version__,
        "kinetic_airflow": __version__,
        "format": FORMAT_VERSION,
    }


_INSTALLED_PREFIXES = tuple(
    sorted(
        {
            os.path.join(path, "")
            for key in ("stdlib", "platstdlib", "purelib", "platlib")
            if (raw := sysconfig.get_paths().get(key))
            for path in (raw, os.path.realpath(raw))
        }
    )
)


# Modules that can never qualify (installed or file-less), remembered across submits in a process.
_SKIP: dict[str, Any] = {}


def _is_installed(file: str) -> bool:
    return "site-packages" in file or "dist-packages" in file or file.startswith(_INSTALLED_PREFIXES)


def _callable_module_name(fn: Any) -> str | None:
    target = getattr(fn, "func", fn)  # functools.partial
    name = getattr(target, "__module__", None)
    if name is None and not isinstance(target, type):
        name = type(target).__module__
    return name


def _dir_prefixes(paths: Iterable[str | os.PathLike[str] | None]) -> tuple[str, ...]:
    out = set()
    for path in paths:
        if path:
            for variant in (os.path.abspath(path), os.path.realpath(path)):
                out.add(os.path.join(variant, ""))
    return tuple(sorted(out))


def register_dag_modules_by_value(fn: Any, roots: Iterable[str | os.PathLike[str] | None] = ()) -> list[str]:
    """Pickle DAG-file modules and their sibling modules by value. Returns the module names.

    A module qualifies when Airflow generated its name (``unusual_prefix_``) or its file
    lies under one of ``roots`` (the DAG folder, the bundle path, the DAG file's
    directory) and is not an installed package. Only string prefixes are compared (no
    filesystem calls): this runs on every submit, over every module the worker imported.
    """
    roots = list(roots)
    fn_module = sys.modules.get(_callable_module_name(fn) or "")
    fn_file = vars(fn_module).get("__file__") if fn_module is not None else None
    prefixes = _dir_prefixes(roots)
    if fn_file and not _is_installed(fn_file):
        if fn_module.__name__.startswith("unusual_prefix_") or fn_file.startswith(prefixes):
            prefixes = _dir_prefixes([*roots, os.path.dirname(fn_file)])
    registered = []
    for name, module in list(sys.modules.items()):
        if module is None or name in ("__main__", "__mp_main__") or name.startswith("kinetic_airflow"):
            continue
        if _SKIP.get(name) is module:  # an installed module seen before: never qualifies
            continue
        if not name.startswith("unusual_prefix_"):
            # vars(): a plain dict lookup; getattr would run lazy modules' __getattr__ hooks
            file = vars(module).get("__file__") if hasattr(module, "__dict__") else None
            if not file or _is_installed(file):
                _SKIP[name] = module
                continue
            if not file.startswith(prefixes):
                continue
        try:
            cloudpickle.register_pickle_by_value(module)
        except ValueError:
            continue
        registered.append(name)
    return sorted(registered)


class _HashingWriter:
    """What cloudpickle streams into: hashes, counts and forwards in bounded slices.

    Large buffers arrive whole as ``pickle.PickleBuffer`` (protocol 5, e.g. a 1 GiB array);
    forwarding them in ``_SLICE`` pieces lets a streaming upload send each piece before the
    next is copied, so memory stays at one slice. Failures of the sink are remembered, so
    they are reported as storage errors, not as pickling errors.
    """

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.digest = hashlib.sha256()
        self.size = 0
        self.sink_error: BaseException | None = None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        self.size += view.nbytes
        try:
            for start in range(0, view.nbytes, _SLICE):
                self.fh.write(view[start : start + _SLICE])
        except BaseException as exc:
            self.sink_error = exc
            raise
        return view.nbytes


def _find_unpicklable(payload: dict[str, Any], error: Exception) -> str:
    """Name the part of the payload that fails, so the error points at the culprit."""
    parts: list[tuple[str, Any]] = [("the function", payload["fn"])]
    parts += [(f"positional argument {i}", a) for i, a in enumerate(payload["args"])]
    parts += [(f"argument {k!r}", v) for k, v in payload["kwargs"].items()]
    parts += [(f"volume {k!r}", v) for k, v in (payload.get("volumes") or {}).items()]
    for label, obj in parts:
        try:
            cloudpickle.dumps(obj)
        except Exception as exc:
            return f"{label} (a {type(obj).__module__}.{type(obj).__qualname__}) cannot be pickled: {exc}"
    return f"the payload cannot be pickled ({error})"


def _payload(
    fn: Any,
    args: list[Any],
    kwargs: dict[str, Any],
    env: dict[str, str] | None,
    volumes: dict[str, Any] | None,
) -> dict[str, Any]:
    """The one shape of a payload: ``write_payload`` ships it, ``payload_digest`` digests it."""
    return {"fn": fn, "args": list(args), "kwargs": dict(kwargs), "env": env or {}, "volumes": volumes}


class _DigestOnly:
    """A sink that keeps nothing: what ``payload_digest`` pickles into."""

    def write(self, data: Any) -> int:
        return memoryview(data).nbytes


def payload_digest(
    fn: Any,
    args: list[Any],
    kwargs: dict[str, Any],
    *,
    env: dict[str, str] | None = None,
    volumes: dict[str, Any] | None = None,
    task_label: str = "",
) -> str:
    """The SHA-256 ``write_payload`` would give these parts, without storing anything.

    The same pickler over the same payload shape, so in one process the digest equals the
    shipped payload's; a result cache looks itself up by it before any job exists. Pickling
    errors are those of ``write_payload`` (raised as ``PayloadError`` when it ships)."""
    payload = _payload(fn, args, kwargs, env, volumes)
    writer = _HashingWriter(_DigestOnly())  # type: ignore[arg-type]
    try:
        FilenamePickler(writer).dump(payload)
    except Exception as exc:  # before any job exists: the same words as when it ships
        raise _payload_error(payload, exc, task_label) from exc
    return writer.digest.hexdigest()


def _payload_error(payload: dict[str, Any], error: Exception, task_label: str) -> PayloadError:
    culprit = _find_unpicklable(payload, error)
    where = f" for {task_label}" if task_label else ""
    return PayloadError(
        f"cannot build the job payload{where}: {culprit}. Everything the function receives is "
        "pickled with cloudpickle and sent to the job: pass plain data, paths or Data(...) "
        "objects instead of open files, locks, clients or connections, and create those inside "
        "the function."
    )


def write_payload(
    storage: Any,
    uri: str,
    fn: Any,
    args: list[Any],
    kwargs: dict[str, Any],
    *,
    env: dict[str, str] | None = None,
    volumes: dict[str, Any] | None = None,
    task_label: str = "",
) -> dict[str, Any]:
    """Pickle straight into the payload object at ``uri``, digesting in the same pass.

    No temp file and no second read: building a payload costs cloudpickle plus the upload.
    Returns the manifest fields (sha256, size, fingerprint, pickling time).
    """
    payload = _payload(fn, args, kwargs, env, volumes)
    started = time.perf_counter()
    writer: _HashingWriter | None = None
    pickled = False
    try:
        with storage.open_write(uri) as fh:
            writer = _HashingWriter(fh)
            FilenamePickler(writer).dump(payload)  # tracebacks keep the DAG file's name
            pickled = True
    except Exception as exc:
        if pickled or writer is None or writer.sink_error is not None:
            raise  # storage failed (its own error names the bucket or permission)
        raise _payload_error(payload, exc, task_label) from exc
    return {
        "sha256": writer.digest.hexdigest(),
        "payload_bytes": writer.size,
        "fingerprint": fingerprint(),
        "pickle_seconds": round(time.perf_counter() - started, 3),
    }
