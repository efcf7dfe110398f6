"""A download stream copied to a file and digested in the same pass, on two threads.

Measured against fake-gcs-server (256 MiB, this 2-core machine): google-cloud-storage's
``download_as_bytes`` reads 0.41 s in one stream and 0.82 s in four parallel ranges (its
8 KiB-chunk loop in Python contends for the GIL), the HTTP response read with ``readinto``
in 8 MiB pieces 0.32 s whether in one stream or four; SHA-256 takes another 0.18 s. So
one stream is read in large pieces into two alternating buffers, and while one is being
filled a second thread digests and writes the other: the digest costs no time of its own,
and memory stays at two pieces whatever the object's size.

Standard library only: the runner uses it inside the job.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import BinaryIO

__all__ = ["PIECE_BYTES", "copy_hashed"]

PIECE_BYTES = 8 * 1024 * 1024

ReadInto = Callable[[memoryview], int]  # fills a prefix of the view; 0 at the end of the stream


def _fill(read_into: ReadInto, buffer: bytearray) -> int:
    """Read until ``buffer`` is full or the stream ends; the number of bytes read."""
    view = memoryview(buffer)
    filled = 0
    while filled < len(buffer):
        got = read_into(view[filled:])
        if not got:
            break
        filled += got
    return filled


def copy_hashed(read_into: ReadInto, fh: BinaryIO, *, piece_bytes: int = PIECE_BYTES) -> tuple[str, int]:
    """Copy the stream to ``fh``; returns its SHA-256 and its length."""
    digest = hashlib.sha256()
    buffers = (bytearray(piece_bytes), bytearray(piece_bytes))

    def consume(buffer: bytearray, length: int) -> None:
        view = memoryview(buffer)[:length]
        digest.update(view)
        fh.write(view)

    total = 0
    pending: Future[None] | None = None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kinetic-digest") as pool:
        index = 0
        while True:
            buffer = buffers[index % 2]  # the other one may still be being consumed
            length = _fill(read_into, buffer)
            if pending is not None:
                pending.result()
            if not length:
                break
            total += length
            pending = pool.submit(consume, buffer, length)
            index += 1
    return digest.hexdigest(), total
