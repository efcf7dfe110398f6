"""Many kinetic jobs deferred at once on the cluster backends, for tests/test_triggerer_concurrency.py.

Every job prints a line a second and runs until the test creates ``$KN_RELEASE`` (a file on this
machine, set in the emulator's environment, which its pods inherit), so all of them are deferred
together for as long as the test wants, whatever the machine's speed. The triggerer then follows
twenty Jobs (or twenty two-host LeaderWorkerSets, forty pods) at once: the shared watch, the log
streams and the client look-ups of every trigger in one event loop.
"""

from __future__ import annotations

import os
import time

import pendulum
from airflow.sdk import dag, task

START = pendulum.datetime(2026, 1, 1, tz="UTC")
TAGS = ["kinetic-concurrency-test"]
WIDTH = 20
_MAX_SECONDS = 600  # a job never outlives a broken test by long


def _run_until_released(i: int) -> dict:
    release = os.environ["KN_RELEASE"]
    host = os.environ.get("KINETIC_HOST_INDEX", "0")
    started = time.time()
    beats = 0
    while not os.path.exists(release) and time.time() - started < _MAX_SECONDS:
        beats += 1
        print(f"member {i} host {host} beat {beats}", flush=True)
        time.sleep(1.0)
    return {"i": i, "host": host, "released": os.path.exists(release)}


@task.kinetic(backend="gke")
def long_job(i: int) -> dict:
    return _run_until_released(i)


@task.kinetic(backend="pathways", accelerator="tpu-v6e-8")
def long_slice(i: int) -> dict:
    return _run_until_released(i)


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS, max_active_tasks=WIDTH)
def kn_concurrent_gke():
    long_job.expand(i=list(range(WIDTH)))


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS, max_active_tasks=WIDTH)
def kn_concurrent_pathways():
    long_slice.expand(i=list(range(WIDTH)))


kn_concurrent_gke()
kn_concurrent_pathways()
