"""kinetic's objects in one cluster namespace, listed once: for the jobs CLI and retention.

One list of Jobs (``app=kinetic``), one of LeaderWorkerSets (``app=kinetic-pathways``,
if the cluster has the API) and one of their pods, instead of requests per job. A job's
state is read off them with the backends' own classifiers, so the CLI says what the
trigger would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kinetic_airflow.backends.base import BackendStatus, JobRef
from kinetic_airflow.backends.gke import discovery
from kinetic_airflow.backends.gke.classify import classify
from kinetic_airflow.backends.gke.client import KubeApi, cluster_key, kube_api
from kinetic_airflow.backends.gke.group_status import HostMemory, classify_group
from kinetic_airflow.backends.gke.lws_manifest import LWS_GROUP, LWS_PLURAL, lws_name

__all__ = ["ClusterObject", "ClusterSnapshot", "snapshot_for"]

TI_LABEL = "kinetic.airflow/ti"


@dataclass
class ClusterObject:
    kind: str  # "Job" or "LeaderWorkerSet"
    name: str
    namespace: str
    body: dict[str, Any]
    pods: list[dict[str, Any]]
    status: BackendStatus

    @property
    def labels(self) -> dict[str, str]:
        return self.body.get("metadata", {}).get("labels") or {}

    @property
    def annotations(self) -> dict[str, str]:
        return self.body.get("metadata", {}).get("annotations") or {}

    @property
    def job_id(self) -> str:
        return self.labels.get("job-id", "")

    @property
    def task_instance(self) -> str:
        """``dag/run/task/map_index`` from the annotation (label values are hashed)."""
        return self.annotations.get("kinetic.airflow/task-instance", "")

    @property
    def try_number(self) -> int:
        return int(self.labels.get("kinetic.airflow/try-number") or 0)

    @property
    def created(self) -> str:
        return self.body.get("metadata", {}).get("creationTimestamp") or ""

    @property
    def ours(self) -> bool:
        """Made by kinetic-airflow (keras-kinetic's own jobs carry no task-instance label)."""
        return TI_LABEL in self.labels


class ClusterSnapshot:
    def __init__(self, cluster: dict[str, Any], namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.api = kube_api(cluster)
        self.lws_version: str | None = None
        pods = self._list(KubeApi.pods_path(namespace), "app in (kinetic,kinetic-pathways)")
        self._pods: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            owner = (pod["metadata"].get("labels") or {}).get("job-name")
            if owner:
                self._pods.setdefault(owner, []).append(pod)
        self.objects: dict[str, ClusterObject] = {}
        for job in self._list(KubeApi.jobs_path(namespace), "app=kinetic"):
            name = job["metadata"]["name"]
            found = self._pods.get(name, [])
            self.objects[name] = ClusterObject("Job", name, namespace, job, found, classify(job, found))
        for group in self._groups():
            name = group["metadata"]["name"]
            found = self._pods.get(name, [])
            hosts = int(group.get("spec", {}).get("leaderWorkerTemplate", {}).get("size") or 1)
            status = classify_group(group, found, hosts, HostMemory())
            self.objects[name] = ClusterObject("LeaderWorkerSet", name, namespace, group, found, status)

    def _list(self, path: str, selector: str) -> list[dict[str, Any]]:
        return self.api.request("GET", path, query={"labelSelector": selector}).get("items", [])

    def _groups(self) -> list[dict[str, Any]]:
        try:
            self.lws_version = discovery.api_version(self.api, LWS_GROUP)
        except discovery.GroupNotServedError:
            return []  # no LeaderWorkerSet API kinetic speaks on this cluster: no pathways jobs either
        return self._list(self.group_path(), "app=kinetic-pathways")

    def group_path(self, name: str | None = None) -> str:
        base = f"/apis/{LWS_GROUP}/{self.lws_version}/namespaces/{self.namespace}/{LWS_PLURAL}"
        return f"{base}/{name}" if name else base

    def status_of(self, ref: JobRef) -> BackendStatus:
        if ref.backend == "multislice":  # not in the listing: JobSets are read one by one
            from kinetic_airflow.backends.gke.multislice import MultisliceBackend  # (its own API)

            return MultisliceBackend().status(ref)
        name = lws_name(ref.job_id) if ref.backend == "pathways" else f"kinetic-{ref.job_id}"
        found = self.objects.get(name)
        if found is None:
            return BackendStatus(classify(None, []).state)
        return found.status

    def delete(self, obj: ClusterObject) -> None:
        """Delete the object and (Foreground) its pods; a 404 is fine."""
        path = KubeApi.jobs_path(self.namespace, obj.name) if obj.kind == "Job" else self.group_path(obj.name)
        self.api.delete_foreground(path)


def snapshot_key(cluster: dict[str, Any], namespace: str) -> str:
    """One snapshot per cluster and namespace: the key jobs that share both are listed under."""
    return cluster_key(cluster) + "|" + namespace


def snapshot_for(cache: dict[str, ClusterSnapshot], ref: JobRef) -> ClusterSnapshot:
    k8s = ref.on_cluster()
    key = snapshot_key(k8s.cluster or {}, k8s.namespace)
    if key not in cache:
        cache[key] = ClusterSnapshot(k8s.cluster or {}, k8s.namespace)
    return cache[key]
