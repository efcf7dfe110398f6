"""Pathways backend: a multi-host TPU slice as one LeaderWorkerSet per attempt.

Everything a Job attempt has, for N hosts: the same identity, labels, ownership check
and task-state record; status from every host's pod (``group_status``); every host's
log in the task log with a ``[hN]`` prefix; the group deleted once the attempt has
ended (its hosts idle after their run, see ``lws_manifest``), so no slice is held after
its outcome is known.
"""

from __future__ import annotations

import logging
from typing import Any

from kinetic_airflow.backends.base import BackendStatus, JobRef
from kinetic_airflow.backends.gke import discovery
from kinetic_airflow.backends.gke.backend import GKEBackend, container_running
from kinetic_airflow.backends.gke.classify import ran_and_ended
from kinetic_airflow.backends.gke.client import KubeApi
from kinetic_airflow.backends.gke.group_status import HostMemory, classify_group, host_index
from kinetic_airflow.backends.gke.logstream import PodLogStream
from kinetic_airflow.backends.gke.lws_manifest import LWS_GROUP, LWS_PLURAL, build_lws_manifest, lws_name
from kinetic_airflow.backends.gke.manifest import CONTAINER_NAME
from kinetic_airflow.backends.gke.watch_cache import ClusterWatch, shared_watch

__all__ = ["LwsMissingError", "PathwaysBackend"]

log = logging.getLogger(__name__)

_INSTALL_HINT = (
    "Install it with `kinetic up` (kinetic's infrastructure command installs LWS), or with "
    "`kubectl apply --server-side -f https://github.com/kubernetes-sigs/lws/releases/latest/download/"
    "manifests.yaml` (see https://lws.sigs.k8s.io/docs/installation/)."
)


class LwsMissingError(RuntimeError):
    """The cluster has no LeaderWorkerSet API: multi-host slices cannot run there."""


def _discovered_version(api: KubeApi) -> str:
    """The LeaderWorkerSet version to call (discovery.py: asked once per API server)."""
    try:
        return discovery.api_version(api, LWS_GROUP)
    except discovery.GroupNotServedError as exc:
        what = f"serves {LWS_GROUP} only in {', '.join(exc.served)}" if exc.served else "has no"
        raise LwsMissingError(
            f"this cluster {what} LeaderWorkerSet API ({LWS_GROUP}, kinetic-airflow needs "
            f"{', '.join(discovery.SPOKEN[LWS_GROUP])}): multi-host TPU slices (backend='pathways') run "
            f"as LeaderWorkerSets. {_INSTALL_HINT}"
        ) from None


def _hosts(job: JobRef) -> int:
    """The slice's hosts: the reference's (what the job was submitted with, kept for a job an older
    version sized differently), or (a reference without them) its accelerator spec's."""
    return int(job.hosts or job.accelerator_spec.hosts)


