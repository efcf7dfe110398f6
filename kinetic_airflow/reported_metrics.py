"""The metrics a job reported (``kinetic_airflow.report``), as Airflow sees them.

One task instance's try may run several attempts (a preemption makes a new job): their points
form one curve, each point tagged with its attempt. When the try succeeds the worker publishes
the final values (the last value of each metric, from the newest attempt that reported it):

* XCom ``kinetic_metrics``: ``{"loss": 0.12, "accuracy": 0.97}`` for a downstream ``pick_best``;
* Airflow's metrics (StatsD / OpenTelemetry) as gauges ``kinetic.metric.<name>`` tagged like
  the chip-hours figures (``kinetic_airflow.usage``);
* the ``extra`` of the Asset events of the task's ``outlets``: ``{"kinetic_metrics": {...},
  "kinetic_best": {...}}``, so a DAG scheduled on the model's Asset sees what produced it.

Everything read here is plain JSON, checked number by number (``job.metrics.read_attempt``).
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from typing import Any

from kinetic_airflow.job.layout import JobLayout
from kinetic_airflow.job.metrics import best_of, chunk_weight, read_attempt
from kinetic_airflow.job.ref import JobRef

__all__ = ["METRICS_XCOM_KEY", "combine", "publish", "read_attempts"]

log = logging.getLogger(__name__)

METRICS_XCOM_KEY = "kinetic_metrics"
# Parsed metrics chunks, shared by every request of this process (a chunk never changes once
# written), sized by what they hold rather than by how many there are: a chunk holds from one
# point to ``job.metrics.MAX_CHUNK_POINTS`` (16 bytes each, compact), so a count of chunks would
# bound nothing. The least recently used go first.
_CHUNKS: OrderedDict[str, tuple[Any, int]] = OrderedDict()
_CHUNKS_LOCK = threading.Lock()
_CHUNKS_POINTS = 2_000_000  # about 32 MB of points, at most
_chunks_held = 0


class _ChunkCache:
    """A bounded view of the process-wide chunk cache with the dict methods read_attempt uses."""

    def get(self, uri: str) -> Any:
        with _CHUNKS_LOCK:
            found = _CHUNKS.get(uri)
            if found is None:
                return None
            _CHUNKS.move_to_end(uri)
            return found[0]

    def __setitem__(self, uri: str, value: Any) -> None:
        global _chunks_held
        weight = chunk_weight(value)
        with _CHUNKS_LOCK:
            earlier = _CHUNKS.pop(uri, None)
            if earlier is not None:
                _chunks_held -= earlier[1]
            _CHUNKS[uri] = (value, weight)
            _chunks_held += weight
            while _chunks_held > _CHUNKS_POINTS and _CHUNKS:
                _chunks_held -= _CHUNKS.popitem(last=False)[1][1]


def read_attempts(
    jobs: list[dict[str, Any]], storage_of: Any, *, summary_only: bool = False
) -> list[dict[str, Any]]:
    """``[{"job_id", "attempt", "try_number", "points", "summary"}]`` for ``jobs`` (entries with a
    ``job_uri``), in order; ``storage_of(uri)`` opens a job's storage. ``summary_only``: no
    points, one chunk read per attempt (``job.metrics.read_attempt``)."""
    out = []
    for job in jobs:
        uri = job.get("job_uri")
        if not uri:
            continue
        try:
            read = read_attempt(
                storage_of(uri),
                JobLayout(uri),
                cache=_ChunkCache(),  # type: ignore[arg-type]
                summary_only=summary_only,
            )
        except Exception as exc:  # metrics are a view: never a reason to fail
            log.warning("could not read the metrics of job %s: %s", job.get("job_id"), exc)
            read = {"points": {}, "summary": {}}
        out.append(
            {
                "job_id": job.get("job_id"),
                "attempt": job.get("attempt") or 1,
                "try_number": job.get("try_number"),
                **read,
            }
        )
    return out


def combine(attempts: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """``{"final": {name: value}, "best": {name: value}, "steps": {name: last step}}`` over attempts
    (oldest first): final from the newest attempt that reported the metric, best over all."""
    final: dict[str, float | None] = {}
    best: dict[str, float | None] = {}
    steps: dict[str, float | None] = {}
    for attempt in attempts:
        for name, summary in attempt["summary"].items():
            final[name] = summary.get("last")
            steps[name] = summary.get("last_step")
            candidate = best_of(name, summary)
            if candidate is None:
                continue
            earlier = best.get(name)
            if earlier is None:
                best[name] = candidate
            else:
                both = {"min": min(earlier, candidate), "max": max(earlier, candidate)}
                best[name] = best_of(name, both)
    return {"final": final, "best": best, "steps": steps}


def _stat_name(name: str) -> str:
    return "kinetic.metric." + (re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:100] or "_")


def gauge_tags(ti: Any, job: JobRef) -> dict[str, str]:
    """The gauges' tags for a task instance's job; a sweep's members are series of their own."""
    tags = {
        "dag_id": ti.dag_id,
        "task_id": ti.task_id,
        "accelerator": job.accelerator or "cpu",
        "backend": job.backend or "",
    }
    map_index = getattr(ti, "map_index", -1)
    if map_index is not None and map_index >= 0:
        tags["map_index"] = str(map_index)
    return tags


