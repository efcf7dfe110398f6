"""Supervisor of a local job: runs the runner, records how it ended, keeps its log.

It exists because the process that launched the job (an Airflow worker) may be
gone by the time the job ends, so nobody else could collect the exit status.

It also owns the job's process tree. It is a child subreaper (Linux ``prctl``), so a
process the function started and left behind - a plain ``Popen``, a daemon that
double-forked, one that moved to its own session - becomes its child instead of PID 1's
when the runner exits. Once the runner has ended, every such process is stopped (SIGTERM,
then SIGKILL after a grace period) and the job's log says which: a job never leaves work
running on the Airflow worker's machine.

Standard library (+ kinetic_airflow.job.storage for a gs:// log copy) only.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import BinaryIO

from kinetic_airflow.job.integrity import KEY_FD_ENV
from kinetic_airflow.job.layout import CANCEL_NAME, EXIT_NAME, LOG_NAME
from kinetic_airflow.job.storage import open_storage
from kinetic_airflow.procfs import PROC, command_line, stat_fields

_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
LEFTOVER_GRACE_SECONDS = 5.0


def oom_kills() -> int | None:
    """How many processes the kernel's out-of-memory killer has killed since boot (``/proc/vmstat``)."""
    try:
        with open(f"{PROC}/vmstat") as fh:
            for line in fh:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def become_subreaper() -> bool:
    """Orphaned descendants re-parent to this process (not PID 1); False where Linux says no."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children(pid: int) -> list[int]:
    found = []
    try:
        names = os.listdir(PROC)
    except OSError:
        return found
    for name in names:
        if name.isdigit():
            fields = stat_fields(int(name))
            # stat_fields: state first, then ppid; a zombie is already gone (only waiting to be reaped).
            if fields and fields[1] == str(pid) and fields[0] != "Z":
                found.append(int(name))
    return found


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in _children(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_leftovers(log: BinaryIO, grace: float = LEFTOVER_GRACE_SECONDS) -> list[str]:
    """Stop every process still descending from this one; say which in the job's log."""
    left = _descendants(os.getpid())
    if not left:
        return []
    described = [f"{pid} ({(command_line(pid) or '?')[:200]})" for pid in left]
    log.write(
        (
            f"[kinetic] the job left {len(left)} process(es) running after its function ended; "
            f"stopping them: {', '.join(described)}\n"
        ).encode()
    )
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _descendants(os.getpid()):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            _reap()
            if not _descendants(os.getpid()):
                break
            time.sleep(0.05)
        if not _descendants(os.getpid()):
            break
    _reap()
    return described


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kinetic_airflow.backends.local_supervisor")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--log-uri", default=None, help="also copy the log here (gs:// jobs)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    state = args.state_dir
    log_path = os.path.join(state, LOG_NAME)
    cancelled = False

    become_subreaper()
    oom_before = oom_kills()
    # The job key's pipe (LocalBackend.submit) goes to the runner unread; this process keeps no copy.
    key_fd = int(os.environ[KEY_FD_ENV]) if os.environ.get(KEY_FD_ENV, "").isdigit() else None

    with open(log_path, "ab", buffering=0) as log:
        try:
            child = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=() if key_fd is None else (key_fd,),
            )
        finally:
            if key_fd is not None:
                os.close(key_fd)

        def on_term(signum: int, _frame: object) -> None:
            nonlocal cancelled
            cancelled = True
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        returncode = child.wait()
        stopped = stop_leftovers(log)
        # The job's temporary directory (its TMPDIR, see LocalBackend.submit): work dir, copies of
        # Data inputs, the function's temp files. Payload, result and log live elsewhere and stay.
        shutil.rmtree(os.path.join(state, "tmp"), ignore_errors=True)

    record = {
        "returncode": returncode,
        "signal": -returncode if returncode < 0 else None,
        "cancelled": cancelled or os.path.exists(os.path.join(state, CANCEL_NAME)),
        "time": time.time(),
    }
    if stopped:
        record["stopped_processes"] = stopped
    oom_after = oom_kills()
    if oom_before is not None and oom_after is not None:
        # Tells a SIGKILL from the OOM killer (the count moved while the job ran) from a kill -9.
        record["oom_kills_while_running"] = oom_after - oom_before
    if args.log_uri and args.log_uri.startswith("gs://"):
        try:
            open_storage(args.log_uri).upload_file(log_path, args.log_uri)
        except Exception as exc:  # the local copy stays; say why the remote one is missing
            record["log_upload_error"] = str(exc)
    tmp = os.path.join(state, ".exit.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(record, fh)
    os.replace(tmp, os.path.join(state, EXIT_NAME))
    return 0


if __name__ == "__main__":
    sys.exit(main())
