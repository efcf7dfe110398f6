"""jobset.x-k8s.io/v1alpha2 controller: a JobSet's child Jobs, its headless Service, its status,
and its success and failure policies.

Every rule here is read from kubernetes-sigs/jobset at 08dfbdf (the commit
``shared/ACCELERATORS.md`` cites), ``pkg/controllers/jobset_controller.go`` unless another file
is named; the webhook's defaults and checks are in ``validation.py``. Jobs it creates are run by
the emulator's Job controller, so their pods, indexes and failures are the real Job semantics.
What is not modelled is listed in this package's README (JobSet section).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import re
from typing import Any

from . import errors
from .objects import condition_true, controller_uid, find_condition, set_condition
from .resources import JOBS, JOBSETS, SERVICES

log = logging.getLogger(__name__)

# api/jobset/v1alpha2/jobset_types.go and pkg/constants/constants.go
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
REPLICATED_JOB_NAME = "jobset.sigs.k8s.io/replicatedjob-name"
REPLICATED_JOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
GLOBAL_REPLICAS = "jobset.sigs.k8s.io/global-replicas"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOB_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
JOB_KEY = "jobset.sigs.k8s.io/job-key"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
GROUP_NAME = "jobset.sigs.k8s.io/group-name"
GROUP_REPLICAS = "jobset.sigs.k8s.io/group-replicas"
JOB_GROUP_INDEX = "jobset.sigs.k8s.io/job-group-index"
COORDINATOR = "jobset.sigs.k8s.io/coordinator"
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
NODE_SELECTOR_STRATEGY = "alpha.jobset.sigs.k8s.io/node-selector"
NAMESPACED_JOB = "alpha.jobset.sigs.k8s.io/namespaced-job"
NO_SCHEDULE_TAINT = "alpha.jobset.sigs.k8s.io/no-schedule"
CONTROLLER_NAME = "jobset.sigs.k8s.io/jobset-controller"
DEFAULT_GROUP = "default"  # the CRD's default for replicatedJobs[].groupName

COMPLETED, FAILED, SUSPENDED, RESTARTING = "Completed", "Failed", "Suspended", "RestartingJobSet"


class JobSetController:
    """Reconciles every JobSet with the Jobs it owns (controller owner reference)."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster

    def reconcile_all(self) -> None:
        store = self.cluster.store
        owned: dict[str, list[dict[str, Any]]] = {}
        for job in store.list(JOBS):
            owner = controller_uid(job)
            if owner:
                owned.setdefault(owner, []).append(job)
        for jobset in store.list(JOBSETS):
            try:
                self.reconcile(jobset, owned.get(jobset["metadata"]["uid"], []))
            except errors.ApiError as exc:  # races with a user's delete
                log.debug("JobSet reconcile: %s", exc)
            except Exception:  # a malformed JobSet must not stop the other controllers' pass
                log.exception("JobSet %s: reconcile failed", jobset["metadata"].get("name"))

    def reconcile(self, jobset: dict[str, Any], jobs: list[dict[str, Any]]) -> None:
        """One pass of ``reconcile``, in upstream's order."""
        md, spec = jobset["metadata"], jobset.get("spec") or {}
        if spec.get("managedBy") not in (None, CONTROLLER_NAME):
            return  # managedByExternalController: another controller (MultiKueue) owns it
        if md.get("deletionTimestamp"):
            return
        status = dict(jobset.get("status") or {})
        status.setdefault("restarts", 0)  # JobSetStatus.Restarts has no omitempty: always written
        conditions: list[dict[str, Any]] = [dict(c) for c in status.get("conditions") or []]
        restarts = int(status.get("restarts") or 0)
        children = _ChildJobs.of(jobs, restarts)
        status["replicatedJobsStatus"] = _replicated_job_statuses(spec, children)

        if _finished(conditions):
            self._delete_jobs(children.active)
            self._write_status(jobset, status, conditions)
            return
        self._delete_jobs(children.previous)
        if not spec.get("suspend") and _all_jobs_ready(spec, status["replicatedJobsStatus"]):
            if find_condition(conditions, RESTARTING) is not None:
                set_condition(conditions, RESTARTING, "False", "JobsReady", "all jobs are ready", probe=False)
        if children.failed:
            _apply_failure_policy(spec, status, conditions, children.failed)
        elif children.successful and _succeeded(spec, children.successful):
            set_condition(
                conditions,
                COMPLETED,
                "True",
                "AllJobsCompleted",
                "jobset completed successfully",
                probe=False,
            )
            status["terminalState"] = COMPLETED
        if not _finished(conditions) and int(status.get("restarts") or 0) == restarts:
            if (spec.get("network") or {}).get("enableDNSHostnames", True):
                self._ensure_service(jobset)
            if not (children.previous and _blocking_recreate(spec)):
                self._create_jobs(jobset, status, children)
            self._suspend_or_resume(jobset, children.active, conditions)
        self._write_status(jobset, status, conditions)

    # Child Jobs ---------------------------------------------------------------------------
    def _create_jobs(self, jobset: dict[str, Any], status: dict[str, Any], children: _ChildJobs) -> None:
        """``constructJobsFromTemplate``: every missing ``<jobset>-<rjob>-<index>`` of this restart."""
        names = children.names()
        for rjob in jobset["spec"].get("replicatedJobs") or []:
            for index in range(int(rjob.get("replicas", 1))):
                name = job_name(jobset["metadata"]["name"], rjob["name"], index)
                if name in names:
                    continue
                job = construct_job(jobset, rjob, index, int(status.get("restarts") or 0))
                with contextlib.suppress(errors.ApiError):  # still being deleted: next pass
                    self.cluster.create(JOBS, job, validate=False)

    def _delete_jobs(self, jobs: list[dict[str, Any]]) -> None:
        """``deleteJobs``: foreground deletion, so a restart's pods are gone before its Jobs."""
        for job in jobs:
            md = job["metadata"]
            if md.get("deletionTimestamp"):
                continue
            with contextlib.suppress(errors.ApiError):
                self.cluster.delete(JOBS, md["namespace"], md["name"], propagation="Foreground")

    def _suspend_or_resume(
        self, jobset: dict[str, Any], active: list[dict[str, Any]], conditions: list[dict[str, Any]]
    ) -> None:
        """``suspendJobs`` / ``resumeJobsIfNecessary``: each active Job follows ``spec.suspend``."""
        suspend = bool(jobset["spec"].get("suspend"))
        for job in active:
            if bool(job["spec"].get("suspend")) == suspend:
                continue
            md = job["metadata"]

            def write(obj: dict[str, Any], value: bool = suspend) -> None:
                obj["spec"]["suspend"] = value

            self.cluster.store.mutate(JOBS, md["namespace"], md["name"], write)
        if suspend:
            set_condition(conditions, SUSPENDED, "True", "SuspendedJobs", "jobset is suspended", probe=False)
        elif find_condition(conditions, SUSPENDED) is not None:
            set_condition(conditions, SUSPENDED, "False", "ResumeJobs", "jobset is resumed", probe=False)

    def _ensure_service(self, jobset: dict[str, Any]) -> None:
        """``createHeadlessSvcIfNecessary``: named after the subdomain, selecting the JobSet's pods."""
        md = jobset["metadata"]
        name = subdomain(jobset)
        if self.cluster.store.get(SERVICES, md["namespace"], name) is not None:
            return
        network = jobset["spec"].get("network") or {}
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": md["namespace"], "ownerReferences": [_owner(jobset)]},
            "spec": {
                "clusterIP": "None",
                "clusterIPs": ["None"],
                "selector": {JOBSET_NAME: md["name"]},
                "publishNotReadyAddresses": network.get("publishNotReadyAddresses", True),
                "type": "ClusterIP",
            },
        }
        with contextlib.suppress(errors.ApiError):
            self.cluster.create(SERVICES, service, validate=False)

    def _write_status(
        self, jobset: dict[str, Any], status: dict[str, Any], conditions: list[dict[str, Any]]
    ) -> None:
        status["conditions"] = conditions
        if not conditions:
            status.pop("conditions")
        md = jobset["metadata"]

        def write(obj: dict[str, Any]) -> None:
            obj["status"] = status

        self.cluster.store.mutate(JOBSETS, md["namespace"], md["name"], write)


