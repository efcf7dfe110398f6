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
from array import array
from typing import Any

__all__ = [
    "MAX_ATTEMPT_POINTS",
    "MAX_CHUNK_POINTS",
    "MAX_CURVE_POINTS",
    "MAX_POINTS_PER_CHUNK",
    "MetricsWriter",
    "best_of",
    "chunk_weight",
    "higher_is_better",
    "read_attempt",
    "report",
]

FORMAT = 1
# What one chunk holds at most, whatever the function reports; the summary stays exact. These
# limits are also what a reader accepts: a chunk beyond them was not written by this writer.
MAX_POINTS_PER_CHUNK = 2000  # per metric
MAX_CHUNK_POINTS = 20_000  # over all metrics (many metrics: fewer points of each)
_MAX_METRICS = 200  # distinct names per job; later names are dropped, with one warning
_MAX_NAME = 100
_MAX_INT_STEP = 2**53  # a larger int step is stored as a float (its JSON stays short)
# The final chunk's points are carried by no later chunk: its write is tried this many times.
FINAL_FLUSH_TRIES = 3
# A chunk's JSON at those limits: points of two numbers (at most ~55 characters each), names
# twice (points and summary) and a summary entry of five numbers per metric. Readers read no
# more than this of a chunk, and parse none with more lists, objects or elements than such a
# chunk has (a forged 8 MiB chunk parsed to 1.4 M points: about 123 MB in an api-server).
_MAX_CHUNK_BYTES = MAX_CHUNK_POINTS * 56 + _MAX_METRICS * (2 * (6 * _MAX_NAME + 4) + 5 * 40) + 4096
_MAX_CHUNK_ITEMS = 3 * MAX_CHUNK_POINTS + 8 * _MAX_METRICS + 2 * _MAX_METRICS * _MAX_NAME + 64
# What a reader hands back for one attempt: each curve thinned to MAX_CURVE_POINTS, all of them
# together to MAX_ATTEMPT_POINTS (many metrics: fewer points each).
MAX_CURVE_POINTS = 5000
MAX_ATTEMPT_POINTS = 100_000
# Metric names for which a larger value is better (the rest: smaller is better, like a loss).
_HIGHER_IS_BETTER = ("acc", "auc", "precision", "recall", "f1", "score", "iou", "map", "reward", "r2")

