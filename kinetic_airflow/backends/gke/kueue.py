"""What Kueue says about a job it manages: queued (where, and why), admitted, evicted, refused.

A job with ``local_queue`` is suspended by Kueue's webhook until Kueue admits its Workload.
Without this module such a job would look like any pending job, and ``startup_timeout`` would
give it up while it waits its turn. Kueue keeps the facts on the job's Workload
(``kueue.x-k8s.io/v1beta1``; the rules in kubernetes-sigs/kueue ``pkg/workload`` and
``pkg/controller/jobframework``):

* the Workload is labelled ``kueue.x-k8s.io/job-uid=<the job's uid>`` and owned by the job;
* ``QuotaReserved`` / ``Admitted`` conditions: not reserved yet, the condition's message is
  the scheduler's reason ("couldn't assign flavors to pod set main: insufficient unused quota
  for ...");
* ``Evicted`` (reasons ``Preempted``, ``PodsReadyTimeout``, ``AdmissionCheck``,
  ``InactiveWorkload`` ...): Kueue stops the pods and suspends the job again;
* ``status.admissionChecks[]``: a check whose ProvisioningRequest failed goes ``Retry``
  (``Evicted`` reason ``AdmissionCheck``: Kueue tries again, the job stays queued) until its
  retries are spent, then ``Rejected``: the Workload is deactivated (``Evicted`` reason
  ``DeactivatedDueToAdmissionCheck``, the check's message quoted) and never admitted.

The position in the queue comes from Kueue's visibility API (``visibility.kueue.x-k8s.io``);
a cluster without it (or RBAC refusing it) just gets no position.
"""

from __future__ import annotations

import calendar
import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from kinetic_airflow.backends.base import BackendStatus, JobState
from kinetic_airflow.backends.gke.client import ApiError, KubeApi
from kinetic_airflow.job.envelope import RERUN_REFUSED_EXIT

__all__ = ["QueueState", "queue_state", "with_queue"]

log = logging.getLogger(__name__)

KUEUE = "/apis/kueue.x-k8s.io/v1beta1"
VISIBILITY = "/apis/visibility.kueue.x-k8s.io/v1beta1"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
PROVISIONING_REQUESTS = "/apis/autoscaling.x-k8s.io/v1"

# Evictions after which Kueue requeues the job: for kinetic a new attempt of the same try, as a
# node preemption is. An inactive (deactivated) Workload is not requeued: the job failed.
_REQUEUED = {"Preempted", "PodsReadyTimeout", "AdmissionCheck", "NodeFailures", "Evicted", "InClusterQueue"}
# ... and of those, the ones that stop a job that was running (an admission check's retry
# happens before the pods start).
_RESTARTED = _REQUEUED - {"AdmissionCheck"}


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
    path = f"{KUEUE}/namespaces/{namespace}/workloads"
    found = api.request("GET", path, query={"labelSelector": f"{JOB_UID_LABEL}={uid}"}).get("items") or []
    if not found:  # kinds Kueue does not label this way own their Workloads all the same
        found = [w for w in api.request("GET", path).get("items") or [] if _owned_by(w, uid)]
    return max(found, key=lambda w: w["metadata"].get("creationTimestamp") or "") if found else None


def _position(api: KubeApi, namespace: str, queue: str, workload: str) -> int | None:
    try:
        listed = api.request(
            "GET", f"{VISIBILITY}/namespaces/{namespace}/localqueues/{queue}/pendingworkloads"
        )
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
        listed = api.request("GET", f"{PROVISIONING_REQUESTS}/namespaces/{namespace}/provisioningrequests")
    except ApiError:
        return None
    names = [
        (i.get("metadata") or {}).get("name", "")
        for i in listed.get("items") or []
        if (i.get("metadata") or {}).get("name", "").startswith(f"{workload}-{check}-")
    ]
    return max(names, key=lambda n: (len(n), n)) if names else None


