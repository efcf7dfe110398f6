"""``debug=True``: the job starts debugpy and waits for a debugger before the function runs.

keras-kinetic's ``@kinetic.run(debug=True)`` does the same in its pod; here the parts are:

* the parse-time check (``check_debug_options``, called by ``options.validate_options``): the
  option values, and kinetic's warning when ``debug=True`` meets Spot capacity;
* the runner's side (``wait_for_debugger``, called by ``JobRunner.run`` after the payload is set
  up and before the function runs): install debugpy when the image lacks it (the same
  environment cache as ``requirements=``), listen on 127.0.0.1 of the job's host or pod, write
  where in the ``status/debug.json`` marker and the job's log, wait for a client up to
  ``debug_wait``, then run the function (``debug_on_timeout="run"``) or fail naming the fix;
* ``kinetic-airflow jobs debug JOB_ID`` (``kinetic_airflow.cli.debug``) reads the marker and
  connects the user's machine to that port (a port-forward through the API server for a
  cluster job).

Why 127.0.0.1 and not 0.0.0.0: a debug adapter runs any code its client sends. Bound to the
pod's loopback, only the pod itself and a port-forward (which needs ``create`` on
``pods/portforward`` in the job's namespace) reach it; nothing else on the cluster network does.
The port is the one the OS picks (port 0), so jobs sharing a machine (the local backend, the
cluster emulator) never collide; the marker says which it is.

Multi-host jobs: only host 0 starts a debugger and waits; the other hosts run the function at
once (and wait for host 0 in their first collective). Debugging every host would need a client
per host attached in step, which no editor does.

Standard library only at import: the runner runs without Airflow, and debugpy is imported only
in a job that asked for it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "DEBUG_MARKER",
    "DEFAULT_ON_TIMEOUT",
    "DEFAULT_WAIT_SECONDS",
    "DebugOnSpotWarning",
    "DebuggerNotAttached",
    "check_debug_options",
    "debug_settings",
    "wait_for_debugger",
]

DEBUG_MARKER = "debug"  # status/debug.json (status/debug-host<N>.json is never written: host 0 only)
# The defaults of debug_wait and debug_on_timeout: the option table (options.py) uses these, and
# the job falls back to them for a manifest without them.
DEFAULT_WAIT_SECONDS = 600.0
DEFAULT_ON_TIMEOUT = "fail"
DEBUGPY_REQUIREMENT = "debugpy>=1.8"


class DebugOnSpotWarning(UserWarning):
    """``debug=True`` on Spot capacity: the node can be taken away while you step through."""


class DebuggerNotAttached(RuntimeError):
    """No debugger attached within ``debug_wait`` and ``debug_on_timeout="fail"``."""


# Parse time ------------------------------------------------------------------------------------
def check_debug_options(checked: Mapping[str, Any], error: Callable[[str], Exception]) -> None:
    """The debug options together, after each was checked by its row of the option table.

    ``debug_wait`` / ``debug_on_timeout`` without ``debug=True`` would do nothing: an error naming
    the fix rather than a silent no-op. ``debug=True`` with Spot (``spot=True``, an accelerator's
    ``:spot`` or ``capacity="spot"``) warns, as keras-kinetic does: a preemption ends the session.
    ``error`` makes the exception (``options.KineticOptionError``: this package imports nothing
    outside ``job/``).
    """
    debug = checked.get("debug")
    if debug is False:
        defaults = {"debug_wait": DEFAULT_WAIT_SECONDS, "debug_on_timeout": DEFAULT_ON_TIMEOUT}
        given = [name for name, default in defaults.items() if checked.get(name) not in (None, default)]
        if given:
            shown = ", ".join(f"{name}={checked[name]!r}" for name in given)
            raise error(
                f"{shown} given without debug=True does nothing (it bounds the wait of a debug job); write "
                f"debug=True to debug the job, or leave out {' and '.join(given)}."
            )
    if not debug:
        return
    if _on_spot(checked):
        warnings.warn(
            "debug=True on Spot capacity: the node can be preempted while the job waits for your debugger "
            "or stands at a breakpoint, which ends the session and the job. Debug on on-demand capacity "
            "(leave out spot=True / ':spot' / capacity='spot') unless the bug only shows on Spot.",
            DebugOnSpotWarning,
            stacklevel=4,
        )


def _on_spot(checked: Mapping[str, Any]) -> bool:
    if checked.get("spot") is True or checked.get("capacity") == "spot":
        return True
    accelerator = checked.get("accelerator")
    if isinstance(accelerator, str) and "{{" not in accelerator:
        # Start-up cost: the accelerator catalog, only for a debug=True task.
        from kinetic_airflow.job.accelerators import parse_accelerator

        try:
            return parse_accelerator(accelerator).spot
        except ValueError:  # the accelerator's own check reports it
            return False
    return False


def debug_settings(debug: bool, wait: float | None, on_timeout: str | None) -> dict[str, Any] | None:
    """What the job's manifest carries (HMAC-checked, so no bucket writer can turn debugging on)."""
    if not debug:
        return None
    return {
        "wait_seconds": float(wait if wait is not None else DEFAULT_WAIT_SECONDS),
        "on_timeout": on_timeout or DEFAULT_ON_TIMEOUT,
    }


