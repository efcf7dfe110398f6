"""Packages a job needs beyond its image, installed at start into an environment cached by hash.

Worker side (``resolve_requirements``): the task's ``requirements=`` (a list of requirement
strings and/or the path of a requirements file), else what kinetic discovers — a
``requirements.txt`` beside the DAG file or at the bundle root, else the ``[project]
dependencies`` of a ``pyproject.toml`` there. They travel in the manifest, as text.

Runner side (``ensure_environment``): the requirements' sha256 names a folder under the
environment cache; if it is complete, nothing is installed and it goes on ``sys.path``.
Otherwise ``uv pip install --target`` (pip when the image has no uv) fills a temporary
folder, renamed into place when the install succeeded, so a half-done install is never
used and two jobs installing the same set at once both end with one complete copy.

The cache lives where a machine keeps it across jobs: on the local backend under the local
state dir; on a cluster a hostPath folder of the node (``/var/cache/kinetic/envs``), because
accelerator nodes run many jobs one after another and what costs time is download and build.
A wheelhouse in job storage would still install every time. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

import tomllib

__all__ = ["InstallError", "ensure_environment", "requirements_digest", "resolve_requirements"]

COMPLETE = ".kinetic-complete"


class InstallError(RuntimeError):
    """The installer failed; the message names the requirement set and the installer's last words."""


def _read_requirements_file(path: Path) -> list[str]:
    lines = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")):
            nested = line.split(None, 1)[1]
            lines.extend(_read_requirements_file((path.parent / nested).resolve()))
            continue
        lines.append(line)
    return lines


def _pyproject_dependencies(path: Path) -> list[str]:

    data = tomllib.loads(path.read_text())
    return [str(d) for d in (data.get("project") or {}).get("dependencies") or []]


def resolve_requirements(
    requirements: str | Sequence[str] | None, search_dirs: Sequence[str | os.PathLike[str]] = ()
) -> tuple[list[str], str]:
    """(requirement lines, where they came from). Empty when the job needs nothing extra.

    Items of ``requirements`` that name an existing file (``requirements.txt`` or a path
    ending in ``.txt``) are read as requirements files; others are requirement strings.
    """
    if requirements is not None:
        items = [requirements] if isinstance(requirements, str) else list(requirements)
        lines: list[str] = []
        for item in items:
            if not isinstance(item, str):
                raise TypeError(
                    f"requirements: each item must be a requirement string (e.g. 'scikit-learn>=1.4') "
                    f"or the path of a requirements file, got {type(item).__name__}"
                )
            path = Path(item).expanduser()
            if item.endswith(".txt") or path.is_file():
                if not path.is_file():
                    raise FileNotFoundError(
                        f"requirements: the file {item!r} does not exist on the Airflow worker (a relative "
                        "path is read from the worker's current directory; use an absolute path)"
                    )
                lines.extend(_read_requirements_file(path))
            else:
                lines.append(item.strip())
        return [line for line in lines if line], "requirements="
    for folder in search_dirs:
        txt = Path(folder) / "requirements.txt"
        if txt.is_file():
            return _without_airflow(_read_requirements_file(txt)), str(txt)
        pyproject = Path(folder) / "pyproject.toml"
        if pyproject.is_file():
            deps = _without_airflow(_pyproject_dependencies(pyproject))
            if deps:
                return deps, f"{pyproject} [project] dependencies"
    return [], ""


def _without_airflow(lines: list[str]) -> list[str]:
    """Discovered files describe the DAG project, which needs Airflow; the job never does (the
    runner has no Airflow), so Airflow and its providers are not installed into jobs."""

    def name(line: str) -> str:
        return re.split(r"[\s\[<>=!~;@]", line, maxsplit=1)[0].lower().replace("_", "-")

    return [line for line in lines if not name(line).startswith(("apache-airflow", "kinetic-airflow"))]


def requirements_digest(lines: Sequence[str]) -> str:
    """Order and duplicates do not matter; the Python version does (wheels are per version)."""
    key = {"requirements": sorted(set(lines)), "python": f"{sys.version_info[0]}.{sys.version_info[1]}"}
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:20]


# How pip (ERROR: ...) and uv (a multiplication sign, then an arrow) start their error lines.
_ERROR_LINE_STARTS = ("error", "\u00d7", "\u2570\u2500\u25b6")


def _installer(target: str, requirements_file: str) -> list[str]:
    uv = shutil.which("uv")
    if uv:
        return [uv, "pip", "install", "--python", sys.executable, "--target", target,
                "-r", requirements_file]  # fmt: skip
    return [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
            "--target", target, "-r", requirements_file]  # fmt: skip


def ensure_environment(
    lines: Sequence[str], cache_root: str, log: Callable[[str], None]
) -> tuple[str, bool, float]:
    """(folder for ``sys.path``, True if it had to be installed, seconds spent)."""
    started = time.monotonic()
    digest = requirements_digest(lines)
    final = os.path.join(cache_root, digest)
    if os.path.exists(os.path.join(final, COMPLETE)):
        log(f"requirements {digest}: cached environment {final}, nothing to install")
        return final, False, time.monotonic() - started
    os.makedirs(cache_root, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f".{digest}-", dir=cache_root)
    try:
        req_file = os.path.join(work, "requirements.txt")
        with open(req_file, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        target = os.path.join(work, "env")
        command = _installer(target, req_file)
        log(f"requirements {digest}: installing {', '.join(lines)} with {os.path.basename(command[0])}")
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tail: deque[str] = deque(maxlen=15)
        assert proc.stdout is not None
        for line in proc.stdout:  # the installer's output goes to the task log as it comes
            line = line.rstrip()
            print(f"[install] {line}", flush=True)
            tail.append(line)
        if proc.wait() != 0:
            # The whole output is in the log just above ([install] lines): the error names the
            # installer's own error lines only, so the log does not show the output twice more.
            errors = [line for line in tail if line.lstrip().lower().startswith(_ERROR_LINE_STARTS)]
            raise InstallError(
                f"installing the job's requirements failed ({' '.join(lines)}; exit code {proc.returncode}): "
                + ("; ".join(errors[-3:]) if errors else (tail[-1] if tail else "no output"))
                + ". The installer's whole output is in the job's log ([install] lines)."
            )
        Path(target, COMPLETE).write_text(json.dumps({"requirements": list(lines), "time": time.time()}))
        try:
            os.rename(target, final)
        except OSError:  # another job finished the same set first: use its copy
            if not os.path.exists(os.path.join(final, COMPLETE)):
                raise
        return final, True, time.monotonic() - started
    finally:
        shutil.rmtree(work, ignore_errors=True)
