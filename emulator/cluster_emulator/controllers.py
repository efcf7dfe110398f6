"""Job and LeaderWorkerSet controllers plus the garbage-collector pass.

One reconcile loop (woken by every store change, resynced every 0.25 s for
timers such as ``activeDeadlineSeconds`` and ``ttlSecondsAfterFinished``)
drives everything; reconciles are idempotent and only write when something
changes, so the loop settles.

The Job controller follows kube-controller-manager 1.31+: on success it sets
``SuccessCriteriaMet`` then ``Complete``; on failure ``FailureTarget`` then
``Failed`` once the remaining pods are gone; ``backoffLimit``,
``activeDeadlineSeconds``, ``podFailurePolicy``, ``suspend``, ``Indexed``
completion and ``ttlSecondsAfterFinished`` are honoured. Pod recreation after
a failure waits ``job_backoff * 2**(failures-1)`` seconds (capped at 10x),
much shorter than the real 10 s base so tests stay fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import errors
from ._util import fmt_time, parse_time, utcnow, wait_event
from .jobset import JobSetController
from .kueue import KueueController
from .objects import condition_true, controller_uid, find_condition, set_condition
from .resources import JOBS, LWS, PODS, SERVICES, STATEFULSETS

if TYPE_CHECKING:
    from .cluster import Cluster

log = logging.getLogger(__name__)

INDEX_KEY = "batch.kubernetes.io/job-completion-index"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
LWS_REVISION = "leaderworkerset.sigs.k8s.io/template-revision-hash"
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"
LWS_LEADER_NAME = "leaderworkerset.sigs.k8s.io/leader-name"
LWS_LEADER_REQUESTS_TPUS = "leaderworkerset.sigs.k8s.io/leader-requests-tpus"
TPU_PROCESS_DEFAULT_PORT = 8476

MSG_COMPLETE = "Reached expected number of succeeded pods"
MSG_BACKOFF = "Job has reached the specified backoff limit"
MSG_DEADLINE = "Job was active longer than specified deadline"


def _pod_ready(pod: dict[str, Any]) -> bool:
    return condition_true((pod.get("status") or {}).get("conditions") or [], "Ready")


def _requests_tpus(container: dict[str, Any]) -> bool:
    resources = container.get("resources") or {}
    return any(
        str((resources.get(section) or {}).get("google.com/tpu", "0")) not in ("0", "")
        for section in ("limits", "requests")
    )


def _tpu_containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Containers, then init containers, that request ``google.com/tpu`` (LWS's order)."""
    containers = list(spec.get("containers") or []) + list(spec.get("initContainers") or [])
    return [c for c in containers if _requests_tpus(c)]


def _exit_code_match(status: dict[str, Any], requirement: dict[str, Any]) -> tuple[str, int] | None:
    """(container, exit code) of the first terminated container the requirement matches."""
    values = set(requirement.get("values") or [])
    operator = requirement.get("operator")
    for group in ("containerStatuses", "initContainerStatuses"):
        for cs in status.get(group) or []:
            term = (cs.get("state") or {}).get("terminated")
            if not term or not term.get("exitCode"):
                continue
            if requirement.get("containerName") and requirement["containerName"] != cs.get("name"):
                continue
            code = int(term["exitCode"])
            if (operator == "In" and code in values) or (operator == "NotIn" and code not in values):
                return str(cs.get("name")), code
    return None


def _condition_match(status: dict[str, Any], patterns: list[dict[str, Any]]) -> str | None:
    """The type of the first pod condition a pattern matches (type and status)."""
    for cond in status.get("conditions") or []:
        for pattern in patterns:
            if cond.get("type") == pattern.get("type") and cond.get("status") == pattern.get(
                "status", "True"
            ):
                return str(cond["type"])
    return None


def compress_indexes(indexes: set[int]) -> str:
    """``{0,1,2,4}`` -> ``"0-2,4"`` (Job ``completedIndexes`` format)."""
    parts = []
    ordered = sorted(indexes)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


@dataclass
class JobTracking:
    """Per-job bookkeeping that real controllers keep in pod finalizers and status."""

    counted: dict[str, str] = field(default_factory=dict)  # pod uid -> succeeded|failed|ignored
    seen: set[str] = field(default_factory=set)
    deleted_by_controller: set[str] = field(default_factory=set)
    succeeded_indexes: set[int] = field(default_factory=set)
    last_failure: float = 0.0
    fail_job: tuple[str, str] | None = None
    finished_at: float | None = None
    create_failures: int = 0  # pod creations refused in a row (admission)
    create_retry_at: float = 0.0


def _reconcile_owners(
    cluster: Cluster,
    resource: Any,
    reconcile: Callable[[dict[str, Any], list[dict[str, Any]]], None],
    tracking: dict[str, Any],
) -> None:
    """Reconcile each object of ``resource`` with the pods it owns; forget deleted objects."""
    pods_by_owner: dict[str, list[dict[str, Any]]] = {}
    for pod in cluster.store.list(PODS):
        owner = controller_uid(pod)
        if owner:
            pods_by_owner.setdefault(owner, []).append(pod)
    live = set()
    for obj in cluster.store.list(resource):
        uid = obj["metadata"]["uid"]
        live.add(uid)
        try:
            reconcile(obj, pods_by_owner.get(uid, []))
        except errors.ApiError as exc:  # pragma: no cover - races with user deletes
            log.debug("%s reconcile: %s", obj.get("kind"), exc)
    for uid in list(tracking):
        if uid not in live:
            del tracking[uid]