# In the job ------------------------------------------------------------------------------------
def wait_for_debugger(runner: Any, fn: Any, log: Callable[[str], None]) -> None:
    """Before ``fn`` runs on ``runner``'s host: listen, say where, wait for a client (bounded).

    ``runner`` is the ``JobRunner`` (its manifest, host, marker writer); nothing happens
    unless the manifest asks for debugging, or on a host other than 0.
    """
    settings = runner.manifest.get("debug")
    if not settings:
        return
    if runner.host != 0:
        log(f"debug=True: host {runner.host} runs without a debugger (only host 0 waits for one)")
        return
    wait = float(settings.get("wait_seconds") or DEFAULT_WAIT_SECONDS)
    on_timeout = settings.get("on_timeout") or DEFAULT_ON_TIMEOUT
    # debugpy warns (in the job's log) that frozen standard-library modules may miss breakpoints;
    # the function's own code is never frozen, and the interpreter's flags cannot change now.
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    debugpy = _import_debugpy(runner, log)
    # The runner's own threads (heartbeat, metrics) must keep running while the function stands
    # at a breakpoint (debugpy suspends every traced thread): a stale heartbeat would read as a
    # lost node. Every thread alive now is the runner's: the function has not started.
    for thread in threading.enumerate():
        if thread is not threading.current_thread():
            thread.pydev_do_not_trace = True  # type: ignore[attr-defined]
    host, port = debugpy.listen(("127.0.0.1", 0))
    deadline = time.time() + wait
    where = {
        "listen_host": host,
        "port": port,
        "wait_seconds": wait,
        "deadline": deadline,
        "on_timeout": on_timeout,
        "cwd": os.getcwd(),
        "source_file": _source_file(fn),
        "code_sources": dict(getattr(runner, "code_sources", {}) or {}),
        "state": "waiting",
    }
    runner.marker(DEBUG_MARKER, **where)
    job_id = runner.manifest.get("job_id") or "JOB_ID"
    log(
        f"debug=True: debugpy listens on {host}:{port} (pid {os.getpid()}); waiting up to {wait:.0f}s for a "
        f"debugger. Run `kinetic-airflow jobs debug {job_id}` and attach VS Code with the configuration "
        "it prints"
    )
    if _wait_bounded(debugpy, wait):
        runner.marker(DEBUG_MARKER, **{**where, "state": "attached", "attached": time.time()})
        log("debug=True: a debugger attached; running the function")
        return
    runner.marker(DEBUG_MARKER, **{**where, "state": "timed out"})
    if on_timeout == "run":
        log(f"debug=True: no debugger attached within {wait:.0f}s; running the function without one")
        return
    raise DebuggerNotAttached(
        f"debug=True: no debugger attached within {wait:.0f}s (debug_wait), so the job stopped before "
        f"running the function (debug_on_timeout='fail'). Run `kinetic-airflow jobs debug {job_id}` while "
        "the job waits, raise debug_wait, or set debug_on_timeout='run' to run without a debugger"
    )


def _wait_bounded(debugpy: Any, seconds: float) -> bool:
    """``debugpy.wait_for_client()`` has no timeout: run it in a thread and cancel it at the bound."""
    done = threading.Event()

    def wait() -> None:
        try:
            debugpy.wait_for_client()
        finally:
            done.set()

    waiter = threading.Thread(target=wait, name="kinetic-debug-wait", daemon=True)
    waiter.pydev_do_not_trace = True  # type: ignore[attr-defined]
    waiter.start()
    if not done.wait(seconds):
        debugpy.wait_for_client.cancel()
        done.wait(5)
    return bool(debugpy.is_client_connected())


def _import_debugpy(runner: Any, log: Callable[[str], None]) -> Any:
    """debugpy from the image, else installed into the job's environment cache (as ``requirements=``)."""
    try:
        import debugpy  # optional: only a debug=True job needs it, and the image may lack it
    except ImportError:
        # the installer's module, only when debugpy has to be installed
        from kinetic_airflow.job.requirements import InstallError, ensure_environment

        cache = os.environ.get("KINETIC_ENV_CACHE") or os.path.expanduser("~/.cache/kinetic/envs")
        log(f"debug=True: the image has no debugpy; installing {DEBUGPY_REQUIREMENT}")
        try:
            path, _, _ = ensure_environment([DEBUGPY_REQUIREMENT], cache, log)
        except InstallError as exc:
            raise RuntimeError(
                f"debug=True needs debugpy, which this image lacks and which could not be installed: {exc} "
                "Use a container_image with debugpy installed (pip install debugpy), or let the job reach "
                "a package index"
            ) from None
        sys.path.insert(0, path)
        import debugpy  # now installed (optional, as above)
    return debugpy


def _source_file(fn: Any) -> str | None:
    """The file the function's code says it came from: breakpoints are set on this path."""
    code = getattr(getattr(fn, "__wrapped__", fn), "__code__", None) or getattr(fn, "__code__", None)
    return getattr(code, "co_filename", None)
