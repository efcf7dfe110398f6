"""Worker side of the result envelope: load it, turn it into XCom, or re-raise the remote error."""

from __future__ import annotations

import json
import logging
from typing import Any

from kinetic_airflow import __version__
from kinetic_airflow.job.envelope import FORMAT_VERSION, ResultRef, load_checked_envelope
from kinetic_airflow.job.integrity import check_result
from kinetic_airflow.job.storage import Storage
from kinetic_airflow.job.tracebacks import clean_remote_traceback, type_name, user_summary

__all__ = [
    "KineticJobError",
    "KineticRemoteError",
    "load_verified_envelope",
    "log_remote_traceback",
    "raise_remote",
    "to_xcom",
]

log = logging.getLogger(__name__)


class KineticJobError(RuntimeError):
    """The job failed outside the user's function (exit, kill, preemption, setup), or cannot be read."""


class KineticRemoteError(RuntimeError):
    """The function raised an exception whose type cannot be recreated on the worker."""

    def __init__(self, error_type: str, message: str, remote_traceback: str = "") -> None:
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type
        self.remote_traceback = remote_traceback


def load_verified_envelope(
    storage: Storage, uri: str, summary: dict[str, Any] | None, key: str | None, host: int
) -> tuple[dict[str, Any], str]:
    """Check, then unpickle; returns the envelope and its digest.

    The check comes first: the file's SHA-256 must be the one its ``result.json`` names, and
    that claim must carry the HMAC of (host, digest) under the job's key (from the job record),
    which only the job's runner can make. A mismatch raises ``IntegrityError`` naming the object
    and nothing is unpickled.
    """
    envelope, sha256 = load_checked_envelope(
        storage, uri, lambda actual: check_result(summary, actual, key, host, f"the result envelope {uri}")
    )
    check_envelope_format(envelope, uri)
    return envelope, sha256


def check_envelope_format(envelope: Any, uri: str) -> None:
    """Refuse, with both releases named, an envelope in another job-file format than this worker's
    (``envelope.FORMAT_VERSION``): its fields would be misread, not merely missing."""
    fingerprint = (envelope.get("fingerprint") or {}) if isinstance(envelope, dict) else {}
    found = fingerprint.get("format", 1)  # envelopes written before the field existed: 1
    if found != FORMAT_VERSION:
        raise KineticJobError(
            f"the job's result {uri} is in job format {found}, written by the runner of kinetic-airflow "
            f"{fingerprint.get('kinetic_airflow', '?')}, but this worker (kinetic-airflow {__version__}) "
            f"reads format {FORMAT_VERSION}: rebuild the runner image with the workers' release "
            "(kinetic-airflow image) and re-run the task"
        )


def _xcom_size(value: Any) -> int | None:
    """Serialized size through Airflow's serde, or None when XCom cannot carry the value."""
    # Airflow start-up cost: loaded when called, not when this module is imported.
    from airflow.sdk.serde import serialize

    if isinstance(value, (bytes, bytearray, memoryview)):
        return None
    try:
        return len(json.dumps(serialize(value)))
    except Exception:
        return None


def _fits(value: Any, max_bytes: int) -> bool:
    size = _xcom_size(value)
    return size is not None and size <= max_bytes


def _ref(result_uri: str, value: Any, key: str | None, sha256: str) -> dict[str, Any]:
    type_name = f"{type(value).__module__}.{type(value).__qualname__}"
    shape = getattr(value, "shape", None)
    summary = f"shape={tuple(shape)} dtype={getattr(value, 'dtype', '')}" if shape is not None else ""
    return ResultRef(result_uri, key, type_name, summary, sha256).to_xcom()


def to_xcom(value: Any, result_uri: str, *, multiple_outputs: bool, max_bytes: int, sha256: str) -> Any:
    """The value itself when XCom can carry it; else a small reference to the stored envelope,
    carrying ``sha256`` (the envelope's verified digest) so its loaders check it first."""
    if multiple_outputs and isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out[key] = item if _fits(item, max_bytes) else _ref(result_uri, item, key, sha256)
        if _fits(out, max_bytes * max(1, len(out))):
            return out
    if _fits(value, max_bytes):
        return value
    ref = _ref(result_uri, value, None, sha256)
    log.info(
        "the result (%s) is not XCom-serializable or exceeds %d bytes; XCom gets a reference to %s. "
        "Downstream kinetic tasks receive the real object; plain tasks call "
        "kinetic_airflow.load_result(value), or get the value itself with "
        "[core] xcom_backend = kinetic_airflow.xcom.KineticXComBackend.",
        ref["type"],
        max_bytes,
        result_uri,
    )
    return ref


def _note(exc: BaseException, text: str) -> None:
    add_note = getattr(exc, "add_note", None)
    if add_note is not None:
        add_note(text)


# A traceback longer than this (deep recursion) is logged by its end, nearest the raise.
_TRACEBACK_LINES = 400


def log_remote_traceback(summary: dict[str, Any], job_id: str, where: str = "", logger: Any = None) -> bool:
    """Log the job's traceback as plain ERROR lines (to ``logger``: the task's); True if there was one.

    Called just before the task's error is raised, so the user's own file and line are the
    last thing above Airflow's exception line, whose frames are Airflow's and kinetic's. Plain
    log lines, because Airflow's log viewer shows neither exception notes nor chained causes.
    """
    if not summary.get("traceback"):
        return False
    logger = logger or log
    lines = clean_remote_traceback(summary["traceback"]).rstrip("\n").splitlines()
    job = f"job {job_id}" + (f", {where}" if where else "")
    logger.error("[kinetic] %s raised in phase %s; its traceback:", job, summary.get("phase"))
    if len(lines) > _TRACEBACK_LINES:
        logger.error(
            "[kinetic] ... %d earlier lines left out (`kinetic-airflow jobs result %s` prints them all) ...",
            len(lines) - _TRACEBACK_LINES,
            job_id,
        )
        lines = lines[-_TRACEBACK_LINES:]
    for line in lines:
        logger.error("%s", line)
    return True


def raise_remote(
    envelope: dict[str, Any] | None,
    summary: dict[str, Any],
    job_id: str,
    where: str = "",
    logger: Any = None,
) -> None:
    """Log the remote traceback, then re-raise the function's exception with its original
    type where it can be loaded.

    ``summary``: the job's ``result.json`` (``where`` failing host's); ``where``: on a
    multi-host job, which host raised it ("host 2 of 4 (also failed: ...)"); ``logger``: the
    task's (the module's logger is not shown by ``dag.test()``).
    """
    summary = user_summary(summary) or {}
    logged = log_remote_traceback(summary, job_id, where, logger)
    phase = summary.get("phase")
    job = f"kinetic job {job_id}" + (f", {where}" if where else "")
    exc = envelope.get("exception") if envelope else None
    error_type = type_name(summary.get("error_type")) or "Error"
    message = summary.get("error_message") or "unknown error"
    tb = clean_remote_traceback(summary["traceback"]) if logged else ""
    if phase == "execute" and isinstance(exc, Exception):
        raised: BaseException = exc
    elif phase == "execute":
        raised = KineticRemoteError(error_type, (f"{where}: " if where else "") + message, tb)
    else:
        raised = KineticJobError(f"{job} failed in phase {phase!r}: {message}")
    if logged:  # a pointer, not the traceback again: the log shows it once
        _note(raised, f"Raised remotely in {job} (phase {phase}); its traceback is logged just above.")
    raise raised
