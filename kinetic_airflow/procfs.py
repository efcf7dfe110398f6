"""Reading other processes of this host through Linux ``/proc``, without touching them.

The resume guard (``resume_window``, ``local_executor_watch``) learns from here when Airflow's
own processes have done what it waits for. Everything here fails soft, returning None, because
a process may vanish between two reads and ``/proc`` may be absent or restricted; the callers
then fall back to a fixed bound. Standard library only: the triggerer runs this on its loop.
"""

from __future__ import annotations

import array
import fcntl
import os
import termios

PROC = "/proc"


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def pid_namespace(proc: str = PROC) -> str | None:
    """This process's PID namespace (``pid:[inode]``)."""
    try:
        return os.readlink(f"{proc}/self/ns/pid")
    except OSError:
        return None


def boot_id(proc: str = PROC) -> str | None:
    return read_text(f"{proc}/sys/kernel/random/boot_id")


def stat_fields(pid: int, proc: str = PROC) -> list[str] | None:
    """The fields after the command name of ``/proc/<pid>/stat`` (state first), or None."""
    text = read_text(f"{proc}/{pid}/stat")
    if not text or ")" not in text:
        return None
    fields = text[text.rindex(")") + 1 :].split()
    return fields if len(fields) > 19 else None


def start_ticks(pid: int, proc: str = PROC) -> int | None:
    """When the process started, in clock ticks since boot: tells it from a later one that
    reuses its PID."""
    fields = stat_fields(pid, proc)
    return _int(fields[19]) if fields else None


def command_line(pid: int, proc: str = PROC) -> str | None:
    """The process's title as ``setproctitle`` leaves it (arguments joined by spaces)."""
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()


def pipes_held_both_ways(pid: int, proc: str = PROC) -> list[str] | None:
    """Paths of one read-end descriptor of each pipe the process holds both ends of.

    A pipe created before a fork (a ``multiprocessing`` queue) is held both ways by the
    children; one the process only writes to (its stdout) or only reads is not.
    None when the process's descriptors cannot be listed (gone, or not ours to read).
    """
    fd_dir = f"{proc}/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return None
    readers: dict[str, str] = {}
    writers: set[str] = set()
    for name in sorted(names, key=lambda n: int(n) if n.isdigit() else -1):
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:
            continue
        if not target.startswith("pipe:"):
            continue
        flags = _fd_flags(pid, name, proc)
        if flags is None:
            continue
        if flags & os.O_ACCMODE == os.O_WRONLY:
            writers.add(target)
        else:
            readers.setdefault(target, f"{fd_dir}/{name}")
    return [path for target, path in readers.items() if target in writers]


def unread_bytes(pipe_path: str) -> int | None:
    """Bytes written to a pipe and not yet read, through a new read-only descriptor of it.

    Opening ``/proc/<pid>/fd/<n>`` of a pipe opens the pipe itself; ``FIONREAD`` counts what it
    holds without reading any of it, so the process that will read it is not disturbed.
    """
    try:
        fd = os.open(pipe_path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        count = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, count, True)
        return count[0]
    except OSError:
        return None
    finally:
        os.close(fd)


def _fd_flags(pid: int, fd: str, proc: str) -> int | None:
    text = read_text(f"{proc}/{pid}/fdinfo/{fd}")
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        if key == "flags":
            try:
                return int(value.strip(), 8)
            except ValueError:
                return None
    return None


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None