_active: MetricsWriter | None = None
_NAN = float("nan")


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
        self._warned_too_many = False
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
        new_names = 0
        for step, metrics in taken:
            if step is None:
                last = last + 1
            elif type(step) is int and -_MAX_INT_STEP < step < _MAX_INT_STEP:
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
                    if name not in self.summary:
                        if len(self.summary) + new_names >= _MAX_METRICS:
                            self._too_many(name)
                            continue
                        new_names += 1
                    steps[name], values[name] = [], []
                steps[name].append(last)
                values[name].append(value)
        self.last_step = last
        series: dict[str, list[list[Any]]] = {}
        each = max(2, min(MAX_POINTS_PER_CHUNK, MAX_CHUNK_POINTS // max(1, len(values))))
        for name, vals in values.items():
            xs = steps[name]
            series[name] = [[xs[i], vals[i]] for i in _kept(len(xs), each)]
            finite = [v for v in vals if v is not None]
            entry = self.summary.setdefault(name, {"count": 0, "min": None, "max": None})
            entry["count"] += len(vals)
            entry["last"], entry["last_step"] = vals[-1], xs[-1]
            if finite:
                low, high = min(finite), max(finite)
                entry["min"] = low if entry["min"] is None else min(entry["min"], low)
                entry["max"] = high if entry["max"] is None else max(entry["max"], high)
        return series, sum(len(vals) for vals in values.values())

    def _too_many(self, name: str) -> None:
        if not self._warned_too_many:
            self._warned_too_many = True
            _warn(
                f"kinetic_airflow.report: more than {_MAX_METRICS} metric names in this job; "
                f"{name!r} and any later new name are dropped"
            )

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


def _within_writer_limits(data: bytes) -> bool:
    """Whether a chunk's JSON could hold no more lists, objects and elements than a chunk the
    writer makes: counted in the bytes (three C-speed scans), so a forged chunk of a million
    points is refused before it is parsed into a million Python lists."""
    return data.count(b"[") + data.count(b"{") + data.count(b",") <= _MAX_CHUNK_ITEMS


def _check_chunk(document: Any) -> tuple[dict[str, array], dict[str, Any]]:
    """The points and summary of one chunk, or nothing from a chunk the writer could not have
    written (a series longer than ``MAX_POINTS_PER_CHUNK``, more than ``MAX_CHUNK_POINTS`` in
    all). Points are kept compact: per metric one array of step, value, step, value... (a gap's
    value as NaN), 16 bytes a point where a list of two floats costs about 120; anything that is
    not the expected shape of plain numbers is left out."""
    points: dict[str, array] = {}
    summary: dict[str, Any] = {}
    if not isinstance(document, dict):
        return points, summary
    total = 0
    for name, series in (
        (document.get("points") or {}).items() if isinstance(document.get("points"), dict) else ()
    ):
        if not isinstance(name, str) or len(name) > _MAX_NAME or not isinstance(series, list):
            continue
        if len(points) >= _MAX_METRICS:
            break
        total += len(series)
        if len(series) > MAX_POINTS_PER_CHUNK or total > MAX_CHUNK_POINTS:
            return {}, {}  # more than the writer puts in a chunk: not one of its chunks
        kept = array("d")
        for point in series:
            if (
                isinstance(point, list)
                and len(point) >= 2
                and _valid_number(point[0])
                and point[0] is not None
                and _valid_number(point[1])
            ):
                kept.append(point[0])
                kept.append(_NAN if point[1] is None else point[1])
        points[name] = kept
    raw_summary = document.get("summary")
    if isinstance(raw_summary, dict):
        for name, entry in raw_summary.items():
            if len(summary) >= _MAX_METRICS:
                break
            if not isinstance(name, str) or len(name) > _MAX_NAME or not isinstance(entry, dict):
                continue
            fields = {k: entry.get(k) for k in ("last", "last_step", "min", "max", "count")}
            if all(_valid_number(v) for v in fields.values()):
                summary[name] = fields
    return points, summary


def chunk_weight(parsed: tuple[dict[str, array], dict[str, Any]]) -> int:
    """What a parsed chunk holds, in points (a summary entry counted as one): what a cache of
    chunks is sized by."""
    points, summary = parsed
    return sum(len(flat) // 2 for flat in points.values()) + len(summary) + 1


class _Curve:
    """One metric's points over an attempt's chunks, thinned as they come: every ``stride``-th
    point (by its place in the whole series) is kept, and the stride doubles whenever more than
    twice the curve's share are kept, so memory stays bounded however many chunks there are
    and the points kept stay evenly spaced. The last point is always kept."""

    __slots__ = ("count", "kept", "last", "stride")

    def __init__(self) -> None:
        self.kept = array("d")
        self.count = 0
        self.stride = 1
        self.last: tuple[float, float] | None = None

    def extend(self, flat: array, share: int) -> None:
        for i in range(0, len(flat), 2):
            if self.count % self.stride == 0:
                self.kept.append(flat[i])
                self.kept.append(flat[i + 1])
            self.count += 1
        if len(flat):
            self.last = (flat[-2], flat[-1])
        while len(self.kept) > 4 * share:
            self.stride *= 2
            self.kept = array("d", (v for j in range(0, len(self.kept), 4) for v in self.kept[j : j + 2]))

    def kept_count(self) -> int:
        return len(self.kept) // 2 + (1 if self._last_missing() else 0)

    def _last_missing(self) -> bool:
        return self.last is not None and (self.count - 1) % self.stride != 0

    def points(self, most: int) -> list[list[float | None]]:
        pairs = [(self.kept[i], self.kept[i + 1]) for i in range(0, len(self.kept), 2)]
        if self._last_missing():
            pairs.append(self.last)  # type: ignore[arg-type]
        chosen = (pairs[i] for i in _kept(len(pairs), most))
        return [[_plain(x), None if y != y else _plain(y)] for x, y in chosen]  # NaN: a gap


def _plain(value: float) -> float | int:
    """A step or value as it was reported: whole numbers as ints."""
    return int(value) if value.is_integer() and abs(value) < _MAX_INT_STEP else value


def _shares(curves: dict[str, _Curve]) -> dict[str, int]:
    """How many points each curve hands back: at most ``MAX_CURVE_POINTS``, and all of them
    together at most ``MAX_ATTEMPT_POINTS``; a short curve leaves its unused share to the rest."""
    shares: dict[str, int] = {}
    remaining = MAX_ATTEMPT_POINTS
    ordered = sorted(curves, key=lambda name: curves[name].kept_count())
    for i, name in enumerate(ordered):
        share = min(curves[name].kept_count(), MAX_CURVE_POINTS, remaining // (len(ordered) - i))
        shares[name] = share
        remaining -= share
    return shares


def read_attempt(
    storage: Any,
    layout: Any,
    host: int = 0,
    cache: dict[str, Any] | None = None,
    *,
    summary_only: bool = False,
) -> dict:
    """One attempt's metrics: ``{"points": {name: [[step, value], ...]}, "summary": {name: {...}}}``.

    Bounded whatever storage holds: a chunk is read only up to the largest the writer makes and
    parsed only if it has no more elements than such a chunk, at most ``_MAX_METRICS`` metrics
    are followed, and each curve is thinned while it is read (``_Curve``) and handed back with
    at most ``MAX_CURVE_POINTS`` points, ``MAX_ATTEMPT_POINTS`` in all.

    Chunks never change once written, so ``cache`` (uri -> parsed chunk) spares re-reading them.
    Every chunk carries the running summary, so ``summary_only`` reads the newest readable one
    alone (no points): what the final values need at a task's end."""
    summary: dict[str, Any] = {}
    curves: dict[str, _Curve] = {}
    try:
        listed = storage.list(layout.metrics_prefix)
        uris = [u for u in listed if u.rsplit("/", 1)[-1].startswith(f"h{host}-")]
    except Exception:
        return {"points": {}, "summary": summary}
    for uri in sorted(uris, reverse=summary_only):
        parsed = cache.get(uri) if cache is not None else None
        if parsed is None:
            try:
                data = storage.read_at_most(uri, _MAX_CHUNK_BYTES)
                if data is None or not _within_writer_limits(data):
                    continue  # larger than any chunk the writer makes: not ours, and not parsed
                parsed = _check_chunk(json.loads(data))
            except Exception:
                continue
            if cache is not None:
                cache[uri] = parsed
        chunk_points, chunk_summary = parsed
        if summary_only:
            if chunk_summary:
                return {"points": {}, "summary": chunk_summary}
            continue
        for name, flat in chunk_points.items():
            curve = curves.get(name)
            if curve is None:
                if len(curves) >= _MAX_METRICS:
                    continue
                curve = curves[name] = _Curve()
            curve.extend(flat, MAX_CURVE_POINTS)
        summary = chunk_summary or summary  # the latest chunk's running summary
    shares = _shares(curves)
    points = {name: curve.points(shares[name]) for name, curve in curves.items()}
    return {"points": points, "summary": summary}
