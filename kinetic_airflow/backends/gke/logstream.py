"""Follow one pod's log as a task of the caller's event loop: no thread per pod.

A triggerer watching 500 jobs must not hold 500 threads blocked in socket reads.
Each followed pod is one ``follow=true&timestamps=true`` request read with aiohttp
inside the triggerer's event loop. What a real API server and network do to such a
stream, and what this does about it:

* a reconnect resumes by time (``sinceTime``, which the API server passes on in whole
  seconds), skipping lines at or before the last one received, so no line is lost or
  repeated: the kubelet serves a new request only the current rotated log file, so
  resuming by line count would skip new lines after a rotation;
* a stream silent for ``IDLE_RECONNECT_SECONDS`` is re-opened (a half-open connection
  behind a NAT that forgot it never ends by itself), and TCP keepalive is on;
* an end of stream while the container still runs (a proxy's or the API server's own
  timeout) is a reconnect, not the end of the log;
* only lines the watcher has not consumed are held (``read_from`` / ``release``), so a
  job printing for ten hours costs no memory in the triggerer.

Each request goes the way the client's own requests go (``transport.ApiServer``): through its
proxy (``HTTPS_PROXY`` / ``HTTP_PROXY`` unless ``NO_PROXY`` names the server, a kubeconfig's
``proxy-url``, the hook's configured proxy) with its ``Proxy-Authorization``, and with its TLS
settings, ``tls_server_name`` included.

Errors of any kind are retried with a growing pause (400/404: the container has not
started, or the pod is gone; the rest are transient); a stream that makes no progress
for ``GIVE_UP_SECONDS`` is abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable

import aiohttp  # imported with the backend, in a worker thread: never first on the event loop

from kinetic_airflow.backends.gke.client import ApiError, KubeApi

__all__ = ["PodLogStream"]

log = logging.getLogger(__name__)

GIVE_UP_SECONDS = 600.0
# A stream that brings nothing for this long is re-opened: on a half-open connection nothing
# would ever arrive again. A quiet job costs one request per interval; nothing is repeated.
IDLE_RECONNECT_SECONDS = 120.0


def _target(api: KubeApi, path: str) -> tuple[str, dict[str, str], ssl.SSLContext | bool]:
    """URL, headers (a fresh bearer token: GKE's are short-lived) and TLS settings of the client."""
    server = api.server
    return server.url(path), server.headers(accept="text/plain"), server.ssl_context()


def _keepalive(response: aiohttp.ClientResponse) -> None:
    """TCP keepalive on the stream's socket: a dead peer is noticed, and a NAT keeps the mapping."""
    connection = response.connection
    sock = connection.transport.get_extra_info("socket") if connection and connection.transport else None
    if sock is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 60)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 15)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 4)


def _split_timestamp(raw: bytes) -> tuple[str, str]:
    """(RFC 3339 timestamp, text) of a ``timestamps=true`` log line."""
    text = raw.decode("utf-8", "replace")
    stamp, sep, rest = text.partition(" ")
    return (stamp, rest) if sep and stamp[:1].isdigit() and "T" in stamp else ("", text)


def _whole_second(stamp: str) -> str:
    """``2026-12-01T10:00:01.123456789Z`` -> ``2026-12-01T10:00:01Z`` (what sinceTime can say)."""
    return stamp.split(".", 1)[0].rstrip("Z") + "Z"


