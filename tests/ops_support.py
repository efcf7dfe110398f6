"""Shared pieces of the operations tests: the emulator environment and running the CLI."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from components.emulator_process import DEFAULT_NODE_POOLS
from emulated_cluster import point_kinetic_at, running_emulator

NODE_POOLS = list(DEFAULT_NODE_POOLS)


def cli(*argv: str) -> tuple[int, str, str]:
    """Run ``kinetic-airflow`` in this process: (exit code, stdout, stderr)."""
    from kinetic_airflow.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def cli_json(*argv: str) -> Any:
    code, out, err = cli(*argv, "--json")
    assert code == 0, err
    return json.loads(out)


class _Routed:
    """Stands in for ``sys.stdout``/``sys.stderr`` while background threads run commands in this
    process (``cli_polled``): such a thread writes into its own buffer, every other thread (the
    test's ``dag.test()`` in the main one) into the stream this one replaced."""

    def __init__(self, name: str, fallback: Any) -> None:
        self.name = name
        self.fallback = fallback

    def _target(self) -> Any:
        buffers = getattr(_thread_output, "buffers", None)
        return buffers[self.name] if buffers else self.fallback

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def isatty(self) -> bool:
        return self._target().isatty()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._target(), attr)


_thread_output = threading.local()
_routing_lock = threading.Lock()
_routing_users = 0


def cli_polled(*argv: str) -> tuple[int, str, str]:
    """``kinetic-airflow`` in this process, from any thread: (exit code, stdout, stderr).

    For what a background thread asks again and again while the test's DAG runs (is the job
    running yet, has it logged its first line): the same ``main`` a person's process runs, without
    starting Python and importing Airflow each time (~4 s a question on this machine, most of a
    poll). ``cli`` swaps ``sys.stdout`` for the whole process, which would take the main thread's
    output too; this routes each thread's writes to its own buffers instead."""
    global _routing_users
    from kinetic_airflow.cli.main import main

    with _routing_lock:
        if _routing_users == 0:
            sys.stdout, sys.stderr = _Routed("out", sys.stdout), _Routed("err", sys.stderr)
        _routing_users += 1
    out, err = io.StringIO(), io.StringIO()
    _thread_output.buffers = {"out": out, "err": err}
    try:
        code = main(list(argv))
    finally:
        _thread_output.buffers = None
        with _routing_lock:
            _routing_users -= 1
            if _routing_users == 0:
                for name in ("stdout", "stderr"):
                    stream = getattr(sys, name)
                    if isinstance(stream, _Routed):  # unless someone swapped it since
                        setattr(sys, name, stream.fallback)
    return code, out.getvalue(), err.getvalue()


def cli_polled_json(*argv: str) -> Any:
    code, out, err = cli_polled(*argv, "--json")
    assert code == 0, err
    return json.loads(out)


def cli_run(*argv: str, timeout: float = 120) -> tuple[int, str, str]:
    """``kinetic-airflow`` as its own process, to completion: for threads (stdout is per process)."""
    proc = subprocess.run(
        [sys.executable, "-m", "kinetic_airflow.cli", *argv],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=timeout,
    )
    return proc.returncode, proc.stdout, proc.stderr


def cli_run_json(*argv: str) -> Any:
    code, out, err = cli_run(*argv, "--json")
    assert code == 0, err
    return json.loads(out)


def cli_process(*argv: str, **kwargs: Any) -> subprocess.Popen[str]:
    """``kinetic-airflow`` as its own process (what a person runs)."""
    return subprocess.Popen(
        [sys.executable, "-m", "kinetic_airflow.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
        **kwargs,
    )


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def in_background(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    results: list[Any] = []

    def run() -> None:
        try:
            results.append(fn())
        except BaseException as exc:
            results.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, results


def job_of(task_id: str, **filters: str) -> dict[str, Any]:
    args = ["jobs", "list", "--task-id", task_id]
    for key, value in filters.items():
        args += [f"--{key.replace('_', '-')}", value]
    rows = cli_json(*args)
    assert len(rows) == 1, rows
    return rows[0]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_emulator(tmp_path_factory, NODE_POOLS) as running:
        yield running


@pytest.fixture
def gke_env(cluster, monkeypatch, tmp_path):
    """The emulator as the cluster of every kinetic job (a Kubernetes connection), as in the README."""
    emulator, kubeconfig = cluster
    point_kinetic_at(emulator, kubeconfig, monkeypatch)
    out = tmp_path / "failures"
    out.mkdir()
    monkeypatch.setenv("KN_TEST_FAILURES", str(out))
    return emulator, kubeconfig, out


@pytest.fixture
def local_env(monkeypatch, tmp_path):
    out = tmp_path / "failures"
    out.mkdir()
    monkeypatch.setenv("KN_TEST_FAILURES", str(out))
    return out


def k8s(emulator: Any) -> tuple[Any, Any]:
    import kubernetes

    client = emulator.api_client()
    return kubernetes.client.BatchV1Api(client), kubernetes.client.CoreV1Api(client)
