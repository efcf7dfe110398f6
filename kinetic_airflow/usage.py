"""What a job cost: accelerator chips times the time they ran, with the wait for them kept apart.

Each attempt of a task (a preemption makes a new one) is counted once, by the worker,
when its outcome reaches Airflow::

    queue_seconds  submitted -> the runner started (scheduling, node scale-up, image pull)
    run_seconds    the runner started -> it ended (the chips are held by the function)
    chips          TPU chips (hosts x chips per host) or GPUs; 0 for a CPU job and for any
                   local job (it runs on this machine's CPU, whatever its accelerator string)
    device         where it ran: the accelerator, or "local CPU" on the local backend
    chip_hours     chips x run_seconds / 3600
    spot           Spot / preemptible capacity, or on-demand

The figures go to the task's XCom under ``USAGE_XCOM_KEY`` (every attempt of the try and
their sums), into the task's job record (the Kinetic view reads it there), to
``{job_uri}/usage.json`` beside the result summary (``kinetic-airflow jobs show`` reads it
there, from storage alone), and to Airflow's metrics (StatsD / OpenTelemetry) as
``kinetic.chip_seconds`` (a counter, so a dashboard can sum a night's sweep),
``kinetic.queue_wait`` and ``kinetic.run_time`` (timers), tagged with DAG, task,
accelerator, backend and spot.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta
from typing import Any

from kinetic_airflow.job.accelerators import InvalidAcceleratorError, parse_accelerator
from kinetic_airflow.job.layout import USAGE_NAME, JobLayout
from kinetic_airflow.job.ref import JobRef
from kinetic_airflow.job.storage import Storage, UnreadableObject

__all__ = [
    "USAGE_NAME",
    "USAGE_XCOM_KEY",
    "attempt_usage",
    "chips_of",
    "emit_metrics",
    "ended_usage",
    "reused_usage",
    "totals",
]

log = logging.getLogger(__name__)

USAGE_XCOM_KEY = "kinetic_usage"


def chips_of(ref: JobRef) -> tuple[int, bool]:
    """(chips, spot) of a job's accelerator; a CPU job holds no chips, and neither does a local
    one: the local backend runs any accelerator string as a process on this machine's CPU, so
    billing its ``tpu-v6e-8t`` as 8 TPU chips would report an accelerator bill nobody paid."""
    if ref.backend == "local":
        return 0, False
    text = ref.accelerator or "cpu"
    spec = ref.spec  # parsed with the reference; None for no accelerator or one this version does not read
    if spec is None:
        return 0, text.endswith(":spot")
    slices = int((ref.k8s.slices if ref.k8s is not None else None) or 1)  # multislice: every slice's
    return (spec.count * slices if spec.kind in ("tpu", "gpu") else 0), spec.spot


def ended_usage(
    backend: str | None, accelerator: str | None, started: float | None, ended: float | None
) -> dict[str, Any]:
    """The cost of an attempt whose outcome never reached a worker, from the times its files
    hold: a task marked failed (or cleared) while deferred has its job stopped by the trigger,
    and no worker runs ``attempt_usage`` for it, yet its chips were held from the runner's start
    to the stop. {} without both times. (A multislice job counts one slice here: the view's
    history entry does not name the slices.)"""
    if started is None or ended is None:
        return {}
    chips, spot = 0, False
    if backend != "local":
        text = accelerator or "cpu"
        try:
            spec = parse_accelerator(text)
        except InvalidAcceleratorError:
            spec = None
        chips, spot = (spec.count if spec.kind in ("tpu", "gpu") else 0, spec.spot) if spec else (0, False)
    run = max(0.0, ended - started)
    return {
        "started_at": started,
        "finished_at": ended,
        "run_seconds": round(run, 3),
        "chips": chips,
        "spot": spot,
        "chip_hours": round(chips * run / 3600, 6),
        "counted": "from the job's files (its outcome never reached a worker)",
    }


def _stored_json(storage: Storage, uri: str) -> Any:
    """A marker or progress record, bounded; None when absent or not one a writer of ours made (a
    figure must never fail the task)."""
    try:
        return storage.read_json_or_none(uri)
    except UnreadableObject as exc:
        log.warning("usage: ignoring %s", exc)
        return None


def _time_in(record: Any, key: str) -> float | None:
    value = record.get(key) if isinstance(record, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e11:
        return None
    return float(value)


def _marker_time(storage: Storage, layout: JobLayout, name: str) -> float | None:
    return _time_in(_stored_json(storage, layout.status(name)), "time")


def attempt_usage(storage: Storage, ref: JobRef, outcome: str, *, ended: float | None = None) -> dict:
    """The cost of one attempt, from its markers (the runner's start and end; the watcher's
    ``running`` time when the runner never wrote one, as after a lost node)."""
    layout = JobLayout(ref.job_uri)
    identity = ref.job_identity
    submitted = float(ref.submitted_at or 0) or None
    started = _marker_time(storage, layout, "started")
    if started is None:
        started = _time_in(_stored_json(storage, layout.status("progress")), "running_since")
    finished = _marker_time(storage, layout, "finished") or ended or time.time()
    chips, spot = chips_of(ref)
    queue = max(0.0, started - submitted) if started and submitted else None
    if queue is None and submitted and outcome == "withdrawn":  # a ladder's rung that never started:
        queue = max(0.0, finished - submitted)  # all it did was wait
    run = max(0.0, finished - started) if started else 0.0
    usage = {
        "job_id": ref.job_id,
        "try_number": identity.try_number,
        "attempt": identity.attempt,
        "backend": ref.backend,
        "accelerator": ref.accelerator or "cpu",
        "device": "local CPU" if ref.backend == "local" else ref.accelerator or "cpu",
        "chips": chips,
        "spot": spot,
        "submitted_at": submitted,
        "started_at": started,
        "finished_at": finished,
        "queue_seconds": round(queue, 3) if queue is not None else None,
        "run_seconds": round(run, 3),
        "chip_hours": round(chips * run / 3600, 6),
        "outcome": outcome,
    }
    if ref.rung:  # a capacity ladder's rung (kinetic_airflow.ladder): which one, and what it asked for
        capacity = ref.k8s.capacity if ref.k8s is not None else None
        usage.update(rung=ref.rung.get("rung"), rungs=ref.rung.get("of"), capacity=capacity or _model(spot))
    try:
        storage.write_text(JobLayout(ref.job_uri).usage, json.dumps(usage, sort_keys=True))
    except Exception as exc:  # a figure must never fail the task
        log.warning("could not record the usage of job %s: %s", ref.job_id, exc)
    return usage


def _model(spot: bool) -> str:
    return "spot" if spot else "on-demand"


def reused_usage(ref: JobRef, reused_job_id: str) -> dict[str, Any]:
    """The cost of a try that reused an earlier job's result (``cache=True``): nothing ran, so no
    chip-hours; the earlier job's own usage stays with the task instance that ran it."""
    identity = ref.job_identity
    now = time.time()
    return {
        "job_id": ref.job_id,
        "try_number": identity.try_number,
        "attempt": identity.attempt,
        "backend": ref.backend,
        "accelerator": ref.accelerator or "cpu",
        "device": "local CPU" if ref.backend == "local" else ref.accelerator or "cpu",
        "chips": 0,
        "spot": False,
        "submitted_at": None,
        "started_at": None,
        "finished_at": now,
        "queue_seconds": None,
        "run_seconds": 0.0,
        "chip_hours": 0.0,
        "outcome": "reused",
        "reused_job_id": reused_job_id,
    }