class PodLogStream:
    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        pod: str,
        container: str,
        *,
        previous: bool = False,
        still_running: Callable[[], bool] | None = None,
    ) -> None:
        """``previous``: read the log of the container's last run (an LWS host whose runner ended
        and was restarted in place) instead of following the current one. ``still_running``
        says (from memory: the shared watch) whether the container still runs, which tells an
        early end of the stream from the end of the log."""
        self.api, self.namespace, self.pod, self.container = api, namespace, pod, container
        self.previous = previous
        self.still_running = still_running
        self.received = 0  # lines received so far (absolute line numbers start at 0)
        self._held: deque[str] = deque()  # lines [received - len(_held), received)
        self._floor = 0  # lines below this number are consumed: never held
        self.done = asyncio.Event()
        self.ended = False  # a stream reached the end of the log (not an error) at least once
        # Set when lines arrive or the stream ends: what wakes a watcher instead of a timer.
        self.listeners: set[asyncio.Event] = set()
        self._task: asyncio.Task[None] | None = None
        self._last_stamp = ""  # timestamp of the last line received
        self._at_last_stamp: list[str] = []  # the lines received with that timestamp
        self._resume_stamp = ""  # what the current connection resumed from ("" on the first)
        self._replay: list[str] = []  # lines at _resume_stamp it will send again

    def read_from(self, offset: int) -> list[str]:
        """Lines from absolute line ``offset`` on that are still held (none below the floor)."""
        first = self.received - len(self._held)
        start = max(0, offset - first)
        return list(itertools.islice(self._held, start, None))

    def release(self, upto: int) -> None:
        """Lines below ``upto`` are consumed: drop them, and never hold them if they come later."""
        self._floor = max(self._floor, upto)
        first = self.received - len(self._held)
        for _ in range(min(len(self._held), self._floor - first)):
            self._held.popleft()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"kinetic-log-{self.pod}")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _wake(self) -> None:
        for listener in self.listeners:
            listener.set()

    def _accept(self, raw: bytes) -> bool:
        """Keep one received line unless a reconnect delivered it again; True if it is new."""
        stamp, text = _split_timestamp(raw)
        if stamp and self._resume_stamp:  # a reconnect re-sends the whole second it resumes in
            if stamp < self._resume_stamp:
                return False
            if stamp == self._resume_stamp and text in self._replay:
                self._replay.remove(text)
                return False
        if stamp and stamp != self._last_stamp:
            self._last_stamp, self._at_last_stamp = stamp, []
        if stamp:
            self._at_last_stamp.append(text)
        if self.received >= self._floor:
            self._held.append(text)
        self.received += 1
        return True

    def _path(self) -> str:
        """The request of a (re)connect; from the last line's second on once lines were received."""
        which = "previous=true" if self.previous else "follow=true"
        path = f"{KubeApi.pods_path(self.namespace, self.pod)}/log?{which}&timestamps=true"
        path += f"&container={self.container}"
        self._resume_stamp, self._replay = self._last_stamp, list(self._at_last_stamp)
        if self._last_stamp:
            path += f"&sinceTime={_whole_second(self._last_stamp)}"
        return path

    async def _run(self) -> None:
        pause, last_progress = 0.5, time.monotonic()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=IDLE_RECONNECT_SECONDS)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                while time.monotonic() - last_progress < GIVE_UP_SECONDS:
                    try:
                        url, headers, tls = await asyncio.to_thread(_target, self.api, self._path())
                        server = self.api.server
                        async with session.get(
                            url,
                            headers=headers,
                            ssl=tls,
                            proxy=server.proxy,
                            proxy_headers=server.proxy_headers,
                            server_hostname=server.tls_server_name if tls is not False else None,
                        ) as response:
                            if response.status >= 300:
                                body = await response.text()
                                raise ApiError(response.status, response.reason or "", body)
                            _keepalive(response)
                            buffer = b""
                            async for chunk in response.content.iter_any():
                                *complete, buffer = (buffer + chunk).split(b"\n")
                                new = sum(1 for raw in complete if self._accept(raw))
                                if new:
                                    pause, last_progress = 0.5, time.monotonic()
                                    self._wake()
                            if buffer:
                                self._accept(buffer)
                        # The kubelet ends a followed log when the container's output has closed:
                        # usually its process has exited, a moment before the pod's status says so.
                        self.ended = True
                        self._wake()
                        if self.previous or self.still_running is None or not self.still_running():
                            return
                        # The stream ended while the container runs: a timeout on the way, not the
                        # end of the log. Resume from the last line's time.
                        log.info("log stream of pod %s ended early; resuming", self.pod)
                    except (ApiError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                        if isinstance(exc, ApiError) and exc.rbac_denied:
                            # RBAC: no reconnect mends a Role without get on pods/log; the message
                            # names the grant (ApiError), once, where the task log shows it. Any
                            # other 403 (a kubelet's, relayed) is retried like other errors.
                            log.warning("cannot follow the log of pod %s: %s", self.pod, exc)
                            return
                        if not (isinstance(exc, ApiError) and exc.status in (400, 404)):
                            log.info(
                                "log stream of pod %s: %s; reconnecting", self.pod, exc or type(exc).__name__
                            )
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, 10.0)
                log.warning("giving up following the log of pod %s: no progress", self.pod)
        finally:
            self.done.set()
            self._wake()
