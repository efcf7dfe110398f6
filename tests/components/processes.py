"""Find and end the processes a test helper started, wherever they ended up.

Process groups are not enough to clean up after real services: kinetic's local
backend detaches job processes into their own sessions, and the cluster
emulator runs every pod in a session of its own. What all of them keep is the
environment they inherited, so each helper puts a unique marker variable in
the environment of what it starts and looks for it in ``/proc/<pid>/environ``
(readable for our own processes, and for all of them as root, which CI is).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from pathlib import Path

__all__ = ["MARKER_VAR", "kill_marked", "marked_processes", "new_marker"]

# Inherited by everything a helper starts; the value tells one helper instance from another.
MARKER_VAR = "KN_TEST_PROCESS_MARK"


def new_marker(kind: str) -> str:
    """A marker value unique to one helper instance, e.g. ``airflow-3f2a...``."""
    return f"{kind}-{os.getpid()}-{secrets.token_hex(6)}"


def _state(pid: str) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def marked_processes(marker: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries ``KN_TEST_PROCESS_MARK=<marker>``."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ.split(b"\0") and _state(entry.name) not in (None, "Z", "X"):
            found.append(int(entry.name))
    return sorted(found)


def kill_marked(marker: str, *, grace: float = 3.0) -> list[int]:
    """SIGTERM every marked process (and its group), SIGKILL what is left after ``grace`` seconds.

    Returns the pids that were still running when called, so callers can report what leaked.
    """
    pids = marked_processes(marker)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and marked_processes(marker):
        time.sleep(0.1)
    for pid in marked_processes(marker):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            pgid = os.getpgid(pid)
            if pgid != os.getpgrp():  # never the test runner's own group
                os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids
