"""Kueue (kueue.x-k8s.io, stored in v1beta2) as one controller: the job webhook's suspend, one
Workload per job, quota admission through LocalQueue -> ClusterQueue, preemption within a
ClusterQueue, eviction and requeueing, stop policies, the ProvisioningRequest admission check
(with a model of GKE's queued provisioning answering the requests), the visibility API's pending
workloads, and GKE flex-start's maximum run duration.

Every rule is read from kubernetes-sigs/kueue at the pinned release v0.19.2 (crds/UPSTREAM.json,
commit 8eab687; file and function named where the rule is written, paths relative to that tag)
with its default feature gates and configuration, or from the GKE documentation (URL named).
Nothing of upstream's code is copied. What is not modelled is listed in this package's README
(Kueue section).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import time
from typing import Any

from . import errors
from ._util import fmt_time, parse_time, utcnow
from .objects import condition_true, find_condition, set_condition
from .resources import (
    ADMISSIONCHECKS,
    CLUSTERQUEUES,
    JOBS,
    JOBSETS,
    LOCALQUEUES,
    LWS,
    PODS,
    PODTEMPLATES,
    PROVISIONINGREQUESTCONFIGS,
    PROVISIONINGREQUESTS,
    RESOURCEFLAVORS,
    WORKLOADPRIORITYCLASSES,
    WORKLOADS,
    ResourceType,
)

log = logging.getLogger(__name__)

GROUP = "kueue.x-k8s.io"
# pkg/controller/constants/constants.go
QUEUE_NAME = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"
JOB_UID = "kueue.x-k8s.io/job-uid"
MANAGED = "kueue.x-k8s.io/managed"
# pkg/controller/jobs/pod/constants: the scheduling gate Kueue's pod webhook adds (pod groups, LWS)
ADMISSION_GATE = "kueue.x-k8s.io/admission"
# pkg/controller/admissionchecks/provisioning (ControllerName) and the autoscaler API's annotations
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
CONSUME_PROVREQ = "autoscaling.x-k8s.io/consume-provisioning-request"
PROVREQ_CLASS = "autoscaling.x-k8s.io/provisioning-class-name"
QUEUED_PROVISIONING_CLASS = "queued-provisioning.gke.io"
# GKE: https://cloud.google.com/kubernetes-engine/docs/concepts/dws (flex-start nodes, maxRunDurationSeconds)
# and https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest (queued provisioning)
FLEX_START_LABEL = "cloud.google.com/gke-flex-start"
# Not confirmed in the GKE pages read for this (only the pool-level maxRunDurationSeconds is):
# the queued-provisioning key and a per-pod max-run node selector. Kept as names, see README.
QUEUED_LABEL = "cloud.google.com/gke-queued"
MAX_RUN_SELECTOR = "cloud.google.com/gke-max-run-duration-seconds"
FLEX_START_DEFAULT_MAX_RUN = 7 * 24 * 3600.0  # "If you don't specify ... the default is seven days"

LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"

# pkg/features/kube_features.go: UnadmittedWorkloadsObservability is Beta and off by default in
# v0.19.2 (main turned it on after the release branch). Off, the unadmitted reasons are the
# fallbacks (``pkg/workload/workload.go`` ``UnadmittedWorkloadReasonWithFallback``).
UNADMITTED_WORKLOADS_OBSERVABILITY = False

QUOTA_RESERVED, ADMITTED, FINISHED = "QuotaReserved", "Admitted", "Finished"
EVICTED, PREEMPTED, REQUEUED = "Evicted", "Preempted", "Requeued"
# Eviction reasons after which Kueue requeues at once (Requeued=True): reconciler.go ``setRequeued``
REQUEUED_AT_ONCE = ("Preempted", "NodeFailures")
DEACTIVATION_TARGET = "DeactivationTarget"

_GVK = {
    JOBS: ("Job", "batch"),
    JOBSETS: ("JobSet", "jobset.x-k8s.io"),
    LWS: ("LeaderWorkerSet", "leaderworkerset.x-k8s.io"),
}


# ------------------------------------------------------------------------ the webhooks
def kueue_default_suspend(obj: dict[str, Any]) -> None:
    """``pkg/controller/jobframework/defaults.go`` ``ApplyDefaultForSuspend``: a Job / JobSet
    naming a queue (``manageJobsWithoutQueueName: false``) is created suspended."""
    if ((obj.get("metadata") or {}).get("labels") or {}).get(QUEUE_NAME):
        obj.setdefault("spec", {})["suspend"] = True


def kueue_gate_pod(cluster: Any, pod: dict[str, Any]) -> None:
    """Kueue's LWS integration runs each group as a pod group (``pkg/controller/jobs/
    leaderworkerset``, ``pkg/controller/jobs/pod/pod_webhook.go`` ``Default``): the pods get the
    ``kueue.x-k8s.io/admission`` scheduling gate until the group's Workload is admitted."""
    labels = pod["metadata"].get("labels") or {}
    lws_name = labels.get(LWS_NAME)
    if not lws_name:
        return
    lws = cluster.store.get(LWS, pod["metadata"].get("namespace"), lws_name)
    if lws is None or not (lws["metadata"].get("labels") or {}).get(QUEUE_NAME):
        return
    name = workload_name(f"{lws_name}-{labels.get(LWS_GROUP, '0')}", lws["metadata"]["uid"], LWS)
    wl = cluster.store.get(WORKLOADS, pod["metadata"]["namespace"], name)
    if wl is not None and condition_true(_conds(wl), ADMITTED):
        _merge_pod_spec(
            pod.setdefault("spec", {}),
            pod.setdefault("metadata", {}),
            _podset_info(cluster, wl, _pod_podset(pod, lws)),
        )
        return
    gates = pod.setdefault("spec", {}).setdefault("schedulingGates", [])
    if not any(g.get("name") == ADMISSION_GATE for g in gates):
        gates.append({"name": ADMISSION_GATE})


