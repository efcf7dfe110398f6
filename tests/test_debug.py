"""``debug=True`` (issue 41): the job starts debugpy and waits; ``kinetic-airflow jobs debug`` connects
a debugger to it; a real Debug Adapter Protocol client (below: DAP over TCP, as VS Code speaks it)
attaches, stops at a breakpoint in the function, reads a local variable and continues; the task
then succeeds. On the local backend and on the cluster emulator (there through the API server's
``pods/portforward``). Also the parse-time checks and kinetic's Spot warning.

The job's environment has no debugpy (this venv does not install it): each job installs it
through the requirements path into the test's environment cache.
"""

from __future__ import annotations

import json
import socket
import sys
import warnings

import pytest
from helpers import ti_states, xcom
from ops_support import (
    cli,
    cli_polled_json,
    cli_process,
    cluster,
    gke_env,
    in_background,
    local_env,
    wait_for,
)

__all__ = ["cluster", "gke_env", "local_env"]  # fixtures


# A Debug Adapter Protocol client ---------------------------------------------------------------
class DapClient:
    """The messages VS Code sends to attach: ``Content-Length`` framed JSON over TCP."""

    def __init__(self, host: str, port: int, timeout: float = 120) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buffer = b""
        self.seq = 0
        self.pending: list[dict] = []  # messages read while waiting for another

    def send(self, command: str, **arguments) -> int:
        self.seq += 1
        body = json.dumps({"seq": self.seq, "type": "request", "command": command, "arguments": arguments})
        data = body.encode()
        self.sock.sendall(b"Content-Length: %d\r\n\r\n" % len(data) + data)
        return self.seq

    def _read(self) -> dict:
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        while len(self.buffer) < length:
            self._fill()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return json.loads(body)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the debug adapter closed the connection")
        self.buffer += chunk

    def wait(self, predicate) -> dict:
        for i, message in enumerate(self.pending):
            if predicate(message):
                return self.pending.pop(i)
        while True:
            message = self._read()
            if predicate(message):
                return message
            self.pending.append(message)

    def response(self, seq: int) -> dict:
        message = self.wait(lambda m: m.get("type") == "response" and m.get("request_seq") == seq)
        assert message["success"], message
        return message.get("body") or {}

    def event(self, name: str) -> dict:
        return self.wait(lambda m: m.get("type") == "event" and m.get("event") == name).get("body") or {}

    def request(self, command: str, **arguments) -> dict:
        return self.response(self.send(command, **arguments))

    def close(self) -> None:
        self.sock.close()


def debug_session(host: str, port: int, source: str, line: int, while_stopped=lambda: None) -> dict:
    """Attach, break at ``source``:``line``, read the frame's locals, run ``while_stopped``,
    continue; what was seen."""
    client = DapClient(host, port)
    try:
        client.request("initialize", clientID="kinetic-test", adapterID="debugpy", pathFormat="path",
                       linesStartAt1=True, columnsStartAt1=True)  # fmt: skip
        attach = client.send("attach", justMyCode=True)
        client.event("initialized")
        verified = client.request("setBreakpoints", source={"path": source}, breakpoints=[{"line": line}])
        client.request("configurationDone")
        client.response(attach)
        stopped = client.event("stopped")
        frames = client.request("stackTrace", threadId=stopped["threadId"])["stackFrames"]
        top = frames[0]
        scopes = client.request("scopes", frameId=top["id"])["scopes"]
        local_scope = next(s for s in scopes if s["name"].lower().startswith("local"))
        variables = client.request("variables", variablesReference=local_scope["variablesReference"])
        seen = {v["name"]: v["value"] for v in variables["variables"]}
        while_stopped()
        client.request("continue", threadId=stopped["threadId"])
        return {
            "breakpoints": verified["breakpoints"],
            "reason": stopped.get("reason"),
            "frame": {"name": top["name"], "line": top["line"], "path": top["source"]["path"]},
            "locals": seen,
        }
    finally:
        client.close()


# Attaching through `kinetic-airflow jobs debug` ---------------------------------------------------
@pytest.fixture
def env_cache(tmp_path_factory, monkeypatch):
    """One environment cache for the module's jobs: debugpy is installed into it once."""
    cache = tmp_path_factory.getbasetemp() / "debug-envs"
    monkeypatch.setenv("KINETIC_ENV_CACHE", str(cache))
    return cache


