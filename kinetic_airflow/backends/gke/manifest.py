"""The batch/v1 Job manifest of one attempt: accelerator -> selectors, resources, tolerations.

Plain dicts in Kubernetes' JSON shape, so they can be validated offline, logged,
and sent by any client. Airflow owns retries, hence ``backoffLimit: 0``.
"""

from __future__ import annotations

from typing import Any

from kinetic_airflow.accelerators import AcceleratorSpec

__all__ = ["CONTAINER_NAME", "DEFAULT_IMAGES", "build_job_manifest", "default_image"]

CONTAINER_NAME = "kinetic-worker"
# Documented defaults per accelerator kind; build them from docker/ and override with
# container_image= or [kinetic] container_image.
DEFAULT_IMAGES = {
    "cpu": "us-docker.pkg.dev/kinetic-airflow/runner/runner-cpu:py3.11",
    "gpu": "us-docker.pkg.dev/kinetic-airflow/runner/runner-gpu:py3.11",
    "tpu": "us-docker.pkg.dev/kinetic-airflow/runner/runner-tpu:py3.11",
}
# Long enough that a triggerer restarted after an outage still finds the finished Job.
TTL_AFTER_FINISHED_SECONDS = 24 * 3600
CPU_REQUESTS = {"cpu": "1", "memory": "4Gi"}


def default_image(spec: AcceleratorSpec) -> str:
    return DEFAULT_IMAGES[spec.kind]


def build_job_manifest(
    *,
    name: str,
    namespace: str,
    labels: dict[str, str],
    annotations: dict[str, str],
    spec: AcceleratorSpec,
    image: str,
    job_uri: str,
    python: str = "python",
    service_account: str | None = "kinetic",
    active_deadline_seconds: int | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if spec.resources:
        resources = {"limits": dict(spec.resources), "requests": dict(spec.resources)}
    else:
        resources = {"requests": dict(CPU_REQUESTS)}
    container_env = [{"name": k, "value": str(v)} for k, v in sorted((env or {}).items())]
    container_env.append({"name": "KINETIC_JOB_ID", "value": labels.get("job-id", name)})
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": CONTAINER_NAME,
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": [python, "-m", "kinetic_airflow.runner", "--job-uri", job_uri],
                "env": container_env,
                "resources": resources,
            }
        ],
    }
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    if spec.node_selectors:
        pod_spec["nodeSelector"] = dict(spec.node_selectors)
    if spec.tolerations:
        pod_spec["tolerations"] = [t.to_k8s() for t in spec.tolerations]
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,
        "completions": 1,
        "parallelism": 1,
        "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_SECONDS,
        "template": {
            "metadata": {
                "labels": dict(labels),
                # a training pod must not be evicted to save a node: it would lose its work
                "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false", **annotations},
            },
            "spec": pod_spec,
        },
    }
    if active_deadline_seconds:
        job_spec["activeDeadlineSeconds"] = int(active_deadline_seconds)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels),
            "annotations": annotations,
        },
        "spec": job_spec,
    }
