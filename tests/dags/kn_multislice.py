"""DAGs for the multislice tests (slices=2 of tpu-v6e-16: one JobSet, 2 x 4 hosts), run
against the cluster emulator."""

from __future__ import annotations

import os
import time

import pendulum
from airflow.sdk import dag, task

START = pendulum.datetime(2026, 1, 1, tz="UTC")
MULTISLICE = {"backend": "auto", "accelerator": "tpu-v6e-16", "slices": 2}


def _host() -> int:
    return int(os.environ["KINETIC_HOST_INDEX"])


def _barrier(name: str, hosts: int, timeout: float = 120) -> None:
    """Every host marks itself, then waits for all (a stand-in for a collective)."""
    out, attempt = os.environ["KINETIC_OUTPUT_DIR"], os.environ["KINETIC_ATTEMPT"]
    with open(os.path.join(out, f"{name}-a{attempt}-h{_host()}"), "w"):
        pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(f.startswith(f"{name}-a{attempt}-h") for f in os.listdir(out)) == hosts:
            return
        time.sleep(0.1)
    raise TimeoutError(f"not every host of {hosts} reached {name}")


@task.kinetic(**MULTISLICE, container_env={"JAX_PLATFORMS": "cpu"})
def multislice_collective() -> dict:
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    from kinetic_airflow.job.multihost import initialize_jax

    initialize_jax()  # unchanged: the process id and count span both slices
    me = jax.process_index()
    gathered = multihost_utils.process_allgather(jnp.array([me + 1])).ravel().tolist()
    print(
        f"process {me} of {jax.process_count()} (slice {os.environ['MEGASCALE_SLICE_ID']}): "
        f"allgather {gathered}",
        flush=True,
    )
    assert sum(gathered) == sum(range(1, jax.process_count() + 1)), gathered
    return {
        "gathered": gathered,
        "env": {
            k: os.environ.get(k)
            for k in ("MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID", "MEGASCALE_PORT", "KINETIC_NUM_HOSTS")
        },
        "megascale_coordinator": os.environ.get("MEGASCALE_COORDINATOR_ADDRESS"),
    }


@dag(schedule=None, start_date=START, catchup=False)
def kn_multislice_jax():
    multislice_collective()


class HostFailure(Exception):
    pass


@task.kinetic(**MULTISLICE)
def slice_1_host_fails() -> str:
    print(f"host {_host()} starting", flush=True)
    if _host() == 6:  # slice 1, host 2
        raise HostFailure("bad shard on host 6")
    time.sleep(600)  # the others wait in their "collective" until the attempt is stopped
    return "never"


@dag(schedule=None, start_date=START, catchup=False)
def kn_multislice_host_fails():
    slice_1_host_fails()


@task.kinetic(**MULTISLICE)
def multislice_resumes() -> dict:
    attempt = int(os.environ["KINETIC_ATTEMPT"])
    if attempt == 1:
        _barrier("ready", 8)  # every host of both slices is up: the test preempts one now
        time.sleep(600)
    _barrier("resume", 8)
    return {"attempt": attempt, "hosts": int(os.environ["KINETIC_NUM_HOSTS"])}


@dag(schedule=None, start_date=START, catchup=False)
def kn_multislice_preempted():
    multislice_resumes()


kn_multislice_jax()
kn_multislice_host_fails()
kn_multislice_preempted()
