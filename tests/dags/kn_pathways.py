"""DAGs for the multi-host (Pathways, LeaderWorkerSet) tests, run against the cluster emulator.

Every host runs the same function, as on a TPU slice; they meet in KINETIC_OUTPUT_DIR (a
shared directory here) where a real job would meet in a collective.
"""

from __future__ import annotations

import datetime as dt
import os
import time

import pendulum
from airflow.sdk import dag, task

START = pendulum.datetime(2026, 1, 1, tz="UTC")


def _host() -> int:
    return int(os.environ["KINETIC_HOST_INDEX"])


def _barrier(name: str, hosts: int, timeout: float = 120) -> list[int]:
    """Every host marks itself, then waits for all: a stand-in for a collective."""
    out = os.environ["KINETIC_OUTPUT_DIR"]
    attempt = os.environ["KINETIC_ATTEMPT"]
    with open(os.path.join(out, f"{name}-a{attempt}-h{_host()}"), "w") as fh:
        fh.write(os.environ.get("KINETIC_COORDINATOR_ADDRESS", ""))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = sorted(
            int(f.rsplit("-h", 1)[1]) for f in os.listdir(out) if f.startswith(f"{name}-a{attempt}-h")
        )
        if len(seen) == hosts:
            return seen
        time.sleep(0.1)
    raise TimeoutError(f"only {len(seen)} of {hosts} hosts reached {name}")


@task.kinetic(backend="auto", accelerator="tpu-v6e-16")
def every_host_runs() -> dict:
    hosts = int(os.environ["KINETIC_NUM_HOSTS"])
    seen = _barrier("start", hosts)
    print(f"host {_host()} of {hosts} sees {seen}", flush=True)
    return {
        "host": _host(),
        "seen": seen,
        "env": {
            k: os.environ.get(k)
            for k in (
                "KERAS_BACKEND",
                "JAX_PLATFORMS",
                "TPU_WORKER_ID",
                "KINETIC_NUM_HOSTS",
            )
        },
        "coordinator": os.environ.get("KINETIC_COORDINATOR_ADDRESS"),
        "hostnames": os.environ.get("TPU_WORKER_HOSTNAMES"),
    }


@dag(schedule=None, start_date=START, catchup=False)
def kn_pathways_all_hosts():
    every_host_runs()


class HostFailure(Exception):
    def __init__(self, host: int, detail: str) -> None:
        super().__init__(f"host {host} broke: {detail}")
        self.host = host


@task.kinetic(backend="auto", accelerator="tpu-v6e-16")
def one_worker_raises() -> str:
    print(f"host {_host()} starting", flush=True)
    if _host() == 2:
        raise HostFailure(2, "bad shard")
    time.sleep(600)  # the others wait in their "collective" until the group is stopped
    return "never"


@dag(schedule=None, start_date=START, catchup=False)
def kn_pathways_worker_fails():
    one_worker_raises()


@task.kinetic(backend="auto", accelerator="tpu-v6e-16")
def every_worker_raises() -> str:
    _barrier("all-up", 4)  # every host fails, at about the same time
    raise ValueError("every host: bad config")


@dag(schedule=None, start_date=START, catchup=False)
def kn_pathways_all_fail():
    every_worker_raises()


@task.kinetic(backend="auto", accelerator="tpu-v6e-16")
def resumes_after_preemption() -> dict:
    out = os.environ["KINETIC_OUTPUT_DIR"]
    attempt = int(os.environ["KINETIC_ATTEMPT"])
    checkpoint = os.path.join(out, "checkpoint")
    if attempt == 1:
        if _host() == 0:
            with open(checkpoint, "w") as fh:
                fh.write("step=7")
        _barrier("ready", 4)  # every host is up: the test preempts one now
        time.sleep(600)
    _barrier("resume", 4)
    with open(checkpoint) as fh:
        return {"attempt": attempt, "resumed_from": fh.read()}


@dag(schedule=None, start_date=START, catchup=False)
def kn_pathways_preempted():
    resumes_after_preemption()


@task.kinetic(backend="auto", accelerator="tpu-v6e-16", execution_timeout=dt.timedelta(seconds=20))
def runs_too_long() -> None:
    time.sleep(600)


@dag(schedule=None, start_date=START, catchup=False)
def kn_pathways_timeout():
    runs_too_long()


@task.kinetic(backend="auto", accelerator="tpu-v6e-16", container_env={"JAX_PLATFORMS": "cpu"})
def jax_collective() -> list:
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    # From the environment every host gets. On a TPU slice a bare initialize() finds the same
    # from TPU_WORKER_HOSTNAMES/TPU_WORKER_ID (JAX's GKE TPU detection); JAX on CPU has no such
    # detection, so the test passes kinetic's variables.
    jax.distributed.initialize(
        coordinator_address=os.environ["KINETIC_COORDINATOR_ADDRESS"],
        num_processes=int(os.environ["KINETIC_NUM_HOSTS"]),
        process_id=int(os.environ["KINETIC_HOST_INDEX"]),
        cluster_detection_method="deactivate",  # everything is given: detect nothing
    )
    me = jax.process_index()
    gathered = multihost_utils.process_allgather(jnp.array([me + 1]))
    total = int(gathered.sum())
    print(f"process {me} of {jax.process_count()}: allgather {gathered.ravel().tolist()} sum {total}")
    assert total == sum(range(1, jax.process_count() + 1)), total
    return gathered.ravel().tolist()


@dag(schedule=None, start_date=START, catchup=False)
def kn_pathways_jax():
    jax_collective()


@task.kinetic(backend="auto", accelerator="tpu-v6e-16")
def one_host_runs_out_of_memory() -> None:
    print(f"host {_host()} up", flush=True)
    time.sleep(600)  # the test OOM-kills host 3 meanwhile


@dag(schedule=None, start_date=START, catchup=False)
def kn_pathways_oom():
    one_host_runs_out_of_memory()


kn_pathways_all_hosts()
kn_pathways_worker_fails()
kn_pathways_all_fail()
kn_pathways_preempted()
kn_pathways_timeout()
kn_pathways_jax()
kn_pathways_oom()
