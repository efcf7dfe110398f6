"""Metrics reported from inside a job: ``kinetic_airflow.report(step=..., **metrics)``.

Runs in the job (stdlib only, no Airflow). ``report`` appends one tuple to a buffer and
returns; a background thread (``MetricsWriter``) takes what the buffer holds once per
interval and writes it as ONE new object ``metrics/h{host}-{seq}.json`` (``JobLayout``), so a
job makes at most one metrics write per interval whatever its report rate, plus one final
flush when the function returns. Each chunk carries the running summary (last, min, max and
count of every metric since the attempt started), so the final and best values are exact even
when a chunk's points are thinned to ``MAX_POINTS_PER_CHUNK`` per metric for the charts.

Reporting never slows or fails the function: a value that is not a number is dropped (one
warning per metric name), a storage error drops that chunk's points with one warning (the
summary in the next chunk still counts them), and outside a job ``report`` does nothing. A
multi-host job reports from host 0 only, unless ``KINETIC_METRICS_ALL_HOSTS=1``: then every host
stores its own chunks (``h{host}-``), which the readers here leave alone: Airflow's side (XCom,
StatsD, Asset events, the view) shows host 0's, the host whose result is the task's.

The reading side (``read_attempt``) is used by Airflow (XCom, StatsD, Asset events, the UI):
chunks are plain JSON, checked number by number, never unpickled.
"""

from __future__ import annotations

import collections
import json
import math
import os
import sys
import threading
import time
from typing import Any

__all__ = [
    "MAX_POINTS_PER_CHUNK",
    "MetricsWriter",
    "best_of",
    "higher_is_better",
    "read_attempt",
    "report",
]

FORMAT = 1
MAX_POINTS_PER_CHUNK = 2000  # per metric; the summary stays exact
# The final chunk's points are carried by no later chunk: its write is tried this many times.
FINAL_FLUSH_TRIES = 3
_MAX_NAME = 100
# What a reader takes from storage, which a bucket writer can forge and a long job makes large:
# a chunk the writer could never write is skipped, and each curve handed back is thinned.
_MAX_CHUNK_BYTES = 8 * 1024 * 1024
_MAX_METRICS = 200
MAX_CURVE_POINTS = 5000
# Metric names for which a larger value is better (the rest: smaller is better, like a loss).
_HIGHER_IS_BETTER = ("acc", "auc", "precision", "recall", "f1", "score", "iou", "map", "reward", "r2")

_active: MetricsWriter | None = None


def report(step: float | None = None, **metrics: Any) -> None:
    """Record ``metrics`` (plain numbers) at ``step`` (default: the previous step + 1).

    Cheap: one append to the runner's buffer. Nothing is written here; the runner's writer
    thread stores the buffer at most once per ``[kinetic] metrics_interval``. Outside a kinetic
    job (a local call of the function, a unit test) it does nothing.
    """
    writer = _active
    if writer is not None:
        writer.buffer.append((step, metrics))


def higher_is_better(name: str) -> bool:
    lowered = name.lower()
    return "loss" not in lowered and "error" not in lowered and any(k in lowered for k in _HIGHER_IS_BETTER)


def best_of(name: str, summary: dict[str, Any]) -> float | None:
    """The best value of a metric from its summary (max for accuracy-like names, else min)."""
    return summary.get("max") if higher_is_better(name) else summary.get("min")


def _warn(message: str) -> None:
    print(f"[kinetic] warning: {message}", file=sys.stderr, flush=True)


def _number(value: Any) -> float | bool | None:
    """A finite float, None for NaN/inf (a diverged loss: a gap in the chart), False: not a number."""
    if isinstance(value, (bool, str, bytes)):  # float("1.5") would pass a string for a number
        return False
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        try:  # numpy / jax scalars, one-element arrays
            number = float(value)
        except Exception:
            return False
    return number if math.isfinite(number) else None


