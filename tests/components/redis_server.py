"""A private, throwaway Redis server: the Celery broker of the real-components tier.

``RedisServer`` never touches a machine-wide Redis (port 6379, ``/var/lib/redis``): it
runs Debian's ``redis-server`` in the foreground on a free 127.0.0.1 port with a temp
dir of its own as working dir, no persistence (no RDB snapshots, no AOF: the broker's
queues are thrown away with the test), and ``stop()`` ends it and removes the dir.

Usage::

    with RedisServer() as redis:
        redis.url  # redis://127.0.0.1:PORT/0
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from components.airflow_services import free_port

__all__ = ["RedisError", "RedisServer", "find_redis_server"]


class RedisError(RuntimeError):
    """The server is missing, did not come up, or would not stop (message carries the log tail)."""


def find_redis_server() -> str:
    """Path of ``redis-server``, or an error that says how to install it."""
    path = shutil.which("redis-server") or next(
        (p for p in ("/usr/bin/redis-server", "/usr/sbin/redis-server") if Path(p).is_file()), None
    )
    if path is None:
        raise RedisError(
            "redis-server is not installed: the CeleryExecutor tests need Debian's redis-server as "
            "their broker. Run `bash scripts/debian-install.sh Redis redis-server` as root "
            "(scripts/setup.sh does it when it runs as root)."
        )
    return path


class RedisServer:
    """One redis-server process on 127.0.0.1, started by :meth:`start`, ended by :meth:`stop`."""

    def __init__(self) -> None:
        self.port = 0
        self.dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        assert self.dir is not None
        return self.dir / "redis.log"

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except (OSError, AssertionError) as exc:
            return f"<no redis log: {exc}>"

    def start(self, timeout: float = 30.0, tries: int = 3) -> RedisServer:
        """Start on a free port; a port taken between the probe and redis' bind (another test's
        server, in another xdist process) is tried again on a new one."""
        binary = find_redis_server()
        self.dir = Path(tempfile.mkdtemp(prefix="kn-redis-"))
        while True:
            try:
                return self._start_once(binary, timeout)
            except RedisError:
                tries -= 1
                if tries == 0 or "Address already in use" not in self.log_tail():
                    self.stop()
                    raise
                self.log_path.unlink(missing_ok=True)

    def _start_once(self, binary: str, timeout: float) -> RedisServer:
        self.port = free_port()
        command = [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--logfile", str(self.log_path),
            "--save", "",  # no RDB snapshots
            "--appendonly", "no",
            "--daemonize", "no",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self.proc.poll() is not None:
                raise RedisError(f"redis-server exited with code {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() >= deadline:
                raise RedisError(f"redis-server did not answer PING in {timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.05)
        return self

    def ping(self) -> bool:
        """True when the server answers ``PING`` (a bare RESP inline command: no client library)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(Exception):
            self.stop()