def queue_state(api: KubeApi, namespace: str, found: dict[str, Any], queue: str) -> QueueState:
    """What Kueue says about the job ``found`` (its API object) waiting in ``queue``."""
    uid = (found.get("metadata") or {}).get("uid") or ""
    try:
        workload = find_workload(api, namespace, uid)
    except ApiError as exc:
        log.debug("cannot read the Workload of %s (%s)", uid, exc)
        return QueueState(queue, pending=f"its Workload cannot be read ({exc})")
    if workload is None:
        return QueueState(queue)
    name = workload["metadata"]["name"]
    conditions = _conditions(workload)
    admitted = conditions.get("Admitted", {}).get("status") == "True"
    evicted = conditions.get("Evicted", {})
    # An eviction Kueue has since undone by admitting the Workload again leaves ``Requeued``
    # True with the eviction's reason (jobframework/reconciler.go, the evicted branch) and
    # ``Evicted`` False ("QuotaReserved", workload.SetQuotaReservation): the job's pods were
    # stopped and started again, which for kinetic ends the attempt.
    requeued = conditions.get("Requeued", {})
    requeued_after = (
        str(requeued.get("reason"))
        if requeued.get("status") == "True"
        and requeued.get("reason") in _RESTARTED
        and "Evicted" in conditions
        else None
    )
    state = QueueState(
        queue,
        workload=name,
        admitted=admitted,
        admitted_at=_time(conditions.get("Admitted", {}).get("lastTransitionTime")) if admitted else None,
        requeued_after=requeued_after,
        requeued_message=str(requeued.get("message") or "") if requeued_after else "",
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
        # a check in Retry (a ProvisioningRequest GKE will try again): still waiting in the queue
        return QueueState(
            queue,
            workload=name,
            pending=f"retrying admission: {evicted.get('message') or ''}",
            position=_position(api, namespace, queue, name),
        )
    if evicted.get("status") == "True":
        return QueueState(
            queue,
            workload=name,
            evicted_reason=str(evicted.get("reason") or "Evicted"),
            evicted_message=str(evicted.get("message") or ""),
        )
    if admitted:
        return state
    reserved = conditions.get("QuotaReserved", {})
    pending = str(reserved.get("message") or "")
    checks = [
        c for c in (workload.get("status") or {}).get("admissionChecks") or [] if c.get("state") != "Ready"
    ]
    if reserved.get("status") == "True" and checks:
        pending = "; ".join(
            f"admission check {c.get('name')}: {c.get('message') or c.get('state')}" for c in checks
        )
    return QueueState(queue, workload=name, pending=pending, position=_position(api, namespace, queue, name))


def with_queue(status: BackendStatus, state: QueueState) -> BackendStatus:
    """``status`` of a job Kueue manages, told by its Workload."""
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
        and status.exit_code == RERUN_REFUSED_EXIT
    ):
        # evicted and admitted again before the watcher looked: the resumed pod refused to run
        # the attempt twice (the runner's RERUN_REFUSED_EXIT)
        state = replace(state, evicted_reason=state.requeued_after, evicted_message=state.requeued_message)
    if state.evicted_reason is not None:
        if state.evicted_reason in _REQUEUED:
            return BackendStatus(
                JobState.FAILED,
                reason="Preempted",
                message=f"Kueue evicted Workload {state.workload} ({state.evicted_reason}: "
                f"{state.evicted_message})",
                details={"evicted_by": "kueue", "workload": state.workload},
            )
        return BackendStatus(
            JobState.FAILED,
            reason="KueueDeactivated",
            message=f"Kueue stopped Workload {state.workload} "
            f"({state.evicted_reason}: {state.evicted_message})",
            details={"evicted_by": "kueue", "workload": state.workload},
        )
    if state.admitted:
        return BackendStatus(
            status.state,
            status.exit_code,
            status.reason,
            status.message,
            {**status.details, "admitted_at": state.admitted_at, "workload": state.workload},
        )
    return BackendStatus(
        JobState.PENDING,
        reason="Queued",
        message=state.waiting_text,
        details={"queue": state.queue, "position": state.position, "workload": state.workload},
    )
