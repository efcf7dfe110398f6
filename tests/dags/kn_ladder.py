"""DAGs for tests/test_capacity_ladder.py: capacity ladders whose first rung never gets nodes."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

START = pendulum.datetime(2026, 1, 1, tz="UTC")


# Spot L4s are stocked out in the test's cluster: rung 1 never gets a node; rung 2 (on-demand) does.
@task.kinetic(backend="gke", accelerator="gpu-l4", capacity=[("spot", 2), "on-demand"])
def spot_then_on_demand() -> str:
    import os

    return f"ran in {os.environ['KINETIC_JOB_ID']}"


# The test's cluster has no A100 pool at all: rung 1 is unschedulable with no scale-up possible.
@task.kinetic(backend="gke", accelerator=[("gpu-a100", 2), "gpu-l4"])
def a100_else_l4() -> str:
    return "l4"


# Every rung is stocked out (the test stocks out on-demand L4s too): the ladder is used up and
# the task fails, naming the last rung's cause.
@task.kinetic(backend="gke", accelerator="gpu-l4", capacity=[("spot", 2), ("on-demand", 2)], retries=0)
def nothing_starts() -> str:
    return "never"


@dag(schedule=None, start_date=START, catchup=False)
def kn_ladder():
    spot_then_on_demand()
    a100_else_l4()


@dag(schedule=None, start_date=START, catchup=False)
def kn_ladder_used_up():
    nothing_starts()


kn_ladder()
kn_ladder_used_up()


# Multi-host TPU rungs: a LeaderWorkerSet (pathways) and a JobSet (multislice) per rung. Spot
# v6e 2x4 slices are stocked out in the test's cluster; on-demand ones are not.
@task.kinetic(backend="auto", accelerator="tpu-v6e-8", capacity=[("spot", 2), "on-demand"])
def slice_spot_then_on_demand() -> int:
    import os

    return int(os.environ["KINETIC_NUM_HOSTS"])


@task.kinetic(backend="auto", accelerator="tpu-v6e-8", slices=2, capacity=[("spot", 2), "on-demand"])
def multislice_spot_then_on_demand() -> int:
    import os

    return int(os.environ["KINETIC_NUM_HOSTS"])


@dag(schedule=None, start_date=START, catchup=False)
def kn_ladder_slices():
    slice_spot_then_on_demand()
    multislice_spot_then_on_demand()


kn_ladder_slices()


def _wait_to_be_preempted_on_attempt_2() -> str:
    """Attempt 2 (the ladder's second rung) waits to be preempted; any other attempt returns."""
    import os
    import time

    job = os.environ["KINETIC_JOB_ID"]
    if job.endswith("-t1a2"):
        print("attempt 2 waits to be preempted", flush=True)
        time.sleep(120)
    return job


# Preempted on rung 2 (on-demand): resubmitted from the first rung (Spot, stocked out), by default
@task.kinetic(backend="gke", accelerator="gpu-l4", capacity=[("spot", 2), "on-demand"])
def preempted_from_first_rung() -> str:
    return _wait_to_be_preempted_on_attempt_2()


# ... or on the rung it was preempted on
@task.kinetic(
    backend="gke", accelerator="gpu-l4", capacity=[("spot", 2), "on-demand"], rung_after_preemption="same"
)
def preempted_on_same_rung() -> str:
    return _wait_to_be_preempted_on_attempt_2()


@dag(schedule=None, start_date=START, catchup=False)
def kn_ladder_preempted():
    preempted_from_first_rung()
    preempted_on_same_rung()


kn_ladder_preempted()


# No backend named: [kinetic] backend decides when the task runs (the test says local)
@task.kinetic(accelerator="gpu-l4", capacity=["spot", "on-demand"], retries=0)
def ladder_on_configured_backend() -> str:
    return "ran"


@dag(schedule=None, start_date=START, catchup=False)
def kn_ladder_configured_local():
    ladder_on_configured_backend()


kn_ladder_configured_local()


# Through Kueue: rung 1 is not admitted in its 3 s (a blocker holds the queue's quota) and is
# withdrawn with its Workload; rung 2 waits its turn and runs once the quota is free.
@task.kinetic(backend="gke", local_queue="ladder-q", capacity=[("spot", 3), "on-demand"])
def queued_spot_then_on_demand() -> str:
    return "admitted on rung 2"


@dag(schedule=None, start_date=START, catchup=False)
def kn_ladder_kueue():
    queued_spot_then_on_demand()


kn_ladder_kueue()
