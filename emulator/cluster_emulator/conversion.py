"""Conversion between the served versions of a custom resource, as the CRD's conversion webhook does.

Objects are stored in the CRD's storage version; a request in another served version gets them
converted on the way out, and its bodies converted on the way in. Only the fields that differ
between the versions and that the product or the tests use are converted; every other field is
the same in both versions and passes through. Kueue's ``v1beta1`` <-> ``v1beta2`` rules are read
from kubernetes-sigs/kueue at the release crds/UPSTREAM.json names (``apis/kueue/v1beta1/
*_conversion.go``); what is not converted is listed in the README (served versions).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from .resources import CLUSTERQUEUES, LOCALQUEUES, WORKLOADS, ResourceType

Obj = dict[str, Any]

# apis/kueue/v1beta2/workload_types.go: WorkloadPriorityClassGroup/Kind, PodPriorityClassGroup/Kind;
# v1beta1's PriorityClassSource values (apis/kueue/v1beta1/constants.go)
_WPC = ("kueue.x-k8s.io", "WorkloadPriorityClass", "kueue.x-k8s.io/workloadpriorityclass")
_PPC = ("scheduling.k8s.io", "PriorityClass", "scheduling.k8s.io/priorityclass")


def _rename(node: Obj | None, old: str, new: str) -> None:
    if isinstance(node, dict) and old in node:
        node[new] = node.pop(old)


def _workload_to_v1beta2(obj: Obj) -> None:
    """workload_conversion.go ``Convert_v1beta1_WorkloadSpec_To_v1beta2_WorkloadSpec`` and
    ``..._WorkloadStatus_...``: priorityClassSource + priorityClassName -> priorityClassRef; the
    misspelt ``accumulatedPastExexcutionTimeSeconds`` -> ``accumulatedPastExecutionTimeSeconds``."""
    spec = obj.get("spec")
    if isinstance(spec, dict):
        source, name = spec.pop("priorityClassSource", None), spec.pop("priorityClassName", None)
        for group, kind, v1beta1_source in (_WPC, _PPC):
            if source == v1beta1_source and name:
                spec["priorityClassRef"] = {"group": group, "kind": kind, "name": name}
    _rename(obj.get("status"), "accumulatedPastExexcutionTimeSeconds", "accumulatedPastExecutionTimeSeconds")


def _workload_to_v1beta1(obj: Obj) -> None:
    """workload_conversion.go ``Convert_v1beta2_WorkloadSpec_To_v1beta1_WorkloadSpec``."""
    spec = obj.get("spec")
    if isinstance(spec, dict):
        ref = spec.pop("priorityClassRef", None) or {}
        for group, kind, v1beta1_source in (_WPC, _PPC):
            if ref.get("group") == group and ref.get("kind") == kind:
                spec["priorityClassSource"] = v1beta1_source
                spec["priorityClassName"] = ref.get("name", "")
    _rename(obj.get("status"), "accumulatedPastExecutionTimeSeconds", "accumulatedPastExexcutionTimeSeconds")


def _cluster_queue_to_v1beta2(obj: Obj) -> None:
    """clusterqueue_conversion.go ``Convert_v1beta1_ClusterQueueSpec_To_v1beta2_ClusterQueueSpec``:
    ``cohort`` -> ``cohortName``; ``admissionChecks`` -> ``admissionChecksStrategy`` rules."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    _rename(spec, "cohort", "cohortName")
    checks = spec.pop("admissionChecks", None)
    if checks:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": name} for name in checks]}


def _cluster_queue_to_v1beta1(obj: Obj) -> None:
    """clusterqueue_conversion.go ``Convert_v1beta2_ClusterQueueSpec_To_v1beta1_ClusterQueueSpec``
    (the strategy stays a strategy: v1beta1 has both fields)."""
    _rename(obj.get("spec"), "cohortName", "cohort")


def _local_queue_to_v1beta2(obj: Obj) -> None:
    """localqueue_conversion.go: ``status.flavorUsage`` -> ``status.flavorsUsage``."""
    _rename(obj.get("status"), "flavorUsage", "flavorsUsage")


def _local_queue_to_v1beta1(obj: Obj) -> None:
    _rename(obj.get("status"), "flavorsUsage", "flavorUsage")


_CONVERTERS: dict[tuple[ResourceType, str, str], Callable[[Obj], None]] = {
    (WORKLOADS, "v1beta1", "v1beta2"): _workload_to_v1beta2,
    (WORKLOADS, "v1beta2", "v1beta1"): _workload_to_v1beta1,
    (CLUSTERQUEUES, "v1beta1", "v1beta2"): _cluster_queue_to_v1beta2,
    (CLUSTERQUEUES, "v1beta2", "v1beta1"): _cluster_queue_to_v1beta1,
    (LOCALQUEUES, "v1beta1", "v1beta2"): _local_queue_to_v1beta2,
    (LOCALQUEUES, "v1beta2", "v1beta1"): _local_queue_to_v1beta1,
}


def convert(rt: ResourceType, obj: Any, from_version: str, to_version: str) -> Any:
    """``obj`` (an object, or a partial one such as a merge patch) of ``rt`` in ``to_version``;
    the input is not changed. Anything not an object passes through."""
    if from_version == to_version or not isinstance(obj, dict):
        return obj
    out = copy.deepcopy(obj)
    if "apiVersion" in out:
        out["apiVersion"] = f"{rt.group}/{to_version}" if rt.group else to_version
    step = _CONVERTERS.get((rt, from_version, to_version))
    if step is not None:
        step(out)
    return out


def to_storage(rt: ResourceType, obj: Any, version: str) -> Any:
    """A request body sent in ``version``, as it is stored."""
    return convert(rt, obj, version, rt.version)


def from_storage(rt: ResourceType, obj: Any, version: str) -> Any:
    """A stored object, in the ``version`` the request asked for."""
    return convert(rt, obj, rt.version, version)