# Names, labels, annotations ---------------------------------------------------------------------
def job_name(jobset_name: str, rjob_name: str, index: int) -> str:
    """``placement.GenJobName`` (pkg/util/placement/placement.go)."""
    return f"{jobset_name}-{rjob_name}-{index}"


def subdomain(jobset: dict[str, Any]) -> str:
    """``GetSubdomain``: ``spec.network.subdomain``, else the JobSet's name."""
    return (jobset["spec"].get("network") or {}).get("subdomain") or jobset["metadata"]["name"]


def construct_job(jobset: dict[str, Any], rjob: dict[str, Any], index: int, restarts: int) -> dict[str, Any]:
    """``constructJob``: the replicated job's template, labelled and annotated (Job and pods),
    its pods in the JobSet's subdomain, suspended with the JobSet, owned by it."""
    md = jobset["metadata"]
    template = rjob.get("template") or {}
    tmd = template.get("metadata") or {}
    name = job_name(md["name"], rjob["name"], index)
    job_spec = copy.deepcopy(template.get("spec") or {})
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": md["namespace"],
            "labels": dict(tmd.get("labels") or {}),
            "annotations": dict(tmd.get("annotations") or {}),
            "ownerReferences": [_owner(jobset)],
        },
        "spec": job_spec,
    }
    pod = job_spec.setdefault("template", {})
    pod_md = pod.setdefault("metadata", {})
    for obj_md in (job["metadata"], pod_md):
        _label_and_annotate(obj_md, jobset, rjob, index, restarts)
    pod_spec = pod.setdefault("spec", {})
    if (jobset["spec"].get("network") or {}).get("enableDNSHostnames", True):
        pod_spec["subdomain"] = subdomain(jobset)
    annotations = job["metadata"]["annotations"]
    if EXCLUSIVE_TOPOLOGY in annotations and NODE_SELECTOR_STRATEGY in annotations:
        pod_spec.setdefault("nodeSelector", {})[NAMESPACED_JOB] = f"{md['namespace']}_{name}"
        pod_spec.setdefault("tolerations", []).append(
            {"key": NO_SCHEDULE_TAINT, "operator": "Exists", "effect": "NoSchedule"}
        )
    job_spec["suspend"] = bool(jobset["spec"].get("suspend"))
    return job


