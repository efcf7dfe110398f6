"""Node pools and the scheduler's feasibility check.

A node pool stands for a GKE node pool: a set of node labels and taints. The
default pools (``default_node_pools``, from ``gke_node_pools.json``) carry GKE's
real labels, one pool per accelerator, machine type and TPU topology; a pool made
by hand may give a label the value ``"*"``, which matches whatever value a pod
asks for (and is left out of the Node object). The scheduler only checks
``nodeSelector``, required node affinity and taints; it ignores capacity, so
any number of pods fit on a node. Messages follow kube-scheduler's wording so
code that parses ``Unschedulable`` conditions can be tested.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WILDCARD = "*"

LABEL_TPU_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
LABEL_TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
LABEL_GPU_ACCELERATOR = "cloud.google.com/gke-accelerator"
LABEL_ACCELERATOR_COUNT = "cloud.google.com/gke-accelerator-count"
LABEL_SPOT = "cloud.google.com/gke-spot"
LABEL_NODEPOOL = "cloud.google.com/gke-nodepool"

LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
# The default pools, as data this package owns (gke_node_pools.json; its "_comment" names the
# GKE pages and autoscaler files each label value comes from).
POOLS_FILE = Path(__file__).with_name("gke_node_pools.json")


@dataclass(frozen=True)
class Taint:
    """A node taint; pods must tolerate ``NoSchedule`` / ``NoExecute`` taints to land on the node."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def to_dict(self) -> dict[str, str]:
        """As it appears in ``Node.spec.taints``."""
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out


@dataclass
class NodePool:
    """A group of identical nodes. ``labels`` values may be ``"*"`` (matches any requested value)."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: Sequence[Taint | Mapping[str, str]] = ()
    node_count: int = 1
    capacity: dict[str, str] = field(default_factory=dict)
    # GKE flex-start (label ``cloud.google.com/gke-flex-start: "true"``): a node lives at most this
    # long (``maxRunDurationSeconds``, https://cloud.google.com/kubernetes-engine/docs/concepts/dws);
    # None: GKE's default of seven days. See kueue.py ``KueueController._flex_start``.
    max_run_seconds: float | None = None
    # Capacity that never arrives: the pool exists, but every scale-up of it fails, as when GCE
    # has no VMs of its kind in the zone (a Spot or TPU stockout, ZONE_RESOURCE_POOL_EXHAUSTED).
    # Its node is never ready, so no pod is bound to it; a pod only it would fit gets the
    # cluster-autoscaler's events for a failed scale-up (kubelet.py ``_schedule``). Set by
    # ``"stockout": true`` on a pool of gke_node_pools.json or ``ClusterEmulator.stock_out``.
    stockout: bool = False

    def taint_objects(self) -> list[Taint]:
        """Taints normalized to :class:`Taint`."""
        return [
            t if isinstance(t, Taint) else Taint(t["key"], t.get("value", ""), t.get("effect", "NoSchedule"))
            for t in self.taints
        ]


def default_node_pools() -> list[NodePool]:
    """GKE Standard node pools for every accelerator, machine type and TPU topology in
    ``gke_node_pools.json``, each once on-demand and once on Spot VMs, with the labels GKE puts
    on such nodes (no wildcard: a pod lands only where a real cluster's pod of the same
    selectors would). One node per pool stands for the pool; capacity is not modelled, so the
    pods of a multi-host slice share it."""
    data = json.loads(POOLS_FILE.read_text(encoding="utf-8"))
    pools: list[NodePool] = []
    for cpu in data["cpu"]:
        labels = {LABEL_INSTANCE_TYPE: cpu["machine_type"]}
        if cpu.get("spot"):
            labels[LABEL_SPOT] = "true"
        pools.append(
            NodePool(
                cpu["name"],
                labels=labels,
                capacity={"cpu": "8", "memory": "32Gi"},
                stockout=bool(cpu.get("stockout")),
            )
        )
    for spot in (False, True):
        for tpu in data["tpu"]:
            chips = str(tpu["chips_per_node"])
            for topology in tpu["topologies"]:
                labels = {
                    LABEL_TPU_ACCELERATOR: tpu["accelerator"],
                    LABEL_TPU_TOPOLOGY: topology,
                    LABEL_ACCELERATOR_COUNT: chips,
                    LABEL_INSTANCE_TYPE: tpu["machine_type"],
                }
                pools.append(
                    _accelerator_pool(
                        f"{tpu['accelerator']}-{chips}t-{topology}",
                        labels,
                        spot,
                        Taint("google.com/tpu", "present", "NoSchedule"),
                        {"cpu": "224", "memory": "448Gi", "google.com/tpu": chips},
                        _stockout(tpu, spot),
                    )
                )
        for gpu in data["gpu"]:
            for machine_type, count in gpu["machine_types"].items():
                labels = {
                    LABEL_GPU_ACCELERATOR: gpu["accelerator"],
                    LABEL_ACCELERATOR_COUNT: str(count),
                    LABEL_INSTANCE_TYPE: machine_type,
                }
                if gpu.get("arch"):
                    labels["kubernetes.io/arch"] = gpu["arch"]
                pools.append(
                    _accelerator_pool(
                        f"{gpu['accelerator'].removeprefix('nvidia-')}-{machine_type}",
                        labels,
                        spot,
                        Taint("nvidia.com/gpu", "present", "NoSchedule"),
                        {"cpu": "96", "memory": "680Gi", "nvidia.com/gpu": str(count)},
                        _stockout(gpu, spot),
                    )
                )
    return pools


def _stockout(entry: Mapping[str, Any], spot: bool) -> bool:
    """An entry's ``"stockout"``: true (both of its pools), ``"spot"`` or ``"on-demand"`` (one)."""
    value = entry.get("stockout")
    return value is True or value == ("spot" if spot else "on-demand")


