"""DAGs for tests/test_kueue_jobs.py: jobs in a Kueue LocalQueue on the cluster emulator."""

from __future__ import annotations

import os
import time

import pendulum
from airflow.sdk import dag, task
from kn_test_util import read_text, record_failure, write_text

START = pendulum.datetime(2026, 1, 1, tz="UTC")


# startup_timeout is far shorter than the wait for the quota: it must count from admission
@task.kinetic(backend="gke", local_queue="team-a", startup_timeout=6)
def waits_its_turn() -> str:
    print("admitted and running", flush=True)
    return "ran after the queue"


@dag(schedule=None, start_date=START, catchup=False)
def kn_kueue_turn():
    waits_its_turn()


@task.kinetic(backend="gke", local_queue="team-a", queue_timeout=4, on_failure_callback=record_failure)
def waits_too_long() -> str:
    return "never admitted"


@dag(schedule=None, start_date=START, catchup=False)
def kn_kueue_timeout():
    waits_too_long()


@task.kinetic(backend="gke", local_queue="team-a", on_failure_callback=record_failure)
def evicted_training() -> dict:
    """Attempt 1 checkpoints and waits to be evicted; attempt 2 resumes from the checkpoint."""
    ckpt = os.environ["KINETIC_OUTPUT_DIR"].rstrip("/") + "/ckpt.txt"
    found = read_text(ckpt)
    if found is not None:
        return {"resumed_from": found, "attempt": os.environ["KINETIC_ATTEMPT"]}
    write_text(ckpt, f"written by attempt {os.environ['KINETIC_ATTEMPT']}")
    print("checkpoint written", flush=True)
    time.sleep(120)  # the test evicts it long before
    return {}


@dag(schedule=None, start_date=START, catchup=False)
def kn_kueue_eviction():
    evicted_training()


@task.kinetic(
    backend="gke",
    accelerator="gpu-l4",
    capacity="queued",
    local_queue="dws",
    on_failure_callback=record_failure,
)
def provisioned() -> str:
    return "ran on provisioned nodes"


@dag(schedule=None, start_date=START, catchup=False)
def kn_kueue_provisioning():
    provisioned()


kn_kueue_turn()
kn_kueue_timeout()
kn_kueue_eviction()
kn_kueue_provisioning()
