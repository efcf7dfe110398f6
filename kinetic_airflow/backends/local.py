"""Local backend: the job is a detached process on this machine running the runner.

The process is started in its own session (so it outlives the Airflow worker that
launched it and is not killed with the worker's process group) under a tiny
supervisor that records the exit status. Everything about the process lives in
the job's local state directory: ``launch.json`` (created exclusively, which is
what makes submit idempotent), ``pid.json``, ``exit.json`` and ``job.log``. With
``file://`` storage that directory *is* the job's storage prefix.
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

from kinetic_airflow.backends.base import Backend, BackendStatus, JobRef, JobState
from kinetic_airflow.config import local_state_root
from kinetic_airflow.job.integrity import KEY_ENV, KEY_FD_ENV, key_pipe
from kinetic_airflow.job.layout import CANCEL_NAME, EXIT_NAME, LAUNCH_NAME, LOG_NAME, SUPERVISOR_LOG_NAME
from kinetic_airflow.job.ref import JobRefError
from kinetic_airflow.job.stop import kill_after_seconds

__all__ = ["LocalBackend", "process_alive"]


_TMP_DIR = "tmp"  # also in local_supervisor.py
_EXIT_CHECK_SECONDS = 0.05


def _state_dir(job: JobRef) -> Path:
    if not job.local_dir:
        raise JobRefError(
            f"local job {job.job_id!r} has no local_dir (its state directory on the worker machine): "
            "its reference was not written by the operator for the local backend; clear the task to run "
            "a new job"
        )
    return Path(job.local_dir)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


class LocalBackend(Backend):
    name = "local"

    def submit(self, job: JobRef, *, env: dict[str, str] | None = None, job_key: str | None = None) -> None:
        state = _state_dir(job)
        state.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(state / LAUNCH_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return  # already launched: adopt it
        python = job.python or sys.executable
        command = [
            python, "-m", "kinetic_airflow.backends.local_supervisor",
            "--state-dir", str(state),
            "--log-uri", job.job_uri + "/job.log",
            "--", python, "-m", "kinetic_airflow.runner", "--job-uri", job.job_uri,
        ]  # fmt: skip
        child_env = dict(os.environ)
        # As kinetic does, Keras runs on JAX unless told otherwise. JAX_PLATFORMS is left to JAX
        # here: this machine's hardware is whatever it is, whatever the accelerator string says.
        child_env.setdefault("KERAS_BACKEND", "jax")
        # Environments of requirements= are cached per machine, under the local state dir.
        child_env.setdefault("KINETIC_ENV_CACHE", os.path.join(local_state_root(), "envs"))
        child_env.update(env or {})
        # The job's key reaches the runner through an inherited pipe, which the supervisor passes on
        # unread and the runner empties: never an environment (/proc/PID/environ is readable by
        # every process of the user all local jobs share), launch.json or the job's directory
        # (job storage, with file://).
        child_env.pop(KEY_ENV, None)
        child_env.pop(KEY_FD_ENV, None)
        key_fd = key_pipe(job_key) if job_key else None
        if key_fd is not None:
            child_env[KEY_FD_ENV] = str(key_fd)
            child_env["KINETIC_JOB_KEY_SOURCE"] = "a pipe from the Airflow worker that started the job"
        # The job's temporary files (the runner's work dir with its copies of Data inputs, and
        # whatever the function puts in tempfile's dir) stay inside the job's own directory; the
        # supervisor removes it when the job ends, however it ends (README, "The local backend").
        child_env["TMPDIR"] = str(state / _TMP_DIR)
        (state / _TMP_DIR).mkdir(exist_ok=True)
        log_path = state / SUPERVISOR_LOG_NAME
        try:
            with open(log_path, "ab") as supervisor_log:
                proc = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=supervisor_log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=() if key_fd is None else (key_fd,),
                    env=child_env,
                    cwd=str(state),
                )
        finally:
            if key_fd is not None:
                os.close(key_fd)
        with os.fdopen(fd, "w") as fh:
            json.dump({"time": time.time(), "pid": proc.pid, "command": command}, fh)

    def status(self, job: JobRef) -> BackendStatus:
        state = _state_dir(job)
        launch = _read_json(state / LAUNCH_NAME)
        if launch is None:
            if (state / LAUNCH_NAME).exists():
                return BackendStatus(JobState.PENDING, reason="Launching")
            return BackendStatus(JobState.NOT_FOUND)
        exit_record = _read_json(state / EXIT_NAME)
        if exit_record is not None:
            code = exit_record.get("returncode")
            if code == 0:
                return BackendStatus(JobState.SUCCEEDED, exit_code=0)
            sig = exit_record.get("signal")
            reason = "Cancelled" if exit_record.get("cancelled") else ("Signaled" if sig else "Error")
            if reason == "Signaled" and sig == signal.SIGKILL and "oom_kills_while_running" in exit_record:
                # The kernel counts its out-of-memory kills: none while the job ran means a kill -9.
                reason = "OOMKilled" if exit_record["oom_kills_while_running"] else "Killed"
            message = (
                f"the job process was killed by signal {sig}"
                if sig
                else f"the job process exited with code {code}"
            )
            return BackendStatus(
                JobState.FAILED, exit_code=code, reason=reason, message=message, details=exit_record
            )
        pid = launch.get("pid")
        if pid and process_alive(int(pid)):
            return BackendStatus(JobState.RUNNING)
        # The supervisor may have just finished: exit.json is written before it exits.
        exit_record = _read_json(state / EXIT_NAME)
        if exit_record is not None:
            return self.status(job)
        return BackendStatus(
            JobState.FAILED,
            exit_code=None,
            reason="Lost",
            message="the job process and its supervisor are gone without recording an exit status "
            "(killed with SIGKILL, or the machine restarted)",
        )

    def cancel(self, job: JobRef) -> None:
        state = _state_dir(job)
        launch = _read_json(state / LAUNCH_NAME)
        if not launch or _read_json(state / EXIT_NAME) is not None:
            return
        pid = int(launch["pid"])
        (state / CANCEL_NAME).write_text(json.dumps({"time": time.time()}))
        try:
            os.killpg(pid, signal.SIGTERM)  # the supervisor leads its own session: pgid == pid
        except ProcessLookupError:
            return
        deadline = time.monotonic() + kill_after_seconds(job.stop_grace_seconds)  # job.stop's grace
        while time.monotonic() < deadline:
            if not process_alive(pid):
                break
            time.sleep(0.1)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    async def await_change(self, job: JobRef, timeout: float) -> None:
        """Until the supervisor records the exit (a local stat, no storage request), or ``timeout``."""
        exit_path = _state_dir(job) / EXIT_NAME
        end = time.monotonic() + timeout
        while not exit_path.exists():
            left = end - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(_EXIT_CHECK_SECONDS, left))

    def full_log_hint(self, job: JobRef) -> str:
        local = _state_dir(job) / LOG_NAME
        if job.job_uri.startswith("file://"):
            return str(local)
        return f"{local} (a copy goes to {job.job_uri}/job.log when the job ends)"

    def read_log(self, job: JobRef, offset: int) -> tuple[str, int]:
        path = _state_dir(job) / LOG_NAME
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(4 * 1024 * 1024)
        except FileNotFoundError:
            return "", offset
        # Only hand out whole lines, unless the job has finished writing.
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) < 4 * 1024 * 1024:
            return "", offset
        data = data[:cut] if cut else data
        return data.decode("utf-8", errors="replace"), offset + len(data)