def _pod_podset(pod: dict[str, Any], lws: dict[str, Any]) -> str:
    """The pod set of an LWS pod (``_podsets``): ``main`` without a leaderTemplate, else the
    leader (worker index 0) or the workers."""
    if not ((lws.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("leaderTemplate"):
        return "main"
    return (
        "leader"
        if (pod["metadata"].get("labels") or {}).get("leaderworkerset.sigs.k8s.io/worker-index", "0") == "0"
        else "worker"
    )


# ------------------------------------------------------------------------ names
def workload_name(owner_name: str, owner_uid: str, rt: ResourceType) -> str:
    """``pkg/controller/jobframework/workload_names.go`` ``GetWorkloadNameForOwnerWithGVK``:
    ``<kind lowercased>-<name>`` (cut to 247) ``-`` first 5 hex of SHA-1(kind, group, name, uid)."""
    kind, group = _GVK[rt]
    prefix = f"{kind.lower()}-{owner_name}"[: 253 - 1 - 5]
    digest = hashlib.sha1(f"{kind}\n{group}\n{owner_name}\n{owner_uid}".encode()).hexdigest()
    return f"{prefix}-{digest[:5]}"


def _limit_name(full: str) -> str:
    """``pkg/controller/admissionchecks/provisioning/controller.go`` ``limitObjectName``."""
    if len(full) <= 252 - 5:
        return full
    return f"{full[: 252 - 5]}-{hashlib.sha1(full.encode()).hexdigest()[:5]}"


def provisioning_request_name(workload: str, check: str, attempt: int) -> str:
    """``provisioning.go`` ``ProvisioningRequestName``: ``<workload>-<check>-<attempt>``."""
    return _limit_name(f"{workload}-{check}-{attempt}")


def pod_template_name(request: str, podset: str) -> str:
    """``provisioning.go`` ``getProvisioningRequestPodTemplateName``: ``ppt-<request>-<podset>``."""
    return _limit_name(f"ppt-{request}-{podset}")


# ------------------------------------------------------------------------ quantities
_SUFFIX = {
    "": 1.0,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
}


def quantity(text: Any) -> float:
    s = str(text).strip()
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if suffix and s.endswith(suffix):
            return float(s[: -len(suffix)]) * _SUFFIX[suffix]
    return float(s)


def format_quantity(resource: str, value: float) -> str:
    """Like ``resource.Quantity.String()``: cpu in cores or millicores, memory in the largest
    binary suffix dividing it, other resources as integers."""
    if resource == "cpu":
        milli = round(value * 1000)
        return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"
    amount = round(value)
    if resource in ("memory", "ephemeral-storage") and amount:
        for suffix in ("Pi", "Ti", "Gi", "Mi", "Ki"):
            if amount % int(_SUFFIX[suffix]) == 0:
                return f"{amount // int(_SUFFIX[suffix])}{suffix}"
    return str(amount)


def pod_requests(spec: dict[str, Any]) -> dict[str, float]:
    """``pkg/workload/resources.go``: the containers' requests (limits where a request is
    missing, ``UseLimitsAsMissingRequestsInPod``), at least each init container's."""

    def one(c: dict[str, Any]) -> dict[str, float]:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: quantity(v) for k, v in merged.items()}

    total: dict[str, float] = {}
    for c in spec.get("containers") or []:
        for k, v in one(c).items():
            total[k] = total.get(k, 0.0) + v
    for c in spec.get("initContainers") or []:
        for k, v in one(c).items():
            total[k] = max(total.get(k, 0.0), v)
    return total


def _conds(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return (obj.get("status") or {}).get("conditions") or []


def queue_timestamp(wl: dict[str, Any]) -> str:
    """``pkg/workload/workload.go`` ``Ordering.GetQueueOrderTimestamp``: the time of an eviction
    still in force (``Evicted=True``) by ``PodsReadyTimeout`` (``waitForPodsReady.
    requeuingStrategy.timestamp: Eviction``, the default) or ``AdmissionCheck``, else the
    creation time: a workload evicted for any other reason (``Preempted``, a stopped queue,
    ``NodeFailures``...) keeps its place by creation time."""
    ev = find_condition(_conds(wl), EVICTED)
    if ev and ev.get("status") == "True" and ev.get("reason") in ("PodsReadyTimeout", "AdmissionCheck"):
        return str(ev["lastTransitionTime"])
    return str(wl["metadata"]["creationTimestamp"])


def _unadmitted_reason(granular: str, fallback: str) -> str:
    """``pkg/workload/workload.go`` ``UnadmittedWorkloadReasonWithFallback``."""
    return granular if UNADMITTED_WORKLOADS_OBSERVABILITY else fallback


def _merge_pod_spec(spec: dict[str, Any], meta: dict[str, Any], info: dict[str, Any]) -> None:
    """``pkg/podset/podset.go`` ``Merge``: node labels of the assigned flavors into the node
    selector, the flavors' tolerations appended, the admission checks' annotations."""
    if info.get("nodeSelector"):
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **info["nodeSelector"]}
    for tol in info.get("tolerations") or []:
        tols = spec.setdefault("tolerations", [])
        if tol not in tols:
            tols.append(tol)
    if info.get("annotations"):
        meta["annotations"] = {**(meta.get("annotations") or {}), **info["annotations"]}
    if info.get("labels"):
        meta["labels"] = {**(meta.get("labels") or {}), **info["labels"]}


def _podset_info(cluster: Any, wl: dict[str, Any], podset: str) -> dict[str, Any]:
    """``pkg/podset/podset.go`` ``FromAssignment`` + the admission checks' ``podSetUpdates``."""
    info: dict[str, Any] = {"nodeSelector": {}, "tolerations": [], "annotations": {}, "labels": {}}
    for psa in ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []:
        if psa.get("name") != podset:
            continue
        for flavor_name in dict.fromkeys((psa.get("flavors") or {}).values()):
            flavor = cluster.store.get(RESOURCEFLAVORS, None, flavor_name)
            fspec = (flavor or {}).get("spec") or {}
            info["nodeSelector"].update(fspec.get("nodeLabels") or {})
            info["tolerations"].extend(fspec.get("tolerations") or [])
    for check in (wl.get("status") or {}).get("admissionChecks") or []:
        for upd in check.get("podSetUpdates") or []:
            if upd.get("name") == podset:
                info["nodeSelector"].update(upd.get("nodeSelector") or {})
                info["annotations"].update(upd.get("annotations") or {})
                info["labels"].update(upd.get("labels") or {})
                info["tolerations"].extend(upd.get("tolerations") or [])
    return info


# ------------------------------------------------------------------------ the controller
class KueueController:
    """One pass reconciles the jobs with their Workloads, schedules each ClusterQueue, syncs the
    admission checks and runs the model of GKE's provisioning and flex-start nodes."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        # The provisioning model (``set_provisioning``): how GKE answers ProvisioningRequests.
        self.provisioning: dict[str, Any] = {"delay_seconds": 0.0, "fail": False, "message": None}
        self._pr_seen: dict[str, float] = {}
        self._flex_killed: set[str] = set()

    @property
    def store(self) -> Any:
        return self.cluster.store

    def reconcile_all(self) -> None:
        if not any(self.store.list(rt) for rt in (WORKLOADS, CLUSTERQUEUES, LOCALQUEUES)) and not any(
            (o["metadata"].get("labels") or {}).get(QUEUE_NAME)
            for rt in (JOBS, JOBSETS, LWS)
            for o in self.store.list(rt)
        ):
            self._flex_start()  # nothing queued: only GKE's part runs
            return
        for step in (
            self._drain_stopped_queues,
            self._sync_jobs,
            self._delete_orphans,
            self._requeue,
            self._schedule,
            self._sync_checks,
            self._autoscaler,
        ):
            try:
                step()
            except errors.ApiError as exc:  # races with a user's delete
                log.debug("kueue %s: %s", step.__name__, exc)
            except Exception:
                log.exception("kueue %s failed", step.__name__)
        self._flex_start()

    # Jobs <-> Workloads ---------------------------------------------------------------------
    def _owners(self) -> list[tuple[ResourceType, dict[str, Any], str, str, list[dict[str, Any]]]]:
        """(kind, job, workload name, job uid, podSets) for each job Kueue manages."""
        out = []
        for rt in (JOBS, JOBSETS):
            for job in self.store.list(rt):
                md = job["metadata"]
                if not (md.get("labels") or {}).get(QUEUE_NAME) or md.get("deletionTimestamp"):
                    continue
                if rt is JOBS and any(r.get("controller") for r in md.get("ownerReferences") or []):
                    # a JobSet's child: managed through its parent (jobframework IsOwnerManagedByKueue)
                    continue
                out.append((rt, job, workload_name(md["name"], md["uid"], rt), md["uid"], _podsets(rt, job)))
        for lws in self.store.list(LWS):
            md = lws["metadata"]
            if not (md.get("labels") or {}).get(QUEUE_NAME) or md.get("deletionTimestamp"):
                continue
            for group in range(int((lws.get("spec") or {}).get("replicas", 1))):
                # leaderworkerset_webhook.go GetWorkloadName: one Workload per group
                name = workload_name(f"{md['name']}-{group}", md["uid"], LWS)
                out.append((LWS, lws, name, md["uid"], _podsets(LWS, lws)))
        return out

    def _sync_jobs(self) -> None:
        for rt, job, name, uid, podsets in self._owners():
            md = job["metadata"]
            wl = self.store.get(WORKLOADS, md["namespace"], name)
            if wl is None:
                wl = self._create_workload(rt, job, name, uid, podsets)
                if wl is None:
                    continue
            self._sync_job(rt, job, wl, name)

    def _create_workload(
        self, rt: ResourceType, job: dict[str, Any], name: str, uid: str, podsets: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """``pkg/controller/jobframework/reconciler.go`` ``ensureOneWorkload`` /
        ``handleJobWithNoWorkload`` (``constructWorkload``, ``prepareWorkload``). The priority is
        ``ExtractPriority``'s: a ``kueue.x-k8s.io/priority-class`` label naming no
        WorkloadPriorityClass is an error (``pkg/util/priority`` ``GetPriorityFromWorkloadPriorityClass``
        returns the NotFound), so no Workload is created and the job stays suspended until the
        class exists (the reconciler retries); v0.19.2 records no event for it."""
        md = job["metadata"]
        labels = md.get("labels") or {}
        kind, group = _GVK[rt]
        spec: dict[str, Any] = {
            "queueName": labels[QUEUE_NAME],
            "podSets": podsets,
            "active": True,
            "priority": 0,
        }
        pc = labels.get(PRIORITY_CLASS)
        if pc:
            wpc = self.store.get(WORKLOADPRIORITYCLASSES, None, pc)
            if wpc is None:
                return None
            # v1beta2's priorityClassRef (v1beta1: priorityClassSource + priorityClassName)
            spec["priorityClassRef"] = {"group": GROUP, "kind": "WorkloadPriorityClass", "name": pc}
            spec["priority"] = int(wpc.get("value", 0))
        obj = {
            "apiVersion": WORKLOADS.api_version,
            "kind": "Workload",
            "metadata": {
                "name": name,
                "namespace": md["namespace"],
                "labels": {JOB_UID: uid},
                "ownerReferences": [
                    {
                        "apiVersion": f"{group}/{rt.version}",
                        "kind": kind,
                        "name": md["name"],
                        "uid": uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }
        with contextlib.suppress(errors.ApiError):
            created = self.cluster.create(WORKLOADS, obj, validate=False)
            self.cluster.record_event(
                job,
                "Normal",
                "CreatedWorkload",
                f"Created Workload: {md['namespace']}/{name}",
                component="kueue-admission",
            )
            return created
        return None

    def _sync_job(self, rt: ResourceType, job: dict[str, Any], wl: dict[str, Any], name: str) -> None:
        """``jobframework/reconciler.go`` ``ReconcileGenericJob``: finished, evicted, admitted."""
        md = job["metadata"]
        conds = _conds(wl)
        if condition_true(conds, FINISHED):
            return
        finished = _job_finished(rt, job)
        if finished is not None:
            success, message = finished

            def finish(obj: dict[str, Any]) -> None:
                c = obj.setdefault("status", {}).setdefault("conditions", [])
                # workload/finish: Finish(reason Succeeded|Failed, the job's condition message)
                set_condition(c, FINISHED, "True", "Succeeded" if success else "Failed", message, probe=False)

            self.store.mutate(WORKLOADS, md["namespace"], name, finish)
            return
        reserved = condition_true(conds, QUOTA_RESERVED)
        if condition_true(conds, EVICTED) and reserved:
            # "the workload is evicted: stop the job, then release the quota"
            if self._stop_job(rt, job, wl):
                self._release(wl)
            return
        if condition_true(conds, ADMITTED) and self._suspended(rt, job, wl):
            self._start_job(rt, job, wl)

    def _suspended(self, rt: ResourceType, job: dict[str, Any], wl: dict[str, Any]) -> bool:
        if rt is LWS:
            return any(
                ADMISSION_GATE in [g.get("name") for g in p["spec"].get("schedulingGates") or []]
                for p in self._group_pods(job, wl)
            )
        return bool((job.get("spec") or {}).get("suspend"))

    def _group_pods(self, lws: dict[str, Any], wl: dict[str, Any]) -> list[dict[str, Any]]:
        group = wl["metadata"]["name"].rsplit("-", 2)[-2]
        return [
            p
            for p in self.store.list(PODS, lws["metadata"]["namespace"])
            if (p["metadata"].get("labels") or {}).get(LWS_NAME) == lws["metadata"]["name"]
            and (p["metadata"].get("labels") or {}).get(LWS_GROUP) == group
        ]

    def _start_job(self, rt: ResourceType, job: dict[str, Any], wl: dict[str, Any]) -> None:
        """``GenericJob.RunWithPodSetsInfo``: inject each pod set's info, then unsuspend / ungate."""
        md = job["metadata"]
        if rt is LWS:
            for pod in self._group_pods(job, wl):
                info = _podset_info(self.cluster, wl, _pod_podset(pod, job))

                def ungate(obj: dict[str, Any], info: dict[str, Any] = info) -> None:
                    gates = [
                        g for g in obj["spec"].get("schedulingGates") or [] if g.get("name") != ADMISSION_GATE
                    ]
                    obj["spec"]["schedulingGates"] = gates
                    if not gates:
                        obj["spec"].pop("schedulingGates")
                    _merge_pod_spec(obj["spec"], obj["metadata"], info)

                self.store.mutate(PODS, md["namespace"], pod["metadata"]["name"], ungate)
            self.cluster.scheduling_changed()
        else:

            def run(obj: dict[str, Any]) -> None:
                spec = obj["spec"]
                for ps_name, template in _templates(rt, obj):
                    info = _podset_info(self.cluster, wl, ps_name)
                    _merge_pod_spec(
                        template.setdefault("spec", {}), template.setdefault("metadata", {}), info
                    )
                spec["suspend"] = False

            self.store.mutate(rt, md["namespace"], md["name"], run)
            if rt is JOBSETS:  # child Jobs created while suspended take the injected template too
                fresh = self.store.get(JOBSETS, md["namespace"], md["name"])
                self._sync_jobset_children(fresh)
        cq = ((wl.get("status") or {}).get("admission") or {}).get("clusterQueue", "")
        self.cluster.record_event(
            job, "Normal", "Started", f"Admitted by clusterQueue {cq}", component="kueue-admission"
        )

    def _sync_jobset_children(self, jobset: dict[str, Any] | None) -> None:
        if jobset is None:
            return
        rjobs = {r["name"]: r for r in jobset["spec"].get("replicatedJobs") or []}
        for job in self.store.list(JOBS, jobset["metadata"]["namespace"]):
            if not any(
                r.get("uid") == jobset["metadata"]["uid"]
                for r in job["metadata"].get("ownerReferences") or []
            ):
                continue
            rjob = rjobs.get(
                (job["metadata"].get("labels") or {}).get("jobset.sigs.k8s.io/replicatedjob-name", "")
            )
            if rjob is None:
                continue
            tmpl = ((rjob.get("template") or {}).get("spec") or {}).get("template") or {}

            def copy_in(obj: dict[str, Any], tmpl: dict[str, Any] = tmpl) -> None:
                pt = obj["spec"].setdefault("template", {})
                ps = pt.setdefault("spec", {})
                tspec = tmpl.get("spec") or {}
                for key in ("nodeSelector", "tolerations"):
                    if key in tspec:
                        ps[key] = copy.deepcopy(tspec[key])
                ann = (tmpl.get("metadata") or {}).get("annotations")
                if ann:
                    pt.setdefault("metadata", {}).setdefault("annotations", {}).update(ann)

            self.store.mutate(JOBS, job["metadata"]["namespace"], job["metadata"]["name"], copy_in)

    def _stop_job(self, rt: ResourceType, job: dict[str, Any], wl: dict[str, Any]) -> bool:
        """``GenericJob.Suspend`` + ``RestorePodSetsInfo`` (the templates as the Workload kept
        them); True once no pod of the job is active, so the quota can be released."""
        md = job["metadata"]
        if rt is LWS:
            pods = self._group_pods(job, wl)
            for pod in pods:  # the group's pods are deleted and come back gated
                if not pod["metadata"].get("deletionTimestamp"):
                    with contextlib.suppress(errors.ApiError):
                        self.cluster.delete(PODS, md["namespace"], pod["metadata"]["name"], grace=None)
            return not pods
        originals = {ps["name"]: ps.get("template") or {} for ps in wl["spec"].get("podSets") or []}

        def stop(obj: dict[str, Any]) -> None:
            obj["spec"]["suspend"] = True
            for ps_name, template in _templates(rt, obj):
                orig = originals.get(ps_name) or {}
                spec = template.setdefault("spec", {})
                for key in ("nodeSelector", "tolerations"):
                    if key in (orig.get("spec") or {}):
                        spec[key] = copy.deepcopy(orig["spec"][key])
                    else:
                        spec.pop(key, None)

        self.store.mutate(rt, md["namespace"], md["name"], stop)
        if rt is JOBS:
            current = self.store.get(JOBS, md["namespace"], md["name"]) or job
            pods = [
                p
                for p in self.store.list(PODS, md["namespace"])
                if any(r.get("uid") == md["uid"] for r in p["metadata"].get("ownerReferences") or [])
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            ]
            return not pods and not (current.get("status") or {}).get("active")
        children = [
            j
            for j in self.store.list(JOBS, md["namespace"])
            if any(r.get("uid") == md["uid"] for r in j["metadata"].get("ownerReferences") or [])
        ]
        return all(not (j.get("status") or {}).get("active") for j in children)

    def _release(self, wl: dict[str, Any]) -> None:
        """The evicted job is stopped: clear the admission
        (kubernetes-sigs/kueue v0.19.2 ``pkg/controller/jobframework/reconciler.go``
        ``ReconcileGenericJob``, step "6. handle eviction"): ``SetRequeuedCondition(wl,
        <Evicted reason>, <Evicted message>, setRequeued)`` where ``setRequeued`` is true only for
        ``Preempted`` and ``NodeFailures``, then ``UnsetQuotaReservationWithCondition(wl, "Pending",
        <Evicted message>)`` (``Pending``: the fallback while the UnadmittedWorkloadsObservability
        gate is off, its 0.19 default). A ``Requeued=False`` Workload waits until
        ``_requeue`` sets it True (the workload controller)."""
        md = wl["metadata"]

        def unset(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            c = status.setdefault("conditions", [])
            ev = find_condition(c, EVICTED) or {}
            reason = ev.get("reason", "Pending")
            requeued = "True" if reason in REQUEUED_AT_ONCE else "False"
            set_condition(c, REQUEUED, requeued, reason, ev.get("message", ""), probe=False)
            status.pop("admission", None)
            # UnsetQuotaReservationWithCondition (then SyncAdmittedCondition)
            reserved_reason = _unadmitted_reason("PendingEvaluation", "Pending")
            set_condition(c, QUOTA_RESERVED, "False", reserved_reason, ev.get("message", ""), probe=False)
            _sync_admitted(obj)

        self.store.mutate(WORKLOADS, md["namespace"], md["name"], unset)

    def _requeue(self) -> None:
        """``Requeued=False`` back to True (kubernetes-sigs/kueue v0.19.2
        ``pkg/controller/core/workload_controller.go`` ``Reconcile``): after ``PodsReadyTimeout``
        or ``AdmissionCheck`` once ``status.requeueState.requeueAt`` has passed (reason
        ``BackoffFinished``, requeueAt cleared); after a deactivation once ``spec.active`` is true
        again (``Reactivated``); after ``ClusterQueueStopped`` / ``LocalQueueStopped`` once the
        queue's ``stopPolicy`` is ``None`` again (``ClusterQueueRestarted`` / ``LocalQueueRestarted``,
        ``isDisabledRequeuedByClusterQueueStopped`` / ``...LocalQueueStopped``)."""
        now = utcnow()
        for wl in self.store.list(WORKLOADS):
            rq = find_condition(_conds(wl), REQUEUED)
            if not rq or rq.get("status") != "False" or condition_true(_conds(wl), QUOTA_RESERVED):
                continue
            ns, reason = wl["metadata"]["namespace"], rq.get("reason")
            lq = self.store.get(LOCALQUEUES, ns, wl["spec"].get("queueName", ""))
            cq = self.store.get(CLUSTERQUEUES, None, ((lq or {}).get("spec") or {}).get("clusterQueue", ""))
            new: tuple[str, str] | None = None
            if reason in ("PodsReadyTimeout", "AdmissionCheck"):
                at = ((wl.get("status") or {}).get("requeueState") or {}).get("requeueAt")
                if not at or parse_time(at) <= now:
                    new = ("BackoffFinished", "The workload backoff was finished")
            elif reason == "Deactivated" and wl["spec"].get("active", True) is not False:
                new = ("Reactivated", "The workload was reactivated")
            elif reason == "LocalQueueStopped" and lq is not None and _stop_policy(lq) == "None":
                new = ("LocalQueueRestarted", "The LocalQueue was restarted after being stopped")
            elif reason == "ClusterQueueStopped" and cq is not None and _stop_policy(cq) == "None":
                new = ("ClusterQueueRestarted", "The ClusterQueue was restarted after being stopped")
            if new is None:
                continue

            def mark(obj: dict[str, Any], new: tuple[str, str] = new) -> None:
                set_condition(obj["status"]["conditions"], REQUEUED, "True", new[0], new[1], probe=False)
                rqs = obj["status"].get("requeueState")
                if new[0] == "BackoffFinished" and rqs:
                    rqs.pop("requeueAt", None)

            self.store.mutate(WORKLOADS, ns, wl["metadata"]["name"], mark)

    def _drain_stopped_queues(self) -> None:
        """An admitted Workload whose LocalQueue or ClusterQueue has ``stopPolicy: HoldAndDrain`` is
        evicted (kubernetes-sigs/kueue v0.19.2 ``pkg/controller/core/workload_controller.go``
        ``reconcileOnLocalQueueActiveState`` / ``reconcileOnClusterQueueActiveState``); ``Hold``
        only stops new admissions. A Workload set ``spec.active: false`` (by hand) is evicted
        ``Deactivated`` ("The workload is deactivated", ``Reconcile``'s inactive branch)."""
        for wl in self.store.list(WORKLOADS):
            conds = _conds(wl)
            if (
                wl["spec"].get("active", True) is False
                and condition_true(conds, QUOTA_RESERVED)
                and not condition_true(conds, EVICTED)
                and not condition_true(conds, FINISHED)
            ):
                ns, name = wl["metadata"]["namespace"], wl["metadata"]["name"]
                self.evict(ns, name, "Deactivated", "The workload is deactivated")
        for wl in self.store.list(WORKLOADS):
            conds = _conds(wl)
            if not condition_true(conds, ADMITTED) or condition_true(conds, EVICTED):
                continue
            if condition_true(conds, FINISHED):
                continue
            ns, name = wl["metadata"]["namespace"], wl["metadata"]["name"]
            lq = self.store.get(LOCALQUEUES, ns, wl["spec"].get("queueName", ""))
            cq_name = ((wl.get("status") or {}).get("admission") or {}).get("clusterQueue", "")
            cq = self.store.get(CLUSTERQUEUES, None, cq_name)
            if lq is not None and _stop_policy(lq) == "HoldAndDrain":
                self.evict(ns, name, "LocalQueueStopped", "The LocalQueue is stopped")
            elif cq is not None and _stop_policy(cq) == "HoldAndDrain":
                self.evict(ns, name, "ClusterQueueStopped", "The ClusterQueue is stopped")

    def _delete_orphans(self) -> None:
        """A Workload whose job is gone is deleted (GC through the owner reference; with an
        orphaning delete of the Job, jobframework's reconciler deletes it when the job is not found)."""
        live = {
            uid for rt in (JOBS, JOBSETS, LWS) for uid in (o["metadata"]["uid"] for o in self.store.list(rt))
        }
        for wl in self.store.list(WORKLOADS):
            uid = (wl["metadata"].get("labels") or {}).get(JOB_UID)
            if uid and uid not in live and not wl["metadata"].get("deletionTimestamp"):
                with contextlib.suppress(errors.ApiError):
                    self.cluster.delete(WORKLOADS, wl["metadata"]["namespace"], wl["metadata"]["name"])

    # Scheduling -----------------------------------------------------------------------------
    def queue_order(self, workloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``pkg/cache/queue/cluster_queue.go`` ``queueOrderingFunc`` / ``baseCompareFunc``
        (admission fair sharing off): higher priority first (``pkg/util/priority``
        ``EffectivePriority``), then the earlier ``queue_timestamp``. Upstream breaks a tie (the
        same second) by UID, i.e. at random; here the sort is stable, so ties keep creation order."""

        def key(wl: dict[str, Any]) -> tuple[int, str]:
            return (-int(wl["spec"].get("priority") or 0), queue_timestamp(wl))

        return sorted(workloads, key=key)

    def pending(self) -> dict[str, list[dict[str, Any]]]:
        """Pending workloads per ClusterQueue, in queue order (what the visibility API shows)."""
        out: dict[str, list[dict[str, Any]]] = {}
        for wl in self.store.list(WORKLOADS):
            conds = _conds(wl)
            if condition_true(conds, QUOTA_RESERVED) or condition_true(conds, FINISHED):
                continue
            if wl["spec"].get("active", True) is False:
                continue
            lq = self.store.get(LOCALQUEUES, wl["metadata"]["namespace"], wl["spec"].get("queueName", ""))
            if lq is None:
                continue
            out.setdefault((lq.get("spec") or {}).get("clusterQueue", ""), []).append(wl)
        return {cq: self.queue_order(wls) for cq, wls in out.items()}

    def _cq_inactive(self, cq: dict[str, Any]) -> str | None:
        """The reason a ClusterQueue is inactive, or None (``_cq_inactive_reason``)."""
        got = self._cq_inactive_reason(cq)
        return got[0] if got else None

    def _cq_inactive_reason(self, cq: dict[str, Any]) -> tuple[str, str] | None:
        """``pkg/cache/scheduler/clusterqueue.go`` ``updateQueueStatus`` / ``inactiveReason``: a
        ClusterQueue with a stop policy, a missing flavor or a missing admission check is inactive;
        the reason is the first cause's (``Stopped``, ``FlavorNotFound``,
        ``AdmissionCheckNotFound``), the message "Can't admit new workloads: <every cause>."."""
        spec = cq.get("spec") or {}
        reasons: list[str] = []
        messages: list[str] = []
        if spec.get("stopPolicy", "None") != "None":
            reasons.append("Stopped")
            messages.append("is stopped")
        missing = [  # updateFlavorMetadata: in the resource groups' order
            f["name"]
            for rg in spec.get("resourceGroups") or []
            for f in rg.get("flavors") or []
            if self.store.get(RESOURCEFLAVORS, None, f["name"]) is None
        ]
        if missing:
            reasons.append("FlavorNotFound")
            messages.append(f"references missing ResourceFlavor(s): {','.join(missing)}")
        missing_checks = sorted(n for n in _cq_checks(cq) if self.store.get(ADMISSIONCHECKS, None, n) is None)
        if missing_checks:
            reasons.append("AdmissionCheckNotFound")
            messages.append(f"references missing AdmissionCheck(s): {','.join(missing_checks)}")
        if not reasons:
            return None
        return reasons[0], f"Can't admit new workloads: {', '.join(messages)}."

    def _schedule(self) -> None:
        """``pkg/scheduler/scheduler.go`` ``schedule``: per ClusterQueue, heads in queue order."""
        reserving: dict[str, list[dict[str, Any]]] = {}
        for wl in self.store.list(WORKLOADS):
            conds = _conds(wl)
            if condition_true(conds, QUOTA_RESERVED) and not condition_true(conds, FINISHED):
                cq = ((wl.get("status") or {}).get("admission") or {}).get("clusterQueue", "")
                reserving.setdefault(cq, []).append(wl)
        now = utcnow()
        for wl in self.store.list(WORKLOADS):  # not queued at all: the workload controller's message
            conds = _conds(wl)
            if condition_true(conds, QUOTA_RESERVED) or condition_true(conds, FINISHED):
                continue
            if wl["spec"].get("active", True) is False:
                continue
            # workload_controller.go syncQuotaReservedFalseCondition: with the gate off,
            # resolveLegacyUnadmittedQuotaReservedCondition (reason Inadmissible) with
            # getQueueBlocker's message (granular reasons: resolveGranular...Condition)
            ns, qn = wl["metadata"]["namespace"], wl["spec"].get("queueName", "")
            lq = self.store.get(LOCALQUEUES, ns, qn)
            if lq is None:
                self._pending(
                    wl, _unadmitted_reason("Misconfigured", "Inadmissible"), f"LocalQueue {qn} doesn't exist"
                )
                continue
            if _stop_policy(lq) != "None":  # lqActive false
                self._pending(
                    wl, _unadmitted_reason("Suspended", "Inadmissible"), f"LocalQueue {qn} is inactive"
                )
                continue
            cq_name = (lq.get("spec") or {}).get("clusterQueue", "")
            cq = self.store.get(CLUSTERQUEUES, None, cq_name)
            if cq is None:
                self._pending(
                    wl,
                    _unadmitted_reason("Misconfigured", "Inadmissible"),
                    f"ClusterQueue {cq_name} doesn't exist",
                )
            elif self._cq_inactive(cq):
                self._pending(
                    wl, _unadmitted_reason("Suspended", "Inadmissible"), f"ClusterQueue {cq_name} is inactive"
                )
        for cq_name, queue in self.pending().items():
            cq = self.store.get(CLUSTERQUEUES, None, cq_name)
            if cq is None or self._cq_inactive(cq):
                continue
            spec = cq.get("spec") or {}
            strict = spec.get("queueingStrategy", "BestEffortFIFO") == "StrictFIFO"
            usage = _usage(reserving.get(cq_name, []))
            for wl in queue:
                rq = (wl.get("status") or {}).get("requeueState") or {}
                if rq.get("requeueAt") and parse_time(rq["requeueAt"]) > now:
                    continue  # backoff after an admission-check retry
                requeued = find_condition(_conds(wl), REQUEUED)
                lq = self.store.get(LOCALQUEUES, wl["metadata"]["namespace"], wl["spec"].get("queueName", ""))
                if lq is None or _stop_policy(lq) != "None":
                    continue
                if requeued and requeued.get("status") == "False":
                    # pkg/cache/queue/cluster_queue.go backoffWaitingTimeExpired: not until requeued
                    continue
                assignment, reason, message = self._assign(cq, wl, usage)
                # scheduler.go requeueAndUpdate: the QuotaReserved=False reason ("Pending" with
                # the gate off) and the scheduler's message
                reason = _unadmitted_reason(reason, "Pending")
                if assignment is not None:
                    self._reserve(cq, wl, assignment)
                    for psa in assignment:
                        for res, flavor in psa["flavors"].items():
                            usage[(flavor, res)] = usage.get((flavor, res), 0.0) + quantity(
                                psa["resourceUsage"][res]
                            )
                    reserving.setdefault(cq_name, []).append(wl)
                    continue
                victims, waiting = self._preemption_targets(cq, wl, reserving.get(cq_name, []))
                for victim in victims:
                    self._preempt(victim, wl)
                if victims or waiting:
                    n = len(victims) or waiting
                    message += f". Pending the preemption of {n} workload(s)"
                    self._pending(wl, reason, message)
                    break  # the freed quota is the preemptor's: nothing else this cycle
                self._pending(wl, reason, message)
                if strict:
                    break  # StrictFIFO: the head blocks the queue
        self._queue_status()

    def _assign(
        self, cq: dict[str, Any], wl: dict[str, Any], usage: dict[tuple[str, str], float]
    ) -> tuple[list[dict[str, Any]] | None, str, str]:
        """``pkg/scheduler/flavorassigner/flavorassigner.go`` ``Assign``: for each pod set and
        resource group, the first flavor (in the ClusterQueue's order) whose nominal quota minus
        usage covers the request and whose node labels the pod's node selector allows."""
        groups = (cq.get("spec") or {}).get("resourceGroups") or []
        assumed: dict[tuple[str, str], float] = {}
        result: list[dict[str, Any]] = []
        failures: list[str] = []
        reason = "WaitingForQuota"
        for ps in wl["spec"].get("podSets") or []:
            count = int(ps.get("count", 1))
            tspec = (ps.get("template") or {}).get("spec") or {}
            per_pod = pod_requests(tspec)
            requests = {r: v * count for r, v in per_pod.items() if v}
            flavors: dict[str, str] = {}
            ps_failure: list[str] = []
            for res in sorted(requests):
                if not any(res in (rg.get("coveredResources") or []) for rg in groups):
                    ps_failure.append(f"resource {res} unavailable in ClusterQueue")
            for rg in groups:
                covered = [r for r in rg.get("coveredResources") or [] if r in requests]
                if not covered or ps_failure:
                    continue
                reasons: list[str] = []
                chosen = None
                for fq in rg.get("flavors") or []:
                    flavor = self.store.get(RESOURCEFLAVORS, None, fq["name"]) or {}
                    node_labels = (flavor.get("spec") or {}).get("nodeLabels") or {}
                    selector = tspec.get("nodeSelector") or {}
                    clash = [k for k, v in selector.items() if k in node_labels and node_labels[k] != v]
                    if clash:
                        reasons.append(f"flavor {fq['name']} doesn't match node affinity")
                        continue
                    quotas = {
                        r["name"]: quantity(r.get("nominalQuota", 0)) for r in fq.get("resources") or []
                    }
                    ok = True
                    for res in covered:
                        nominal = quotas.get(res, 0.0)
                        key = (fq["name"], res)
                        val = assumed.get(key, 0.0) + requests[res]
                        if val > nominal + 1e-9:
                            reasons.append(
                                f"insufficient quota for {res} in flavor {fq['name']}, previously considered "
                                f"podsets requests ({format_quantity(res, assumed.get(key, 0.0))}) + current "
                                f"podset request ({format_quantity(res, requests[res])}) > maximum capacity "
                                f"({format_quantity(res, nominal)})"
                            )
                            reason = "ExceedsMaxQuota"
                            ok = False
                        elif usage.get(key, 0.0) + val > nominal + 1e-9:
                            more = usage.get(key, 0.0) + val - nominal
                            reasons.append(
                                f"insufficient unused quota for {res} in flavor {fq['name']}, "
                                f"{format_quantity(res, more)} more needed"
                            )
                            ok = False
                    if ok:
                        chosen = fq["name"]
                        break
                if chosen is None:
                    ps_failure.append(", ".join(sorted(reasons)))
                    continue
                for res in covered:
                    flavors[res] = chosen
                    assumed[(chosen, res)] = assumed.get((chosen, res), 0.0) + requests[res]
            if ps_failure:
                failures.append(f"couldn't assign flavors to pod set {ps['name']}: {', '.join(ps_failure)}")
                continue
            result.append(
                {
                    "name": ps["name"],
                    "flavors": flavors,
                    "resourceUsage": {r: format_quantity(r, requests[r]) for r in flavors},
                    "count": count,
                }
            )
        if failures:
            return None, reason, "; ".join(failures)
        return result, "", ""

    def _preemption_targets(
        self, cq: dict[str, Any], wl: dict[str, Any], admitted: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], int]:
        """``pkg/scheduler/preemption/preemption.go`` ``GetTargets`` (within the ClusterQueue):
        with ``withinClusterQueue: LowerPriority`` candidates of lower priority, lowest priority
        and then most recently admitted first, are taken until the preemptor fits."""
        policy = ((cq.get("spec") or {}).get("preemption") or {}).get("withinClusterQueue", "Never")
        if policy not in ("LowerPriority", "LowerOrNewerEqualPriority"):
            return [], 0
        # Targets already evicted still hold their quota until their pods are gone: the
        # preemptor waits for them rather than preempting more (preemption expectations).
        evicted = [a for a in admitted if condition_true(_conds(a), EVICTED)]
        admitted = [a for a in admitted if a not in evicted]
        if evicted and self._assign(cq, wl, _usage(admitted))[0] is not None:
            return [], len(evicted)
        prio = int(wl["spec"].get("priority") or 0)
        ts = queue_timestamp(wl)

        def eligible(c: dict[str, Any]) -> bool:
            # pkg/scheduler/preemption/common/preemption_policy.go SatisfiesPreemptionPolicy
            # (SchedulerTimestampPreemptionBuffer off, its v0.19.2 default)
            cp = int(c["spec"].get("priority") or 0)
            return cp < prio or (
                policy == "LowerOrNewerEqualPriority" and cp == prio and queue_timestamp(c) > ts
            )

        def admitted_at(c: dict[str, Any]) -> str:
            return (find_condition(_conds(c), QUOTA_RESERVED) or {}).get("lastTransitionTime", "")

        candidates = sorted(
            (c for c in admitted if eligible(c)),
            key=lambda c: (int(c["spec"].get("priority") or 0), _neg(admitted_at(c))),
        )
        chosen: list[dict[str, Any]] = []
        for cand in candidates:
            chosen.append(cand)
            remaining = [a for a in admitted if a not in chosen]
            if self._assign(cq, wl, _usage(remaining))[0] is not None:
                # minimal set: drop those not needed (upstream's second pass over the targets)
                for extra in list(chosen[:-1]):
                    trial = [a for a in admitted if a not in chosen or a is extra]
                    if self._assign(cq, wl, _usage(trial))[0] is not None:
                        chosen.remove(extra)
                return chosen, 0
        return [], 0

    def _preempt(self, victim: dict[str, Any], preemptor: dict[str, Any]) -> None:
        """``preemption.go`` ``IssuePreemptions``: Evicted(reason Preempted) and
        Preempted(reason InClusterQueue) with ``preemptionMessage``."""
        message = (
            f"Preempted to accommodate a workload (UID: {preemptor['metadata'].get('uid') or 'UNKNOWN'}, "
            f"JobUID: {(preemptor['metadata'].get('labels') or {}).get(JOB_UID) or 'UNKNOWN'}) due to "
            "prioritization in the ClusterQueue; preemptor path: UNKNOWN; preemptee path: UNKNOWN"
        )
        cq = ((victim.get("status") or {}).get("admission") or {}).get("clusterQueue", "")
        message = message.replace(
            "preemptor path: UNKNOWN; preemptee path: UNKNOWN",
            f"preemptor path: /{cq}; preemptee path: /{cq}",
        )
        self.evict(
            victim["metadata"]["namespace"],
            victim["metadata"]["name"],
            "Preempted",
            message,
            preempted="InClusterQueue",
        )

    def _reserve(self, cq: dict[str, Any], wl: dict[str, Any], assignment: list[dict[str, Any]]) -> None:
        """``workload.SetQuotaReservation`` + ``SyncAdmittedCondition``; the ClusterQueue's admission
        checks start Pending (``reconcileSyncAdmissionChecks``)."""
        checks = _cq_checks(cq)
        cq_name = cq["metadata"]["name"]

        def reserve(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            c = status.setdefault("conditions", [])
            now = fmt_time()
            status["admission"] = {"clusterQueue": cq_name, "podSetAssignments": assignment}
            set_condition(
                c,
                QUOTA_RESERVED,
                "True",
                "QuotaReserved",
                f"Quota reserved in ClusterQueue {cq_name}",
                probe=False,
            )
            for ctype in (EVICTED, PREEMPTED):  # resetActiveCondition
                prev = find_condition(c, ctype)
                if prev and prev.get("status") == "True":
                    set_condition(
                        c,
                        ctype,
                        "False",
                        "QuotaReserved",
                        "Previously: " + prev.get("message", ""),
                        probe=False,
                    )
            states = {s["name"]: s for s in status.get("admissionChecks") or []}
            status["admissionChecks"] = [
                states.get(name)
                or {"name": name, "state": "Pending", "message": "", "lastTransitionTime": now}
                for name in checks
            ]
            if not status["admissionChecks"]:
                status.pop("admissionChecks")
            _sync_admitted(obj)

        self.store.mutate(WORKLOADS, wl["metadata"]["namespace"], wl["metadata"]["name"], reserve)
        self.cluster.record_event(
            wl,
            "Normal",
            "QuotaReserved",
            f"Quota reserved in ClusterQueue {cq_name}, wait time since queued was 0s",
            component="kueue-admission",
        )

    def _pending(self, wl: dict[str, Any], reason: str, message: str) -> None:
        """``pkg/workload/workload.go`` ``UnsetQuotaReservationWithCondition``: QuotaReserved=False
        (reason, message), no admission, then ``SyncAdmittedCondition``."""

        def pend(obj: dict[str, Any]) -> None:
            c = obj.setdefault("status", {}).setdefault("conditions", [])
            set_condition(c, QUOTA_RESERVED, "False", reason, message, probe=False)
            obj["status"].pop("admission", None)
            _sync_admitted(obj)

        self.store.mutate(WORKLOADS, wl["metadata"]["namespace"], wl["metadata"]["name"], pend)

    def _queue_status(self) -> None:
        """Counts and the Active condition of ClusterQueues / LocalQueues
        (``clusterqueue_controller.go`` / ``localqueue_controller.go``)."""
        wls = self.store.list(WORKLOADS)
        for cq in self.store.list(CLUSTERQUEUES):
            name = cq["metadata"]["name"]
            lqs = {
                (lq["metadata"]["namespace"], lq["metadata"]["name"])
                for lq in self.store.list(LOCALQUEUES)
                if (lq.get("spec") or {}).get("clusterQueue") == name
            }
            mine = [w for w in wls if (w["metadata"]["namespace"], w["spec"].get("queueName")) in lqs]
            inactive = self._cq_inactive_reason(cq)

            def write(
                obj: dict[str, Any],
                mine: list[dict[str, Any]] = mine,
                inactive: tuple[str, str] | None = inactive,
            ) -> None:
                status = obj.setdefault("status", {})
                _counts(status, mine)
                c = status.setdefault("conditions", [])
                if inactive:
                    set_condition(c, "Active", "False", inactive[0], inactive[1], probe=False)
                else:
                    set_condition(c, "Active", "True", "Ready", "Can admit new workloads", probe=False)

            self.store.mutate(CLUSTERQUEUES, None, name, write)
        for lq in self.store.list(LOCALQUEUES):
            ns, name = lq["metadata"]["namespace"], lq["metadata"]["name"]
            mine = [w for w in wls if w["metadata"]["namespace"] == ns and w["spec"].get("queueName") == name]
            cq = self.store.get(CLUSTERQUEUES, None, (lq.get("spec") or {}).get("clusterQueue", ""))

            def write_lq(obj: dict[str, Any], mine: list[dict[str, Any]] = mine, cq: Any = cq) -> None:
                status = obj.setdefault("status", {})
                _counts(status, mine)
                c = status.setdefault("conditions", [])
                if cq is None:
                    set_condition(
                        c,
                        "Active",
                        "False",
                        "ClusterQueueDoesNotExist",
                        "Can't submit new workloads to clusterQueue",
                        probe=False,
                    )
                else:
                    set_condition(
                        c, "Active", "True", "Ready", "Can submit new workloads to localQueue", probe=False
                    )

            self.store.mutate(LOCALQUEUES, ns, name, write_lq)

    # Eviction -------------------------------------------------------------------------------
    def evict(
        self,
        namespace: str,
        name: str,
        reason: str = "Preempted",
        message: str | None = None,
        *,
        preempted: str | None = None,
    ) -> None:
        """``pkg/workload/evict`` ``Evict`` / ``prepareForEviction``: Evicted=True with the reason and
        message, admission checks reset to Pending; the job is then stopped and requeued."""
        if self.store.get(WORKLOADS, namespace, name) is None:
            raise LookupError(f"workload {namespace}/{name} not found")
        message = message or f"The workload was evicted ({reason})"

        def mark(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            c = status.setdefault("conditions", [])
            set_condition(c, EVICTED, "True", reason, message, probe=False)
            if preempted:
                set_condition(c, PREEMPTED, "True", preempted, message, probe=False)
            _reset_checks(status)

        self.store.mutate(WORKLOADS, namespace, name, mark)
        wl = self.store.get(WORKLOADS, namespace, name)
        self.cluster.record_event(wl, "Normal", "EvictedDueTo" + reason, message, component="kueue-admission")
        if wl is not None and not condition_true(_conds(wl), QUOTA_RESERVED):
            self._release(wl)

    # Admission checks -----------------------------------------------------------------------
    def _sync_checks(self) -> None:
        """``pkg/controller/admissionchecks/provisioning/controller.go`` ``Reconcile``
        (``syncOwnedProvisionRequest``, ``syncCheckStates``) and the workload controller's
        ``reconcileCheckBasedEviction``."""
        for wl in self.store.list(WORKLOADS):
            conds = _conds(wl)
            if not condition_true(conds, QUOTA_RESERVED) or condition_true(conds, FINISHED):
                continue
            if condition_true(conds, EVICTED):
                continue
            states = (wl.get("status") or {}).get("admissionChecks") or []
            if not states:
                continue
            for state in states:
                ac = self.store.get(ADMISSIONCHECKS, None, state["name"])
                if ac is None or (ac.get("spec") or {}).get("controllerName") != PROVISIONING_CONTROLLER:
                    continue
                self._sync_provisioning(wl, state["name"], ac)
            wl = self.store.get(WORKLOADS, wl["metadata"]["namespace"], wl["metadata"]["name"]) or wl
            self._check_based_eviction(wl)

    def _prc(self, ac: dict[str, Any]) -> dict[str, Any] | None:
        params = (ac.get("spec") or {}).get("parameters") or {}
        if params.get("kind") != "ProvisioningRequestConfig":
            return None
        return self.store.get(PROVISIONINGREQUESTCONFIGS, None, params.get("name", ""))

    def _sync_provisioning(self, wl: dict[str, Any], check: str, ac: dict[str, Any]) -> None:
        ns, wl_name = wl["metadata"]["namespace"], wl["metadata"]["name"]
        state = next(s for s in wl["status"]["admissionChecks"] if s["name"] == check)
        prc = self._prc(ac)
        if prc is None or state.get("state") in ("Ready", "Rejected", "Retry"):
            return
        pspec = prc.get("spec") or {}
        retry = pspec.get("retryStrategy") or {}
        limit = int(retry.get("backoffLimitCount", 3))
        attempt = int(state.get("retryCount") or 0) + 1
        pr_name = provisioning_request_name(wl_name, check, attempt)
        pr = self.store.get(PROVISIONINGREQUESTS, ns, pr_name)
        if pr is None:
            self._create_provisioning_request(wl, pr_name, pspec)
            return
        pconds = _conds(pr)
        new_state, message = state.get("state"), state.get("message", "")
        updates = state.get("podSetUpdates")
        if condition_true(pconds, "Failed"):
            failed = find_condition(pconds, "Failed") or {}
            if attempt <= limit:
                new_state, message = "Retry", f"Retrying after failure: {failed.get('message', '')}"
            else:
                new_state, message = "Rejected", failed.get("message", "")
        elif condition_true(pconds, "Provisioned"):
            new_state = "Ready"
            message = (find_condition(pconds, "Provisioned") or {}).get("message", "")
            # controller.go podSetUpdates: the pods consume the request
            updates = [
                {
                    "name": ps["name"],
                    "annotations": {
                        CONSUME_PROVREQ: pr_name,
                        PROVREQ_CLASS: pr["spec"]["provisioningClassName"],
                    },
                }
                for ps in wl["spec"].get("podSets") or []
            ]
        elif condition_true(pconds, "Accepted"):
            message = (find_condition(pconds, "Provisioned") or {}).get("message", message)
        if (new_state, message) == (state.get("state"), state.get("message", "")):
            return

        def write(obj: dict[str, Any]) -> None:
            for s in obj["status"].get("admissionChecks") or []:
                if s["name"] == check:
                    if s.get("state") != new_state:
                        s["lastTransitionTime"] = fmt_time()
                    s["state"], s["message"] = new_state, message
                    if updates:
                        s["podSetUpdates"] = updates
                    if new_state == "Retry":
                        # workload.UpdateAdmissionCheckRequeueState: base * 2^(n-1), capped
                        base = float(retry.get("backoffBaseSeconds", 60))
                        cap = float(retry.get("backoffMaxSeconds", 1800))
                        delay = min(cap, base * 2 ** (attempt - 1))
                        at = time.time() + delay
                        obj["status"]["requeueState"] = {
                            "count": attempt,
                            "requeueAt": fmt_time(_dt_from_ts(at)),
                        }
            _sync_admitted(obj)

        self.store.mutate(WORKLOADS, ns, wl_name, write)
        if new_state != state.get("state"):
            text = f"Admission check {check} updated state from {state.get('state')} to {new_state}"
            if message:
                text += f" with message: {message}"
            self.cluster.record_event(
                wl, "Normal", "AdmissionCheckUpdated", text, component="kueue-admission"
            )

    def _create_provisioning_request(self, wl: dict[str, Any], pr_name: str, pspec: dict[str, Any]) -> None:
        ns = wl["metadata"]["namespace"]
        owner = {
            "apiVersion": WORKLOADS.api_version,
            "kind": "Workload",
            "name": wl["metadata"]["name"],
            "uid": wl["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        podsets = []
        for ps in wl["spec"].get("podSets") or []:
            pt_name = pod_template_name(pr_name, ps["name"])
            template = copy.deepcopy(ps.get("template") or {})
            _merge_pod_spec(
                template.setdefault("spec", {}),
                template.setdefault("metadata", {}),
                _podset_info(self.cluster, wl, ps["name"]),
            )
            if self.store.get(PODTEMPLATES, ns, pt_name) is None:
                self.cluster.create(
                    PODTEMPLATES,
                    {
                        "apiVersion": "v1",
                        "kind": "PodTemplate",
                        "metadata": {
                            "name": pt_name,
                            "namespace": ns,
                            "labels": {MANAGED: "true"},
                            "ownerReferences": [owner],
                        },
                        "template": template,
                    },
                    validate=False,
                )
            podsets.append({"podTemplateRef": {"name": pt_name}, "count": int(ps.get("count", 1))})
        spec: dict[str, Any] = {
            "provisioningClassName": pspec.get("provisioningClassName", ""),
            "podSets": podsets,
        }
        if pspec.get("parameters"):
            spec["parameters"] = dict(pspec["parameters"])
        self.cluster.create(
            PROVISIONINGREQUESTS,
            {
                "apiVersion": PROVISIONINGREQUESTS.api_version,
                "kind": "ProvisioningRequest",
                "metadata": {
                    "name": pr_name,
                    "namespace": ns,
                    "labels": {MANAGED: "true"},
                    "ownerReferences": [owner],
                },
                "spec": spec,
            },
            validate=False,
        )
        self.cluster.record_event(
            wl,
            "Normal",
            "ProvisioningRequestCreated",
            f'Created ProvisioningRequest: "{pr_name}"',
            component="kueue-admission",
        )

    def _check_based_eviction(self, wl: dict[str, Any]) -> None:
        """``workload_controller.go`` ``reconcileCheckBasedEviction``: a Rejected check deactivates
        the Workload (DeactivationTarget, then eviction ``DeactivatedDueToAdmissionCheck``); a Retry
        check evicts it (reason ``AdmissionCheck``) to be requeued after the backoff."""
        states = wl["status"].get("admissionChecks") or []
        rejected = sorted((s for s in states if s.get("state") == "Rejected"), key=lambda s: s["name"])
        retry = sorted((s for s in states if s.get("state") == "Retry"), key=lambda s: s["name"])
        ns, name = wl["metadata"]["namespace"], wl["metadata"]["name"]
        if rejected:
            message = _checks_message(rejected, "Rejected")

            def deactivate(obj: dict[str, Any]) -> None:
                c = obj["status"].setdefault("conditions", [])
                set_condition(c, DEACTIVATION_TARGET, "True", "AdmissionCheck", message, probe=False)
                obj["spec"]["active"] = False

            self.store.mutate(WORKLOADS, ns, name, deactivate)
            self.cluster.record_event(
                wl,
                "Warning",
                "AdmissionCheckRejected",
                f"Deactivated due to {message}",
                component="kueue-admission",
            )
            # workload_controller.go (spec.active false): Evict(Deactivated + cause,
            # "The workload is deactivated due to <DeactivationTarget message>")
            self.evict(
                ns, name, "DeactivatedDueToAdmissionCheck", f"The workload is deactivated due to {message}"
            )
            self.store.mutate(
                WORKLOADS,
                ns,
                name,
                lambda o: o["status"]["conditions"].remove(
                    find_condition(o["status"]["conditions"], DEACTIVATION_TARGET)
                ),
            )
        elif retry:
            self.evict(ns, name, "AdmissionCheck", f"Evicted due to {_checks_message(retry, 'Retry')}")

    def _autoscaler(self) -> None:
        """The model of GKE's answer to a ProvisioningRequest (``set_provisioning``): after
        ``delay_seconds`` the request is ``Provisioned`` (capacity available: the emulator's node
        pools), or ``Failed`` with the message. Conditions are the autoscaler API's types
        (``Accepted``, ``Provisioned``, ``Failed``; cluster-autoscaler ``apis/provisioningrequest``)."""
        now = time.monotonic()
        for pr in self.store.list(PROVISIONINGREQUESTS):
            uid = pr["metadata"]["uid"]
            conds = _conds(pr)
            if condition_true(conds, "Provisioned") or condition_true(conds, "Failed"):
                continue
            first = self._pr_seen.setdefault(uid, now)
            cfg = self.provisioning
            if not find_condition(conds, "Accepted"):
                self._pr_conditions(
                    pr,
                    [
                        ("Accepted", "True", "Accepted", "ProvisioningRequest is accepted."),
                        ("Provisioned", "False", "Waiting", "Waiting for capacity."),
                    ],
                )
            if now - first < float(cfg.get("delay_seconds") or 0.0):
                continue
            if cfg.get("fail"):
                msg = cfg.get("message") or "Provisioning Request failed: capacity not available"
                self._pr_conditions(pr, [("Failed", "True", "ProvisioningFailed", msg)])
            else:
                msg = cfg.get("message") or "Provisioning Request was successfully provisioned."
                self._pr_conditions(pr, [("Provisioned", "True", "Provisioned", msg)])

    def _pr_conditions(self, pr: dict[str, Any], items: list[tuple[str, str, str, str]]) -> None:
        def write(obj: dict[str, Any]) -> None:
            c = obj.setdefault("status", {}).setdefault("conditions", [])
            for ctype, status, reason, message in items:
                set_condition(c, ctype, status, reason, message, probe=False)

        self.store.mutate(PROVISIONINGREQUESTS, pr["metadata"]["namespace"], pr["metadata"]["name"], write)

    # GKE flex-start -------------------------------------------------------------------------
    def _flex_start(self) -> None:
        """https://cloud.google.com/kubernetes-engine/docs/concepts/dws: flex-start VMs run for at
        most ``maxRunDurationSeconds`` (default seven days), then GKE removes the node; its pods
        end like a node shutdown (``preempt_pod``'s DisruptionTarget / Failed ``Terminated``)."""
        pools = {n.name: n.pool for n in self.cluster.nodes}
        for pod in self.store.list(PODS):
            uid = pod["metadata"]["uid"]
            node = (pod.get("spec") or {}).get("nodeName")
            pool = pools.get(node or "")
            if pool is None or pool.labels.get(FLEX_START_LABEL) != "true" or uid in self._flex_killed:
                continue
            status = pod.get("status") or {}
            if status.get("phase") not in ("Pending", "Running") or not status.get("startTime"):
                continue
            limit = (pod["spec"].get("nodeSelector") or {}).get(MAX_RUN_SELECTOR)
            seconds = (
                float(limit)
                if limit
                else float(getattr(pool, "max_run_seconds", None) or FLEX_START_DEFAULT_MAX_RUN)
            )
            if (utcnow() - parse_time(status["startTime"])).total_seconds() < seconds:
                continue
            self._flex_killed.add(uid)
            with contextlib.suppress(LookupError, errors.ApiError):
                self.cluster.record_event(
                    pod,
                    "Warning",
                    "MaxRunDurationExceeded",
                    f"Node {node} reached its max run duration of {seconds:g}s and is being deleted",
                    component="gke-flex-start",
                )
                self.cluster.preempt_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])


# ------------------------------------------------------------------------ helpers
def _neg(ts: str) -> tuple[int, ...]:
    return tuple(-ord(ch) for ch in ts)


def _dt_from_ts(ts: float) -> Any:
    import datetime as _dt

    return _dt.datetime.fromtimestamp(ts, tz=_dt.timezone.utc)


def _stop_policy(queue: dict[str, Any]) -> str:
    return str((queue.get("spec") or {}).get("stopPolicy") or "None")


def _cq_checks(cq: dict[str, Any]) -> list[str]:
    spec = cq.get("spec") or {}
    names = list(spec.get("admissionChecks") or [])
    names += [c["name"] for c in (spec.get("admissionChecksStrategy") or {}).get("admissionChecks") or []]
    return list(dict.fromkeys(names))


def _checks_message(checks: list[dict[str, Any]], state: str) -> str:
    """``workload_controller.go`` ``buildAdmissionChecksMessage``."""
    parts = [f'"{c["name"]}" ({c["message"]})' if c.get("message") else f'"{c["name"]}"' for c in checks]
    noun = "AdmissionChecks" if len(checks) > 1 else "AdmissionCheck"
    return f"{noun} in {state} state: {'; '.join(parts)}"


def _reset_checks(status: dict[str, Any]) -> None:
    """``evict.go`` ``resetChecksOnEviction``: every check back to Pending (Retry counts)."""
    for i, s in enumerate(status.get("admissionChecks") or []):
        if s.get("state") == "Pending":
            continue
        new = {
            "name": s["name"],
            "state": "Pending",
            "message": "Reset to Pending after eviction. Previously: " + s.get("state", ""),
            "lastTransitionTime": fmt_time(),
        }
        retry_count = int(s.get("retryCount") or 0)
        if s.get("state") == "Retry":
            retry_count += 1
        if retry_count:
            new["retryCount"] = retry_count
        status["admissionChecks"][i] = new


def _sync_admitted(obj: dict[str, Any]) -> None:
    """``pkg/workload/admissionchecks.go`` ``SyncAdmittedCondition`` (``HasAllChecksReady``: every
    check ``Ready``). With UnadmittedWorkloadsObservability off (v0.19.2's default) nothing changes
    while ``Admitted`` already agrees with "reserved and all checks ready": a Workload never
    admitted has no ``Admitted`` condition at all; one admitted before gets ``False``
    ``NoReservation`` / ``NoReservationUnsatisfiedChecks`` / ``UnsatisfiedChecks``."""
    status = obj.setdefault("status", {})
    c = status.setdefault("conditions", [])
    reserved = condition_true(c, QUOTA_RESERVED)
    ready = all(s.get("state") == "Ready" for s in status.get("admissionChecks") or [])
    if UNADMITTED_WORKLOADS_OBSERVABILITY:
        if find_condition(c, QUOTA_RESERVED) is None and find_condition(c, ADMITTED) is None:
            return  # UnadmittedWorkloadsExplicitStatus off
    elif condition_true(c, ADMITTED) == (reserved and ready):
        return
    if reserved and ready:
        set_condition(c, ADMITTED, "True", "Admitted", "The workload is admitted", probe=False)
    elif not reserved and not ready:
        if UNADMITTED_WORKLOADS_OBSERVABILITY:
            reason, message = "NoReservation", "The workload has no reservation"
        else:
            reason, message = (
                "NoReservationUnsatisfiedChecks",
                "The workload has no reservation and not all checks ready",
            )
        set_condition(c, ADMITTED, "False", reason, message, probe=False)
    elif not reserved:
        set_condition(c, ADMITTED, "False", "NoReservation", "The workload has no reservation", probe=False)
    else:
        reason = _unadmitted_reason("UnsatisfiedAdmissionChecks", "UnsatisfiedChecks")
        set_condition(c, ADMITTED, "False", reason, "The workload has not all checks ready", probe=False)


def _usage(workloads: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    usage: dict[tuple[str, str], float] = {}
    for wl in workloads:
        for psa in ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []:
            for res, flavor in (psa.get("flavors") or {}).items():
                amount = quantity((psa.get("resourceUsage") or {}).get(res, 0))
                usage[(flavor, res)] = usage.get((flavor, res), 0.0) + amount
    return usage


def _counts(status: dict[str, Any], workloads: list[dict[str, Any]]) -> None:
    live = [w for w in workloads if not condition_true(_conds(w), FINISHED)]
    status["pendingWorkloads"] = sum(1 for w in live if not condition_true(_conds(w), QUOTA_RESERVED))
    status["reservingWorkloads"] = sum(1 for w in live if condition_true(_conds(w), QUOTA_RESERVED))
    status["admittedWorkloads"] = sum(1 for w in live if condition_true(_conds(w), ADMITTED))


def _templates(rt: ResourceType, obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(pod set name, pod template) of a job, as its integration names the pod sets."""
    spec = obj.setdefault("spec", {})
    if rt is JOBS:
        return [("main", spec.setdefault("template", {}))]  # pkg/controller/jobs/job: one pod set "main"
    if rt is JOBSETS:  # pkg/controller/jobs/jobset: one pod set per replicated job, by its name
        return [
            (r["name"], r.setdefault("template", {}).setdefault("spec", {}).setdefault("template", {}))
            for r in spec.get("replicatedJobs") or []
        ]
    return []


def _podsets(rt: ResourceType, obj: dict[str, Any]) -> list[dict[str, Any]]:
    """``GenericJob.PodSets``: Job ``main`` x parallelism; JobSet per replicated job
    replicas x parallelism; LWS group ``leader`` x1 and ``worker`` x (size - 1)."""
    spec = obj.get("spec") or {}
    if rt is JOBS:
        return [
            {
                "name": "main",
                "count": int(spec.get("parallelism", 1)),
                "template": copy.deepcopy(spec.get("template") or {}),
            }
        ]
    if rt is JOBSETS:
        out = []
        for r in spec.get("replicatedJobs") or []:
            jspec = (r.get("template") or {}).get("spec") or {}
            count = int(r.get("replicas", 1)) * int(jspec.get("parallelism", 1))
            out.append(
                {"name": r["name"], "count": count, "template": copy.deepcopy(jspec.get("template") or {})}
            )
        return out
    # pkg/controller/jobs/leaderworkerset/leaderworkerset_reconciler.go podSets: with a
    # leaderTemplate, "leader" x1 and "worker" x (size - 1) (kept at count 0); without one a
    # single pod set "main" x size
    lwt = spec.get("leaderWorkerTemplate") or {}
    size = int(lwt.get("size", 1))
    worker = copy.deepcopy(lwt.get("workerTemplate") or {})
    if not lwt.get("leaderTemplate"):
        return [{"name": "main", "count": size, "template": worker}]
    leader = copy.deepcopy(lwt["leaderTemplate"])
    return [
        {"name": "leader", "count": 1, "template": leader},
        {"name": "worker", "count": size - 1, "template": worker},
    ]


def _job_finished(rt: ResourceType, job: dict[str, Any]) -> tuple[bool, str] | None:
    """``GenericJob.Finished``: Job Complete/Failed (the condition's message); JobSet
    Completed/Failed. An LWS never finishes."""
    conds = _conds(job)
    pairs = (
        (("Complete", True), ("Failed", False)) if rt is JOBS else (("Completed", True), ("Failed", False))
    )
    if rt is LWS:
        return None
    for ctype, success in pairs:
        cond = find_condition(conds, ctype)
        if cond and cond.get("status") == "True":
            return success, cond.get("message", "")
    return None


def pending_workloads_summary(
    controller: KueueController,
    cq: str,
    lq: tuple[str, str] | None,
    offset: int = 0,
    limit: int = 1000,
    version: str = "v1beta2",
) -> dict[str, Any]:
    """``apis/visibility/v1beta2/types.go`` ``PendingWorkloadsSummary``, v1beta1's the same
    (``pkg/visibility/api/rest/pending_workloads_cq.go`` / ``_lq.go``): the ClusterQueue's pending
    workloads in queue order with their positions; for a LocalQueue only its own, ``offset``/``limit``
    applied."""
    queue = controller.pending().get(cq, [])
    items = []
    per_lq: dict[tuple[str, str], int] = {}
    for pos, wl in enumerate(queue):
        key = (wl["metadata"]["namespace"], wl["spec"].get("queueName", ""))
        lq_pos = per_lq.get(key, 0)
        per_lq[key] = lq_pos + 1
        if lq is not None and key != lq:
            continue
        md = wl["metadata"]
        items.append(
            {
                "metadata": {
                    "name": md["name"],
                    "namespace": md["namespace"],
                    "creationTimestamp": md.get("creationTimestamp"),
                    "ownerReferences": copy.deepcopy(md.get("ownerReferences") or []),
                },
                "priority": int(wl["spec"].get("priority") or 0),
                "localQueueName": key[1],
                "positionInClusterQueue": pos,
                "positionInLocalQueue": lq_pos,
            }
        )
    return {
        "kind": "PendingWorkloadsSummary",
        "apiVersion": f"visibility.kueue.x-k8s.io/{version}",
        "metadata": {"creationTimestamp": None},
        "items": items[offset : offset + limit],
    }


def cluster_queue_of(store: Any, namespace: str, lq: str) -> str | None:
    obj = store.get(LOCALQUEUES, namespace, lq)
    return None if obj is None else (obj.get("spec") or {}).get("clusterQueue")


__all__ = ["KueueController", "kueue_default_suspend", "kueue_gate_pod", "pending_workloads_summary"]