class JobController:
    """batch/v1 Job controller."""

    def __init__(self, cluster: Cluster, backoff: float) -> None:
        self.cluster = cluster
        self.backoff = backoff
        self.tracking: dict[str, JobTracking] = {}

    def reconcile_all(self) -> None:
        """Reconcile every Job."""
        _reconcile_owners(self.cluster, JOBS, self.reconcile, self.tracking)

    # ------------------------------------------------------------------ helpers
    def _event(self, job: dict[str, Any], etype: str, reason: str, message: str) -> None:
        self.cluster.record_event(job, etype, reason, message, component="job-controller")

    def _delete_pod(self, job: dict[str, Any], pod: dict[str, Any], tr: JobTracking) -> None:
        md = pod["metadata"]
        if md.get("deletionTimestamp"):
            return
        tr.deleted_by_controller.add(md["uid"])
        with contextlib.suppress(errors.ApiError):
            self.cluster.delete(PODS, md["namespace"], md["name"])
            self._event(job, "Normal", "SuccessfulDelete", f"Deleted pod: {md['name']}")

    def _failure_policy(self, job: dict[str, Any], pod: dict[str, Any]) -> tuple[str, str] | None:
        """The first ``podFailurePolicy`` rule a failed pod matches: (action, FailJob message).

        kubernetes/kubernetes ``pkg/controller/job/pod_failure_policy.go`` (read at master commit
        95f0849; not re-read at a release tag, the repository could not be fetched here),
        ``matchPodFailurePolicy``: rules in order; ``onExitCodes`` looks at the terminated
        containers with a non-zero exit code, ``containerStatuses`` before
        ``initContainerStatuses`` (``matchOnExitCodes``, ``getMatchingContainerFromList``), with
        ``In`` / ``NotIn`` (another operator never matches); ``onPodConditions`` matches a pod
        condition of the pattern's type and status (``matchOnPodConditions``; the API defaults
        the pattern's status to ``True``); a rule whose action is unknown is skipped, as is
        ``FailIndex`` (``backoffLimitPerIndex`` is not modelled). The FailJob messages are
        upstream's. The Job controller only asks this of a pod in phase ``Failed``.
        """
        rules = ((job.get("spec") or {}).get("podFailurePolicy") or {}).get("rules") or []
        md = pod["metadata"]
        status = pod.get("status") or {}
        where = f"{md['namespace']}/{md['name']}"
        for i, rule in enumerate(rules):
            action = rule.get("action")
            if action not in ("FailJob", "Ignore", "Count"):
                continue
            on_codes = rule.get("onExitCodes")
            if on_codes is not None:
                matched = _exit_code_match(status, on_codes)
                if matched is not None:
                    name, code = matched
                    return action, (
                        f"Container {name} for pod {where} failed with exit code {code} matching "
                        f"{action} rule at index {i}"
                    )
            elif rule.get("onPodConditions") is not None:
                ctype = _condition_match(status, rule["onPodConditions"])
                if ctype is not None:
                    return action, f"Pod {where} has condition {ctype} matching {action} rule at index {i}"
        return None

    def _new_pod(self, job: dict[str, Any], index: int | None) -> None:
        md = job["metadata"]
        name, ns = md["name"], md["namespace"]
        template = copy.deepcopy((job.get("spec") or {}).get("template") or {})
        tmd = template.get("metadata") or {}
        labels = dict(tmd.get("labels") or {})
        annotations = dict(tmd.get("annotations") or {})
        pod_spec = template.get("spec") or {}
        generate = f"{name}-"
        if index is not None:
            labels[INDEX_KEY] = str(index)
            annotations[INDEX_KEY] = str(index)
            generate = f"{name}-{index}-"
            pod_spec.setdefault("hostname", f"{name}-{index}"[:63].rstrip("-"))
            for group in ("initContainers", "containers"):
                for container in pod_spec.get(group) or []:
                    env = container.setdefault("env", [])
                    if not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in env):
                        env.append(
                            {
                                "name": "JOB_COMPLETION_INDEX",
                                "valueFrom": {
                                    "fieldRef": {
                                        "apiVersion": "v1",
                                        "fieldPath": f"metadata.annotations['{INDEX_KEY}']",
                                    }
                                },
                            }
                        )
        pod_md: dict[str, Any] = {
            "generateName": generate,
            "namespace": ns,
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": md["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        }
        if annotations:
            pod_md["annotations"] = annotations
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": pod_md, "spec": pod_spec}
        try:
            created = self.cluster.create(PODS, pod, validate=False)
        except errors.ApiError as exc:
            # kubernetes pkg/controller/controller_utils.go, RealPodControl.createPods: a refused
            # pod (admission: quota, PodSecurity, service account) is only this Warning on the Job;
            # the Job's status shows nothing, and syncJob's error requeues it rate-limited.
            self._event(job, "Warning", "FailedCreate", f"Error creating: {exc.message}")
            tr = self.tracking.setdefault(md["uid"], JobTracking())
            tr.create_failures += 1
            delay = min(self.backoff * (2 ** (tr.create_failures - 1)), self.backoff * 10)
            tr.create_retry_at = time.monotonic() + delay
            return
        self.tracking.setdefault(md["uid"], JobTracking()).create_failures = 0
        self._event(job, "Normal", "SuccessfulCreate", f"Created pod: {created['metadata']['name']}")

    # ---------------------------------------------------------------- reconcile
    def reconcile(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        """Drive one Job towards its spec."""
        md = job["metadata"]
        uid, ns, name = md["uid"], md["namespace"], md["name"]
        spec = job.get("spec") or {}
        status = copy.deepcopy(job.get("status") or {})
        conditions: list[dict[str, Any]] = status.setdefault("conditions", [])
        tr = self.tracking.setdefault(uid, JobTracking())
        if md.get("deletionTimestamp"):
            return
        if condition_true(conditions, "Complete") or condition_true(conditions, "Failed"):
            self._ttl(job, tr)
            return

        indexed = spec.get("completionMode") == "Indexed"
        completions = spec.get("completions")
        parallelism = spec.get("parallelism", 1)
        backoff_limit = spec.get("backoffLimit", 6)
        now_mono = time.monotonic()

        active: list[dict[str, Any]] = []
        terminating: list[dict[str, Any]] = []
        current_uids = set()
        for pod in pods:
            puid = pod["metadata"]["uid"]
            current_uids.add(puid)
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                if puid not in tr.counted:
                    self._count_terminal(job, pod, phase, tr, now_mono)
            elif pod["metadata"].get("deletionTimestamp"):
                terminating.append(pod)
            else:
                active.append(pod)
        for puid in tr.seen - current_uids:
            if puid not in tr.counted:
                if puid in tr.deleted_by_controller and spec.get("suspend"):
                    tr.counted[puid] = "ignored"
                else:
                    tr.counted[puid] = "failed"
                    tr.last_failure = now_mono
        tr.seen = set(current_uids)
        succeeded = sum(1 for v in tr.counted.values() if v == "succeeded")
        failed = sum(1 for v in tr.counted.values() if v == "failed")

        failure_target = condition_true(conditions, "FailureTarget")
        success_target = condition_true(conditions, "SuccessCriteriaMet")
        start_time = status.get("startTime")

        if not failure_target and not success_target and not spec.get("suspend"):
            reason = message = None
            if tr.fail_job is not None:
                reason, message = tr.fail_job
            elif failed > backoff_limit or self._past_backoff_on_failure(job, active, backoff_limit):
                reason, message = "BackoffLimitExceeded", MSG_BACKOFF
            elif spec.get("activeDeadlineSeconds") and start_time:
                elapsed = (utcnow() - parse_time(start_time)).total_seconds()
                if elapsed >= float(spec["activeDeadlineSeconds"]):
                    reason, message = "DeadlineExceeded", MSG_DEADLINE
            if reason is not None:
                set_condition(conditions, "FailureTarget", "True", reason, message or "")
                failure_target = True
                self._event(job, "Warning", reason, message or "")
            elif self._success(spec, succeeded, active, tr, indexed, completions):
                set_condition(conditions, "SuccessCriteriaMet", "True", "CompletionsReached", MSG_COMPLETE)
                success_target = True

        if failure_target or success_target:
            for pod in active:
                self._delete_pod(job, pod, tr)
            still_running = [
                p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            ]
            if not still_running:
                target = (
                    find_condition(conditions, "FailureTarget" if failure_target else "SuccessCriteriaMet")
                    or {}
                )
                final = "Failed" if failure_target else "Complete"
                set_condition(conditions, final, "True", target.get("reason", ""), target.get("message", ""))
                if final == "Complete":
                    status["completionTime"] = fmt_time()
                    self._event(job, "Normal", "Completed", "Job completed")
                tr.finished_at = now_mono
            active = []
        elif spec.get("suspend"):
            for pod in active:
                self._delete_pod(job, pod, tr)
            active = []
            if not condition_true(conditions, "Suspended"):
                set_condition(conditions, "Suspended", "True", "JobSuspended", "Job suspended")
                self._event(job, "Normal", "Suspended", "Job suspended")
            status.pop("startTime", None)
        else:
            if condition_true(conditions, "Suspended"):
                set_condition(conditions, "Suspended", "False", "JobResumed", "Job resumed")
                self._event(job, "Normal", "Resumed", "Job resumed")
            if not status.get("startTime"):
                status["startTime"] = fmt_time()
            delay = 0.0
            if failed and tr.last_failure:
                delay = min(self.backoff * (2 ** (failed - 1)), self.backoff * 10)
            if now_mono - tr.last_failure >= delay and now_mono >= tr.create_retry_at:
                self._create_pods(job, active, terminating, succeeded, tr, indexed, completions, parallelism)

        status["active"] = len(active)
        status["ready"] = sum(1 for p in active if _pod_ready(p))
        status["terminating"] = len(terminating)
        status["succeeded"] = succeeded
        status["failed"] = failed
        for key in ("active", "succeeded", "failed"):
            if not status[key]:
                status.pop(key)
        status["uncountedTerminatedPods"] = {}
        if indexed:
            if tr.succeeded_indexes:
                status["completedIndexes"] = compress_indexes(tr.succeeded_indexes)
            else:
                status.pop("completedIndexes", None)
        if not conditions:
            status.pop("conditions")

        def write(obj: dict[str, Any]) -> None:
            obj["status"] = status

        self.cluster.store.mutate(JOBS, ns, name, write)

    def _count_terminal(
        self, job: dict[str, Any], pod: dict[str, Any], phase: str, tr: JobTracking, now_mono: float
    ) -> None:
        puid = pod["metadata"]["uid"]
        if phase == "Succeeded":
            tr.counted[puid] = "succeeded"
            index = (pod["metadata"].get("annotations") or {}).get(INDEX_KEY)
            if index is not None and index.isdigit():
                tr.succeeded_indexes.add(int(index))
            return
        if puid in tr.deleted_by_controller and (job.get("spec") or {}).get("suspend"):
            tr.counted[puid] = "ignored"
            return
        verdict = self._failure_policy(job, pod)
        action = verdict[0] if verdict else "Count"
        if action == "FailJob" and verdict is not None:
            tr.fail_job = ("PodFailurePolicy", verdict[1])
            tr.counted[puid] = "failed"
        elif action == "Ignore":
            tr.counted[puid] = "ignored"
        else:
            tr.counted[puid] = "failed"
        tr.last_failure = now_mono

    @staticmethod
    def _past_backoff_on_failure(job: dict[str, Any], active: list[dict[str, Any]], limit: int) -> bool:
        template_spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
        if template_spec.get("restartPolicy") != "OnFailure":
            return False
        restarts = 0
        for pod in active:
            status = pod.get("status") or {}
            for cs in list(status.get("initContainerStatuses") or []) + list(
                status.get("containerStatuses") or []
            ):
                restarts += int(cs.get("restartCount") or 0)
        if limit == 0:
            return restarts > 0
        return restarts >= limit

    @staticmethod
    def _success(
        spec: dict[str, Any],
        succeeded: int,
        active: list[dict[str, Any]],
        tr: JobTracking,
        indexed: bool,
        completions: int | None,
    ) -> bool:
        if indexed and completions is not None:
            policy = spec.get("successPolicy")
            if policy:
                for rule in policy.get("rules") or []:
                    wanted = rule.get("succeededIndexes")
                    count = rule.get("succeededCount")
                    pool = tr.succeeded_indexes
                    if wanted:
                        chosen: set[int] = set()
                        for part in str(wanted).split(","):
                            lo, _, hi = part.partition("-")
                            chosen.update(range(int(lo), int(hi or lo) + 1))
                        pool = pool & chosen
                        if count is None and chosen <= tr.succeeded_indexes:
                            return True
                    if count is not None and len(pool) >= count:
                        return True
            return len(tr.succeeded_indexes & set(range(completions))) >= completions
        if completions is None:
            return succeeded > 0 and not active
        return succeeded >= completions

    def _create_pods(
        self,
        job: dict[str, Any],
        active: list[dict[str, Any]],
        terminating: list[dict[str, Any]],
        succeeded: int,
        tr: JobTracking,
        indexed: bool,
        completions: int | None,
        parallelism: int,
    ) -> int:
        spec = job.get("spec") or {}
        replace_when_failed = spec.get("podReplacementPolicy") == "Failed"
        busy = len(active) + (len(terminating) if replace_when_failed else 0)
        created = 0
        if indexed and completions is not None:
            running = {
                int((p["metadata"].get("annotations") or {}).get(INDEX_KEY, "-1"))
                for p in active + (terminating if replace_when_failed else [])
            }
            pending = [i for i in range(completions) if i not in tr.succeeded_indexes and i not in running]
            for index in pending[: max(0, parallelism - busy)]:
                self._new_pod(job, index)
                created += 1
            return created
        if completions is None:
            if succeeded > 0:
                return 0
            want = parallelism
        else:
            want = min(parallelism, completions - succeeded)
        for _ in range(max(0, want - busy)):
            self._new_pod(job, None)
            created += 1
        return created

    def _ttl(self, job: dict[str, Any], tr: JobTracking) -> None:
        ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
        if ttl is None:
            return
        if tr.finished_at is None:
            conditions = (job.get("status") or {}).get("conditions") or []
            final = find_condition(conditions, "Complete") or find_condition(conditions, "Failed") or {}
            when = final.get("lastTransitionTime")
            elapsed = (utcnow() - parse_time(when)).total_seconds() if when else 0.0
            tr.finished_at = time.monotonic() - elapsed
        if time.monotonic() - tr.finished_at >= float(ttl):
            md = job["metadata"]
            with contextlib.suppress(errors.ApiError):
                self.cluster.delete(JOBS, md["namespace"], md["name"], propagation="Foreground")


@dataclass
class LwsTracking:
    """Per-LWS bookkeeping (which groups were fully created, which events were sent)."""

    complete_groups: set[int] = field(default_factory=set)
    events: set[str] = field(default_factory=set)
    create_failures: dict[str, int] = field(default_factory=dict)  # StatefulSet uid -> refused in a row
    create_retry_at: dict[str, float] = field(default_factory=dict)


class LeaderWorkerSetController:
    """leaderworkerset.x-k8s.io/v1 controller: groups of a leader pod and ``size - 1`` workers.

    Pods are owned directly by the LeaderWorkerSet (the real controller goes
    through StatefulSets); names, labels, annotations and injected env match
    the real controller and its pod webhook.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.tracking: dict[str, LwsTracking] = {}

    def reconcile_all(self) -> None:
        """Reconcile every LeaderWorkerSet with the pods of its StatefulSets.

        Ownership as upstream: LWS -> leader StatefulSet -> leader pods -> worker StatefulSet
        (one per group, owned by its leader pod) -> worker pods. A pod belongs to an LWS only
        through that chain, so the pods of a deleted LWS of the same name are never adopted.
        """
        store = self.cluster.store
        owned: dict[str, list[dict[str, Any]]] = {}
        for obj in list(store.list(PODS)) + list(store.list(STATEFULSETS)):
            owner = controller_uid(obj)
            if owner:
                owned.setdefault(owner, []).append(obj)
        live = set()
        for lws in store.list(LWS):
            uid = lws["metadata"]["uid"]
            live.add(uid)
            pods: list[dict[str, Any]] = []
            for sts in owned.get(uid, []):
                if sts.get("kind") != "StatefulSet":
                    continue
                for leader in owned.get(sts["metadata"]["uid"], []):
                    if leader.get("kind") != "Pod":
                        continue
                    pods.append(leader)
                    for worker_sts in owned.get(leader["metadata"]["uid"], []):
                        pods.extend(
                            p for p in owned.get(worker_sts["metadata"]["uid"], []) if p.get("kind") == "Pod"
                        )
            try:
                self.reconcile(lws, pods)
            except errors.ApiError as exc:  # pragma: no cover - races with user deletes
                log.debug("LeaderWorkerSet reconcile: %s", exc)
        for uid in list(self.tracking):
            if uid not in live:
                del self.tracking[uid]

    # StatefulSets ---------------------------------------------------------------------------
    def _statefulset(
        self, lws: dict[str, Any], name: str, owner: dict[str, Any], replicas: int, template: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The StatefulSet ``name`` owned by ``owner``, created if missing; None while another
        (an old group's, being deleted) still holds the name.

        kubernetes-sigs/lws ``pkg/controllers/leaderworkerset_controller.go``
        (``SSAWithStatefulset``: the leader StatefulSet is named after the LWS) and
        ``pkg/controllers/pod_controller.go`` (``constructWorkerStatefulSetApplyConfiguration``:
        the group's workers are a StatefulSet named after the leader pod, ``<lws>-<group>``,
        owned by that pod).
        """
        ns = lws["metadata"]["namespace"]
        existing = self.cluster.store.get(STATEFULSETS, ns, name)
        owner_uid = owner["metadata"]["uid"]
        if existing is not None:
            return existing if controller_uid(existing) == owner_uid else None
        sts = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": {LWS_NAME: lws["metadata"]["name"]},
                "ownerReferences": [
                    {
                        "apiVersion": owner.get("apiVersion") or "v1",
                        "kind": owner.get("kind") or "Pod",
                        "name": owner["metadata"]["name"],
                        "uid": owner_uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "replicas": replicas,
                "serviceName": lws["metadata"]["name"],
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": {LWS_NAME: lws["metadata"]["name"]}},
                "template": template,
            },
        }
        try:
            created = self.cluster.create(STATEFULSETS, sts, validate=False)
        except errors.ApiError as exc:
            self.cluster.record_event(lws, "Warning", "FailedCreate", str(exc.message), component="lws")
            return None
        return created

    @staticmethod
    def _revision_hash(template: dict[str, Any]) -> str:
        """The StatefulSet controller's revision hash (up to 10 characters).

        kubernetes ``pkg/controller/history/controller_history.go``, ``HashControllerRevision``:
        FNV-32a of the revision data, its decimal form through ``rand.SafeEncodeString``.
        """
        data = json.dumps(template, sort_keys=True).encode()
        value = 0x811C9DC5
        for byte in data:
            value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
        alphabet = "bcdfghjklmnpqrstvwxz2456789"
        return "".join(alphabet[ord(ch) % len(alphabet)] for ch in str(value))

    def _create_member(
        self, lws: dict[str, Any], tr: LwsTracking, sts: dict[str, Any], pod: dict[str, Any]
    ) -> None:
        """Create one pod as its StatefulSet's controller does, or say why not.

        kubernetes ``pkg/controller/statefulset/stateful_set_utils.go``, ``newVersionedStatefulSetPod``
        labels every pod ``controller-revision-hash=<statefulset>-<hash>``; a label value over 63
        characters makes the API server refuse the pod, and ``stateful_pod_control.go``,
        ``recordPodEvent``, records ``FailedCreate`` ``create Pod <pod> in StatefulSet <sts> failed
        error: <err>`` on the StatefulSet. The pod never exists; nothing else says so.
        """
        sts_md = sts["metadata"]
        if time.monotonic() < tr.create_retry_at.get(sts_md["uid"], 0.0):
            return
        template = (sts.get("spec") or {}).get("template") or {}
        revision = f"{sts_md['name']}-{self._revision_hash(template)}"
        md = pod["metadata"]
        md["labels"]["controller-revision-hash"] = revision
        md["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "name": sts_md["name"],
                "uid": sts_md["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        try:
            if len(revision) > 63:
                raise errors.ApiError(
                    422,
                    "Invalid",
                    f'Pod "{md["name"]}" is invalid: metadata.labels: Invalid value: "{revision}": '
                    "must be no more than 63 characters",
                )
            self.cluster.create(PODS, pod, validate=False)
        except errors.ApiError as exc:
            self.cluster.record_event(
                sts,
                "Warning",
                "FailedCreate",
                f"create Pod {md['name']} in StatefulSet {sts_md['name']} failed error: {exc.message}",
                component="statefulset-controller",
            )
            failures = tr.create_failures.get(sts_md["uid"], 0) + 1
            tr.create_failures[sts_md["uid"]] = failures
            tr.create_retry_at[sts_md["uid"]] = time.monotonic() + min(0.2 * 2 ** (failures - 1), 5.0)
            return
        tr.create_failures.pop(sts_md["uid"], None)
        self.cluster.record_event(
            sts,
            "Normal",
            "SuccessfulCreate",
            f"create Pod {md['name']} in StatefulSet {sts_md['name']} successful",
            component="statefulset-controller",
        )

    def _event_once(
        self, lws: dict[str, Any], tr: LwsTracking, etype: str, reason: str, message: str
    ) -> None:
        key = f"{reason}|{message}"
        if key in tr.events:
            return
        tr.events.add(key)
        self.cluster.record_event(lws, etype, reason, message, component="lws")

    @staticmethod
    def _revision(lws: dict[str, Any]) -> str:
        lwt = (lws.get("spec") or {}).get("leaderWorkerTemplate") or {}
        blob = json.dumps([lwt.get("leaderTemplate"), lwt.get("workerTemplate")], sort_keys=True)
        return hashlib.sha1(blob.encode()).hexdigest()[:10]

    def _pod_for(self, lws: dict[str, Any], group: int, worker: int, size: int) -> dict[str, Any]:
        md = lws["metadata"]
        name, ns = md["name"], md["namespace"]
        lwt = lws["spec"]["leaderWorkerTemplate"]
        leader_template = lwt.get("leaderTemplate") or lwt["workerTemplate"]
        template = copy.deepcopy(leader_template if worker == 0 else lwt["workerTemplate"])
        leader = f"{name}-{group}"
        pod_name = leader if worker == 0 else f"{leader}-{worker}"
        tmd = template.get("metadata") or {}
        labels = dict(tmd.get("labels") or {})
        labels.update(
            {
                LWS_NAME: name,
                LWS_GROUP: str(group),
                LWS_WORKER: str(worker),
                LWS_GROUP_KEY: hashlib.sha1(f"{ns}/{leader}".encode()).hexdigest(),
                LWS_REVISION: self._revision(lws),
                "apps.kubernetes.io/pod-index": str(group if worker == 0 else worker),
                "statefulset.kubernetes.io/pod-name": pod_name,
            }
        )
        annotations = dict(tmd.get("annotations") or {})
        annotations[LWS_SIZE] = str(size)
        if worker > 0:
            annotations[LWS_LEADER_NAME] = leader
            if _tpu_containers(leader_template.get("spec") or {}):
                annotations[LWS_LEADER_REQUESTS_TPUS] = "true"
        spec = template.get("spec") or {}
        spec["hostname"] = pod_name
        spec["subdomain"] = name
        # The LWS pod webhook: TPU variables are appended first, then the LWS variables
        # are put in front of every container's env (so user values may use $(LWS_...)).
        self._add_tpu_env(spec, annotations, leader, name, worker, size)
        lws_env = [
            {"name": "LWS_LEADER_ADDRESS", "value": f"{leader}.{name}.{ns}"},
            {"name": "LWS_GROUP_SIZE", "value": str(size)},
            {"name": "LWS_WORKER_INDEX", "value": str(worker)},
        ]
        names = {e["name"] for e in lws_env}
        for group_key in ("containers", "initContainers"):
            for container in spec.get(group_key) or []:
                existing = [e for e in container.get("env") or [] if e.get("name") not in names]
                container["env"] = copy.deepcopy(lws_env) + existing
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": ns,
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [
                    {
                        "apiVersion": LWS.api_version,
                        "kind": "LeaderWorkerSet",
                        "name": name,
                        "uid": md["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }

    @staticmethod
    def _add_tpu_env(
        spec: dict[str, Any], annotations: dict[str, str], leader: str, subdomain: str, worker: int, size: int
    ) -> None:
        """``AddTPUVariables`` of the LWS webhook (without subgroups)."""
        containers = _tpu_containers(spec)
        if not containers or any(
            e.get("name") in ("TPU_WORKER_HOSTNAMES", "TPU_WORKER_ID") for e in containers[0].get("env") or []
        ):
            return
        leader_is_tpu_worker = worker == 0 or annotations.get(LWS_LEADER_REQUESTS_TPUS) == "true"
        index = worker if leader_is_tpu_worker else worker - 1

        def own_port(container: dict[str, Any]) -> str | None:
            env = container.get("env") or []
            return next((str(e.get("value", "")) for e in env if e.get("name") == "TPU_PROCESS_PORT"), None)

        ports = [own_port(c) or str(TPU_PROCESS_DEFAULT_PORT + i) for i, c in enumerate(containers)]
        hosts = ([f"{leader}.{subdomain}"] if leader_is_tpu_worker else []) + [
            f"{leader}-{i}.{subdomain}" for i in range(1, size)
        ]
        hostnames = [h for h in hosts for _ in containers]
        addresses = [f"{h}:{p}" for h in hosts for p in ports]
        for i, container in enumerate(containers):
            env = container.setdefault("env", [])
            env += [
                {"name": "TPU_WORKER_HOSTNAMES", "value": ",".join(hostnames)},
                {"name": "TPU_WORKER_ID", "value": str(index * len(containers) + i)},
                {"name": "TPU_NAME", "value": leader},
                {"name": "TPU_PROCESS_ADDRESSES", "value": ",".join(addresses)},
            ]
            if own_port(container) is None:
                env.append({"name": "TPU_PROCESS_PORT", "value": ports[i]})

    def _ensure_service(self, lws: dict[str, Any]) -> None:
        md = lws["metadata"]
        if self.cluster.store.get(SERVICES, md["namespace"], md["name"]) is not None:
            return
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": md["name"],
                "namespace": md["namespace"],
                "labels": {LWS_NAME: md["name"]},
                "ownerReferences": [
                    {
                        "apiVersion": LWS.api_version,
                        "kind": "LeaderWorkerSet",
                        "name": md["name"],
                        "uid": md["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "clusterIP": "None",
                "clusterIPs": ["None"],
                "selector": {LWS_NAME: md["name"]},
                "publishNotReadyAddresses": True,
                "type": "ClusterIP",
            },
        }
        with contextlib.suppress(errors.ApiError):
            self.cluster.create(SERVICES, service, validate=False)

    def _delete(self, pod: dict[str, Any]) -> None:
        md = pod["metadata"]
        if md.get("deletionTimestamp"):
            return
        with contextlib.suppress(errors.ApiError):
            self.cluster.delete(PODS, md["namespace"], md["name"])

    def reconcile(self, lws: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        """Create missing group pods, recreate broken groups, update status."""
        md = lws["metadata"]
        if md.get("deletionTimestamp"):
            return
        tr = self.tracking.setdefault(md["uid"], LwsTracking())
        spec = lws.get("spec") or {}
        lwt = spec.get("leaderWorkerTemplate") or {}
        replicas = int(spec.get("replicas", 1))
        size = int(lwt.get("size", 1))
        restart_policy = lwt.get("restartPolicy", "RecreateGroupOnPodRestart")
        startup = spec.get("startupPolicy", "LeaderCreated")
        for key in ("leaderTemplate", "workerTemplate"):
            template_spec = (lwt.get(key) or {}).get("spec") or {}
            policy = template_spec.get("restartPolicy")
            if policy not in (None, "Always"):
                self._event_once(
                    lws,
                    tr,
                    "Warning",
                    "FailedCreate",
                    f'StatefulSet.apps "{md["name"]}" is invalid: spec.template.spec.restartPolicy: '
                    f'Unsupported value: "{policy}": supported values: "Always"',
                )
                self._write_status(lws, tr, replicas, 0)
                return
        self._ensure_service(lws)
        leader_template = lwt.get("leaderTemplate") or lwt.get("workerTemplate") or {}
        leader_sts = self._statefulset(lws, md["name"], lws, replicas, leader_template)
        groups: dict[int, dict[str, dict[str, Any]]] = {}
        for pod in pods:
            labels = pod["metadata"].get("labels") or {}
            try:
                group = int(labels.get(LWS_GROUP, "-1"))
            except ValueError:
                continue
            groups.setdefault(group, {})[pod["metadata"]["name"]] = pod
        for group, members in groups.items():
            if group >= replicas:
                for pod in members.values():
                    self._delete(pod)
        ready_groups = 0
        for group in range(replicas):
            members = groups.get(group, {})
            expected = [f"{md['name']}-{group}"] + [f"{md['name']}-{group}-{w}" for w in range(1, size)]
            trigger = self._recreate_trigger(restart_policy, group, members, expected, tr)
            if trigger is not None:
                leader_pod = members.get(expected[0])
                if leader_pod is not None and not leader_pod["metadata"].get("deletionTimestamp"):
                    self.cluster.record_event(
                        lws,
                        "Normal",
                        "RecreateGroup",
                        f"Worker pod {trigger} failed, deleted leader pod {expected[0]} "
                        f"to recreate group {group}",
                        component="lws",
                    )
                for pod in members.values():
                    self._delete(pod)
                tr.complete_groups.discard(group)
                continue
            if restart_policy in ("None", "Default"):
                # StatefulSet semantics: a Failed/Succeeded pod is deleted and recreated
                # (containers that exit are restarted in place by the kubelet, as the
                # template's restartPolicy is Always). The workers' StatefulSet is owned
                # by the leader pod, so losing the leader takes the workers with it.
                leader_pod = members.get(expected[0])
                leader_lost = leader_pod is None or bool(
                    leader_pod["metadata"].get("deletionTimestamp")
                    or (leader_pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
                )
                for pod in members.values():
                    if leader_lost or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                        self._delete(pod)
            if any(p["metadata"].get("deletionTimestamp") for p in members.values()):
                continue
            leader_name = expected[0]
            if leader_sts is None:
                continue
            if leader_name not in members:
                self._create_member(lws, tr, leader_sts, self._pod_for(lws, group, 0, size))
            leader = members.get(leader_name)
            if leader is None or size == 1:
                continue  # the workers' StatefulSet is made (and owned) by the leader pod
            if startup == "LeaderReady" and not _pod_ready(leader):
                continue
            worker_template = lwt.get("workerTemplate") or {}
            worker_sts = self._statefulset(lws, leader_name, leader, size - 1, worker_template)
            if worker_sts is None:
                continue
            for worker in range(1, size):
                if expected[worker] not in members:
                    self._create_member(lws, tr, worker_sts, self._pod_for(lws, group, worker, size))
            if all(n in members for n in expected):
                tr.complete_groups.add(group)
                if all(
                    (members[n].get("status") or {}).get("phase") == "Running" and _pod_ready(members[n])
                    for n in expected
                ):
                    ready_groups += 1
        self._write_status(lws, tr, replicas, ready_groups)

    @staticmethod
    def _recreate_trigger(
        policy: str, group: int, members: dict[str, dict[str, Any]], expected: list[str], tr: LwsTracking
    ) -> str | None:
        """Name of the pod that makes ``RecreateGroup*`` recreate the group, or None.

        Upstream's pod controller deletes the leader (and with it the group) when a
        member is being deleted or one of its containers restarted; a Failed/Succeeded
        member (preempted) or one that vanished counts too.
        """
        if policy not in ("RecreateGroupOnPodRestart", "RecreateGroupAfterStart") or not members:
            return None
        if policy == "RecreateGroupAfterStart":
            if len(members) < len(expected) or any(
                (p.get("status") or {}).get("phase") == "Pending" for p in members.values()
            ):
                return None
        for name, pod in sorted(members.items()):
            status = pod.get("status") or {}
            if pod["metadata"].get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
                return name
            for cs in list(status.get("containerStatuses") or []) + list(
                status.get("initContainerStatuses") or []
            ):
                if int(cs.get("restartCount") or 0) > 0:
                    return name
        missing = [n for n in expected if n not in members]
        return missing[0] if missing and group in tr.complete_groups else None

    def _write_status(self, lws: dict[str, Any], tr: LwsTracking, replicas: int, ready: int) -> None:
        md = lws["metadata"]
        status = copy.deepcopy(lws.get("status") or {})
        conditions: list[dict[str, Any]] = status.setdefault("conditions", [])
        available = ready == replicas
        if available:
            changed = not condition_true(conditions, "Available")
            set_condition(
                conditions, "Available", "True", "AllGroupsReady", "All replicas are ready", probe=False
            )
            if find_condition(conditions, "Progressing") is not None:
                set_condition(
                    conditions, "Progressing", "False", "GroupsProgressing", "Replicas are progressing", False
                )
            reason, message = "AllGroupsReady", "All replicas are ready"
        else:
            changed = not condition_true(conditions, "Progressing")
            set_condition(
                conditions, "Progressing", "True", "GroupsProgressing", "Replicas are progressing", False
            )
            if find_condition(conditions, "Available") is not None:
                set_condition(
                    conditions, "Available", "False", "AllGroupsReady", "All replicas are ready", False
                )
            reason, message = "GroupsProgressing", "Replicas are progressing"
        for cond in conditions:
            cond["observedGeneration"] = md.get("generation", 1)
        if changed:
            self.cluster.record_event(
                lws,
                "Normal",
                reason,
                f"{message}, with {ready} groups ready of total {replicas} groups",
                component="lws",
            )
        status["replicas"] = replicas
        status["readyReplicas"] = ready
        status["updatedReplicas"] = replicas
        status["hpaPodSelector"] = f"{LWS_NAME}={md['name']},{LWS_WORKER}=0"
        status["observedGeneration"] = md.get("generation", 1)
        if not ready:
            status.pop("readyReplicas")

        def write(obj: dict[str, Any]) -> None:
            obj["status"] = status

        self.cluster.store.mutate(LWS, md["namespace"], md["name"], write)


class ControllerManager:
    """Runs the reconcile loop for all controllers and the garbage collector."""

    RESYNC_SECONDS = 0.25

    def __init__(self, cluster: Cluster, job_backoff: float = 0.2) -> None:
        self.cluster = cluster
        self.jobs = JobController(cluster, job_backoff)
        self.lws = LeaderWorkerSetController(cluster)
        self.jobsets = JobSetController(cluster)
        self.kueue = KueueController(cluster)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def wake(self) -> None:
        """Request a reconcile pass soon (cheap; called on every store change)."""
        if self._wake is not None:
            self._wake.set()

    def start(self) -> None:
        """Start the loop on the running event loop."""
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        """Stop the loop (flag + wake rather than cancel, so a pass is never cut in half)."""
        self._stopping = True
        self.wake()
        if self._task is not None:
            done, _ = await asyncio.wait({self._task}, timeout=5.0)
            if not done:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            self._task = None

    def reconcile_once(self) -> None:
        """One pass over every controller."""
        self.jobs.reconcile_all()
        self.lws.reconcile_all()
        self.jobsets.reconcile_all()
        self.kueue.reconcile_all()
        self.cluster.gc_pass()

    async def _run(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            self._wake.clear()
            try:
                self.reconcile_once()
            except Exception:  # pragma: no cover - keep the control plane alive
                log.exception("controller pass failed")
            await wait_event(self._wake, self.RESYNC_SECONDS)
            if self._stopping:
                break
            await asyncio.sleep(0.005)