class PathwaysBackend(GKEBackend):
    name = "pathways"
    kind_label = "LeaderWorkerSet"

    def __init__(self) -> None:
        super().__init__()
        self._memory: dict[str, HostMemory] = {}
        self._host_streams: dict[str, dict[int, PodLogStream]] = {}

    def api_version(self, job: JobRef) -> str:
        return _discovered_version(self._api(job))

    def object_name(self, job: JobRef) -> str:
        return lws_name(job.job_id)

    def object_path(self, job: JobRef, name: str | None = None) -> str:
        namespace = job.on_cluster().namespace
        base = f"/apis/{LWS_GROUP}/{self.api_version(job)}/namespaces/{namespace}/{LWS_PLURAL}"
        return f"{base}/{name}" if name else base

    def manifest(self, job: JobRef) -> dict[str, Any]:
        return build_lws_manifest(**self._pod_args(job), api_version=self.api_version(job))

    # Status -----------------------------------------------------------------------------------
    def _classify(
        self, job: JobRef, found: dict[str, Any] | None, pods: list[dict[str, Any]]
    ) -> BackendStatus:
        memory = self._memory.setdefault(self.object_name(job), HostMemory())
        hosts = _hosts(job)
        return classify_group(found, pods, hosts, memory)

    def _cached_object(self, watch: Any, name: str) -> dict[str, Any] | None:
        return watch.group(name)

    def missing_pods(self, job: JobRef, pods: list[dict[str, Any]]) -> bool:
        hosts = _hosts(job)
        return len({host_index(p) for p in pods} - {-1}) < hosts

    def refusal_names(self, job: JobRef) -> set[str]:
        """The LWS and its StatefulSets: the leader's ``<lws>`` and the group's ``<lws>-0``."""
        name = self.object_name(job)
        return {name, f"{name}-0"}

    def _group_watch(self, job: JobRef) -> ClusterWatch:
        """The namespace's watch, watching LeaderWorkerSets too (discovery: may do I/O)."""
        k8s = job.on_cluster()
        watch = shared_watch(k8s.cluster, k8s.namespace)
        watch.watch_groups(self.object_path(job))
        return watch

    def _connect(self, job: JobRef) -> tuple[KubeApi, ClusterWatch]:
        return self._api(job), self._group_watch(job)

    def _connected(self, job: JobRef) -> tuple[KubeApi, ClusterWatch] | None:
        """From memory only once the watch follows LeaderWorkerSets (their path needs discovery)."""
        found = super()._connected(job)
        return found if found is not None and found[1].groups is not None else None

    async def arelease(self, job: JobRef) -> None:
        """The attempt's outcome is known: delete the group (its hosts only wait now)."""
        await self.acancel(job)

    # Logs -------------------------------------------------------------------------------------
    async def _streams_of(self, job: JobRef) -> dict[int, PodLogStream]:
        """One stream per host, opened once its pod has started (``previous`` if it already ended)."""
        name = self.object_name(job)
        streams = self._host_streams.setdefault(name, {})
        observed = await self._aobserved(job)
        for pod in self._watched_pods(observed.watch, job):
            host = self.host_of(job, pod)
            if host < 0 or host in streams:
                continue
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            started = any(
                (cs.get("state") or {}).get("running") or cs.get("lastState") or ran_and_ended(cs)
                for cs in statuses
            )
            if not started:
                continue
            restarted = any(int(cs.get("restartCount") or 0) > 0 for cs in statuses)
            stream = streams[host] = PodLogStream(
                observed.api,
                job.on_cluster().namespace,
                pod["metadata"]["name"],
                CONTAINER_NAME,
                previous=restarted,
                still_running=container_running(observed.watch, pod["metadata"]["name"]),
            )
            stream.listeners.add(observed.changed)
            stream.start()
        return streams

    def host_of(self, job: JobRef, pod: dict[str, Any]) -> int:
        """A pod's host index in the group (-1: not one of its hosts)."""
        return host_index(pod)

    def log_prefix(self, job: JobRef, host: int) -> str:
        return f"[h{host}]"

    async def aread_log(self, job: JobRef, offset: Any) -> tuple[str, Any]:
        """The offset is lines per host ({"0": n, "3": m}); every line carries its host's prefix."""
        seen = dict(offset) if isinstance(offset, dict) else {}
        out: list[str] = []
        for host, stream in sorted((await self._streams_of(job)).items()):
            start = int(seen.get(str(host), 0))
            lines = stream.read_from(start)
            stream.release(start + len(lines))  # shown: not kept
            if lines:
                prefix = self.log_prefix(job, host)
                out.extend(f"{prefix} {line}" for line in lines)
                seen[str(host)] = start + len(lines)
        if not out:
            return "", offset
        return "\n".join(out) + "\n", seen

    async def alog_complete(self, job: JobRef) -> bool:
        streams = await self._streams_of(job)
        return bool(streams) and all(stream.done.is_set() for stream in streams.values())

    def output_ended(self, job: JobRef) -> bool:
        return False  # hosts end one by one: the group's status decides (JobWatcher._settle_group)

    def full_log_hint(self, job: JobRef) -> str:
        name = self.object_name(job)
        command = f"kubectl logs -n {job.on_cluster().namespace} -l job-name={name} --prefix --previous"
        url = self._logs_url(job)
        if url is None:
            return f"`{command}` (until the attempt ends and its LeaderWorkerSet is deleted)"
        return f"Cloud Logging {url}"

    def close(self) -> None:
        for streams in self._host_streams.values():
            for stream in streams.values():
                stream.stop()
        self._host_streams.clear()
        super().close()
