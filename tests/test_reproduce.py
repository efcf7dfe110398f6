"""``kinetic-airflow reproduce JOB [--pdb]``: a stored job run again here with the same runner,
reproducing a failed job's exception, printing the command ``jobs show`` also prints, and never
touching the original job's files (local backend and cluster emulator; file:// and fake GCS)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import backend_and_storage, on_storage, ti_states
from ops_support import cli, cli_json, cli_run, cluster, gke_env, local_env

from kinetic_airflow.job.storage import open_storage

__all__ = ["cluster", "gke_env", "local_env"]  # fixtures


@pytest.fixture(params=["local", "gke"])
def backend(request):
    request.getfixturevalue("gke_env" if request.param == "gke" else "local_env")
    return request.param


def _jobs(backend: str) -> dict[str, dict]:
    import kn_ops

    dr = kn_ops.DAGS[f"kn_ops_{backend}"].test()
    assert ti_states(dr) == {"greet": "success", "diverges": "failed", "big": "success"}
    return {r["task_instance"].rsplit("/", 1)[-1]: r for r in cli_json("jobs", "list", "--run-id", dr.run_id)}


def _files(storage, job_uri: str) -> dict[str, bytes]:
    return {uri: storage.read_bytes(uri) for uri in storage.list(job_uri)}


@backend_and_storage
def test_reproduce_a_failed_job_and_a_successful_one(backend, base_uri, tmp_path):
    jobs = _jobs(backend)
    failed = jobs["diverges"]
    storage = open_storage(base_uri)
    before = _files(storage, failed["job_uri"])

    code, out, err = cli_run("reproduce", failed["job_id"])
    assert code == 1, err
    assert f"reproducing job {failed['job_id']}" in out
    assert "the job failed: builtins.ValueError (bad learning rate: -1.0)" in out
    running = next(line for line in out.splitlines() if line.startswith("running: "))
    assert (
        "KERAS_BACKEND=jax" in running
        and f"{sys.executable} -m kinetic_airflow.runner --job-uri file://" in running
    )
    reproduced = "reproduced: builtins.ValueError: bad learning rate: -1.0 (phase execute)"
    assert f"{reproduced}; the same exception as the job" in out
    assert 'raise ValueError(f"bad learning rate: {lr}")' in err  # the runner's traceback, here
    assert _files(storage, failed["job_uri"]) == before  # the original job is only read

    # its copy is in a new private directory (not a fixed, guessable /tmp path), kept to look at
    workdir = next(line for line in out.splitlines() if line.startswith("local job files: "))[17:]
    assert os.path.basename(workdir).startswith(f"kinetic-reproduce-{failed['job_id']}-")
    assert os.stat(workdir).st_mode & 0o777 == 0o700
    assert running.count(workdir) == 1

    # jobs show prints exactly the command reproduce runs (WORKDIR: the directory it makes)
    code, shown, _ = cli("jobs", "show", failed["job_id"])
    assert code == 0 and "runs: " + running[len("running: ") :].replace(workdir, "WORKDIR") in shown

    ok = jobs["greet"]
    code, out, err = cli_run("reproduce", ok["job_uri"], "--workdir", str(tmp_path / "repro"))
    assert code == 0, err
    assert "reproduced: the function returned {'greeting': 'hello ops', 'job': " in out
    assert f"KINETIC_OUTPUT_DIR: file://{tmp_path / 'repro' / 'output'}" in out  # not the task's own
    assert "hello ops line 2" in err + out
    assert (tmp_path / "repro" / "jobs" / ok["job_id"] / "result.json").exists()

    # a --workdir that holds anything is refused, and nothing in it is touched
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    code, _, err = cli_run("reproduce", ok["job_uri"], "--workdir", str(tmp_path / "mine"))
    assert code != 0 and "is not an empty directory" in err and "never overwrites" in err
    assert os.listdir(tmp_path / "mine") == ["notes.txt"]


@on_storage("file")  # reading the job from either storage: above
def test_reproduce_under_pdb(local_env, base_uri):
    failed = _jobs("local")["diverges"]
    proc = subprocess.run(
        [sys.executable, "-m", "kinetic_airflow.cli", "reproduce", failed["job_id"], "--pdb"],
        input="p step * 2\np lr\nc\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    assert "--pdb" in proc.stdout and "(Pdb)" in proc.stdout
    assert "84" in proc.stdout and "-1.0" in proc.stdout  # the frame that raised, its locals
    assert "reproduced: builtins.ValueError: bad learning rate: -1.0" in proc.stdout


def test_reproduce_says_what_is_wrong(local_env, base_uri):
    code, _, err = cli_run("reproduce", "no-such-job")
    assert code == 2 and "no job no-such-job in " in err
