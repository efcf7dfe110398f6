"""Multislice backend: ``slices=N`` multi-host TPU slices as one JobSet per attempt.

A ``PathwaysBackend`` whose group is a JobSet (``jobset_manifest``) instead of a
LeaderWorkerSet; everything else is the same: identity, labels, ownership check, status from
every host's pod (``group_status.classify_group``, hosts counted across slices: any host failing
fails the attempt, a preempted or lost host is a new attempt of the whole group), every host's
log in the task log, prefixed ``[sS hH]``, and the JobSet deleted once the attempt has ended.
"""

from __future__ import annotations

from typing import Any

from kinetic_airflow.backends.base import BackendStatus, JobRef
from kinetic_airflow.backends.gke import discovery
from kinetic_airflow.backends.gke.client import ApiError, KubeApi
from kinetic_airflow.backends.gke.group_status import HostMemory, classify_group
from kinetic_airflow.backends.gke.jobset_manifest import (
    COMPLETION_INDEX_ANNOTATION,
    JOB_INDEX_LABEL,
    JOBSET_API_VERSION,
    JOBSET_GROUP,
    JOBSET_NAME_LABEL,
    JOBSET_PLURAL,
    REPLICATED_JOB,
    build_jobset_manifest,
    check_jobset_names,
    jobset_name,
)
from kinetic_airflow.backends.gke.pathways import PathwaysBackend
from kinetic_airflow.backends.gke.watch_cache import ClusterWatch, shared_watch
from kinetic_airflow.job.multihost import host_label

__all__ = ["JobSetMissingError", "MultisliceBackend", "slices_of"]

_INSTALL_HINT = (
    "Install JobSet with `kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/"
    "releases/latest/download/manifests.yaml` (see https://jobset.sigs.k8s.io/docs/installation/)."
)


class JobSetMissingError(RuntimeError):
    """The cluster has no JobSet API: multislice jobs cannot run there."""


def slices_of(job: JobRef) -> int:
    return int((job.k8s.slices if job.k8s is not None else None) or 1)


def _per_slice(job: JobRef) -> int:
    """Hosts per slice: the accelerator's (``job.hosts`` counts every slice's)."""
    return int(job.accelerator_spec.hosts)


