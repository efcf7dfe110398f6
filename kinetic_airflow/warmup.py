"""Load what triggers of cluster jobs import, in the triggerer, before it forks its trigger runner.

Airflow's triggerer runs every trigger on one event-loop thread. A trigger's first look at a
cluster job imports the Kubernetes clients in a worker thread (the cncf-kubernetes hook module
alone is about 1.3 s of CPU on an idle core, several seconds on a busy one). Imports hold the
GIL, and the loop thread, which needs it back at every wake-up, falls behind: Airflow logs a
blocked loop and every trigger's events wait. Airflow calls its listeners' ``on_starting`` when
a job component is created, and the triggerer creates its job before it forks the process that
runs triggers, so what is imported here is already loaded there: no trigger imports anything.

Then the loaded modules are frozen out of Python's cyclic garbage collector (``gc.freeze``): a
full collection walks every tracked object, and with Airflow and the Kubernetes and Google
clients loaded that is several hundred thousand objects, a quarter of a second on an idle core
and over a second on a busy one, during which no thread runs, the event loop included. Objects
that live for the life of the process never need collecting; frozen, they are never walked.

Left out where it cannot help: processes other than ``airflow triggerer`` (``on_starting`` runs
in the scheduler and dag processor too) and deployments whose default backend is ``local``
(about 110 MB of client libraries for nothing; their cluster tasks import on first use).
"""

from __future__ import annotations

import gc
import importlib
import logging
import sys
import time
from typing import Any

from airflow.listeners import hookimpl

from kinetic_airflow.config import resolve_setting

__all__ = ["WARM_MODULES", "on_starting"]

log = logging.getLogger(__name__)

WARM_MODULES = (
    "kinetic_airflow.triggers",
    "kinetic_airflow.watch",
    "kinetic_airflow.connections",
    "kinetic_airflow.lifecycle",
    "kinetic_airflow.backends.local",
    "kinetic_airflow.backends.gke.pathways",
    "airflow.providers.cncf.kubernetes.hooks.kubernetes",
    "airflow.providers.google.cloud.hooks.kubernetes_engine",
    "airflow.providers.google.cloud.hooks.gcs",
)


def _is_triggerer() -> bool:
    """``airflow triggerer`` (the job is not yet typed when listeners hear of it)."""
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    return bool(args) and args[0] == "triggerer"


def warm_up() -> list[str]:
    """Import ``WARM_MODULES``; returns those that could not be imported (optional providers)."""
    missing = []
    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    gc.collect()  # what the imports left as garbage goes now, once, before the loop exists
    gc.freeze()
    return missing


@hookimpl
def on_starting(component: Any) -> None:
    if not _is_triggerer():
        return
    try:
        if resolve_setting("backend") == "local":
            return
    except Exception:  # a bad setting is reported where it is used, not by the warm-up
        return
    started = time.monotonic()
    missing = warm_up()
    log.info(
        "kinetic: loaded the cluster clients for triggers in %.1fs%s",
        time.monotonic() - started,
        f" (not installed: {', '.join(missing)})" if missing else "",
    )