def _accelerator_pool(
    name: str,
    labels: dict[str, str],
    spot: bool,
    taint: Taint,
    capacity: dict[str, str],
    stockout: bool = False,
) -> NodePool:
    # A Standard Spot pool carries the gke-spot label; its taint is optional (--node-taints), and
    # only NAP / Autopilot add it (https://cloud.google.com/kubernetes-engine/docs/how-to/autopilot-spot-pods)
    if spot:
        labels = {**labels, LABEL_SPOT: "true"}
    name = f"{name}-spot" if spot else name
    return NodePool(name, labels=labels, taints=[taint], capacity=capacity, stockout=stockout)


@dataclass
class Node:
    """One node of a pool (the scheduler binds pods to these names)."""

    name: str
    pool: NodePool

    @property
    def labels(self) -> dict[str, str]:
        """Pool labels plus the ones every GKE node carries."""
        labels = dict(self.pool.labels)
        labels.setdefault(LABEL_NODEPOOL, self.pool.name)
        labels.setdefault("kubernetes.io/hostname", self.name)
        labels.setdefault("kubernetes.io/os", "linux")
        labels.setdefault("kubernetes.io/arch", "amd64")
        labels.setdefault("topology.kubernetes.io/zone", "us-central1-a")
        labels.setdefault("topology.kubernetes.io/region", "us-central1")
        return labels


def make_nodes(pools: Iterable[NodePool]) -> list[Node]:
    """Deterministic GKE-style node names: ``gke-emulator-<pool>-<hash>-<n>``."""
    nodes = []
    for pool in pools:
        digest = hashlib.sha1(pool.name.encode()).hexdigest()[:8]
        for i in range(max(1, pool.node_count)):
            suffix = hashlib.sha1(f"{pool.name}/{i}".encode()).hexdigest()[:4]
            nodes.append(Node(f"gke-emulator-{pool.name}-{digest}-{suffix}"[:63].rstrip("-"), pool))
    return nodes


def node_object(node: Node, created: str, kubelet_version: str) -> dict[str, Any]:
    """The ``v1 Node`` stored for a node (wildcard labels are left out)."""
    labels = {k: v for k, v in node.labels.items() if v != WILDCARD}
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    capacity.update(node.pool.capacity)
    condition_time = created
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels, "annotations": {}},
        "spec": {
            "providerID": f"gce://emulator/us-central1-a/{node.name}",
            "taints": [t.to_dict() for t in node.pool.taint_objects()],
        },
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": condition_time,
                    "lastTransitionTime": condition_time,
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": node.name},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": "",
                "containerRuntimeVersion": "emulator://1.0",
                "kernelVersion": "",
                "kubeProxyVersion": kubelet_version,
                "kubeletVersion": kubelet_version,
                "machineID": "",
                "operatingSystem": "linux",
                "osImage": "Kinetic cluster emulator",
                "systemUUID": "",
            },
        },
    }