def totals(attempts: list[dict[str, Any]]) -> dict[str, Any]:
    """The sums of a task's attempts, as pushed to XCom."""
    return {
        "attempts": attempts,
        "chip_hours": round(sum(a.get("chip_hours") or 0 for a in attempts), 6),
        "queue_seconds": round(sum(a.get("queue_seconds") or 0 for a in attempts), 3),
        "run_seconds": round(sum(a.get("run_seconds") or 0 for a in attempts), 3),
        "preempted_attempts": sum(1 for a in attempts if a.get("outcome") == "preempted"),
    }


def emit_metrics(usage: dict[str, Any], dag_id: str, task_id: str) -> None:
    """Through Airflow's own metrics: StatsD, Datadog or OpenTelemetry, as configured."""
    try:
        # Airflow start-up cost: loaded when called, not when this module is imported.
        from airflow.sdk.observability.stats import Stats
    except ImportError:  # an Airflow without the task SDK's metrics
        return
    tags = {
        "dag_id": dag_id,
        "task_id": task_id,
        "accelerator": usage["accelerator"],
        "backend": usage.get("backend") or "",
        "spot": str(bool(usage["spot"])).lower(),
        "outcome": usage["outcome"],
    }
    try:
        Stats.incr("kinetic.chip_seconds", count=round(usage["chips"] * usage["run_seconds"]), tags=tags)
        Stats.timing("kinetic.run_time", timedelta(seconds=usage["run_seconds"]), tags=tags)
        if usage.get("queue_seconds") is not None:
            Stats.timing("kinetic.queue_wait", timedelta(seconds=usage["queue_seconds"]), tags=tags)
        Stats.incr("kinetic.attempts", tags=tags)
    except Exception as exc:
        log.warning("could not emit kinetic metrics: %s", exc)
