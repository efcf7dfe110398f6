"""The batch/v1 Job manifest of one attempt: accelerator -> selectors, resources, tolerations.

Plain dicts in Kubernetes' JSON shape, so they can be validated offline, logged,
and sent by any client. Airflow owns retries, hence ``backoffLimit: 0``.
"""

from __future__ import annotations

from typing import Any

from kinetic_airflow.accelerators import AcceleratorSpec

__all__ = [
    "CONTAINER_NAME",
    "DEFAULT_IMAGES",
    "build_job_manifest",
    "default_image",
    "platform_env",
    "pod_spec",
]

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


# What kinetic sets so Keras and JAX pick the job's hardware (kinetic's k8s_utils values).
JAX_PLATFORMS = {"cpu": "cpu", "gpu": "gpu", "tpu": "tpu"}


def platform_env(spec: AcceleratorSpec, user_env: dict[str, str] | None) -> dict[str, str]:
    """KERAS_BACKEND=jax and JAX_PLATFORMS for the accelerator kind, unless the user set them."""
    env = {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": JAX_PLATFORMS[spec.kind]}
    return {k: v for k, v in env.items() if k not in (user_env or {})}


def pod_spec(
    *,
    spec: AcceleratorSpec,
    image: str,
    job_uri: str,
    job_id: str,
    python: str = "python",
    service_account: str | None = "kinetic",
    env: dict[str, str] | None = None,
    extra_env: list[dict[str, Any]] | None = None,
    restart_policy: str = "Never",
) -> dict[str, Any]:
    """The pod of one host: the runner, the accelerator's resources, selectors and tolerations."""
    resources: dict[str, Any] = {}
    if spec.resources:
        resources = {"limits": dict(spec.resources), "requests": dict(spec.resources)}
    else:
        resources = {"requests": dict(CPU_REQUESTS)}
    values = {**platform_env(spec, env), **(env or {})}
    container_env = [{"name": k, "value": str(v)} for k, v in sorted(values.items())]
    container_env.append({"name": "KINETIC_JOB_ID", "value": job_id})
    container_env.extend(extra_env or [])
    spec_dict: dict[str, Any] = {
        "restartPolicy": restart_policy,
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
        spec_dict["serviceAccountName"] = service_account
    if spec.node_selectors:
        spec_dict["nodeSelector"] = dict(spec.node_selectors)
    if spec.tolerations:
        spec_dict["tolerations"] = [t.to_k8s() for t in spec.tolerations]
    return spec_dict


def pod_annotations(annotations: dict[str, str]) -> dict[str, str]:
    # a training pod must not be evicted to save a node: it would lose its work
    return {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false", **annotations}


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
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,
        "completions": 1,
        "parallelism": 1,
        "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_SECONDS,
        "template": {
            "metadata": {"labels": dict(labels), "annotations": pod_annotations(annotations)},
            "spec": pod_spec(
                spec=spec,
                image=image,
                job_uri=job_uri,
                job_id=labels.get("job-id", name),
                python=python,
                service_account=service_account,
                env=env,
            ),
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