# ----------------------------------------------------------------- feasibility
def _label_matches(node_labels: Mapping[str, str], key: str, op: str, values: Sequence[str]) -> bool:
    present = key in node_labels
    value = node_labels.get(key)
    wildcard = value == WILDCARD
    if op == "In":
        return present and (wildcard or value in values)
    if op == "NotIn":
        return not present or wildcard or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present or wildcard:
            return present
        try:
            number, bound = int(value or ""), int(values[0])
        except (ValueError, IndexError):
            return False
        return number > bound if op == "Gt" else number < bound
    return False


def selector_matches(pod_spec: Mapping[str, Any], node_labels: Mapping[str, str]) -> bool:
    """``nodeSelector`` AND required node affinity (terms ORed, expressions ANDed)."""
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if not _label_matches(node_labels, key, "In", [str(value)]):
            return False
    affinity = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if affinity:
        terms = affinity.get("nodeSelectorTerms") or []
        if not any(
            all(
                _label_matches(node_labels, e["key"], e["operator"], e.get("values") or [])
                for e in term.get("matchExpressions") or []
            )
            for term in terms
        ):
            return False
    return True


def requested_resources(pod_spec: Mapping[str, Any]) -> set[str]:
    """Resource names a pod requests or limits (for ExtendedResourceToleration)."""
    names: set[str] = set()
    for group in ("containers", "initContainers"):
        for container in pod_spec.get(group) or []:
            resources = container.get("resources") or {}
            for section in ("limits", "requests"):
                names.update((resources.get(section) or {}).keys())
    return names


def tolerates(pod_spec: Mapping[str, Any], taint: Taint) -> bool:
    """Whether the pod tolerates ``taint``; GKE's ExtendedResourceToleration is emulated too."""
    if taint.effect not in ("NoSchedule", "NoExecute"):
        return True
    if taint.key in requested_resources(pod_spec):
        return True
    for tol in pod_spec.get("tolerations") or []:
        key = tol.get("key") or ""
        operator = tol.get("operator") or "Equal"
        effect = tol.get("effect") or ""
        if effect and effect != taint.effect:
            continue
        if operator == "Exists":
            if not key or key == taint.key:
                return True
        elif key == taint.key and (tol.get("value") or "") == taint.value:
            return True
    return False


def find_node(pod_spec: Mapping[str, Any], nodes: Sequence[Node]) -> tuple[Node | None, str]:
    """First feasible node, or None plus kube-scheduler's ``0/N nodes are available`` message."""
    reasons: dict[str, int] = {}
    for node in nodes:
        if not selector_matches(pod_spec, node.labels):
            reason = "node(s) didn't match Pod's node affinity/selector"
        else:
            bad = next((t for t in node.pool.taint_objects() if not tolerates(pod_spec, t)), None)
            if bad is None and not node.pool.stockout:
                return node, ""
            if bad is None:  # it would fit, but its VM never came: the scheduler sees it full
                reason = f"Insufficient {_first_extended(pod_spec)}"
            else:
                reason = f"node(s) had untolerated taint {{{bad.key}: {bad.value}}}"
        reasons[reason] = reasons.get(reason, 0) + 1
    total = len(nodes)
    parts = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
    message = (
        f"0/{total} nodes are available: {parts}. preemption: 0/{total} nodes are available: "
        f"{total} Preemption is not helpful for scheduling."
    )
    return None, message


def stocked_out_pool(pod_spec: Mapping[str, Any], nodes: Sequence[Node]) -> NodePool | None:
    """The stocked-out pool (``NodePool.stockout``) the pod would fit, if only such pools fit it."""
    for node in nodes:
        if node.pool.stockout and selector_matches(pod_spec, node.labels):
            if all(tolerates(pod_spec, t) for t in node.pool.taint_objects()):
                return node.pool
    return None


def _first_extended(pod_spec: Mapping[str, Any]) -> str:
    extended = sorted(r for r in requested_resources(pod_spec) if "/" in r)
    return extended[0] if extended else "cpu"


def scale_up_message(pod_spec: Mapping[str, Any], total: int) -> str:
    """Message while a node pool is (pretend) scaling up for the pod."""
    resource = _first_extended(pod_spec)
    return (
        f"0/{total} nodes are available: {total} Insufficient {resource}. preemption: 0/{total} nodes are "
        f"available: {total} No preemption victims found for incoming pod."
    )
