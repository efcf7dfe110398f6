"""Issue 38 item 9b: a preempted pod deleted before anyone read it still reads as a preemption.

Each Job carries ``podFailurePolicy`` rule ``{action: FailJob, onPodConditions: [{type:
DisruptionTarget}]}`` (manifest.PREEMPTION_FAILURE_POLICY), so the Job controller writes the
verdict on the Job itself (condition reason ``PodFailurePolicy``, a message naming
``DisruptionTarget``) and it outlives the pod; without it the Job says ``BackoffLimitExceeded``
and the cause is lost with the pod. The emulator's Job controller implements podFailurePolicy
as upstream's ``pod_failure_policy.go`` does (emulator/tests/test_jobs.py).
"""

from __future__ import annotations

import sys
import time

import cloudpickle
import kubernetes
import kubernetes_validate
import pytest
from cluster_emulator import NodePool, wait_until
from emulated_cluster import point_kinetic_at, running_emulator
from jobkit import gke_job

from kinetic_airflow.backends.base import JobState
from kinetic_airflow.backends.gke.backend import k8s_job_name
from kinetic_airflow.backends.gke.classify import classify
from kinetic_airflow.backends.gke.manifest import PREEMPTION_FAILURE_POLICY, build_job_manifest
from kinetic_airflow.backends.registry import get_backend

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _failed_job(reason: str, message: str) -> dict:
    condition = {"type": "Failed", "status": "True", "reason": reason, "message": message}
    return {"metadata": {"name": "j", "uid": "u"}, "status": {"conditions": [condition]}}


def test_the_job_condition_alone_says_preempted():
    message = "Pod ml/kinetic-x-abcde has condition DisruptionTarget matching FailJob rule at index 0"
    status = classify(_failed_job("PodFailurePolicy", message), [])
    assert status.state is JobState.FAILED and status.reason == "Preempted"
    assert status.details["preempted"] is True and message in status.message
    # the same Job failing for another reason stays that reason
    status = classify(_failed_job("BackoffLimitExceeded", "Job has reached the specified backoff limit"), [])
    assert status.reason == "BackoffLimitExceeded" and not status.details.get("preempted")


def test_every_job_manifest_carries_the_rule_and_validates():
    from kinetic_airflow.accelerators import parse_accelerator

    manifest = build_job_manifest(
        name="kinetic-j",
        namespace="ml",
        labels={"job-id": "j"},
        annotations={},
        spec=parse_accelerator("tpu-v6e-8t"),
        image="runner:1",
        job_uri="gs://b/j",
    )
    assert manifest["spec"]["podFailurePolicy"] == PREEMPTION_FAILURE_POLICY
    assert manifest["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # the policy needs it
    kubernetes_validate.validate(manifest, "1.33", strict=True)


@pytest.fixture(scope="module")
def _cluster(tmp_path_factory):
    with running_emulator(tmp_path_factory, [NodePool("cpu", {})]) as running:
        yield running


def sleeps() -> None:
    time.sleep(120)


def test_a_preempted_pod_deleted_before_anyone_looked_is_a_preemption(_cluster, monkeypatch, tmp_path):
    emulator, kubeconfig = _cluster
    point_kinetic_at(emulator, kubeconfig, monkeypatch)
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    _, ref, _ = gke_job("preempted", sleeps, [])
    name = k8s_job_name(ref)

    def running_pod() -> str | None:
        pods = [p for p in emulator.list_objects("pods", "default") if p["metadata"]["name"].startswith(name)]
        return next(
            (p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Running"), None
        )

    pod = wait_until(running_pod, timeout=120)
    emulator.preempt_pod("default", pod, grace_seconds=1)
    job = wait_until(
        lambda: next(
            (
                c
                for c in ((emulator.get_object("jobs", "default", name) or {}).get("status") or {}).get(
                    "conditions", []
                )
                if c["type"] == "Failed" and c["status"] == "True"
            ),
            None,
        ),
        timeout=60,
    )
    assert job["reason"] == "PodFailurePolicy", job
    core = kubernetes.client.CoreV1Api(emulator.api_client())
    core.delete_namespaced_pod(pod, "default", grace_period_seconds=0)
    wait_until(lambda: emulator.get_object("pods", "default", pod) is None, timeout=30)
    status = get_backend("gke").status(ref)  # the first look: the pod is gone
    assert status.state is JobState.FAILED and status.reason == "Preempted", status
    assert status.details["preempted"] is True and "DisruptionTarget" in status.message
