"""What Kueue says about a job it manages: queued (where, and why), admitted, evicted, refused.

A job with ``local_queue`` is suspended by Kueue's webhook until Kueue admits its Workload.
Without this module such a job would look like any pending job, and ``startup_timeout`` would
give it up while it waits its turn. Kueue keeps the facts on the job's Workload
(``kueue.x-k8s.io``, read in the version the cluster serves, v1beta2 preferred: discovery.py; the
rules as kubernetes-sigs/kueue v0.19.2 writes them in ``pkg/workload``,
``pkg/controller/jobframework/reconciler.go`` and ``pkg/controller/core/workload_controller.go``):

* the Workload is labelled ``kueue.x-k8s.io/job-uid=<the job's uid>`` and owned by the job;
* ``QuotaReserved`` / ``Admitted`` conditions: not reserved yet, the condition's message is
  the scheduler's reason ("couldn't assign flavors to pod set main: insufficient unused quota
  for ...");
* ``Evicted`` (``EVICTIONS``): Kueue stops the pods and suspends the job again. An active
  Workload is admitted again later (``Requeued``: True at once after ``Preempted`` and
  ``NodeFailures``; False until ``BackoffFinished`` after ``PodsReadyTimeout`` and
  ``AdmissionCheck``; False until ``ClusterQueueRestarted`` / ``LocalQueueRestarted`` after a
  queue's ``HoldAndDrain`` stop): for kinetic the attempt ended and the next one resumes. A
  deactivated Workload (``spec.active: false``, reasons ``Deactivated...``) is never admitted
  again: the job failed;
* ``status.admissionChecks[]``: a check whose ProvisioningRequest failed goes ``Retry``
  (``Evicted`` reason ``AdmissionCheck``: Kueue tries again, the job stays queued) until its
  retries are spent, then ``Rejected``: the Workload is deactivated (``Evicted`` reason
  ``DeactivatedDueToAdmissionCheck``, the check's message quoted) and never admitted.

The position in the queue comes from Kueue's visibility API (``visibility.kueue.x-k8s.io``);
a cluster without it (or RBAC refusing it) just gets no position.

A Workload that cannot be read (RBAC, a Kueue version whose API kinetic does not read) is told as
such with its HTTP status and what to fix; it never turns the job's own verdict (failed) into
"queued".
"""

from __future__ import annotations

import calendar
import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from kinetic_airflow.backends.base import BackendStatus, JobState
from kinetic_airflow.backends.gke import discovery
from kinetic_airflow.backends.gke.client import ApiError, KubeApi
from kinetic_airflow.job.envelope import RERUN_REFUSED_EXIT

__all__ = [
    "EVICTIONS",
    "LocalQueueMissingError",
    "QueueState",
    "check_local_queue",
    "queue_state",
    "with_queue",
]

log = logging.getLogger(__name__)

JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"

# The reasons of a Workload's ``Evicted`` condition after which Kueue admits it again, and when
# (kubernetes-sigs/kueue v0.19.2: apis/kueue/v1beta2/workload_types.go WorkloadEvictedBy*;
# pkg/controller/jobframework/reconciler.go ReconcileGenericJob step 6 sets Requeued=True only
# for Preempted and NodeFailures; pkg/controller/core/workload_controller.go Reconcile turns the
# others True). For kinetic each ends the attempt that ran, and the next attempt waits its turn.
# ``Deactivated`` and ``DeactivatedDueTo<cause>`` (evict.go Evict) are not requeued.
EVICTIONS = {
    "Preempted": "Kueue requeues it at once",
    "NodeFailures": "Kueue requeues it at once",
    "PodsReadyTimeout": "Kueue requeues it after its backoff (Requeued: BackoffFinished)",
    "AdmissionCheck": "Kueue requeues it after its backoff (Requeued: BackoffFinished)",
    "ClusterQueueStopped": "Kueue requeues it when the ClusterQueue runs again (ClusterQueueRestarted)",
    "LocalQueueStopped": "Kueue requeues it when the LocalQueue runs again (LocalQueueRestarted)",
    "FlavorMigration": "Kueue admits it with another flavor",
}
_DEACTIVATED = "Deactivated"
_SIGTERM_EXIT = 128 + 15  # how a pod Kueue stops by suspending its job ends
# ... and the Requeued reasons the workload controller writes when it admits such a Workload again
# (told when the watcher saw the job only after it was admitted again)
_READMITTED = {
    "BackoffFinished": "Kueue admitted it again after its backoff",
    "ClusterQueueRestarted": "Kueue admitted it again when the ClusterQueue ran again",
    "LocalQueueRestarted": "Kueue admitted it again when the LocalQueue ran again",
    "Reactivated": "Kueue admitted it again once it was reactivated",
}