def _label_and_annotate(
    obj_md: dict[str, Any], jobset: dict[str, Any], rjob: dict[str, Any], index: int, restarts: int
) -> None:
    """``labelAndAnnotateObject``: the same keys as labels and as annotations, except the
    exclusive-placement ones, which are annotations only."""
    md, spec = jobset["metadata"], jobset["spec"]
    name = job_name(md["name"], rjob["name"], index)
    group = rjob.get("groupName") or DEFAULT_GROUP
    values = {
        JOBSET_NAME: md["name"],
        JOBSET_UID: md["uid"],
        REPLICATED_JOB_NAME: rjob["name"],
        RESTART_ATTEMPT: str(restarts),
        REPLICATED_JOB_REPLICAS: str(int(rjob.get("replicas", 1))),
        GLOBAL_REPLICAS: str(sum(int(r.get("replicas", 1)) for r in spec.get("replicatedJobs") or [])),
        JOB_INDEX: str(index),
        JOB_KEY: hashlib.sha1(f"{md['namespace']}/{name}".encode()).hexdigest(),  # jobHashKey
        JOB_GLOBAL_INDEX: str(_global_index(spec, rjob["name"], index)),
        GROUP_NAME: group,
        GROUP_REPLICAS: str(_group_replicas(spec, group)),
        JOB_GROUP_INDEX: str(_group_index(spec, group, rjob["name"], index)),
    }
    if spec.get("coordinator"):
        values[COORDINATOR] = coordinator_endpoint(jobset)
    labels = obj_md.setdefault("labels", {})
    annotations = obj_md.setdefault("annotations", {})
    labels.update(values)
    annotations.update(values)
    for source in (
        md.get("annotations") or {},
        (rjob.get("template") or {}).get("metadata", {}).get("annotations") or {},
    ):
        if EXCLUSIVE_TOPOLOGY in source:
            annotations[EXCLUSIVE_TOPOLOGY] = source[EXCLUSIVE_TOPOLOGY]
            if NODE_SELECTOR_STRATEGY in source:
                annotations[NODE_SELECTOR_STRATEGY] = source[NODE_SELECTOR_STRATEGY]


def coordinator_endpoint(jobset: dict[str, Any]) -> str:
    """``CoordinatorEndpoint``: ``<jobset>-<rjob>-<jobIndex>-<podIndex>.<subdomain>``."""
    coordinator = jobset["spec"]["coordinator"]
    return (
        f"{jobset['metadata']['name']}-{coordinator['replicatedJob']}-{coordinator.get('jobIndex', 0)}-"
        f"{coordinator.get('podIndex', 0)}.{subdomain(jobset)}"
    )


def _global_index(spec: dict[str, Any], rjob_name: str, index: int) -> int:
    """``globalJobIndex``: replicas of the replicated jobs before this one, plus its index."""
    before = 0
    for rjob in spec.get("replicatedJobs") or []:
        if rjob["name"] == rjob_name:
            return before + index
        before += int(rjob.get("replicas", 1))
    return before + index


