"""Polling helper for tests: wait for a condition without asserting on durations."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str | Callable[[], str] = "condition",
) -> T:
    """Call ``predicate`` until it returns a truthy value (returned) or ``timeout`` passes (TimeoutError).

    Exceptions raised by ``predicate`` count as "not yet" until the deadline,
    then the last one is chained to the TimeoutError so failures stay readable.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last_exc = None
        except Exception as exc:
            last_exc = exc
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {text}") from last_exc
        time.sleep(interval)
