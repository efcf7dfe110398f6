"""What one local job can reach of another, and what a job leaves behind on the worker machine.

Every local job runs as the same OS user as the Airflow worker, so the job key must never sit
where any process of that user can read it: not in an environment (``/proc/PID/environ`` keeps
a process's initial environment for its life), not in job storage. And a job's processes end
with the job: a child the function started and left running is stopped, and the log says so.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
from jobkit import key_of, make_job, run_runner

from kinetic_airflow.backends.local import LocalBackend
from kinetic_airflow.job.layout import JobIdentity
from kinetic_airflow.job.ref import JobRef
from kinetic_airflow.job.storage import open_storage, uri_to_local_path
from kinetic_airflow.watch import JobWatcher

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _ref(base_uri: str, job_id: str) -> JobRef:
    return JobRef(
        backend="local",
        job_id=job_id,
        job_uri=f"{base_uri}/jobs/{job_id}",
        local_dir=uri_to_local_path(f"{base_uri}/jobs/{job_id}"),
        python=sys.executable,
        identity=JobIdentity("d", "r", job_id),
    )


def _watch(ref: JobRef) -> tuple[dict | None, list[str]]:
    shown: list[str] = []
    watcher = JobWatcher(
        ref,
        open_storage(ref.job_uri),
        LocalBackend(),
        poll_interval=0.1,
        emit_log=shown.append,
        emit_progress=lambda line: None,
    )
    return asyncio.run(watcher.wait()), shown


def _sleep_until(path: str, limit: float) -> str:
    Path(path).write_text("started")
    end = time.monotonic() + limit
    while time.monotonic() < end and Path(path).exists():
        time.sleep(0.05)
    return "done"


def _refuse_if_readable(secret: str) -> None:
    found = _processes_holding(secret)
    if found:
        raise AssertionError(f"the key is readable at {found}")


def _processes_holding(secret: str) -> list[str]:
    """Every process whose environment or command line this job can read and that holds ``secret``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        for part in ("environ", "cmdline"):
            try:
                data = Path(f"/proc/{pid}/{part}").read_bytes()
            except OSError:
                continue
            if secret.encode() in data:
                found.append(f"{pid}/{part}")
    return found


def _start_sleeping_job(tmp_path: Path, job_id: str) -> tuple[JobRef, Path]:
    """A local job whose function has started and waits until its flag file is removed."""
    base = f"file://{tmp_path}"
    flag = tmp_path / f"{job_id}-running"
    make_job(base, _sleep_until, (str(flag), 120), job_id=job_id)
    ref = _ref(base, job_id)
    LocalBackend().submit(ref, job_key=key_of(ref.job_uri))
    end = time.monotonic() + 60
    while not flag.exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert flag.exists(), f"job {job_id} did not start"
    return ref, flag


def test_a_second_local_job_cannot_read_a_running_jobs_key(tmp_path):
    base = f"file://{tmp_path}"
    ref_a, flag = _start_sleeping_job(tmp_path, "job-a")

    # Job B looks for A's key wherever a process of the same user can read it. (The key is B's
    # argument only to have something to look for; arguments travel in the payload, not in an
    # environment.)
    key_a = key_of(ref_a.job_uri)
    make_job(base, _refuse_if_readable, (key_a,), job_id="job-b")
    ref_b = _ref(base, "job-b")
    LocalBackend().submit(ref_b, job_key=key_of(ref_b.job_uri))
    event_b, _ = _watch(ref_b)
    assert event_b["status"] == "success", event_b
    flag.unlink()  # A finishes, having used its key to sign its result
    event_a, _ = _watch(ref_a)
    assert event_a["status"] == "success", event_a
    assert _processes_holding(key_a) == []


def _environment_view(out: str) -> None:
    view = {
        "proc_environ_has_key": b"KINETIC_JOB_KEY=" in Path("/proc/self/environ").read_bytes(),
        "variables": sorted(name for name in os.environ if name.startswith("KINETIC_JOB_KEY")),
    }
    Path(out).write_text(json.dumps(view))


def test_a_key_given_in_the_environment_leaves_the_runners_environment(tmp_path):
    """A cluster pod gets its key from a Secret as an environment variable (secretKeyRef): the
    runner starts itself again with the key on a pipe, so not even /proc/self/environ holds it."""
    out = tmp_path / "view.json"
    layout = make_job(f"file://{tmp_path}", _environment_view, (str(out),), job_id="from-env")
    proc, summary = run_runner(layout)  # KINETIC_JOB_KEY in the runner's environment
    assert proc.returncode == 0, proc.stderr
    assert summary and summary["ok"] is True, (summary, proc.stderr)
    assert json.loads(out.read_text()) == {"proc_environ_has_key": False, "variables": []}


def _leave_children_running(marker: str) -> list[int]:
    plain = subprocess.Popen(["sleep", "600"])
    detached = subprocess.Popen(["sleep", "601"], start_new_session=True)
    Path(marker).write_text(f"{plain.pid} {detached.pid}")
    return [plain.pid, detached.pid]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


def test_a_child_the_function_left_running_is_stopped_when_the_job_ends(tmp_path):
    base = f"file://{tmp_path}"
    marker = tmp_path / "children"
    make_job(base, _leave_children_running, (str(marker),), job_id="parent")
    ref = _ref(base, "parent")
    LocalBackend().submit(ref, job_key=key_of(ref.job_uri))
    event, _ = _watch(ref)
    assert event["status"] == "success", event
    pids = [int(p) for p in marker.read_text().split()]
    end = time.monotonic() + 30
    while not all(_gone(pid) for pid in pids) and time.monotonic() < end:
        time.sleep(0.1)
    assert [pid for pid in pids if not _gone(pid)] == []
    log = (tmp_path / "jobs/parent/job.log").read_text()
    assert "the job left 2 process(es) running after its function ended" in log
    assert "sleep 600" in log and "sleep 601" in log


def test_a_kill_from_outside_is_not_called_out_of_memory(tmp_path):
    ref, _ = _start_sleeping_job(tmp_path, "victim")
    started = json.loads(next((tmp_path / "jobs/victim/status").glob("started*")).read_text())
    os.kill(started["pid"], signal.SIGKILL)  # the runner, as `kill -9` would
    event, _ = _watch(ref)
    assert event["status"] == "failed" and event["cause"] == "killed", event
    assert "out of memory" not in event["message"] + event.get("hint", "")
    assert "something outside the job killed it" in event["message"] + event.get("hint", "")
