"""The result envelope: what a job hands back, success or failure.

Two objects per host: ``result.pkl`` (cloudpickle of the envelope dict, holding
the real value or exception) and ``result.json`` (the same minus user objects).
The trigger and the failure classifier read only the JSON, so they never need
the user's modules; the worker unpickles the ``.pkl`` only to return the value
or re-raise the exception. Standard library + cloudpickle only (the runner).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

import cloudpickle

from kinetic_airflow.job.integrity import check_digest
from kinetic_airflow.job.storage import open_storage

# How a runner ends, with no envelope, when its attempt already ran (EX_TEMPFAIL): a
# single-host Job suspended and resumed (a Kueue eviction) starts a second pod, which must not
# run the function twice. The GKE backend reads this code with the Workload's eviction history
# as a preemption, so kinetic starts the next attempt.
RERUN_REFUSED_EXIT = 75

__all__ = [
    "FORMAT_VERSION",
    "PHASES",
    "RERUN_REFUSED_EXIT",
    "ResultRef",
    "is_result_ref",
    "load_checked_envelope",
    "summary_from_envelope",
]

# The version of the job files' format: the manifest and payload the worker writes, the envelope
# the runner writes back. A runner and a worker of different kinetic-airflow releases work together
# while this number is the same; a change of the format increments it, and either side refuses the
# other's files with a message naming both releases (runner.py, results.load_envelope). The manifest
# and envelope of releases before the number was written are format 1.
FORMAT_VERSION = 1

# The steps of a job, in order; an envelope names the one that failed.
PHASES = ("download", "verify", "unpickle", "setup", "execute", "upload")

_REF_KEY = "__kinetic_result_ref__"
REF_NOTE = (
    "a reference to a kinetic result kept in job storage: kinetic_airflow.load_result(value) returns "
    "the value; with [core] xcom_backend = kinetic_airflow.xcom.KineticXComBackend every task gets it"
)


def summary_from_envelope(envelope: dict[str, Any]) -> dict[str, Any]:
    """The JSON-safe part of an envelope."""
    keys = (
        "ok",
        "phase",
        "error_type",
        "error_message",
        "traceback",
        "host",
        "timings",
        "exit_code",
        "value_type",
        "value_repr",
        "fingerprint",
        "attempt",
        "integrity",  # the envelope's digest and HMAC (kinetic_airflow.integrity)
    )
    return {k: envelope.get(k) for k in keys}


def dumps_summary(envelope: dict[str, Any]) -> str:
    return json.dumps(summary_from_envelope(envelope), default=repr, sort_keys=True)


def load_checked_envelope(storage: Any, uri: str, check: Callable[[str], Any]) -> tuple[Any, str]:
    """Download an envelope to a temp file (digested as it arrives), pass its SHA-256 to
    ``check`` (which raises on a mismatch), and only then unpickle it; returns the envelope and
    its digest. The one place a stored envelope is unpickled: nothing from storage runs before
    its check. A temp file, so a large value is held once in memory."""
    fd, tmp = tempfile.mkstemp(prefix="kinetic-envelope-")
    os.close(fd)
    try:
        actual = storage.download_hashed(uri, tmp)
        check(actual)
        with open(tmp, "rb") as fh:
            return cloudpickle.load(fh), actual
    finally:
        os.unlink(tmp)


class ResultRef:
    """A pointer to a job result kept in storage because XCom cannot (or should not) carry it.

    XCom holds ``to_xcom()``'s plain dict; a downstream kinetic task receives the
    real object (the runner resolves refs before calling the function), and a plain
    task calls ``kinetic_airflow.load_result(ref)``.
    """

    def __init__(
        self, uri: str, key: str | None = None, type_name: str = "", summary: str = "", sha256: str = ""
    ) -> None:
        self.uri = uri
        self.key = key
        self.type_name = type_name
        self.summary = summary
        # The digest the worker verified (HMAC under the job key) before it made this reference:
        # whoever loads the envelope later checks the bytes against it before unpickling.
        self.sha256 = sha256

    def to_xcom(self) -> dict[str, Any]:
        return {
            _REF_KEY: self.uri,
            "key": self.key,
            "type": self.type_name,
            "summary": self.summary,
            "sha256": self.sha256,
            # For whoever meets the reference where they expected the value (a plain task, the UI).
            "note": REF_NOTE,
        }

    @classmethod
    def from_xcom(cls, data: dict[str, Any]) -> ResultRef:
        return cls(
            data[_REF_KEY],
            data.get("key"),
            data.get("type", ""),
            data.get("summary", ""),
            data.get("sha256", ""),
        )

    def load(self, storage: Any = None) -> Any:
        """Download the envelope, check it against the verified digest, and return the value."""
        envelope, _ = load_checked_envelope(
            storage or open_storage(self.uri),
            self.uri,
            lambda actual: check_digest(
                actual,
                self.sha256,
                f"the result {self.uri}",
                "its XCom reference (the digest the worker verified with the job key)",
            ),
        )
        value = envelope["value"]
        return value[self.key] if self.key is not None else value

    def __repr__(self) -> str:
        suffix = f"[{self.key!r}]" if self.key is not None else ""
        return f"ResultRef({self.uri}{suffix}, {self.type_name})"


def is_result_ref(obj: Any) -> bool:
    return isinstance(obj, dict) and _REF_KEY in obj


def replace_refs(obj: Any, fn: Any) -> Any:
    """Apply ``fn`` to every result-ref dict / ResultRef inside lists, tuples and dicts."""
    if is_result_ref(obj) or isinstance(obj, ResultRef):
        return fn(obj)
    if isinstance(obj, list):
        return [replace_refs(x, fn) for x in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(replace_refs(x, fn) for x in obj)
    if isinstance(obj, dict):
        return {k: replace_refs(v, fn) for k, v in obj.items()}
    return obj


def _rebuild_exception(cls: type, args: tuple, state: dict[str, Any] | None) -> BaseException:
    """Recreate an exception without calling its ``__init__`` (see ``dump_envelope``)."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    if state:
        exc.__dict__.update(state)
    return exc


def dump_envelope(envelope: dict[str, Any], fh: Any) -> None:
    """cloudpickle the envelope, keeping exceptions faithful.

    Plain pickling rebuilds an exception by calling ``cls(*exc.args)``, which breaks
    the many user exceptions whose ``__init__`` takes other arguments than it passes
    to ``super().__init__`` (``MyError(step=42)`` comes back as ``MyError("...")``).
    Exceptions without their own ``__reduce__`` are rebuilt from ``args`` and
    ``__dict__`` instead, so type, message and attributes all survive.
    """

    class _Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, BaseException):
                cls = type(obj)
                if (
                    cls.__reduce__ is BaseException.__reduce__
                    and cls.__reduce_ex__ is BaseException.__reduce_ex__
                ):
                    return _rebuild_exception, (cls, obj.args, dict(obj.__dict__) or None)
            return super().reducer_override(obj)

    _Pickler(fh, protocol=5).dump(envelope)
