"""Remote tracebacks that name the DAG file's lines and the user's names, shown once in the task log.

Three things stood in the way:

* cloudpickle replaces the file name of every function it pickles by value with
  ``"<dynamic-code>"`` (to make payloads independent of where they were built). DAG files
  and their helper modules are pickled by value, so a remote traceback named no file.
  ``FilenamePickler`` keeps the real ``co_filename`` (line numbers always survived).
* The traceback reached the task log several times: the job's log streamed live, its last
  lines again at the end, the exception's note, and the triggerer's log of the event. The
  runner brackets the traceback it prints with marker lines; the watcher leaves that block
  out of the streamed log (the job's own log keeps it) and events carry no traceback. The
  worker logs it once, as plain ERROR lines just before Airflow's exception line, with the
  source lines filled in from the worker's copy of the DAG files: Airflow's log viewer shows
  log lines, not exception notes, and its own frames of the error are Airflow's and kinetic's.
* Airflow imports DAG files under generated module names, so a DAG file's exception class
  read ``unusual_prefix_<sha1>_<file>.Name``; ``user_names`` turns that back into
  ``<file>.Name`` wherever a name or a traceback is recorded or shown.

Standard library + cloudpickle only: the runner imports this module.
"""

from __future__ import annotations

import linecache
import re
import types
from collections import ChainMap
from typing import Any

import cloudpickle

# The runner's own frames (``python -m kinetic_airflow.runner`` and the runner it calls): a
# user's traceback shows only their code.
_RUNNER_FILES = ("kinetic_airflow/job/runner.py", "kinetic_airflow/runner/__main__.py")

__all__ = [
    "TRACEBACK_BEGIN",
    "TRACEBACK_END",
    "FilenamePickler",
    "StreamedTracebackFilter",
    "clean_remote_traceback",
    "mark_traceback",
    "type_name",
    "user_names",
    "user_summary",
]

TRACEBACK_BEGIN = "[kinetic] ---- traceback of the failure (the task's error shows it too) ----"
TRACEBACK_END = "[kinetic] ---- end of traceback ----"
# The marker lines above stay as they are: runners in older images print them.
_SHOWN_INSTEAD = "[kinetic] (traceback left out here: it is logged at the end of the task, before its error)"
_DYNAMIC = "<dynamic-code>"
# Airflow imports a DAG file as module ``unusual_prefix_<sha1 of its path>_<file name>``
# (airflow/serialization/stringify.py strips the same pattern for the same reason).
_AIRFLOW_MODULE_PREFIX = re.compile(r"\bunusual_prefix_[0-9a-f]{40}_")


def user_names(text: str) -> str:
    """``text`` with the module names the user wrote (``nt_fail.TrainingDiverged``) in place of
    the ones Airflow generated for DAG files (``unusual_prefix_<sha1>_nt_fail...``).

    The one place such names are cleaned: the runner applies it to what it records, and every
    place that shows a name or a traceback applies it again (records of older runners).
    """
    return _AIRFLOW_MODULE_PREFIX.sub("", text)


def user_summary(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """A result summary (``result.json``) whose names, message and traceback read as the user's."""
    if not summary:
        return summary
    keys = ("error_type", "error_message", "traceback", "value_type", "value_repr")
    return {k: user_names(v) if k in keys and isinstance(v, str) else v for k, v in summary.items()}


def type_name(name: str | None) -> str | None:
    """A recorded type's name as a person reads it: ``ValueError``, ``nt_fail.TrainingDiverged``."""
    if not name:
        return name
    name = user_names(name)
    return name[len("builtins.") :] if name.startswith("builtins.") else name


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


_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.+)$')


def clean_remote_traceback(text: str) -> str:
    """Drop the runner's own frames; add source lines the job could not show (files not in the
    image); the user's module names (``user_names``)."""
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
        if frame["file"].replace("\\", "/").endswith(_RUNNER_FILES):
            i = j
            continue
        out.append(line)
        if not body:
            source = linecache.getline(frame["file"], int(frame["line"])).strip()
            if source:
                body = [f"    {source}"]
        out.extend(body)
        i = j
    return user_names("\n".join(out) + "\n")
