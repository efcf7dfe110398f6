"""The batch/v1 Job manifest of one attempt: accelerator -> selectors, resources, tolerations.

Plain dicts in Kubernetes' JSON shape, so they can be validated offline, logged,
and sent by any client. Airflow owns retries, hence ``backoffLimit: 0``.
"""

from __future__ import annotations

import copy
from typing import Any

from kinetic_airflow.accelerators import AcceleratorSpec
from kinetic_airflow.backends.gke.volumes import PodExtras
from kinetic_airflow.capacity import Placement

__all__ = [
    "CONTAINER_NAME",
    "build_job_manifest",
    "object_metadata",
    "platform_env",
    "pod_spec",
    "pod_template",
]

CONTAINER_NAME = "kinetic-worker"
# Long enough that a triggerer restarted after an outage still finds the finished Job.
TTL_AFTER_FINISHED_SECONDS = 24 * 3600
CPU_REQUESTS = {"cpu": "1", "memory": "4Gi"}
# A disrupted pod (DisruptionTarget: Spot reclaim, node shutdown, eviction, preemption) fails the
# Job with reason PodFailurePolicy and a message naming the condition ("Pod <ns>/<pod> has
# condition DisruptionTarget matching FailJob rule at index 0", kubernetes
# pkg/controller/job/pod_failure_policy.go, matchPodFailurePolicy). Without it the Job says only
# BackoffLimitExceeded, and a pod deleted before the watcher saw it reads as an ordinary failure;
# with it the verdict stays on the Job (classify.py). FailJob, not Ignore: Airflow, not the Job
# controller, decides whether a preempted attempt runs again.
PREEMPTION_FAILURE_POLICY: dict[str, Any] = {
    "rules": [{"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
}


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
    extras: PodExtras | None = None,
    secret_env: list[dict[str, Any]] | None = None,
    placement: Placement | None = None,
) -> dict[str, Any]:
    """The pod of one host: the runner, the accelerator's resources, selectors and tolerations,
    and those of the capacity it asks for (``placement``)."""
    resources: dict[str, Any] = {}
    if spec.resources:
        resources = {"limits": dict(spec.resources), "requests": dict(spec.resources)}
    else:
        resources = {"requests": dict(CPU_REQUESTS)}
    extras = extras or PodExtras()
    values = {**platform_env(spec, env), **extras.env, **(env or {})}
    container_env = [{"name": k, "value": str(v)} for k, v in sorted(values.items())]
    container_env.append({"name": "KINETIC_JOB_ID", "value": job_id})
    container_env.extend(extra_env or [])
    container_env.extend(secret_env or [])  # the job key, by reference (backends.gke.job_key)
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
    if extras.mounts:
        spec_dict["containers"][0]["volumeMounts"] = list(extras.mounts)
        spec_dict["volumes"] = list(extras.volumes)
    if service_account:
        spec_dict["serviceAccountName"] = service_account
    placement = placement or Placement()
    selectors = {**spec.node_selectors, **placement.node_selectors()}
    if selectors:
        spec_dict["nodeSelector"] = selectors
    tolerations = [t.to_k8s() for t in spec.tolerations] + placement.tolerations()
    if tolerations:
        spec_dict["tolerations"] = tolerations
    return spec_dict


def object_metadata(
    name: str,
    namespace: str,
    labels: dict[str, str],
    annotations: dict[str, str],
    placement: Placement | None,
) -> dict[str, Any]:
    """The metadata of the Job / LeaderWorkerSet / JobSet itself: Kueue reads its queue and
    priority labels, and the ProvisioningRequest parameters, from the object, not its pods."""
    placement = placement or Placement()
    return {
        "name": name,
        "namespace": namespace,
        "labels": {**labels, **placement.object_labels()},
        "annotations": {**annotations, **placement.object_annotations()},
    }


def pod_annotations(annotations: dict[str, str]) -> dict[str, str]:
    # a training pod must not be evicted to save a node: it would lose its work
    return {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false", **annotations}


def pod_template(
    *,
    labels: dict[str, str],
    annotations: dict[str, str],
    spec: AcceleratorSpec,
    image: str,
    job_uri: str,
    job_id: str,
    python: str = "python",
    service_account: str | None = "kinetic",
    env: dict[str, str] | None = None,
    extras: PodExtras | None = None,
    extra_env: list[dict[str, Any]] | None = None,
    restart_policy: str = "Never",
    secret_env: list[dict[str, Any]] | None = None,
    placement: Placement | None = None,
    grace_seconds: int | None = None,
) -> dict[str, Any]:
    """The pod template of a Job or a LeaderWorkerSet: labels, annotations and ``pod_spec``;
    ``grace_seconds``: SIGTERM to SIGKILL, the function's ``stop_grace_seconds`` and the runner's
    flush (``job.stop``)."""
    extras = extras or PodExtras()
    template = {
        "metadata": {
            "labels": dict(labels),
            "annotations": pod_annotations({**annotations, **extras.annotations}),
        },
        "spec": pod_spec(
            spec=spec,
            image=image,
            job_uri=job_uri,
            job_id=job_id,
            python=python,
            service_account=service_account,
            env=env,
            extra_env=extra_env,
            restart_policy=restart_policy,
            extras=extras,
            secret_env=secret_env,
            placement=placement,
        ),
    }
    if grace_seconds is not None:
        template["spec"]["terminationGracePeriodSeconds"] = grace_seconds
    return template


def build_job_manifest(
    *,
    name: str,
    namespace: str,
    labels: dict[str, str],
    annotations: dict[str, str],
    active_deadline_seconds: int | None = None,
    placement: Placement | None = None,
    **pod: Any,
) -> dict[str, Any]:
    """``pod``: the rest of ``pod_template``'s arguments (spec, image, job_uri, env, extras ...)."""
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,
        "podFailurePolicy": copy.deepcopy(PREEMPTION_FAILURE_POLICY),
        "completions": 1,
        "parallelism": 1,
        "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_SECONDS,
        "template": pod_template(
            labels=labels,
            annotations=annotations,
            job_id=labels.get("job-id", name),
            placement=placement,
            **pod,
        ),
    }
    if active_deadline_seconds:
        job_spec["activeDeadlineSeconds"] = int(active_deadline_seconds)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": object_metadata(name, namespace, labels, annotations, placement),
        "spec": job_spec,
    }
