"""Helpers for tests: create Kueue's cluster-side objects (ResourceFlavor, ClusterQueue,
LocalQueue, WorkloadPriorityClass, the provisioning AdmissionCheck) through the API, as an
administrator would with kubectl. Each takes a :class:`ClusterEmulator` or a ``kubernetes``
``ApiClient`` (so it works against the separate-process form too) and returns what it created."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .kueue import PROVISIONING_CONTROLLER, QUEUED_PROVISIONING_CLASS

# The preferred version of the pinned release (crds/UPSTREAM.json): the one every Kueue release
# from 0.15 serves, and the only one once v1beta1 is unserved (kubernetes-sigs/kueue#14558).
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"


def _api(target: Any) -> Any:
    from kubernetes import client

    api_client = target.api_client() if hasattr(target, "api_client") else target
    return client.CustomObjectsApi(api_client)


def _create(api: Any, plural: str, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    from kubernetes.client.rest import ApiException

    try:
        if namespace is None:
            return api.create_cluster_custom_object(GROUP, VERSION, plural, body)
        return api.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        name = body["metadata"]["name"]
        if namespace is None:
            return api.get_cluster_custom_object(GROUP, VERSION, plural, name)
        return api.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)


def resource_flavor(
    target: Any,
    name: str = "default-flavor",
    node_labels: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A ResourceFlavor (already existing: returned as is)."""
    spec: dict[str, Any] = {}
    if node_labels:
        spec["nodeLabels"] = dict(node_labels)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": spec,
    }
    return _create(_api(target), "resourceflavors", body)


def kueue_queue(
    target: Any,
    name: str,
    namespace: str = "default",
    quota: Mapping[str, str | int] | None = None,
    *,
    flavor: str = "default-flavor",
    node_labels: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
    admission_checks: Sequence[str] = (),
    within_cluster_queue: str | None = None,
    queueing_strategy: str = "BestEffortFIFO",
    local_queue: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A ResourceFlavor ``flavor``, a ClusterQueue ``name`` with one resource group covering the
    ``quota`` resources (nominal quotas, e.g. ``{"cpu": "4", "google.com/tpu": 8}``), and a
    LocalQueue ``local_queue or name`` in ``namespace`` pointing at it. Returns (cq, lq)."""
    quota = dict(quota or {"cpu": "4", "memory": "16Gi"})
    resource_flavor(target, flavor, node_labels, tolerations)
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "queueingStrategy": queueing_strategy,
        "resourceGroups": [
            {
                "coveredResources": list(quota),
                "flavors": [
                    {
                        "name": flavor,
                        "resources": [{"name": r, "nominalQuota": str(q)} for r, q in quota.items()],
                    }
                ],
            }
        ],
    }
    if admission_checks:  # v1beta2 has only the strategy (v1beta1's admissionChecks converts to it)
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in admission_checks]}
    if within_cluster_queue:
        spec["preemption"] = {"withinClusterQueue": within_cluster_queue}
    api = _api(target)
    cq = _create(
        api,
        "clusterqueues",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": spec,
        },
    )
    lq_name = local_queue or name
    lq = _create(
        api,
        "localqueues",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "LocalQueue",
            "metadata": {"name": lq_name, "namespace": namespace},
            "spec": {"clusterQueue": name},
        },
        namespace,
    )
    return cq, lq


def workload_priority_class(target: Any, name: str, value: int, description: str = "") -> dict[str, Any]:
    """A WorkloadPriorityClass (label jobs with ``kueue.x-k8s.io/priority-class: <name>``)."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": name},
        "value": int(value),
        "description": description,
    }
    return _create(_api(target), "workloadpriorityclasses", body)


def provisioning_check(
    target: Any,
    name: str = "dws-prov",
    config: str = "dws-config",
    provisioning_class: str = QUEUED_PROVISIONING_CLASS,
    *,
    parameters: Mapping[str, str] | None = None,
    backoff_limit_count: int | None = None,
    backoff_base_seconds: int | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A ProvisioningRequestConfig ``config`` and an AdmissionCheck ``name`` (controllerName
    ``kueue.x-k8s.io/provisioning-request``) using it, as GKE's DWS guide sets them up."""
    pspec: dict[str, Any] = {"provisioningClassName": provisioning_class}
    if parameters:
        pspec["parameters"] = dict(parameters)
    retry: dict[str, Any] = {}
    if backoff_limit_count is not None:
        retry["backoffLimitCount"] = int(backoff_limit_count)
    if backoff_base_seconds is not None:
        retry["backoffBaseSeconds"] = int(backoff_base_seconds)
    if retry:
        pspec["retryStrategy"] = retry
    api = _api(target)
    prc = _create(
        api,
        "provisioningrequestconfigs",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ProvisioningRequestConfig",
            "metadata": {"name": config},
            "spec": pspec,
        },
    )
    ac = _create(
        api,
        "admissionchecks",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AdmissionCheck",
            "metadata": {"name": name},
            "spec": {
                "controllerName": PROVISIONING_CONTROLLER,
                "parameters": {"apiGroup": GROUP, "kind": "ProvisioningRequestConfig", "name": config},
            },
        },
    )
    return ac, prc