def _failed(pod: dict[str, Any]) -> bool:
    """Whether the pod's runner ended with an error (a non-zero exit code)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated") or {}
        if terminated and terminated.get("exitCode") not in (None, 0):
            return True
    return False


class MultisliceBackend(PathwaysBackend):
    name = "multislice"
    kind_label = "JobSet"

    def api_version(self, job: JobRef) -> str:
        """The JobSet version the cluster serves (discovery.py: asked once per API server)."""
        try:
            return discovery.api_version(self._api(job), JOBSET_GROUP)
        except discovery.GroupNotServedError as exc:
            what = f"serves {JOBSET_GROUP} only in {', '.join(exc.served)}" if exc.served else "has no"
            raise JobSetMissingError(
                f"this cluster {what} JobSet API ({JOBSET_GROUP}, kinetic-airflow needs "
                f"{', '.join(discovery.SPOKEN[JOBSET_GROUP])}): multislice TPU jobs "
                f"(slices={slices_of(job)}) run as JobSets. {_INSTALL_HINT}"
            ) from None

    def object_name(self, job: JobRef) -> str:
        return jobset_name(job.job_id)

    def object_path(self, job: JobRef, name: str | None = None) -> str:
        namespace = job.on_cluster().namespace
        base = f"/apis/{JOBSET_GROUP}/{self.api_version(job)}/namespaces/{namespace}/{JOBSET_PLURAL}"
        return f"{base}/{name}" if name else base

    def manifest(self, job: JobRef) -> dict[str, Any]:
        return build_jobset_manifest(
            **self._pod_args(job), slices=slices_of(job), api_version=self.api_version(job)
        )

    def submit(self, job: JobRef, *, env: dict[str, str] | None = None, job_key: str | None = None) -> None:
        check_jobset_names(job.job_id, slices_of(job), _per_slice(job))
        try:
            super().submit(job, env=env, job_key=job_key)
        except ApiError as exc:
            if exc.status == 404 and "jobset" in f"{exc} {getattr(exc, 'body', '')}".lower():
                raise JobSetMissingError(
                    f"this cluster has no JobSet API ({JOBSET_GROUP}/{JOBSET_API_VERSION}): multislice "
                    f"TPU jobs (slices={slices_of(job)}) run as JobSets. {_INSTALL_HINT}"
                ) from None
            raise

    # Status -----------------------------------------------------------------------------------
    def host_of(self, job: JobRef, pod: dict[str, Any]) -> int:
        """slice * hosts per slice + the pod's completion index in its slice's Job."""
        md = pod.get("metadata") or {}
        labels, annotations = md.get("labels") or {}, md.get("annotations") or {}
        slice_index = labels.get(JOB_INDEX_LABEL, "")
        index = labels.get(COMPLETION_INDEX_ANNOTATION) or annotations.get(COMPLETION_INDEX_ANNOTATION, "")
        if not (slice_index.isdigit() and str(index).isdigit()):
            return -1
        return int(slice_index) * _per_slice(job) + int(index)

    def _name_host(self, job: JobRef) -> Any:
        per_slice = _per_slice(job)
        return lambda host: host_label(host, per_slice)

    def _classify(
        self, job: JobRef, found: dict[str, Any] | None, pods: list[dict[str, Any]]
    ) -> BackendStatus:
        memory = self._memory.setdefault(self.object_name(job), HostMemory())
        if any(_failed(pod) for pod in pods):
            # A failed host fails its slice's Job (backoffLimit 0) and so the JobSet, whose
            # controllers then delete the other hosts' pods: those are not lost hosts (a
            # preemption), the failure is the cause. A preempted pod is still named first.
            memory = HostMemory()
        return classify_group(
            found,
            pods,
            slices_of(job) * _per_slice(job),
            memory,
            index_of=lambda pod: self.host_of(job, pod),
            name_host=self._name_host(job),
            kind="JobSet",
        )

    def _cached_object(self, watch: Any, name: str) -> dict[str, Any] | None:
        return watch.jobset(name)

    def pod_selector(self, job: JobRef) -> str:
        return f"{JOBSET_NAME_LABEL}={self.object_name(job)}"

    def _watched_pods(self, watch: ClusterWatch, job: JobRef) -> list[dict[str, Any]]:
        return watch.pods_of_jobset(self.object_name(job))

    def missing_pods(self, job: JobRef, pods: list[dict[str, Any]]) -> bool:
        found = {self.host_of(job, p) for p in pods} - {-1}
        return len(found) < slices_of(job) * _per_slice(job)

    def refusal_names(self, job: JobRef) -> set[str]:
        """The JobSet (it creates the Jobs) and each slice's Job (it creates the pods)."""
        name = self.object_name(job)
        return {name, *(f"{name}-{REPLICATED_JOB}-{i}" for i in range(slices_of(job)))}

    def _group_watch(self, job: JobRef) -> ClusterWatch:
        k8s = job.on_cluster()
        watch = shared_watch(k8s.cluster, k8s.namespace)
        watch.watch_jobsets(self.object_path(job))
        return watch

    def _connected(self, job: JobRef) -> tuple[KubeApi, ClusterWatch] | None:
        found = super(PathwaysBackend, self)._connected(job)
        return found if found is not None and found[1].jobsets is not None else None

    # Logs -------------------------------------------------------------------------------------
    def log_prefix(self, job: JobRef, host: int) -> str:
        per_slice = _per_slice(job)
        return f"[s{host // per_slice} h{host % per_slice}]"

    def full_log_hint(self, job: JobRef) -> str:
        name = self.object_name(job)
        namespace = job.on_cluster().namespace
        command = f"kubectl logs -n {namespace} -l {JOBSET_NAME_LABEL}={name} --prefix"
        url = self._logs_url(job)
        if url is None:
            return f"`{command}` (until the attempt ends and its JobSet is deleted)"
        return f"Cloud Logging {url}"