def _group_replicas(spec: dict[str, Any], group: str) -> int:
    return sum(
        int(r.get("replicas", 1))
        for r in spec.get("replicatedJobs") or []
        if (r.get("groupName") or DEFAULT_GROUP) == group
    )


def _group_index(spec: dict[str, Any], group: str, rjob_name: str, index: int) -> int:
    before = 0
    for rjob in spec.get("replicatedJobs") or []:
        if (rjob.get("groupName") or DEFAULT_GROUP) != group:
            continue
        if rjob["name"] == rjob_name:
            return before + index
        before += int(rjob.get("replicas", 1))
    return before + index


# Status and policies ----------------------------------------------------------------------------
class _ChildJobs:
    """``getChildJobs``: a restart's leftovers (``previous``) and this run's Jobs by outcome."""

    def __init__(self) -> None:
        self.previous: list[dict[str, Any]] = []
        self.active: list[dict[str, Any]] = []
        self.failed: list[dict[str, Any]] = []
        self.successful: list[dict[str, Any]] = []

    @classmethod
    def of(cls, jobs: list[dict[str, Any]], restarts: int) -> _ChildJobs:
        children = cls()
        for job in jobs:
            try:
                attempt = int((job["metadata"].get("labels") or {}).get(RESTART_ATTEMPT, ""))
            except ValueError:
                attempt = -1  # an invalid label: upstream treats the Job as a previous one
            if attempt < restarts:
                children.previous.append(job)
                continue
            outcome = _job_finished(job)
            {None: children.active, "Failed": children.failed, "Complete": children.successful}[
                outcome
            ].append(job)
        return children

    def names(self) -> set[str]:
        return {j["metadata"]["name"] for j in self.previous + self.active + self.failed + self.successful}


def _job_finished(job: dict[str, Any]) -> str | None:
    """``JobFinished``: the Job's Complete or Failed condition, if true."""
    conditions = (job.get("status") or {}).get("conditions") or []
    return next((t for t in ("Complete", "Failed") if condition_true(conditions, t)), None)


