"""Remote tracebacks that name the DAG file's lines, shown once in the task log.

Two things stood in the way:

* cloudpickle replaces the file name of every function it pickles by value with
  ``"<dynamic-code>"`` (to make payloads independent of where they were built). DAG files
  and their helper modules are pickled by value, so a remote traceback named no file.
  ``FilenamePickler`` keeps the real ``co_filename`` (line numbers always survived).
* The traceback reached the task log four times: the job's log streamed live, its last
  lines again at the end, a "Remote traceback" error line and the exception's note. The
  runner now brackets the traceback it prints with marker lines; the watcher leaves that
  block out of the streamed log (the job's own log keeps it) and the exception carries it
  once, as a note, with the source lines filled in from the worker's copy of the DAG files.

Standard library + cloudpickle only: the runner imports this module.
"""

from __future__ import annotations

import linecache
import re
import types
from collections import ChainMap
from typing import Any

import cloudpickle

__all__ = [
    "TRACEBACK_BEGIN",
    "TRACEBACK_END",
    "FilenamePickler",
    "StreamedTracebackFilter",
    "clean_remote_traceback",
    "mark_traceback",
    "without_tracebacks",
]

TRACEBACK_BEGIN = "[kinetic] ---- traceback of the failure (the task's error shows it too) ----"
TRACEBACK_END = "[kinetic] ---- end of traceback ----"
_SHOWN_INSTEAD = "[kinetic] (the traceback of this failure is shown with the task's error)"
_DYNAMIC = "<dynamic-code>"


def _code_reduce_keeping_filename(code: types.CodeType) -> Any:
    constructor, args = cloudpickle.cloudpickle._code_reduce(code)
    args = tuple(code.co_filename if arg == _DYNAMIC else arg for arg in args)
    return constructor, args


class FilenamePickler(cloudpickle.Pickler):
    """cloudpickle, except that functions pickled by value keep their source file's name."""

    dispatch_table = ChainMap(
        {types.CodeType: _code_reduce_keeping_filename},
        cloudpickle.Pickler.dispatch_table,
    )


def mark_traceback(text: str) -> str:
    """The runner's printed traceback, between the lines the watcher recognizes."""
    return f"{TRACEBACK_BEGIN}\n{text.rstrip()}\n{TRACEBACK_END}\n"


class StreamedTracebackFilter:
    """Leaves marked traceback blocks out of a streamed log, per host of a multi-host job."""

    def __init__(self) -> None:
        self.inside: set[str] = set()

    def __call__(self, line: str, host: str = "") -> str | None:
        """The line to show (``None``: hide it)."""
        if line.endswith(TRACEBACK_BEGIN):
            self.inside.add(host)
            return line[: -len(TRACEBACK_BEGIN)] + _SHOWN_INSTEAD
        if host in self.inside:
            if line.endswith(TRACEBACK_END):
                self.inside.discard(host)
            return None
        return line


def without_tracebacks(lines: list[str]) -> list[str]:
    keep = StreamedTracebackFilter()
    out = []
    for line in lines:
        host = line[2 : line.find("]")] if line.startswith("[h") and "] " in line else ""
        shown = keep(line, host)
        if shown is not None:
            out.append(shown)
    return out


_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.+)$')


def clean_remote_traceback(text: str) -> str:
    """Drop the runner's own frames; add source lines the job could not show (files not in the image)."""
    lines = text.rstrip("\n").splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        frame = _FRAME.match(line)
        if frame is None:
            out.append(line)
            i += 1
            continue
        body = []
        j = i + 1
        while j < len(lines) and lines[j].startswith("    "):
            body.append(lines[j])
            j += 1
        if frame["file"].replace("\\", "/").endswith("kinetic_airflow/runner.py"):
            i = j
            continue
        out.append(line)
        if not body:
            source = linecache.getline(frame["file"], int(frame["line"])).strip()
            if source:
                body = [f"    {source}"]
        out.extend(body)
        i = j
    return "\n".join(out) + "\n"
