"""``kinetic-airflow jobs list|logs|result|cancel|show`` on the local backend and on the cluster
emulator, after real dag.test() runs (file:// and fake-GCS job storage)."""

from __future__ import annotations

import json

import pytest
from helpers import backend_and_storage, on_storage, ti_states, xcom
from ops_support import (
    cli,
    cli_json,
    cli_polled,
    cli_polled_json,
    cli_process,
    cli_run,
    cli_run_json,
    cluster,
    gke_env,
    in_background,
    job_of,
    k8s,
    local_env,
    wait_for,
)

__all__ = ["cluster", "gke_env", "local_env"]  # fixtures


def _dag(dag_id: str):
    import kn_ops

    return kn_ops.DAGS[dag_id]


@pytest.fixture(params=["local", "gke"])
def backend(request):
    """Each test once on the local backend and once on the emulator."""
    if request.param == "gke":
        request.getfixturevalue("gke_env")
    else:
        request.getfixturevalue("local_env")
    return request.param


@backend_and_storage
def test_list_logs_result_show(backend, base_uri):
    dr = _dag(f"kn_ops_{backend}").test()
    assert ti_states(dr) == {"greet": "success", "diverges": "failed", "big": "success"}
    run = dr.run_id

    rows = {r["task_instance"].rsplit("/", 1)[-1]: r for r in cli_json("jobs", "list", "--run-id", run)}
    assert set(rows) == {"greet", "diverges", "big"}
    greet = rows["greet"]
    assert greet["job_id"] == xcom(dr, "greet")["job"]
    assert greet["state"] == "succeeded" and rows["diverges"]["state"] == "failed"
    assert greet["backend"] == backend and greet["accelerator"] == "cpu"
    assert greet["try"] == 1 and greet["attempt"] == 1
    assert greet["task_instance"] == f"kn_ops_{backend}/{run}/greet"
    assert greet["job_uri"] == f"{base_uri}/jobs/{greet['job_id']}"

    # filters, and the table a person reads
    assert [r["job_id"] for r in cli_json("jobs", "list", "--run-id", run, "--state", "failed")] == [
        rows["diverges"]["job_id"]
    ]
    assert [r["job_id"] for r in cli_json("jobs", "list", "--run-id", run, "--task-id", "big")] == [
        rows["big"]["job_id"]
    ]
    assert cli_json("jobs", "list", "--dag-id", "no-such-dag") == []
    code, table, _ = cli("jobs", "list", "--run-id", run)
    assert code == 0
    header, *lines = table.splitlines()
    assert header.split() == ["JOB", "ID", "TASK", "INSTANCE", "TRY", "ATTEMPT", "BACKEND", "ACCELERATOR",
                              "STATE", "AGE"]  # fmt: skip
    assert any(line.startswith(greet["job_id"]) and " succeeded " in line for line in lines)

    # logs
    code, out, _ = cli("jobs", "logs", greet["job_id"])
    assert code == 0 and "hello ops line 0" in out and "hello ops line 2" in out
    # the job's terminal control sequences are shown, not obeyed, unless --raw
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]0;a job set this title\\x07\\x1b[2Jscreen cleared" in out
    code, out, _ = cli("jobs", "logs", greet["job_id"], "--raw")
    assert code == 0 and "\x1b]0;a job set this title\x07\x1b[2Jscreen cleared" in out
    code, out, _ = cli("jobs", "logs", rows["diverges"]["job_id"])
    assert "training..." in out and "ValueError: bad learning rate: -1.0" in out

    # result: the summary, and --load
    code, out, _ = cli("jobs", "result", greet["job_id"])
    assert code == 0 and "value_type: builtins.dict" in out and "'greeting': 'hello ops'" in out
    code, out, _ = cli("jobs", "result", greet["job_id"], "--load")
    assert code == 0 and json.loads(out.replace("'", '"'))["greeting"] == "hello ops"
    code, out, _ = cli("jobs", "result", rows["diverges"]["job_id"], "--json")
    summary = json.loads(out)[0]
    assert code == 1  # the exit code says the job failed
    assert summary["ok"] is False and summary["error_type"] == "builtins.ValueError"
    assert summary["phase"] == "execute" and "bad learning rate: -1.0" in summary["traceback"]
    code, out, _ = cli("jobs", "result", rows["diverges"]["job_id"], "--load")
    assert code == 1 and "ValueError('bad learning rate: -1.0')" in out and "remote traceback" in out
    code, out, _ = cli("jobs", "result", rows["big"]["job_id"], "--load")
    assert code == 0 and out.strip() == repr(b"x" * 1000)

    # show: everything, and how to reproduce it
    code, out, _ = cli("jobs", "show", greet["job_id"])
    assert code == 0
    assert f"job_uri: {greet['job_uri']}" in out and "state: succeeded" in out
    # what the attempt used, from its usage.json (a CPU job holds no accelerator chips)
    assert "usage:" in out and "  chips: 0" in out and "  outcome: success" in out
    assert f"kinetic-airflow reproduce {greet['job_uri']}" in out
    assert "-m kinetic_airflow.runner --job-uri file://" in out
    if backend == "gke":
        assert f"kubernetes_object: kinetic-{greet['job_id']}" in out and "namespace: default" in out
    details = cli_json("jobs", "show", greet["job_uri"])[0]  # a job URI works as well as an id
    assert details["job_id"] == greet["job_id"] and details["callable"] == "greet"


def _running_job(dag_id: str, state: str = "running") -> dict:
    def found():
        rows = cli_polled_json("jobs", "list", "--dag-id", dag_id, "--state", state)
        return rows[0] if rows else None

    return wait_for(found, f"a {state} job of {dag_id}")


def _first_line(job_id: str) -> None:
    wait_for(lambda: "started waiting" in cli_polled("jobs", "logs", job_id)[1], "the job's first log line")


@backend_and_storage
def test_cancel_a_running_job_and_follow_its_log(backend, base_uri, tmp_path, monkeypatch):
    flag = tmp_path / "flag"
    monkeypatch.setenv("KN_OPS_FLAG", str(flag))
    dag_id = f"kn_ops_wait_{backend}"

    def operator_at_the_terminal():
        try:
            job = _running_job(dag_id)
            _first_line(job["job_id"])
            follower = cli_process("jobs", "logs", job["job_id"], "--follow")
            first = ""
            while "started waiting" not in first:  # the follower is following: now stop the job
                line = follower.stdout.readline()
                assert line, "the follower ended before the job's first line"
                first += line
            cancelled = cli_run("jobs", "cancel", job["job_id"], "--reason", "testing cancel")
            rest, _ = follower.communicate(timeout=90)
            followed = first + rest
            return job, cancelled, follower.returncode, followed
        finally:
            flag.write_text("done")  # never leave the job waiting if something above failed

    thread, result = in_background(operator_at_the_terminal)
    dr = _dag(dag_id).test()
    thread.join(180)
    job, (code, out, err), follow_code, followed = result[0]
    assert code == 0, err
    assert f"cancelled job {job['job_id']}" in out
    assert ti_states(dr) == {"waits": "failed"}
    message = (tmp_path / "failures" / "waits.txt").read_text()
    assert f"cancelled by kinetic-airflow jobs cancel ({_me()})" in message and "testing cancel" in message
    assert job_of("waits", dag_id=dag_id, run_id=dr.run_id)["state"] == "cancelled"
    assert follow_code == 0 and "started waiting" in followed and "done waiting" not in followed
    # cancelling an ended job does nothing, and says so
    code, out, _ = cli("jobs", "cancel", job["job_id"])
    assert code == 0 and "already ended (cancelled)" in out


def _me() -> str:
    import getpass
    import socket

    return f"{getpass.getuser()}@{socket.gethostname()}"


@on_storage("file")  # the marker is written as any status file is (both storages: above)
def test_a_cancel_from_the_cli_names_the_user_and_the_host(local_env, base_uri, tmp_path):
    """The cancelled marker (what the task's error, the view and ``jobs show`` quote) says who."""
    import sys
    import time

    from jobkit import key_of, make_job

    from kinetic_airflow.backends.local import LocalBackend
    from kinetic_airflow.job.layout import JobIdentity
    from kinetic_airflow.job.ref import JobRef
    from kinetic_airflow.job.storage import open_storage
    from kinetic_airflow.submission import publish_job

    identity = JobIdentity("d", "r", "sleeps")
    layout = make_job(base_uri, time.sleep, (600,), job_id=identity.job_id)
    ref = JobRef(
        backend="local",
        job_id=identity.job_id,
        job_uri=layout.job_uri,
        python=sys.executable,
        identity=identity,
        local_dir=str(tmp_path / "state"),
    )
    storage = open_storage(base_uri)
    publish_job(storage, ref, "sleep")
    backend = LocalBackend()
    backend.submit(ref, job_key=key_of(ref.job_uri))
    try:
        code, out, err = cli("jobs", "cancel", identity.job_id, "--reason", "wrong data")
        assert code == 0 and f"cancelled job {identity.job_id}" in out, err
        marker = json.loads(storage.read_text(f"{layout.job_uri}/status/cancelled.json"))
        assert marker["by"] == f"kinetic-airflow jobs cancel ({_me()})" and marker["reason"] == "wrong data"
        assert "someone" not in marker["by"]
    finally:
        backend.cancel(ref)


@backend_and_storage
def test_follow_until_the_job_ends(backend, base_uri, tmp_path, monkeypatch):
    flag = tmp_path / "flag"
    monkeypatch.setenv("KN_OPS_FLAG", str(flag))
    dag_id = f"kn_ops_wait_{backend}"

    def follow():
        try:
            job = _running_job(dag_id)
            follower = cli_process("jobs", "logs", job["job_id"], "--follow")
            _first_line(job["job_id"])
            flag.write_text("go")
            out, err = follower.communicate(timeout=90)
            return follower.returncode, out, err
        finally:
            flag.write_text("go")

    thread, result = in_background(follow)
    dr = _dag(dag_id).test()
    thread.join(180)
    code, out, err = result[0]
    assert code == 0, err
    assert "started waiting" in out and "done waiting" in out
    assert ti_states(dr) == {"waits": "success"}


def test_unknown_job_and_bad_base_uri_are_clear(local_env, base_uri):
    code, _, err = cli("jobs", "logs", "no-such-job")
    assert code == 2
    assert "no job no-such-job in " + base_uri + "/jobs" in err and "--base-uri" in err
    code, _, err = cli("jobs", "list", "--base-uri", "s3://bucket/x")
    assert code == 2 and "unsupported storage URI 's3://bucket/x'" in err


@on_storage("gs")  # the state is the cluster's
def test_cluster_state_is_read_from_the_cluster(gke_env, base_uri, tmp_path, monkeypatch):
    """A job whose pod cannot be scheduled yet is 'pending' (read off the cluster), then 'running'."""
    emulator, _, _ = gke_env
    flag = tmp_path / "flag"
    monkeypatch.setenv("KN_OPS_FLAG", str(flag))
    emulator.delay_scheduling(20)

    def watch():
        try:
            pending = _running_job("kn_ops_wait_gke", "pending")
            emulator.clear_faults()
            running = _running_job("kn_ops_wait_gke", "running")
            return pending, running
        finally:
            flag.write_text("go")

    thread, result = in_background(watch)
    dr = _dag("kn_ops_wait_gke").test()
    thread.join(180)
    pending, running = result[0]
    assert pending["job_id"] == running["job_id"]
    batch, _ = k8s(emulator)
    job = batch.read_namespaced_job(f"kinetic-{pending['job_id']}", "default")
    assert job.metadata.labels["job-id"] == pending["job_id"]
    assert ti_states(dr) == {"waits": "success"}


@on_storage("gs")
def test_a_multi_host_job_every_host_s_log(gke_env, base_uri, tmp_path, monkeypatch):
    """backend=pathways: listed with its accelerator; its log is every host's, [hN]-prefixed."""
    flag = tmp_path / "flag"
    monkeypatch.setenv("KN_OPS_FLAG", str(flag))

    def look():
        try:
            job = _running_job("kn_ops_wait_pathways")

            def all_hosts():
                out = cli_polled("jobs", "logs", job["job_id"])[1]
                return out if all(f"[h{h}] started waiting" in out for h in range(4)) else None

            logs = wait_for(all_hosts, "every host's first line")
            return job, logs, cli_run_json("jobs", "show", job["job_id"])[0]
        finally:
            flag.write_text("go")

    thread, result = in_background(look)
    dr = _dag("kn_ops_wait_pathways").test()
    thread.join(240)
    job, logs, shown = result[0]
    assert ti_states(dr) == {"waits": "success"}
    assert job["backend"] == "pathways" and job["accelerator"] == "tpu-v6e-4x4"  # tpu-v6e-16, canonical
    assert shown["kubernetes_object"] == f"keras-pathways-{job['job_id']}"
    assert all(f"[h{h}] started waiting" in logs for h in range(4))
