"""Follow one pod's log as a task of the caller's event loop: no thread per pod.

A triggerer watching 500 jobs must not hold 500 threads blocked in socket reads.
Each followed pod is one ``follow=true`` request read with aiohttp inside the
triggerer's event loop; lines are kept in memory for the watcher, which counts
its cursor in lines. Errors of any kind are retried with a growing pause
(400/404: the container has not started, or the pod is gone; the rest are
transient), skipping lines already received; a stream that makes no progress
for ``GIVE_UP_SECONDS`` is abandoned.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import Any

import aiohttp  # imported with the backend, in a worker thread: never first on the event loop

from kinetic_airflow.backends.gke.client import ApiError, KubeApi

__all__ = ["PodLogStream"]

log = logging.getLogger(__name__)

GIVE_UP_SECONDS = 600.0


def _ssl_context(configuration: Any) -> ssl.SSLContext | bool:
    if not configuration.host.startswith("https"):
        return False
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _target(api: KubeApi, path: str) -> tuple[str, dict[str, str], ssl.SSLContext | bool]:
    """URL, headers (a fresh bearer token: GKE's are short-lived) and TLS settings of the client."""
    configuration = api.api_client.configuration
    headers = {"Accept": "text/plain"}
    for setting in configuration.auth_settings().values():  # may refresh the token (blocking)
        if setting.get("in") == "header" and setting.get("value"):
            headers[setting["key"]] = setting["value"]
    return configuration.host.rstrip("/") + path, headers, _ssl_context(configuration)


class PodLogStream:
    def __init__(
        self, api: KubeApi, namespace: str, pod: str, container: str, *, previous: bool = False
    ) -> None:
        """``previous``: read the log of the container's last run (an LWS host whose runner ended
        and was restarted in place) instead of following the current one."""
        self.api, self.namespace, self.pod, self.container = api, namespace, pod, container
        self.previous = previous
        self.lines: list[str] = []
        self.done = asyncio.Event()
        # Set when lines arrive or the stream ends: what wakes a watcher instead of a timer.
        self.listeners: set[asyncio.Event] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"kinetic-log-{self.pod}")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _wake(self) -> None:
        for listener in self.listeners:
            listener.set()

    async def _run(self) -> None:
        which = "previous=true" if self.previous else "follow=true"
        path = f"{KubeApi.pods_path(self.namespace, self.pod)}/log?{which}&container={self.container}"
        received, pause, last_progress = 0, 0.5, time.monotonic()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                while time.monotonic() - last_progress < GIVE_UP_SECONDS:
                    try:
                        url, headers, tls = await asyncio.to_thread(_target, self.api, path)
                        async with session.get(url, headers=headers, ssl=tls) as response:
                            if response.status >= 300:
                                body = await response.text()
                                raise ApiError(response.status, response.reason or "", body)
                            seen, buffer = 0, b""
                            async for chunk in response.content.iter_any():
                                *complete, buffer = (buffer + chunk).split(b"\n")
                                for raw in complete:
                                    seen += 1
                                    if seen > received:
                                        self.lines.append(raw.decode("utf-8", "replace"))
                                        received, pause, last_progress = seen, 0.5, time.monotonic()
                                if complete:
                                    self._wake()
                            if buffer and seen + 1 > received:
                                self.lines.append(buffer.decode("utf-8", "replace"))
                            return
                    except (ApiError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                        if not (isinstance(exc, ApiError) and exc.status in (400, 404)):
                            log.info("log stream of pod %s: %s; reconnecting", self.pod, exc)
                        await asyncio.sleep(pause)
                        pause = min(pause * 2, 10.0)
                log.warning("giving up following the log of pod %s: no progress", self.pod)
        finally:
            self.done.set()
            self._wake()