def _tag_value(value: str) -> str:
    """A tag value every metrics backend takes: Datadog's and InfluxDB's line formats split on
    ``,`` ``|`` ``#`` ``:`` ``=`` and spaces, so a metric named ``val:acc`` must not cut its line."""
    return re.sub(r"[^A-Za-z0-9_.\-/]+", "_", value)[:200] or "_"


def _gauges(final: dict[str, float | None], tags: dict[str, str]) -> None:
    try:
        # Airflow start-up cost: loaded when called, not when this module is imported.
        from airflow.sdk.observability.stats import Stats
    except ImportError:
        return
    try:
        for name, value in final.items():
            if value is not None:
                clean = {key: _tag_value(str(tag)) for key, tag in {**tags, "metric": name}.items()}
                Stats.gauge(_stat_name(name), value, tags=clean)
    except Exception as exc:
        log.warning("could not emit the job's metrics as gauges: %s", exc)


def _asset_extras(context: Any, outlets: list[Any], extra: dict[str, Any]) -> int:
    """Put ``extra`` into the outlet events of the task's Assets (not aliases: their events are
    added by the task itself, with ``add``). Returns how many were given it."""
    try:
        # Airflow start-up cost: loaded when called, not when this module is imported.
        from airflow.sdk import Asset
    except ImportError:
        return 0
    events = context.get("outlet_events")
    if events is None:
        return 0
    done = 0
    for outlet in outlets or []:
        if isinstance(outlet, Asset):
            events[outlet].extra.update(extra)
            done += 1
    return done


def publish(
    context: Any,
    outlets: list[Any],
    attempts: list[dict[str, Any]],
    tags: dict[str, str],
) -> dict[str, dict[str, float | None]]:
    """XCom, gauges and Asset-event extra for a successful try; returns what it published."""
    combined = combine(attempts)
    final = combined["final"]
    if not final:
        return combined
    context["ti"].xcom_push(key=METRICS_XCOM_KEY, value=final)
    _gauges(final, tags)
    shown = ", ".join(f"{k}={v:.6g}" if v is not None else f"{k}=nan" for k, v in sorted(final.items()))
    assets = _asset_extras(context, outlets, {"kinetic_metrics": final, "kinetic_best": combined["best"]})
    log.info(
        "[kinetic] final metrics: %s (XCom %r%s)",
        shown,
        METRICS_XCOM_KEY,
        f"; the extra of {assets} Asset event(s)" if assets else "",
    )
    return combined
