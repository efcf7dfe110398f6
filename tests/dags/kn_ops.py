"""DAGs for the operations tests (jobs CLI, gc, reproduce, kinetic interop, pod overrides).

Each factory builds its DAG for one backend (``local`` or ``gke``/``auto`` on the emulator); the
DAGs are made at import (dag.test() needs them in the parsed file) and found in ``DAGS``.
Storage comes from KINETIC_BASE_URI.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pendulum
from airflow.sdk import dag, task
from kn_test_util import record_failure

START = pendulum.datetime(2026, 1, 1, tz="UTC")


def ops_dag(backend: str):
    """A job that succeeds (printing), one that raises, one whose result stays in storage."""

    @task.kinetic(backend=backend)
    def greet(name: str) -> dict:
        for i in range(3):
            print(f"hello {name} line {i}", flush=True)
        # Terminal control sequences (set the window title, clear the screen): `jobs logs` escapes them.
        print("\x1b]0;a job set this title\x07\x1b[2Jscreen cleared", flush=True)
        return {"greeting": f"hello {name}", "job": os.environ["KINETIC_JOB_ID"]}

    @task.kinetic(backend=backend, on_failure_callback=record_failure)
    def diverges(lr: float) -> float:
        step = 42  # noqa: F841  (a local the --pdb test prints)
        print("training...", flush=True)
        raise ValueError(f"bad learning rate: {lr}")

    @task.kinetic(backend=backend)
    def big() -> bytes:
        return b"x" * 1000  # bytes cannot be XCom: XCom gets a reference to result.pkl

    @dag(dag_id=f"kn_ops_{backend}", schedule=None, start_date=START, catchup=False)
    def kn_ops():
        greet("ops")
        diverges(-1.0)
        big()

    return kn_ops()


def waiting_dag(backend: str, accelerator: str = "cpu", name: str | None = None):
    """One job that prints, then waits until $KN_OPS_FLAG exists (or 120 s): a live job for a test."""

    @task.kinetic(backend=backend, accelerator=accelerator, on_failure_callback=record_failure)
    def waits() -> str:
        flag_path = os.environ["KN_OPS_FLAG"]
        print("started waiting", flush=True)
        deadline = time.time() + 120
        while not Path(flag_path).exists() and time.time() < deadline:
            time.sleep(0.1)
        print("done waiting", flush=True)
        return "waited"

    @dag(dag_id=f"kn_ops_wait_{name or backend}", schedule=None, start_date=START, catchup=False)
    def kn_ops_wait():
        waits()

    return kn_ops_wait()


# Pod overrides (cluster backends) -----------------------------------------------------------
SECRET_REF = {"name": "db-creds", "key": "password"}
LINUX = {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
RESOURCES_OVERRIDE = {
    "metadata": {
        "labels": {"team": "vision", "cost-center": "ml-42"},
        "annotations": {"example.com/owner": "ml-platform"},
    },
    "spec": {
        "containers": [
            {
                "name": "kinetic-worker",
                "resources": {
                    "requests": {"cpu": "500m", "memory": "2Gi"},
                    "limits": {"cpu": "2", "memory": "8Gi"},
                },
                "env": [
                    {
                        "name": "DB_PASSWORD",
                        "valueFrom": {"secretKeyRef": {"name": "db-creds", "key": "password"}},
                    },
                    {"name": "MODE", "value": "override"},
                ],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            }
        ],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "imagePullSecrets": [{"name": "regcred"}],
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
                            ]
                        }
                    ]
                }
            }
        },
    },
}

REMOVAL_OVERRIDE = {
    "metadata": {"annotations": {"#cluster-autoscaler.kubernetes.io/safe-to-evict": None}},
    "spec": {"containers": [{"name": "base", "env": [{"name": "#JAX_PLATFORMS"}]}]},
}


def override_dag(backend: str, pvc_claim: str | None = None):
    @task.kinetic(backend=backend, pod_override=RESOURCES_OVERRIDE)
    def with_secret() -> dict:
        secret = os.environ.get("DB_PASSWORD", "")
        return {
            "secret_sha256": hashlib.sha256(secret.encode()).hexdigest(),
            "mode": os.environ.get("MODE"),
        }

    @task.kinetic(backend=backend, pod_override=REMOVAL_OVERRIDE)
    def without_defaults() -> dict:
        return {"jax_platforms": os.environ.get("JAX_PLATFORMS"), "keras": os.environ.get("KERAS_BACKEND")}

    @dag(dag_id=f"kn_ops_override_{backend}", schedule=None, start_date=START, catchup=False)
    def kn_ops_override():
        with_secret()
        without_defaults()

    return kn_ops_override()


def pathways_override_dag():
    override = {
        "metadata": {"labels": {"team": "pathways"}},
        "spec": {"containers": [{"name": "kinetic-worker", "env": [{"name": "MODE", "value": "lws"}]}]},
    }

    @task.kinetic(backend="auto", accelerator="tpu-v6e-16", pod_override=override)
    def host_mode() -> dict:
        return {"mode": os.environ.get("MODE"), "host": os.environ.get("KINETIC_HOST_INDEX")}

    @dag(dag_id="kn_ops_override_pathways", schedule=None, start_date=START, catchup=False)
    def kn_ops_override_pathways():
        host_mode()

    return kn_ops_override_pathways()


DAGS = {
    d.dag_id: d
    for d in (
        ops_dag("local"),
        ops_dag("gke"),
        waiting_dag("local"),
        waiting_dag("gke"),
        waiting_dag("auto", accelerator="tpu-v6e-16", name="pathways"),  # a 4-host LeaderWorkerSet
        override_dag("gke"),
        pathways_override_dag(),
    )
}