def _dag(dag_id: str):
    import kn_debug

    return kn_debug.DAGS[dag_id]


@pytest.mark.parametrize(
    ("backend", "base_uri"), [("local", "file"), ("gke", "gs"), ("pathways", "gs")], indirect=["base_uri"]
)
def test_a_debugger_attaches_stops_at_a_breakpoint_and_the_task_succeeds(
    backend, base_uri, env_cache, request, capsys
):
    """On pathways (a 4-host LeaderWorkerSet on the emulator) host 0 waits and is debugged; the
    other hosts run at once, saying so in their logs."""
    request.getfixturevalue("local_env" if backend == "local" else "gke_env")
    import kn_debug

    def developer():
        def waiting():
            rows = cli_polled_json("jobs", "list", "--dag-id", f"kn_debug_{backend}", "--state", "running")
            return rows[0] if rows else None

        job = wait_for(waiting, "the debug job to run", timeout=240)
        forward = cli_process("jobs", "debug", job["job_id"], "--json")
        try:
            line = forward.stdout.readline()
            assert line, forward.stderr.read()
            connection = json.loads(line)
            seen = debug_session(
                connection["host"],
                connection["port"],
                kn_debug.__file__,
                kn_debug.BREAK_LINE,
                while_stopped=lambda: _heartbeats_go_on(job["job_uri"]),
            )
            return job, connection, seen
        finally:
            if forward.poll() is None:
                forward.terminate()
            forward.communicate(timeout=30)

    thread, result = in_background(developer)
    dr = _dag(f"kn_debug_{backend}").test()
    thread.join(300)
    assert result, "the debugging thread did not finish"
    if isinstance(result[0], BaseException):
        raise result[0]
    job, connection, seen = result[0]

    assert ti_states(dr) == {"stepped": "success"}
    assert xcom(dr, "stepped") == 43
    # stopped where asked, in the job's process, and saw the function's local variable
    assert seen["breakpoints"][0]["verified"] is True
    assert seen["reason"] == "breakpoint"
    assert seen["frame"]["name"] == "stepped" and seen["frame"]["line"] == kn_debug.BREAK_LINE
    assert seen["locals"]["total"] == "42" and seen["locals"]["n"] == "6"
    # the VS Code configuration the command printed
    launch = connection["launch"]
    assert launch["type"] == "debugpy" and launch["request"] == "attach"
    assert launch["connect"] == {"host": connection["host"], "port": connection["port"]}
    assert {"localRoot": str(_dags_folder()), "remoteRoot": str(_dags_folder())} in launch["pathMappings"]
    if backend != "local":  # a forwarded local port, not the pod's own
        assert connection["pod"] and connection["port"] != connection["job_port"]
        assert connection["backend"] == backend
    else:
        assert connection["pod"] is None and connection["port"] == connection["job_port"]
    # where it listened is in the job's log, which the task log shows (dag.test() prints it)
    task_log = "".join(capsys.readouterr())  # what the task and its trigger logged, out and err
    assert f"[kinetic] debug=True: debugpy listens on 127.0.0.1:{connection['job_port']}" in task_log
    assert "a debugger attached; running the function" in task_log
    if backend == "pathways":  # the group is gone once its outcome is known: its pods' logs too
        assert connection["pod"].endswith("-0")  # the leader: host 0
        for host in (1, 2, 3):
            assert f"host {host} runs without a debugger (only host 0 waits for one)" in task_log
    else:
        code, logs, _ = cli("jobs", "logs", job["job_id"])
        assert code == 0 and f"debugpy listens on 127.0.0.1:{connection['job_port']}" in logs


def _heartbeats_go_on(job_uri: str) -> None:
    """While the function stands at a breakpoint the runner's heartbeat thread keeps beating
    (debugpy suspends traced threads; the runner's own are not traced), so the trigger does not
    take the job for a lost node."""
    from kinetic_airflow.job.layout import JobLayout
    from kinetic_airflow.job.storage import open_storage

    storage, uri = open_storage(job_uri), JobLayout(job_uri).status("heartbeat")

    def beat() -> int:
        return json.loads(storage.read_text_or_none(uri) or '{"beat": 0}')["beat"]

    first = beat()
    wait_for(lambda: beat() >= first + 2, "two heartbeats while the function stands at a breakpoint")


