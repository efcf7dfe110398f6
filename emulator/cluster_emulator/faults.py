"""Fault injection state and the request log.

Faults are armed from the test thread (or over ``/_emulator`` HTTP) and read
by the server loop, so everything here is guarded by a lock.
"""

from __future__ import annotations

import fnmatch
import re
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field


def _image_matches(pattern: str | re.Pattern[str], image: str) -> bool:
    if isinstance(pattern, re.Pattern):
        return bool(pattern.search(image))
    return pattern == image or fnmatch.fnmatchcase(image, pattern)


@dataclass(frozen=True)
class RequestRecord:
    """One API request the emulator served (admin ``/_emulator`` calls are not recorded)."""

    seq: int
    method: str
    path: str
    query: str
    time: float
    status: int | None = None
    watch: bool = False

    def to_dict(self) -> dict[str, object]:
        """JSON form used by ``GET /_emulator/requests``."""
        return {
            "seq": self.seq,
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "time": self.time,
            "status": self.status,
            "watch": self.watch,
        }


class RequestLog:
    """Thread-safe record of API requests, so benchmarks can count calls per scenario."""

    def __init__(self, max_records: int = 200_000) -> None:
        self._lock = threading.Lock()
        # Bounded so a long-running emulator does not grow without limit; ``count`` is exact.
        self._records: deque[RequestRecord] = deque(maxlen=max_records)
        self._seq = 0

    def add(self, method: str, path: str, query: str, *, watch: bool = False) -> int:
        """Record a request; returns its sequence number (1-based, never reused)."""
        with self._lock:
            self._seq += 1
            self._records.append(RequestRecord(self._seq, method, path, query, time.time(), None, watch))
            return self._seq

    def set_status(self, seq: int, status: int) -> None:
        """Attach the HTTP status once the response is known."""
        with self._lock:
            for i in range(len(self._records) - 1, -1, -1):
                rec = self._records[i]
                if rec.seq == seq:
                    self._records[i] = RequestRecord(
                        rec.seq, rec.method, rec.path, rec.query, rec.time, status, rec.watch
                    )
                    return
                if rec.seq < seq:
                    return

    @property
    def count(self) -> int:
        """Requests served since start (not reset by :meth:`clear`)."""
        with self._lock:
            return self._seq

    @property
    def records(self) -> list[RequestRecord]:
        """Snapshot of the recorded requests (those since the last :meth:`clear`)."""
        with self._lock:
            return list(self._records)

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter(self.records)

    def since(self, seq: int) -> list[RequestRecord]:
        """Records with a sequence number greater than ``seq``."""
        with self._lock:
            return [r for r in self._records if r.seq > seq]

    def filter(self, method: str | None = None, path_regex: str | None = None) -> list[RequestRecord]:
        """Records matching an HTTP method and/or a regex searched in the path."""
        pattern = re.compile(path_regex) if path_regex else None
        return [
            r
            for r in self.records
            if (method is None or r.method.upper() == method.upper())
            and (pattern is None or pattern.search(r.path))
        ]

    def clear(self) -> None:
        """Forget recorded requests (the :attr:`count` keeps counting)."""
        with self._lock:
            self._records.clear()


@dataclass
class ApiFault:
    """Answer matching requests with an error status, ``remaining`` times (None = forever)."""

    method: str
    path_regex: re.Pattern[str]
    status: int
    remaining: int | None
    retry_after: float | None = None
    message: str | None = None

    def matches(self, method: str, path: str) -> bool:
        """Whether this fault applies to the request."""
        return (self.method == "*" or self.method.upper() == method.upper()) and bool(
            self.path_regex.search(path)
        )


@dataclass
class WatchDropRule:
    """Close watch streams abruptly after ``after_events`` events; ``streams`` limits how many."""

    after_events: int
    streams: int | None


@dataclass
class FaultState:
    """Everything the emulator can be told to break."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    api_faults: list[ApiFault] = field(default_factory=list)
    image_pull_patterns: list[str | re.Pattern[str]] = field(default_factory=list)
    scale_up_until: float = 0.0  # time.monotonic() deadline
    scale_up_seconds: float = 0.0
    watch_drop: WatchDropRule | None = None
    # Transient pull failures: [pattern, pulls still to fail] (a registry hiccup, then success).
    image_pull_transient: list[list[object]] = field(default_factory=list)
    # (verb, resource plural or None for every resource) the client's identity may not use.
    denied_verbs: list[tuple[str, str | None]] = field(default_factory=list)
    # Seconds between a container's exit (its output closed: a followed log ends) and its pod
    # status saying so. 0 by default, for fast tests; on a real node a second or more: the
    # kubelet's generic PLEG notices an exit when it relists containers, once a second
    # (kubernetes pkg/kubelet/kubelet.go, genericPlegRelistPeriod), and the Job controller syncs a
    # Job after its pod's update with a batch delay of one second (pkg/controller/job/
    # job_controller.go, syncJobBatchPeriod, enqueueSyncJobBatched).
    exit_report_delay: float = 0.0

    def take_api_fault(self, method: str, path: str) -> ApiFault | None:
        """Consume one matching API fault (decrementing its count)."""
        with self.lock:
            for fault in self.api_faults:
                if fault.matches(method, path):
                    if fault.remaining is not None:
                        fault.remaining -= 1
                        if fault.remaining <= 0:
                            self.api_faults.remove(fault)
                    return fault
        return None

    def image_pull_fails(self, image: str) -> bool:
        """Whether this pull of ``image`` fails (exact name, glob or compiled regex).

        Each call is one pull attempt: a transient rule (``fail_image_pulls(..., times=N)``)
        is used up by its N failing pulls, after which the image pulls.
        """
        with self.lock:
            patterns = list(self.image_pull_patterns)
            for rule in self.image_pull_transient:
                pattern, remaining = rule
                if int(remaining) > 0 and _image_matches(pattern, image):  # type: ignore[arg-type]
                    rule[1] = int(remaining) - 1  # type: ignore[call-overload]
                    return True
        return any(_image_matches(pattern, image) for pattern in patterns)

    def verb_denied(self, verb: str, plural: str) -> bool:
        """Whether RBAC (as armed by ``deny_verb``) forbids ``verb`` on ``plural``."""
        with self.lock:
            return any(v == verb and r in (None, plural) for v, r in self.denied_verbs)

    def scheduling_delay_remaining(self) -> float:
        """Seconds until pretend node scale-up completes (0 when not delaying)."""
        return max(0.0, self.scale_up_until - time.monotonic())

    def claim_watch_drop(self) -> int | None:
        """For a watch stream starting now: after how many events it must be dropped (None = never)."""
        with self.lock:
            rule = self.watch_drop
            if rule is None:
                return None
            if rule.streams is not None:
                rule.streams -= 1
                if rule.streams <= 0:
                    self.watch_drop = None
            return rule.after_events

    def clear(self) -> None:
        """Disarm every fault."""
        with self.lock:
            self.api_faults.clear()
            self.image_pull_patterns.clear()
            self.scale_up_until = 0.0
            self.scale_up_seconds = 0.0
            self.watch_drop = None
            self.image_pull_transient.clear()
            self.denied_verbs.clear()
            self.exit_report_delay = 0.0
