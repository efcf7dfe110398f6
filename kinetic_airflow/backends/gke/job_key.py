"""The job's key on a cluster: a Kubernetes Secret owned by the Job / LeaderWorkerSet.

Why a Secret and not a plain env value in the pod template: the Job's spec is readable by
anyone who may ``get`` Jobs or pods in the namespace, is shown by the GKE console, and its
create request is recorded in the cluster's audit log, while a Secret's data is not (GKE logs
Secret requests at the Metadata level). The pod reads the key with ``secretKeyRef`` as
``KINETIC_JOB_KEY``; the runner removes it from its environment before any user code runs.

The Secret is created just after its owner (an ``ownerReference`` needs the owner's uid), so
the garbage collector deletes it with the Job (its TTL, a cancel) and it never outlives the
job. A pod that starts before the Secret exists waits (``CreateContainerConfigError``, retried
by the kubelet) rather than running without its key.
"""

from __future__ import annotations

import base64
from typing import Any

from kinetic_airflow.backends.gke.client import ApiError, KubeApi
from kinetic_airflow.job.integrity import KEY_ENV

__all__ = ["create_key_secret", "key_env", "key_secret_name"]

SECRET_KEY = "key"


def key_secret_name(object_name: str) -> str:
    return f"{object_name}-key"


def key_env(object_name: str) -> list[dict[str, Any]]:
    """The container's env entries that bring the key (never its value) into the pod."""
    name = key_secret_name(object_name)
    return [
        {"name": KEY_ENV, "valueFrom": {"secretKeyRef": {"name": name, "key": SECRET_KEY}}},
        {"name": "KINETIC_JOB_KEY_SOURCE", "value": f"the Kubernetes Secret {name} (${KEY_ENV})"},
    ]


def create_key_secret(api: KubeApi, owner: dict[str, Any], key: str, labels: dict[str, str]) -> None:
    """The Secret holding ``key``, owned by ``owner`` (the created Job or LeaderWorkerSet)."""
    md = owner["metadata"]
    namespace = md["namespace"]
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": key_secret_name(md["name"]),
            "namespace": namespace,
            "labels": dict(labels),
            "ownerReferences": [
                {
                    "apiVersion": owner["apiVersion"],
                    "kind": owner["kind"],
                    "name": md["name"],
                    "uid": md["uid"],
                }
            ],
        },
        "data": {SECRET_KEY: base64.b64encode(key.encode()).decode()},
    }
    path = f"/api/v1/namespaces/{namespace}/secrets"
    try:
        api.request("POST", path, body=body)
    except ApiError as exc:
        if exc.status != 409:
            raise
        # A Secret of this name from an earlier submit of the same job: replace it, so the key and
        # the owner are this submit's (the record holds the key the job is checked with).
        api.request("DELETE", f"{path}/{body['metadata']['name']}")
        api.request("POST", path, body=body)