def _dags_folder():
    from pathlib import Path

    import kn_debug

    return Path(kn_debug.__file__).parent


@pytest.mark.parametrize("base_uri", ["file"], indirect=True)
def test_nobody_attaches_then_the_job_fails_or_runs_as_debug_on_timeout_says(base_uri, env_cache, local_env):
    failed = _dag("kn_debug_alone_fail").test()
    assert ti_states(failed) == {"alone": "failed"}
    ran = _dag("kn_debug_alone_run").test()
    assert ti_states(ran) == {"alone": "success"}
    assert xcom(ran, "alone") == "ran without a debugger"
    rows = {r["task_instance"].split("/")[0]: r for r in cli_polled_json("jobs", "list")}
    code, logs, _ = cli("jobs", "logs", rows["kn_debug_alone_fail"]["job_id"])
    assert "no debugger attached within 3s (debug_wait)" in logs
    assert "set debug_on_timeout='run'" in logs
    # `jobs debug` on a job that stopped waiting says so, and how to get another chance
    code, _, err = cli("jobs", "debug", rows["kn_debug_alone_fail"]["job_id"], "--wait", "5")
    assert code == 2 and "stopped waiting for a debugger" in err and "raise debug_wait" in err
    # and on one that ran to its end without a debugger, that it has ended
    code, _, err = cli("jobs", "debug", rows["kn_debug_alone_run"]["job_id"], "--wait", "5")
    assert code == 2 and "has ended (succeeded); its debugger stopped with it" in err


# Parse time --------------------------------------------------------------------------------------
def _parse(**options) -> None:
    """What a DAG file does: decorate a function with the options, call it inside a DAG."""
    from airflow.sdk import dag, task

    @dag(dag_id="kn_debug_parse", schedule=None)
    def kn_debug_parse():
        @task.kinetic(**options)
        def f() -> None:
            return None

        f()

    kn_debug_parse()


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"debug": "yes"}, ["debug='yes' is a string, not a bool", "write debug=True"]),
        ({"debug": 1}, ["is an int, not a bool", "write debug=True"]),
        ({"debug": True, "debug_wait": "10m"}, ["debug_wait=600 or debug_wait=timedelta(minutes=10)"]),
        ({"debug": True, "debug_wait": 0}, ["debug_wait=0 must be more than 0"]),
        ({"debug": True, "debug_on_timeout": "continue"}, ["is not one of fail, run"]),
        ({"debug_wait": 60}, ["debug_wait=60.0 given without debug=True", "; write debug=True"]),
        ({"debug": False, "debug_on_timeout": "run"}, ["debug_on_timeout='run' given without debug=True"]),
    ],
)
def test_debug_options_are_checked_at_parse_time(options, expected):
    from kinetic_airflow.options import KineticOptionError

    with pytest.raises(KineticOptionError) as caught:
        _parse(backend="local", **options)
    for words in expected:
        assert words in str(caught.value)


@pytest.mark.parametrize("options", [{"spot": True}, {"accelerator": "tpu-v5e-4:spot"}, {"capacity": "spot"}])
def test_debug_on_spot_warns_as_kinetic_does(options):
    from kinetic_airflow.job.debugging import DebugOnSpotWarning

    with pytest.warns(DebugOnSpotWarning, match="preempted while the job waits for your debugger"):
        _parse(backend="gke", debug=True, **options)


def test_debug_on_demand_does_not_warn_and_reaches_the_manifest_settings():
    from kinetic_airflow.operators import KineticRunOperator

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _parse(backend="gke", accelerator="tpu-v5e-4", debug=True)
    op = KineticRunOperator(task_id="t", python_callable=len, backend="local", debug=True, debug_wait=30)
    assert op.debug_settings == {"wait_seconds": 30.0, "on_timeout": "fail"}
    assert KineticRunOperator(task_id="u", python_callable=len, backend="local").debug_settings is None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