class MetricsWriter(threading.Thread):
    """The runner's buffer and its flusher: one storage write per interval at most."""

    def __init__(self, storage: Any, layout: Any, host: int = 0, interval: float = 5.0) -> None:
        super().__init__(name="kinetic-metrics", daemon=True)
        self.storage, self.layout, self.host = storage, layout, host
        self.interval = max(float(interval), 0.05)
        self.buffer: collections.deque[tuple[Any, dict[str, Any]]] = collections.deque()
        self.stop_event = threading.Event()
        # One flusher at a time without a lock: the thread flushes until close() stops it, then
        # close() makes the final flush only once the thread has ended (a lock held across a
        # storage write would let a hung storage hang the job's end as well).
        self.seq = 0
        self.writes = 0
        self.dropped = 0
        self.last_step: float = 0
        self.summary: dict[str, dict[str, Any]] = {}
        self._warned_storage = False
        self._warned_names: set[str] = set()

    # Lifecycle ------------------------------------------------------------------------------
    def activate(self) -> MetricsWriter:
        global _active
        _active = self
        self.start()
        return self

    def close(self) -> None:
        """Stop the thread and write what is left (the function has returned)."""
        global _active
        if _active is self:
            _active = None
        self.stop_event.set()
        if self.is_alive():
            self.join(timeout=self.interval + 5)
        if self.is_alive():  # stuck in a storage write: the job's result matters more
            _warn(
                f"metrics storage at {self.layout.metrics_prefix} did not answer; the points of the "
                "last interval are dropped"
            )
            return
        self.flush(tries=FINAL_FLUSH_TRIES)

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            self.flush()

    # One flush ------------------------------------------------------------------------------
    def _take(self) -> list[tuple[Any, dict[str, Any]]]:
        taken = []
        pop = self.buffer.popleft
        for _ in range(len(self.buffer)):  # what is there now; later appends wait for the next flush
            taken.append(pop())
        return taken

    def _points(self, taken: list[tuple[Any, dict[str, Any]]]) -> tuple[dict[str, list[list[Any]]], int]:
        """({metric: [[step, value], ...]} thinned for the charts, how many values were taken);
        values checked, summary updated.

        The writer thread's whole cost per point: kept to plain loops and builtins (a float,
        the common case, skips the general check), the summary taken per metric with min/max.
        """
        steps: dict[str, list[Any]] = {}
        values: dict[str, list[Any]] = {}
        last = self.last_step
        isfinite = math.isfinite
        for step, metrics in taken:
            if step is None:
                last = last + 1
            elif type(step) is int:
                last = step
            else:
                number = _number(step)
                last = last + 1 if number is None or number is False else number
            for name, raw in metrics.items():
                if type(raw) is float:
                    value = raw if isfinite(raw) else None
                else:
                    value = _number(raw)
                    if value is False:
                        self._bad_value(name, raw)
                        continue
                if name not in values:
                    if len(name) > _MAX_NAME:
                        self._bad_value(name, raw)
                        continue
                    steps[name], values[name] = [], []
                steps[name].append(last)
                values[name].append(value)
        self.last_step = last
        series: dict[str, list[list[Any]]] = {}
        for name, vals in values.items():
            xs = steps[name]
            series[name] = [[xs[i], vals[i]] for i in _kept(len(xs))]
            finite = [v for v in vals if v is not None]
            entry = self.summary.setdefault(name, {"count": 0, "min": None, "max": None})
            entry["count"] += len(vals)
            entry["last"], entry["last_step"] = vals[-1], xs[-1]
            if finite:
                low, high = min(finite), max(finite)
                entry["min"] = low if entry["min"] is None else min(entry["min"], low)
                entry["max"] = high if entry["max"] is None else max(entry["max"], high)
        return series, sum(len(vals) for vals in values.values())

    def _bad_value(self, name: str, raw: Any) -> None:
        if name not in self._warned_names:
            self._warned_names.add(name)
            _warn(f"kinetic_airflow.report: {name}={raw!r} is not a plain number; dropped")

    def flush(self, tries: int = 1) -> None:
        """Store the points taken since the last flush as one chunk. An interval's flush tries
        once (the next interval carries the summary on); the final one, whose points no later
        chunk would carry, tries ``tries`` times, a second apart at most."""
        taken = self._take()
        if not taken:
            return
        series, count = self._points(taken)
        self.seq += 1
        document = {
            "format": FORMAT,
            "host": self.host,
            "seq": self.seq,
            "time": time.time(),
            "points": series,
            "summary": self.summary,
            "dropped": self.dropped,
        }
        text = json.dumps(document, allow_nan=False)
        for attempt in range(1, tries + 1):
            try:
                self.writes += 1
                self.storage.write_text(self.layout.metrics_chunk(self.seq, self.host), text)
                return
            except Exception as exc:  # reporting must never fail the function
                if attempt < tries:
                    time.sleep(min(1.0, 0.25 * attempt))
                    continue
                self._dropped_on(exc, count)

    def _dropped_on(self, exc: Exception, count: int) -> None:
        self.dropped += count
        if not self._warned_storage:
            self._warned_storage = True
            _warn(
                f"could not write metrics to {self.layout.metrics_prefix} ({exc}); their points "
                "are dropped (the final and best values still count them). Further failures "
                "are not logged."
            )


