"""Large objects read in parallel byte ranges, digested in order as they arrive.

One stream from GCS is bounded by one connection and by the client library's
per-chunk Python work, and a download followed by a separate SHA-256 pass over
the file reads every byte twice. Here a few threads fetch ranges while the
calling thread writes them to the file and feeds them to SHA-256 in order, so
the digest is ready when the last range lands. At most ``workers + 1`` ranges
are held in memory, whatever the object's size.

Standard library only: the runner uses it inside the job.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import BinaryIO

__all__ = ["RANGE_BYTES", "WORKERS", "ObjectChangedError", "download_in_ranges"]

# 32 MiB ranges, four at a time: a 256 MiB object is 8 requests, and the ranges in flight stay
# well under half of it (the bench's peak-memory target is 1.5x the object).
RANGE_BYTES = 32 * 1024 * 1024
WORKERS = 4

Fetch = Callable[[int, int], bytes]  # (start, end exclusive) -> exactly those bytes


class ObjectChangedError(RuntimeError):
    """The object changed while it was read: a range came back short, or its version is gone."""


def download_in_ranges(
    fetch: Fetch,
    fh: BinaryIO,
    *,
    first: bytes,
    size: int,
    range_bytes: int = RANGE_BYTES,
    workers: int = WORKERS,
) -> str:
    """Write ``first`` and then bytes ``len(first)..size`` of the object to ``fh``; return its SHA-256.

    ``first`` is the object's head, already read (the request that found out the object is large).
    """
    digest = hashlib.sha256(first)
    fh.write(first)
    starts = iter(range(len(first), size, range_bytes))
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kinetic-range")
    pending: deque[tuple[int, int, Future[bytes]]] = deque()

    def submit_next() -> None:
        start = next(starts, None)
        if start is not None:
            end = min(start + range_bytes, size)
            pending.append((start, end, pool.submit(fetch, start, end)))

    try:
        for _ in range(workers + 1):
            submit_next()
        while pending:
            start, end, future = pending.popleft()
            data = future.result()
            if len(data) != end - start:
                raise ObjectChangedError(
                    f"bytes {start}-{end - 1} came back as {len(data)} bytes: the object changed "
                    "or was cut while it was read"
                )
            submit_next()
            digest.update(data)
            fh.write(data)
            del data
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return digest.hexdigest()
