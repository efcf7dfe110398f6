"""GKE backend: one batch/v1 Job per attempt.

The worker submits (POST; a 409 for a Job labelled as this task instance's is
adopted) and reads status directly; triggers read status from the shared watch
of the namespace and follow pod logs with one streaming request per pod.

In a trigger, everything that may do I/O (building the cluster's client looks up a
connection; discovery asks the API server) runs once per job in a worker thread
(``_aobserved``); what the loop does afterwards reads memory only.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kinetic_airflow.backends.base import QUEUE_LOOK_SECONDS, Backend, BackendStatus, JobRef, JobState
from kinetic_airflow.backends.gke.classify import classify, with_refusal
from kinetic_airflow.backends.gke.client import ApiError, KubeApi, cached_kube_api, kube_api
from kinetic_airflow.backends.gke.console import job_links
from kinetic_airflow.backends.gke.job_key import create_key_secret, key_env
from kinetic_airflow.backends.gke.kueue import QueueState, check_local_queue, queue_state, with_queue
from kinetic_airflow.backends.gke.logstream import PodLogStream
from kinetic_airflow.backends.gke.manifest import (
    CONTAINER_NAME,
    TTL_AFTER_FINISHED_SECONDS,
    build_job_manifest,
)
from kinetic_airflow.backends.gke.pod_override import apply_to_manifest
from kinetic_airflow.backends.gke.volumes import pod_extras, requirements_cache_for
from kinetic_airflow.backends.gke.watch_cache import (
    FAILED_CREATE,
    ClusterWatch,
    cached_watch,
    shared_watch,
    wait_event,
)
from kinetic_airflow.capacity import placement_of
from kinetic_airflow.config import resolve_setting
from kinetic_airflow.job.layout import JOB_PREFIX, check_derived_names
from kinetic_airflow.job.stop import kill_after_seconds

__all__ = ["GKEBackend", "JobOwnershipError", "Observed", "k8s_job_name"]

log = logging.getLogger(__name__)

TI_LABEL = "kinetic.airflow/ti"
# How long a trigger's look waits (on the loop) for the namespace's watch to list before it reads
# the job from the API instead.
SYNC_TIMEOUT_SECONDS = 30.0


class JobOwnershipError(RuntimeError):
    """A Job with our deterministic name exists but belongs to another task instance."""


def k8s_job_name(job: JobRef) -> str:
    return f"{JOB_PREFIX}{job.job_id}"


def _owner_label(job: JobRef) -> str:
    return job.job_identity.labels()[TI_LABEL]


def container_running(watch: ClusterWatch, pod_name: str) -> Callable[[], bool]:
    """Whether the pod's runner container is running now, from the watch's memory."""

    def running() -> bool:
        pod = watch.pods.get(pod_name) or {}
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") == CONTAINER_NAME:
                return bool((status.get("state") or {}).get("running"))
        return False

    return running


@dataclass
class Observed:
    """What a watcher's loop uses of one job, made off the loop once: the cluster's client, the
    shared watch of its namespace, and the event that watch (and the job's log streams) set on
    every change of the job."""

    api: KubeApi
    watch: ClusterWatch
    changed: asyncio.Event


def _decisive(status: BackendStatus) -> bool:
    """A status the Workload turns into the job's outcome: read it fresh (``_queue_look``)."""
    return status.state is JobState.FAILED


class GKEBackend(Backend):
    name = "gke"

    def __init__(self) -> None:
        self._streams: dict[str, PodLogStream] = {}
        self._observed: dict[str, Observed] = {}
        self._queue_looks: dict[str, tuple[float, QueueState]] = {}

    kind_label = "Job"

    @staticmethod
    def _api(job: JobRef) -> KubeApi:
        return kube_api(job.on_cluster().cluster)

    # What a subclass running another kind of object (a LeaderWorkerSet) changes ---------------
    def object_name(self, job: JobRef) -> str:
        return k8s_job_name(job)

    def object_path(self, job: JobRef, name: str | None = None) -> str:
        return KubeApi.jobs_path(job.on_cluster().namespace, name)

    def _cached_object(self, watch: Any, name: str) -> dict[str, Any] | None:
        return watch.job(name)

    def _classify(
        self, job: JobRef, found: dict[str, Any] | None, pods: list[dict[str, Any]]
    ) -> BackendStatus:
        return classify(found, pods)

    def pod_selector(self, job: JobRef) -> str:
        """The label selector of the job's pods (a JobSet's span several Jobs: its own label)."""
        return f"job-name={self.object_name(job)}"

    def _watched_pods(self, watch: ClusterWatch, job: JobRef) -> list[dict[str, Any]]:
        """The job's pods in the shared watch's memory."""
        return watch.pods_of(self.object_name(job))

    def missing_pods(self, job: JobRef, pods: list[dict[str, Any]]) -> bool:
        """Whether some of the job's pods do not exist (a Job has one)."""
        return not pods

    def refusal_names(self, job: JobRef) -> set[str]:
        """The objects whose controller reports pods it could not create (FailedCreate)."""
        return {self.object_name(job)}

    def _with_refusal(
        self, found: dict[str, Any] | None, status: BackendStatus, events: list[dict[str, Any]]
    ) -> BackendStatus:
        """A job missing pods, told why by its controller's newest FailedCreate event."""
        return with_refusal(found, status, events)

    # Submit -----------------------------------------------------------------------------------
    def _pod_args(self, job: JobRef) -> dict[str, Any]:
        """What every kind of object's pods are built from (the job reference's public fields)."""
        identity = job.job_identity
        k8s = job.on_cluster()
        return {
            "name": self.object_name(job),
            "namespace": k8s.namespace,
            "labels": identity.labels(),
            "annotations": {
                "kinetic.airflow/task-instance": identity.ti_key,
                "kinetic.airflow/job-uri": job.job_uri,
            },
            "spec": job.accelerator_spec,  # parsed once, when the reference was built or decoded
            "image": k8s.image,
            "job_uri": job.job_uri,
            "python": k8s.runner_python or "python",
            "service_account": k8s.service_account,
            "env": k8s.container_env,
            "extras": pod_extras(
                job, requirements_cache_for(resolve_setting("requirements_cache"), k8s.cluster, job)
            ),
            "secret_env": key_env(self.object_name(job)),
            "placement": placement_of(k8s.capacity, k8s.max_run_seconds, k8s.local_queue, k8s.priority_class),
            "grace_seconds": math.ceil(kill_after_seconds(job.stop_grace_seconds)),  # job.stop
        }

    def manifest(self, job: JobRef) -> dict[str, Any]:
        return build_job_manifest(
            **self._pod_args(job), active_deadline_seconds=job.on_cluster().active_deadline_seconds
        )

    def submit(self, job: JobRef, *, env: dict[str, str] | None = None, job_key: str | None = None) -> None:
        # a name the controllers cannot derive pods from is refused here, not silently there
        check_derived_names(job.job_id, int(job.hosts or 1))
        api = self._api(job)
        k8s = job.on_cluster()
        if k8s.local_queue:  # a LocalQueue that does not exist would hold the job for ever
            check_local_queue(api, k8s.namespace, str(k8s.local_queue))
        # pod_override= / [kinetic] pod_override over every pod template, checked before the POST
        manifest = apply_to_manifest(self.manifest(job), job.on_cluster().pod_override)
        created = self._create(api, job, manifest)
        if job_key:  # the key's Secret, owned by what was just created (backends.gke.job_key)
            create_key_secret(api, created, job_key, job.job_identity.labels())

    def _create(self, api: KubeApi, job: JobRef, manifest: dict[str, Any]) -> dict[str, Any]:
        """POST the Job / LeaderWorkerSet, or adopt this task instance's; returns the object."""
        name = self.object_name(job)
        try:
            return api.request("POST", self.object_path(job), body=manifest)
        except ApiError as exc:
            if exc.status != 409:
                raise
            existing = api.get_or_none(self.object_path(job, name)) or {}
            owner = existing.get("metadata", {}).get("labels", {}).get(TI_LABEL)
            if owner != _owner_label(job):
                raise JobOwnershipError(
                    f"a {self.kind_label} named {name} already exists in namespace "
                    f"{job.on_cluster().namespace} but is "
                    f"not labelled as this task instance's ({TI_LABEL}={owner!r}, expected "
                    f"{_owner_label(job)!r}); kinetic will not adopt or delete it. Delete it if it is stale."
                ) from None
            log.info("%s %s already exists for this task instance; adopting it", self.kind_label, name)
            return existing

    # Status -----------------------------------------------------------------------------------
    def status(self, job: JobRef) -> BackendStatus:
        api = self._api(job)
        name = self.object_name(job)
        found = api.get_or_none(self.object_path(job, name))
        if found is None:
            return BackendStatus(JobState.NOT_FOUND)
        query = {"labelSelector": self.pod_selector(job)}
        pods = api.request("GET", KubeApi.pods_path(job.on_cluster().namespace), query=query).get("items", [])
        status = self._classify(job, found, pods)
        if status.state is JobState.PENDING and self.missing_pods(job, pods):
            status = self._with_refusal(found, status, self._listed_refusals(api, job))
        if self._kueue_decides(job, status):
            status = with_queue(status, self._queue_look(api, job, found, fresh=_decisive(status)))
        return status

    # Kueue ------------------------------------------------------------------------------------
    @staticmethod
    def _kueue_decides(job: JobRef, status: BackendStatus) -> bool:
        """A job in a Kueue queue that has not run to success: its Workload says whether it is
        queued, admitted, evicted or refused (a running job's eviction shows as its pods ending)."""
        return bool(job.on_cluster().local_queue) and status.state in (JobState.PENDING, JobState.FAILED)

    def _queue_look(
        self, api: KubeApi, job: JobRef, found: dict[str, Any], *, fresh: bool = False
    ) -> QueueState:
        """The Workload read at most every ``QUEUE_LOOK_SECONDS`` per job: the shared watch does
        not follow Workloads, and a queue wait is long. ``fresh``: read it now, whatever the last
        read: a pod that has just failed may have been stopped by an eviction the last read
        predates, and that read would turn a Kueue preemption into the task's failure."""
        name = self.object_name(job)
        cached = self._queue_looks.get(name)
        now = time.monotonic()
        if (
            not fresh
            and cached is not None
            and now - cached[0] < QUEUE_LOOK_SECONDS
            and cached[1].workload is not None
        ):
            return cached[1]
        k8s = job.on_cluster()
        state = queue_state(api, k8s.namespace, found, str(k8s.local_queue))
        self._queue_looks[name] = (now, state)
        return state

    def _listed_refusals(self, api: KubeApi, job: JobRef) -> list[dict[str, Any]]:
        """FailedCreate events about the job's objects, listed (no watch: the worker's look)."""
        try:
            events = api.request(
                "GET",
                f"/api/v1/namespaces/{job.on_cluster().namespace}/events",
                query={"fieldSelector": FAILED_CREATE},
            ).get("items", [])
        except ApiError as exc:
            log.debug("cannot list events (%s): pods that cannot be created are told by startup_timeout", exc)
            return []
        names = self.refusal_names(job)
        return [e for e in events if (e.get("involvedObject") or {}).get("name") in names]

    def _forbidden(self, watch: ClusterWatch) -> BackendStatus | None:
        reason = watch.forbidden
        if reason is None:
            return None
        return BackendStatus(JobState.FAILED, reason="Forbidden", message=reason)

    def _from_watch(self, job: JobRef, watch: ClusterWatch, found: dict[str, Any]) -> BackendStatus:
        pods = self._watched_pods(watch, job)
        status = self._classify(job, found, pods)
        if status.state is JobState.PENDING and self.missing_pods(job, pods):
            status = self._with_refusal(found, status, watch.failed_creates(self.refusal_names(job)))
        return status

    async def astatus(self, job: JobRef) -> BackendStatus:
        """From the shared watch's memory, in the loop (no thread hop) once it is synced and
        knows the Job; otherwise a direct read in a thread.

        Until the watch has listed, the look waits for it on the loop (``await_synced``), not in
        a worker thread: forty triggers started together by a restarted triggerer must not park
        forty threads of the default executor for the length of a relist. If the watch has not
        listed within ``SYNC_TIMEOUT_SECONDS`` the job is read from the API instead, as before.
        A watch that RBAC refuses is an error naming the verb, never a stale cache.
        """
        observed = await self._aobserved(job)
        watch = observed.watch
        listed = watch.synced or await watch.await_synced(SYNC_TIMEOUT_SECONDS)
        forbidden = self._forbidden(watch)
        if forbidden is not None:
            return forbidden
        found = self._cached_object(watch, self.object_name(job)) if listed else None
        if found is not None:
            status = self._from_watch(job, watch, found)
            if self._kueue_decides(job, status):  # one read of the Workload, off the loop
                state = await asyncio.to_thread(
                    self._queue_look, observed.api, job, found, fresh=_decisive(status)
                )
                status = with_queue(status, state)
            return status
        # not listed in time, or just created and not seen yet, or really gone: ask once
        return await asyncio.to_thread(self.status, job)

    def _connect(self, job: JobRef) -> tuple[KubeApi, ClusterWatch]:
        """The job's client and shared watch; may do I/O, so a trigger calls it in a thread."""
        k8s = job.on_cluster()
        return self._api(job), shared_watch(k8s.cluster, k8s.namespace)

    def _connected(self, job: JobRef) -> tuple[KubeApi, ClusterWatch] | None:
        """``_connect`` from memory when the client and watch exist already (no thread hop)."""
        k8s = job.on_cluster()
        api = cached_kube_api(k8s.cluster)
        watch = cached_watch(k8s.cluster, k8s.namespace)
        return (api, watch) if api is not None and watch is not None else None

    async def _aobserved(self, job: JobRef) -> Observed:
        """The job's ``Observed``, connected in a worker thread on first use.

        The change event is subscribed before the job's state is first read, so a change between
        a look and the next wait is never lost (see ``await_change``).
        """
        name = self.object_name(job)
        found = self._observed.get(name)
        if found is not None and not found.watch.stopped.is_set():
            return found
        api, watch = self._connected(job) or await asyncio.to_thread(self._connect, job)
        found = self._observed.get(name)  # another look of this job may have connected meanwhile
        if found is not None and found.watch is watch:
            return found
        if found is not None:  # its watch was stopped (reset): follow the new one
            found.watch.unsubscribe(name, found.changed)
        changed = found.changed if found is not None else asyncio.Event()
        watch.subscribe(name, changed)
        observed = self._observed[name] = Observed(api, watch, changed)
        return observed

    # Cancel -----------------------------------------------------------------------------------
    def cancel(self, job: JobRef) -> None:
        api = self._api(job)
        name = self.object_name(job)
        path = self.object_path(job, name)
        existing = api.get_or_none(path)
        if existing is None:
            return
        if existing.get("metadata", {}).get("labels", {}).get(TI_LABEL) != _owner_label(job):
            log.warning(
                "not deleting %s %s: it is not labelled as this task instance's", self.kind_label, name
            )
            return
        api.delete_foreground(path)

    # Logs -------------------------------------------------------------------------------------
    async def _stream(self, job: JobRef) -> PodLogStream | None:
        """The log stream of the job's newest started pod, opened on first use (in this loop)."""
        name = self.object_name(job)
        stream = self._streams.get(name)
        if stream is None:
            observed = await self._aobserved(job)
            pods = [
                p
                for p in observed.watch.pods_of(name)
                if p.get("status", {}).get("phase") in ("Running", "Succeeded", "Failed")
            ]
            if not pods:
                return None
            pod = max(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")
            stream = self._streams[name] = PodLogStream(
                observed.api,
                job.on_cluster().namespace,
                pod["metadata"]["name"],
                CONTAINER_NAME,
                still_running=container_running(observed.watch, pod["metadata"]["name"]),
            )
            stream.listeners.add(observed.changed)
            stream.start()
        return stream

    def _logs_url(self, job: JobRef) -> str | None:
        """Cloud Logging query of the job's pods; None on a cluster that is not GKE."""
        k8s = job.on_cluster()
        cluster = k8s.cluster or {}
        if cluster.get("kubernetes_conn_id") and not cluster.get("project"):
            return None
        return job_links(
            project=cluster.get("project"),
            location=cluster.get("location") or "",
            cluster=cluster.get("name") or "",
            namespace=k8s.namespace,
            job_name=self.object_name(job),
        )["logs"]

    def full_log_hint(self, job: JobRef) -> str:
        command = f"kubectl logs -n {job.on_cluster().namespace} job/{self.object_name(job)}"
        url = self._logs_url(job)
        if url is None:
            return f"`{command}` (while the Job exists: ttlSecondsAfterFinished={TTL_AFTER_FINISHED_SECONDS})"
        return f"Cloud Logging {url} , or `{command}` while the Job exists"

    async def alog_complete(self, job: JobRef) -> bool:
        stream = await self._stream(job)
        return stream is not None and stream.done.is_set()

    def output_ended(self, job: JobRef) -> bool:
        stream = self._streams.get(self.object_name(job))
        return stream is not None and stream.ended

    async def aread_log(self, job: JobRef, offset: int) -> tuple[str, int]:
        """Offset counts lines: a rebuilt trigger skips what an earlier one already showed."""
        stream = await self._stream(job)
        if stream is None:
            return "", offset
        lines = stream.read_from(offset)
        stream.release(offset + len(lines))  # shown (or shown by an earlier trigger): not kept
        if not lines:
            return "", offset
        return "\n".join(lines) + "\n", offset + len(lines)

    notifies = True

    async def await_change(self, job: JobRef, timeout: float) -> None:
        """Until the watch sees the Job or a pod of it change, its log stream brings lines or
        ends, or ``timeout``: no timer wakes a watcher whose job is quiet.

        The event stays subscribed between waits and is cleared on waking, before the watcher
        looks again: whatever changes after that look sets it, and the next wait returns at once.
        """
        changed = (await self._aobserved(job)).changed
        await wait_event(changed, timeout)  # not asyncio.wait_for: it may swallow a cancellation
        changed.clear()

    def close(self) -> None:
        for stream in self._streams.values():
            stream.stop()
        self._streams.clear()
        for name, observed in self._observed.items():
            observed.watch.unsubscribe(name, observed.changed)
        self._observed.clear()