def _kept(count: int, most: int = MAX_POINTS_PER_CHUNK) -> range | list[int]:
    """Which of ``count`` points to keep: all, or ``most`` evenly spaced with the last one always
    kept (the charts need no more; the summary counts every point)."""
    if count <= most:
        return range(count)
    stride = count / (most - 1)
    return [*(int(i * stride) for i in range(most - 1)), count - 1]


def flush_on_termination() -> None:
    """Write the points not yet stored, when the job is told to stop (SIGTERM: a preemption or a
    cancel). Bounded as at the job's end: a storage that does not answer drops the interval
    rather than spend the pod's grace period."""
    writer = _active
    if writer is not None:
        writer.close()


def start_for_job(storage: Any, layout: Any, host: int, interval: float) -> MetricsWriter | None:
    """The runner's writer for this host (host 0 only unless KINETIC_METRICS_ALL_HOSTS=1)."""
    if host != 0 and os.environ.get("KINETIC_METRICS_ALL_HOSTS", "") not in ("1", "true", "True"):
        return None
    return MetricsWriter(storage, layout, host, interval).activate()


# Reading (Airflow side: XCom, StatsD, Asset events, the UI) --------------------------------------
def _valid_number(value: Any) -> bool:
    return value is None or (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    )


def _check_chunk(document: Any) -> tuple[dict[str, list[list[float | None]]], dict[str, Any]]:
    """The points ``{name: [[step, value], ...]}`` and summary of one chunk; anything that is not
    the expected shape of plain numbers is left out."""
    points: dict[str, list[list[float | None]]] = {}
    summary: dict[str, Any] = {}
    if not isinstance(document, dict):
        return points, summary
    for name, series in (
        (document.get("points") or {}).items() if isinstance(document.get("points"), dict) else ()
    ):
        if not isinstance(name, str) or len(name) > _MAX_NAME or not isinstance(series, list):
            continue
        if len(points) >= _MAX_METRICS:
            break
        kept = []
        for point in series:
            if (
                isinstance(point, list)
                and len(point) >= 2
                and _valid_number(point[0])
                and point[0] is not None
                and _valid_number(point[1])
            ):
                kept.append([point[0], point[1]])
        points[name] = kept
    raw_summary = document.get("summary")
    if isinstance(raw_summary, dict):
        for name, entry in raw_summary.items():
            if not isinstance(name, str) or len(name) > _MAX_NAME or not isinstance(entry, dict):
                continue
            fields = {k: entry.get(k) for k in ("last", "last_step", "min", "max", "count")}
            if all(_valid_number(v) for v in fields.values()):
                summary[name] = fields
    return points, summary


def read_attempt(
    storage: Any,
    layout: Any,
    host: int = 0,
    cache: dict[str, Any] | None = None,
    *,
    summary_only: bool = False,
) -> dict:
    """One attempt's metrics: ``{"points": {name: [[step, value], ...]}, "summary": {name: {...}}}``.

    Chunks never change once written, so ``cache`` (uri -> parsed chunk) spares re-reading them.
    Every chunk carries the running summary, so ``summary_only`` reads the newest readable one
    alone (no points): what the final values need at a task's end."""
    points: dict[str, list[list[float | None]]] = {}
    summary: dict[str, Any] = {}
    try:
        listed = storage.list(layout.metrics_prefix)
        uris = [u for u in listed if u.rsplit("/", 1)[-1].startswith(f"h{host}-")]
    except Exception:
        return {"points": points, "summary": summary}
    for uri in sorted(uris, reverse=summary_only):
        parsed = cache.get(uri) if cache is not None else None
        if parsed is None:
            try:
                data = storage.read_at_most(uri, _MAX_CHUNK_BYTES)
                if data is None:
                    continue  # larger than any chunk the writer makes: not ours, and not read
                parsed = _check_chunk(json.loads(data))
            except Exception:
                continue
            if cache is not None:
                cache[uri] = parsed
        chunk_points, chunk_summary = parsed
        if summary_only:
            if chunk_summary:
                return {"points": points, "summary": chunk_summary}
            continue
        for name, series in chunk_points.items():
            points.setdefault(name, []).extend(series)
        summary = chunk_summary or summary  # the latest chunk's running summary
    for name, series in points.items():
        if len(series) > MAX_CURVE_POINTS:
            points[name] = [series[i] for i in _kept(len(series), MAX_CURVE_POINTS)]
    return {"points": points, "summary": summary}