def _replicated_job_statuses(spec: dict[str, Any], children: _ChildJobs) -> list[dict[str, Any]]:
    """``calculateReplicatedJobStatuses``: ready, succeeded, failed, active, suspended per replicated job."""
    counts = {
        r["name"]: {"name": r["name"], "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0}
        for r in spec.get("replicatedJobs") or []
    }
    for key, jobs in (("succeeded", children.successful), ("failed", children.failed)):
        for job in jobs:
            entry = counts.get((job["metadata"].get("labels") or {}).get(REPLICATED_JOB_NAME, ""))
            if entry is not None:
                entry[key] += 1
    for job in children.active:
        entry = counts.get((job["metadata"].get("labels") or {}).get(REPLICATED_JOB_NAME, ""))
        if entry is None:
            continue
        job_status, job_spec = job.get("status") or {}, job.get("spec") or {}
        pods = int(job_spec.get("parallelism", 1))
        if job_spec.get("completions") is not None:
            pods = min(pods, int(job_spec["completions"]))
        if int(job_status.get("succeeded") or 0) + int(job_status.get("ready") or 0) >= pods:
            entry["ready"] += 1
        if int(job_status.get("active") or 0) > 0:
            entry["active"] += 1
        if job_spec.get("suspend"):
            entry["suspended"] += 1
    return list(counts.values())


def _all_jobs_ready(spec: dict[str, Any], statuses: list[dict[str, Any]]) -> bool:
    """``allJobsReady``: every replica of every replicated job ready."""
    ready = {s["name"]: s["ready"] for s in statuses}
    return all(ready.get(r["name"], 0) >= int(r.get("replicas", 1)) for r in spec.get("replicatedJobs") or [])


def _succeeded(spec: dict[str, Any], successful: list[dict[str, Any]]) -> bool:
    """``executeSuccessPolicy`` (pkg/controllers/success_policy.go): All counts every replica of
    the targeted replicated jobs, Any needs one."""
    policy = spec.get("successPolicy") or {"operator": "All"}
    targets = policy.get("targetReplicatedJobs") or []

    def targeted(name: str) -> bool:
        return not targets or name in targets

    done = sum(
        1 for j in successful if targeted((j["metadata"].get("labels") or {}).get(REPLICATED_JOB_NAME, ""))
    )
    if policy.get("operator") == "Any":
        expected = 1
    else:
        expected = sum(
            int(r.get("replicas", 1)) for r in spec.get("replicatedJobs") or [] if targeted(r["name"])
        )
    return done >= expected


def _apply_failure_policy(
    spec: dict[str, Any],
    status: dict[str, Any],
    conditions: list[dict[str, Any]],
    failed: list[dict[str, Any]],
) -> None:
    """``executeFailurePolicy`` (pkg/controllers/failure_policy.go).

    No policy: the JobSet fails. Otherwise the first rule (in order) that a failed Job matches
    decides, its earliest-failed Job named; no matching rule restarts the JobSet. A restart
    recreates every Job (``restarts`` + 1); it counts towards ``maxRestarts`` unless the action
    says to ignore it, and past ``maxRestarts`` the JobSet fails.
    """
    policy = spec.get("failurePolicy")
    if policy is None:
        first = _first_failed(failed)
        _fail(status, conditions, "FailedJobs", "jobset failed due to one or more job failures", first)
        return
    rule, job = None, _first_failed(failed)
    for candidate in policy.get("rules") or []:
        matching = [j for j in failed if _rule_applies(candidate, j)]
        if matching:
            rule, job = candidate, _first_failed(matching)
            break
    action = (rule or {}).get("action", "RestartJobSet")
    if action == "FailJobSet":
        _fail(
            status,
            conditions,
            "FailJobSetFailurePolicyAction",
            "applying FailJobSet failure policy action",
            job,
        )
        return
    counts = action != "RestartJobSetAndIgnoreMaxRestarts"
    if counts and int(status.get("restartsCountTowardsMax") or 0) >= int(policy.get("maxRestarts") or 0):
        _fail(
            status,
            conditions,
            "ReachedMaxRestarts",
            "jobset failed due to reaching max number of restarts",
            job,
        )
        return
    status["restarts"] = int(status.get("restarts") or 0) + 1
    if counts:
        status["restartsCountTowardsMax"] = int(status.get("restartsCountTowardsMax") or 0) + 1
    reason = f"FailurePolicy_{rule['name']}" if rule else "DefaultFailurePolicy"
    verb = "RestartJobSet" if counts else "RestartJobSetAndIgnoreMaxRestarts"
    message = f"applying {verb} failure policy action (first failed job: {job['metadata']['name']})"
    set_condition(conditions, RESTARTING, "True", reason, message, probe=False)


def _rule_applies(rule: dict[str, Any], job: dict[str, Any]) -> bool:
    """``ruleIsApplicable``: the Job's failure reason, message pattern and replicated job."""
    cond = _failure_condition(job) or {}
    reasons = rule.get("onJobFailureReasons") or []
    if reasons and cond.get("reason") not in reasons:
        return False
    patterns = rule.get("onJobFailureMessagePatterns") or []
    if patterns and not any(re.search(p, cond.get("message") or "") for p in patterns):
        return False
    targets = rule.get("targetReplicatedJobs") or []
    return not targets or (job["metadata"].get("labels") or {}).get(REPLICATED_JOB_NAME) in targets


def _failure_condition(job: dict[str, Any]) -> dict[str, Any] | None:
    conditions = (job.get("status") or {}).get("conditions") or []
    return find_condition(conditions, "Failed") if condition_true(conditions, "Failed") else None


def _first_failed(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    return min(jobs, key=lambda j: (_failure_condition(j) or {}).get("lastTransitionTime") or "")


def _fail(
    status: dict[str, Any], conditions: list[dict[str, Any]], reason: str, message: str, job: dict[str, Any]
) -> None:
    """``setJobSetFailedCondition``: Failed true, Restarting false, terminal state Failed."""
    failure = f"{message} (first failed job: {job['metadata']['name']})"
    set_condition(conditions, FAILED, "True", reason, failure, probe=False)
    if find_condition(conditions, RESTARTING) is not None:
        set_condition(conditions, RESTARTING, "False", "JobSetFailed", "jobset failed", probe=False)
    status["terminalState"] = FAILED


def _blocking_recreate(spec: dict[str, Any]) -> bool:
    return (spec.get("failurePolicy") or {}).get("restartStrategy") == "BlockingRecreate"


def _finished(conditions: list[dict[str, Any]]) -> bool:
    """``jobSetFinished``."""
    return any(c.get("type") in (COMPLETED, FAILED) and c.get("status") == "True" for c in conditions)


def _owner(jobset: dict[str, Any]) -> dict[str, Any]:
    md = jobset["metadata"]
    return {
        "apiVersion": JOBSETS.api_version,
        "kind": "JobSet",
        "name": md["name"],
        "uid": md["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