@dataclass(frozen=True)
class QueueState:
    """One look at a queued job's Workload."""

    queue: str
    workload: str | None = None
    admitted: bool = False
    admitted_at: float | None = None
    pending: str = ""  # Kueue's reason it is not admitted yet
    position: int | None = None
    evicted_reason: str | None = None
    evicted_message: str = ""
    rejected_check: str | None = None
    rejected_message: str = ""
    provisioning_request: str | None = None
    requeued_after: str | None = None  # the reason Kueue evicted it before admitting it again
    requeued_message: str = ""
    active: bool = True  # spec.active: a deactivated Workload is never admitted again
    unreadable: str = ""  # why the Workload could not be read (HTTP status and what to fix)
    missing_queue: str = ""  # Kueue's word that the LocalQueue does not exist

    @property
    def waiting_text(self) -> str:
        """``queued in team-a (position 2, pending admission: <Kueue's reason>)``."""
        parts = []
        if self.position is not None:
            parts.append(f"position {self.position}")
        if self.pending:
            parts.append(f"pending admission: {self.pending}")
        elif self.workload is None:
            parts.append("waiting for Kueue to make its Workload")
        return f"queued in {self.queue}" + (f" ({', '.join(parts)})" if parts else "")


def _time(stamp: str | None) -> float | None:
    if not stamp:
        return None
    try:
        return float(calendar.timegm(time.strptime(stamp.rstrip("Z").split(".")[0], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def _conditions(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}


def _owned_by(workload: dict[str, Any], uid: str) -> bool:
    meta = workload.get("metadata") or {}
    if (meta.get("labels") or {}).get(JOB_UID_LABEL) == uid:
        return True
    return any(ref.get("uid") == uid for ref in meta.get("ownerReferences") or [])


def find_workload(api: KubeApi, namespace: str, uid: str) -> dict[str, Any] | None:
    """The Workload of the job with ``uid``: by Kueue's job-uid label, else by owner."""
    path = f"{discovery.group_path(api, discovery.KUEUE)}/namespaces/{namespace}/workloads"
    found = api.request("GET", path, query={"labelSelector": f"{JOB_UID_LABEL}={uid}"}).get("items") or []
    if not found:  # kinds Kueue does not label this way own their Workloads all the same
        found = [w for w in api.request("GET", path).get("items") or [] if _owned_by(w, uid)]
    return max(found, key=lambda w: w["metadata"].get("creationTimestamp") or "") if found else None


def _position(api: KubeApi, namespace: str, queue: str, workload: str) -> int | None:
    try:
        visibility = discovery.group_path(api, discovery.KUEUE_VISIBILITY)
        path = f"{visibility}/namespaces/{namespace}/localqueues/{queue}/pendingworkloads"
        listed = api.request("GET", path)
    except ApiError as exc:
        log.debug("no queue position for %s (%s): Kueue's visibility API is not reachable", workload, exc)
        return None
    for item in listed.get("items") or []:
        if (item.get("metadata") or {}).get("name") == workload:
            position = item.get("positionInLocalQueue")
            return int(position) + 1 if position is not None else None  # Kueue counts from 0
    return None


def _provisioning_request(api: KubeApi, namespace: str, workload: str, check: str) -> str | None:
    """The newest ProvisioningRequest Kueue made for this Workload's check (``<wl>-<check>-<n>``)."""
    try:
        provisioning = discovery.group_path(api, discovery.PROVISIONING)
        listed = api.request("GET", f"{provisioning}/namespaces/{namespace}/provisioningrequests")
    except ApiError:
        return None
    names = [
        (i.get("metadata") or {}).get("name", "")
        for i in listed.get("items") or []
        if (i.get("metadata") or {}).get("name", "").startswith(f"{workload}-{check}-")
    ]
    return max(names, key=lambda n: (len(n), n)) if names else None


class LocalQueueMissingError(RuntimeError):
    """The job names a Kueue LocalQueue its namespace does not have."""


def _local_queues(api: KubeApi, namespace: str) -> list[str] | None:
    """The LocalQueues of ``namespace`` (None if they cannot be listed)."""
    try:
        path = f"{discovery.group_path(api, discovery.KUEUE)}/namespaces/{namespace}/localqueues"
        items = api.request("GET", path).get("items") or []
    except ApiError as exc:
        log.debug("cannot list the LocalQueues of %s (%s)", namespace, exc)
        return None
    return sorted(str((i.get("metadata") or {}).get("name")) for i in items)


def _missing_queue_text(api: KubeApi, namespace: str, queue: str) -> str:
    existing = _local_queues(api, namespace)
    if existing is None:
        there = "(its LocalQueues cannot be listed)"
    elif existing:
        there = f"(it has: {', '.join(existing)})"
    else:
        there = "(it has none)"
    return (
        f"Kueue LocalQueue {queue!r} does not exist in namespace {namespace!r} {there}: set local_queue= "
        "(or [kinetic] local_queue) to one of them, or ask the cluster's administrator to create it "
        "(`kubectl get localqueues -n <namespace>`)"
    )


def check_local_queue(api: KubeApi, namespace: str, queue: str) -> None:
    """Refuse, before anything is created, a job whose LocalQueue does not exist: Kueue would
    leave its Workload inadmissible for ever. Raises :class:`LocalQueueMissingError` naming the
    queue and those that exist. A cluster that will not say (RBAC, no Kueue API) is not refused
    here: the Workload's conditions tell it later."""
    try:
        path = f"{discovery.group_path(api, discovery.KUEUE)}/namespaces/{namespace}/localqueues/{queue}"
        api.request("GET", path)
    except ApiError as exc:
        if exc.status == 404 and not isinstance(exc, discovery.GroupNotServedError):
            raise LocalQueueMissingError(_missing_queue_text(api, namespace, queue)) from None
        log.debug("cannot read LocalQueue %s/%s (%s): Kueue's Workload will tell", namespace, queue, exc)


def _unreadable(exc: ApiError) -> str:
    """Why a Workload cannot be read, with what to fix."""
    if isinstance(exc, discovery.GroupNotServedError):
        return f"HTTP 404: {exc}"
    if exc.status == 403:
        hint = (
            "the Role of kinetic's identity needs get and list on workloads (apiGroups "
            "kueue.x-k8s.io): `kinetic-airflow doctor --print-rbac` prints the Role"
        )
    elif exc.status == 404:
        hint = (
            "the cluster does not serve the Kueue API version asked for: is Kueue installed, and a "
            "release that serves kueue.x-k8s.io " + " or ".join(discovery.SPOKEN[discovery.KUEUE]) + "?"
        )
    else:
        hint = "the API server did not answer it"
    return f"HTTP {exc.status} {exc.reason}: {hint} ({exc})"


# workload_controller.go: a Workload whose LocalQueue is gone stays inadmissible with these messages
# (reason Inadmissible, or Misconfigured with the UnadmittedWorkloadsObservability gate)
_NO_QUEUE = ("doesn't exist", "is terminating or missing")


def queue_state(api: KubeApi, namespace: str, found: dict[str, Any], queue: str) -> QueueState:
    """What Kueue says about the job ``found`` (its API object) waiting in ``queue``."""
    uid = (found.get("metadata") or {}).get("uid") or ""
    try:
        workload = find_workload(api, namespace, uid)
    except ApiError as exc:
        log.debug("cannot read the Workload of %s (%s)", uid, exc)
        if exc.status == 404:  # Kueue upgraded since the version was discovered? ask again next time
            discovery.forget(api)
        return QueueState(queue, unreadable=_unreadable(exc))
    if workload is None:
        return QueueState(queue)
    name = workload["metadata"]["name"]
    active = (workload.get("spec") or {}).get("active", True) is not False
    conditions = _conditions(workload)
    admitted = conditions.get("Admitted", {}).get("status") == "True"
    evicted = conditions.get("Evicted", {})
    # An eviction Kueue has since undone by admitting the Workload again leaves ``Requeued``
    # True (its reason the eviction's, or BackoffFinished / ...Restarted / Reactivated: the
    # workload controller) and ``Evicted`` False ("QuotaReserved", workload.SetQuotaReservation):
    # the job's pods were stopped and started again, which for kinetic ends the attempt.
    requeued = conditions.get("Requeued", {})
    requeued_after = (
        str(requeued.get("reason") or "Requeued")
        if requeued.get("status") == "True" and "Evicted" in conditions
        else None
    )
    state = QueueState(
        queue,
        workload=name,
        admitted=admitted,
        admitted_at=_time(conditions.get("Admitted", {}).get("lastTransitionTime")) if admitted else None,
        requeued_after=requeued_after,
        requeued_message=str(requeued.get("message") or "") if requeued_after else "",
        active=active,
    )
    for check in (workload.get("status") or {}).get("admissionChecks") or []:
        if check.get("state") == "Rejected":
            return QueueState(
                queue,
                workload=name,
                rejected_check=check.get("name"),
                rejected_message=str(check.get("message") or ""),
                provisioning_request=_provisioning_request(api, namespace, name, str(check.get("name"))),
            )
    reason = str(evicted.get("reason") or "")
    if evicted.get("status") == "True" and reason == "DeactivatedDueToAdmissionCheck":
        # a check past its retries: Kueue deactivates the Workload and resets the checks'
        # states, so the rejection is told by the eviction (pkg/workload/admissionchecks.go)
        message = str(evicted.get("message") or "")
        check = message.split('"')[1] if message.count('"') >= 2 else None
        return QueueState(
            queue,
            workload=name,
            rejected_check=check or "admission check",
            rejected_message=message,
            provisioning_request=_provisioning_request(api, namespace, name, check) if check else None,
        )
    if evicted.get("status") == "True" and reason == "AdmissionCheck" and not admitted:
        # a check in Retry (a ProvisioningRequest GKE will try again): a job that has not run
        # waits in the queue still (with_queue); one that ran was evicted like any other
        return QueueState(
            queue,
            workload=name,
            pending=f"retrying admission: {evicted.get('message') or ''}",
            position=_position(api, namespace, queue, name),
            evicted_reason=reason,
            evicted_message=str(evicted.get("message") or ""),
            active=active,
        )
    if evicted.get("status") == "True":
        return QueueState(
            queue,
            workload=name,
            evicted_reason=reason or "Evicted",
            evicted_message=str(evicted.get("message") or ""),
            active=active,
        )
    if admitted:
        return state
    reserved = conditions.get("QuotaReserved", {})
    pending = str(reserved.get("message") or "")
    if reserved.get("status") == "False" and any(pending == f"LocalQueue {queue} {w}" for w in _NO_QUEUE):
        return QueueState(queue, workload=name, missing_queue=_missing_queue_text(api, namespace, queue))
    checks = [
        c for c in (workload.get("status") or {}).get("admissionChecks") or [] if c.get("state") != "Ready"
    ]
    if reserved.get("status") == "True" and checks:
        pending = "; ".join(
            f"admission check {c.get('name')}: {c.get('message') or c.get('state')}" for c in checks
        )
    return QueueState(
        queue,
        workload=name,
        pending=pending,
        position=_position(api, namespace, queue, name),
        active=active,
    )


def _evicted(state: QueueState) -> BackendStatus:
    """The verdict on a job whose Workload Kueue evicted: the attempt ended; it resumes if Kueue
    will admit the Workload again, it failed if Kueue deactivated it."""
    reason = str(state.evicted_reason)
    if not state.active or reason.startswith(_DEACTIVATED):
        return BackendStatus(
            JobState.FAILED,
            reason="KueueDeactivated",
            message=f"Kueue stopped Workload {state.workload} ({reason}: {state.evicted_message})",
            details={"evicted_by": "kueue", "workload": state.workload},
        )
    then = EVICTIONS.get(reason) or _READMITTED.get(reason) or "Kueue admits it again when it can"
    return BackendStatus(
        JobState.FAILED,
        reason="Preempted",
        message=f"Kueue evicted Workload {state.workload} ({reason}: {state.evicted_message}); {then}",
        details={"evicted_by": "kueue", "workload": state.workload, "eviction": reason},
    )


def with_queue(status: BackendStatus, state: QueueState) -> BackendStatus:
    """``status`` of a job Kueue manages, told by its Workload. Only a pending job is "Queued":
    a failed job stays failed unless its Workload says Kueue stopped it."""
    if state.unreadable:
        if status.state is JobState.FAILED:  # the job's own verdict; the Workload cannot change it
            return replace(
                status,
                message=f"{status.message} (its Kueue Workload cannot be read: {state.unreadable})".lstrip(),
                details={**status.details, "workload_unreadable": state.unreadable},
            )
        return BackendStatus(
            status.state,
            status.exit_code,
            reason="KueueUnreadable",
            message=f"in Kueue LocalQueue {state.queue}, but its Workload cannot be read: {state.unreadable}",
            details={**status.details, "queue": state.queue, "workload_unreadable": state.unreadable},
        )
    if state.missing_queue:
        return BackendStatus(
            JobState.FAILED,
            reason="LocalQueueMissing",
            message=state.missing_queue,
            details={"queue": state.queue, "workload": state.workload},
        )
    if state.rejected_check is not None:
        request = (
            f"ProvisioningRequest {state.provisioning_request}"
            if state.provisioning_request
            else (f"admission check {state.rejected_check}")
        )
        return BackendStatus(
            JobState.FAILED,
            reason="ProvisioningFailed",
            message=f"the {request} of Workload {state.workload} failed: {state.rejected_message}",
            details={"workload": state.workload, "check": state.rejected_check},
        )
    if (
        state.evicted_reason is None
        and state.requeued_after is not None
        and status.state is JobState.FAILED
        and status.exit_code in (RERUN_REFUSED_EXIT, _SIGTERM_EXIT)
    ):
        # evicted and admitted again before the watcher looked: the pod Kueue stopped (SIGTERM) or
        # the resumed pod, which refused to run the attempt twice (the runner's RERUN_REFUSED_EXIT)
        state = replace(state, evicted_reason=state.requeued_after, evicted_message=state.requeued_message)
    if state.evicted_reason == "AdmissionCheck" and state.pending and status.state is JobState.PENDING:
        return _queued(state)  # retried before it ran: still waiting its turn
    if state.evicted_reason is not None:
        return _evicted(state)
    if state.admitted or status.state is not JobState.PENDING:
        return BackendStatus(
            status.state,
            status.exit_code,
            status.reason,
            status.message,
            {**status.details, "admitted_at": state.admitted_at, "workload": state.workload}
            if state.admitted
            else status.details,
        )
    return _queued(state)


def _queued(state: QueueState) -> BackendStatus:
    return BackendStatus(
        JobState.PENDING,
        reason="Queued",
        message=state.waiting_text,
        details={"queue": state.queue, "position": state.position, "workload": state.workload},
    )
