"""A graceful stop the function can see: ``kinetic_airflow.stop_requested()`` and ``on_stop(hook)``.

Runs in the job (standard library only, no Airflow). When the job is told to stop (SIGTERM: a
cancel, the task's ``execution_timeout``, mark failed, a Spot preemption or a Kueue eviction),
the runner's signal handler calls :func:`request_stop`, which only sets a flag and starts the
``kinetic-stop`` thread. That thread then:

1. runs the hooks registered with :func:`on_stop`, once each, in the order registered;
2. waits until the function has returned (or raised) and the hooks are done, at most
   ``stop_grace_seconds`` from the signal;
3. hands over to the runner's ``finish`` (flush the reported metrics, then end of SIGTERM as
   before, so the watchers see the same stop as without a grace period).

The hooks run in that dedicated thread, not in the signal handler: Python runs a handler in the
main thread between two bytecodes of whatever the function is doing, so a hook run there would
interrupt the function mid-step (a half-updated model), could deadlock on a lock the function
holds (logging, I/O), and would keep the function from reaching its own step boundary. A hook
therefore runs beside the function: one that saves a checkpoint should save state the function
does not change underneath it, or the function should poll :func:`stop_requested` at a step
boundary and save there (what ``kinetic_airflow.keras.CheckpointOnStop`` does).

Outside a job (a local call of the function, a unit test) nothing ever asks for a stop:
:func:`stop_requested` is False and hooks never run.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "FLUSH_MARGIN_SECONDS",
    "kill_after_seconds",
    "on_stop",
    "stop_requested",
]

# What a function gets between the stop and the end when no option says otherwise.
DEFAULT_GRACE_SECONDS = 30.0
# What the backend adds to the grace before it kills: the runner's own end after the grace (the
# ``terminated`` marker, the last metrics chunk, tried up to three times) must fit in it.
FLUSH_MARGIN_SECONDS = 10.0

_requested = threading.Event()
_function_done = threading.Event()
_hooks: list[Callable[[], Any]] = []
# Reentrant: the SIGTERM handler (request_stop) runs in the main thread, which may be inside
# on_stop holding it.
_hooks_lock = threading.RLock()
_thread: threading.Thread | None = None


def kill_after_seconds(grace: float | None) -> float:
    """How long a backend waits between SIGTERM and SIGKILL for a job with this grace."""
    return (DEFAULT_GRACE_SECONDS if grace is None else float(grace)) + FLUSH_MARGIN_SECONDS


def stop_requested() -> bool:
    """True once this job has been asked to stop (cancel, timeout, mark failed, preemption).

    Cheap (one flag read): poll it at a step boundary, save a checkpoint to
    ``KINETIC_OUTPUT_DIR`` and return. The job still ends as stopped (the task does not succeed
    with a half-trained result). Outside a kinetic job it is always False.
    """
    return _requested.is_set()


def on_stop(callback: Callable[[], Any]) -> Callable[[], Any]:
    """Run ``callback()`` once when the job is asked to stop; returns it (usable as a decorator).

    It runs in the runner's ``kinetic-stop`` thread, beside the function, within the job's
    ``stop_grace_seconds``; an exception it raises is logged and the other hooks still run.
    Registered after the stop was asked, it runs at once in the calling thread.
    """
    if not callable(callback):
        raise TypeError(
            f"kinetic_airflow.on_stop takes a function to call with no arguments, not "
            f"{type(callback).__name__}; pass e.g. on_stop(lambda: model.save(path))"
        )
    with _hooks_lock:
        if not _requested.is_set():
            _hooks.append(callback)
            return callback
    _run_hook(callback)
    return callback


def _log(message: str) -> None:
    sys.stderr.write(f"[kinetic] {message}\n")
    sys.stderr.flush()


def _run_hook(hook: Callable[[], Any]) -> None:
    try:
        hook()
    except BaseException as exc:  # one hook's failure must not cost the others their turn
        name = getattr(hook, "__qualname__", None) or repr(hook)
        _log(f"stop hook {name} raised {type(exc).__name__}: {exc}")


# The runner's side ----------------------------------------------------------------------------
def request_stop(grace: float, before_hooks: Callable[[], Any], finish: Callable[[], Any]) -> None:
    """Called by the runner's SIGTERM handler: set the flag and start the ``kinetic-stop`` thread
    (once; a second signal changes nothing). ``before_hooks`` runs first in that thread (the
    ``terminated`` marker), ``finish`` last (flush the metrics, end the process); ``grace`` counts
    from now."""
    global _thread
    with _hooks_lock:
        if _requested.is_set():
            return
        _requested.set()
        hooks = list(_hooks)
    deadline = time.monotonic() + max(float(grace), 0.0)
    _thread = threading.Thread(
        target=_stop_sequence, args=(hooks, deadline, before_hooks, finish), name="kinetic-stop", daemon=True
    )
    _thread.start()


def function_finished() -> None:
    """The function has returned or raised: the stop need not wait for it any longer."""
    _function_done.set()


def _stop_sequence(
    hooks: list[Callable[[], Any]],
    deadline: float,
    before_hooks: Callable[[], Any],
    finish: Callable[[], Any],
) -> None:
    hooks_done = threading.Event()
    try:  # the watchers' record of the stop comes first, whatever the hooks do
        before_hooks()
    except BaseException as exc:
        _log(f"could not record the stop: {exc}")

    def run_hooks() -> None:
        for hook in hooks:
            _run_hook(hook)
        hooks_done.set()

    # The hooks get their own thread so a hook that hangs cannot hold the end past the grace.
    threading.Thread(target=run_hooks, name="kinetic-stop-hooks", daemon=True).start()
    while time.monotonic() < deadline:
        if hooks_done.is_set() and _function_done.is_set():
            break
        hooks_done.wait(min(0.1, max(deadline - time.monotonic(), 0)))
    else:
        waiting = [
            w
            for w, done in (("the stop hooks", hooks_done), ("the function", _function_done))
            if not done.is_set()
        ]
        _log(f"stop grace period over; {' and '.join(waiting)} still running: ending the job")
    finish()


def _reset_for_tests() -> None:
    """Forget a stop (tests run several stops in one process)."""
    global _thread
    with _hooks_lock:
        _requested.clear()
        _function_done.clear()
        _hooks.clear()
        _thread = None
