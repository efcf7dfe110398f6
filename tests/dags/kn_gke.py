"""DAGs for the GKE backend tests (run against the local cluster emulator)."""

from __future__ import annotations

import os
import time

import pendulum
from airflow.sdk import dag, task
from kn_test_util import execute_twice, read_text, record_failure, write_text

START = pendulum.datetime(2026, 1, 1, tz="UTC")


def _where() -> dict:
    return {
        "job": os.environ["KINETIC_JOB_ID"],
        "attempt": os.environ["KINETIC_ATTEMPT"],
        "output_dir": os.environ["KINETIC_OUTPUT_DIR"],
    }


@task.kinetic(backend="gke", accelerator="cpu", pre_execute=execute_twice)
def on_cpu(x: int) -> dict:
    print("running on cpu", flush=True)
    return {"x": x * 2, **_where()}


@task.kinetic(backend="gke", accelerator="gpu-l4")
def on_gpu() -> str:
    return "gpu ok"


@task.kinetic(backend="gke", accelerator="tpu-v6e-8t")  # one 8-chip host: a single-pod Job
def on_tpu() -> str:
    return "tpu ok"


@task.kinetic(backend="gke", on_failure_callback=record_failure)
def raises_value_error():
    raise ValueError("bad learning rate: -1")


@dag(schedule=None, start_date=START, catchup=False)
def kn_gke_basics():
    on_cpu(21)
    on_gpu()
    on_tpu()
    raises_value_error()


@task.kinetic(backend="gke", accelerator="cpu:spot", on_failure_callback=record_failure)
def preemptible_training() -> dict:
    """Attempt 1 checkpoints and waits to be preempted; attempt 2 resumes from the checkpoint."""
    ckpt = os.environ["KINETIC_OUTPUT_DIR"].rstrip("/") + "/ckpt.txt"
    found = read_text(ckpt)
    if found is not None:
        return {"resumed_from": found, **_where()}
    write_text(ckpt, f"written by attempt {os.environ['KINETIC_ATTEMPT']}")
    print("checkpoint written", flush=True)
    time.sleep(120)  # the test preempts it long before
    return {}


@task.kinetic(backend="gke", on_failure_callback=record_failure)
def memory_hog():
    print("allocating", flush=True)
    time.sleep(120)  # the test OOM-kills it long before


@task.kinetic(
    backend="gke",
    container_image="registry.invalid/kinetic/missing:1",
    startup_timeout=3,  # the kubelet retries pulls: only back-off past startup_timeout fails
    on_failure_callback=record_failure,
)
def bad_image():
    return 1


@task.kinetic(backend="gke", accelerator="gpu-h100x8", startup_timeout=2, on_failure_callback=record_failure)
def no_node_pool():
    return 1


@dag(schedule=None, start_date=START, catchup=False)
def kn_gke_faults():
    preemptible_training()
    memory_hog()
    bad_image()
    no_node_pool()


@task.kinetic(backend="gke")
def sleeps_a_while() -> int:
    time.sleep(1)
    return 7


@dag(schedule=None, start_date=START, catchup=False)
def kn_gke_api_faults():
    sleeps_a_while()


@task.kinetic(backend="gke")
def node_goes_silent() -> dict:
    """Attempt 1 is frozen by the test (SIGSTOP: its heartbeat stops while the pod looks alive)."""
    marker = os.environ["KINETIC_OUTPUT_DIR"].rstrip("/") + "/attempt1.txt"
    if read_text(marker) is None:
        write_text(marker, str(os.getpid()))
        time.sleep(120)
    return _where()


@dag(schedule=None, start_date=START, catchup=False)
def kn_gke_stall():
    node_goes_silent()


kn_gke_basics()
kn_gke_faults()
kn_gke_api_faults()
kn_gke_stall()
