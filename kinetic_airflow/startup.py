"""When a job that has not started yet is given up: ``startup_timeout``, counted from submission.

A cluster job can wait before its first host runs for many reasons, and only some of them
end by themselves: a node pool scales up (minutes for accelerators), an image is pulled (a
registry hiccup backs off and succeeds), a quota frees up. So nothing here fails a job at
the first sign of trouble; whatever the pending reason, a job still not running
``startup_timeout`` seconds after it was submitted is cancelled and its task fails with the
most specific reason known: the controller's own words for pods it cannot create (quota,
Pod Security admission, a missing service account, names too long for its StatefulSets),
kube-scheduler's for pods that fit no node, the kubelet's for images it cannot pull.

The watcher calls ``startup_failure`` on every look until the job first runs; once it has
run, a later pending state (a restarting host) is not a startup problem. A job waiting in a
Kueue queue is not starting yet: ``queue_timeout`` bounds that wait, and ``startup_timeout``
counts from its admission.
"""

from __future__ import annotations

import json
import time

from kinetic_airflow.backends.base import BackendStatus, JobState
from kinetic_airflow.job.ref import JobRef, K8sFields

__all__ = ["queue_failure", "startup_failure"]

_REFUSAL_HINTS = {
    "service_account": (
        "Create the Kubernetes service account in the job's namespace (`kubectl create serviceaccount "
        "<name> -n <namespace>`, with its Workload Identity annotation), or set service_account= / "
        "[kinetic] service_account to one that exists there."
    ),
    "quota": (
        "A ResourceQuota of the namespace is full or requires requests/limits the pod does not set: "
        "raise the quota (`kubectl describe resourcequota -n <namespace>`), wait for other pods to "
        "finish, or set the requests/limits through pod_override=."
    ),
    "pod_security": (
        "The namespace enforces a Pod Security level (label pod-security.kubernetes.io/enforce) the "
        "pod does not meet: use a namespace that allows it, set [kinetic] requirements_cache so no "
        "hostPath volume is used, or add the securityContext the message asks for with pod_override=."
    ),
    "invalid": (
        "The API server refused the pods the controller derived from the job (see the message); "
        "this is a kinetic-airflow bug if the names are too long: please report it."
    ),
    "admission": "An admission webhook or policy of the cluster refused the pod: see its message.",
}


def startup_failure(
    job: JobRef, status: BackendStatus, startup_timeout: float | None, submitted_at: float
) -> tuple[str, str, str] | None:
    """(cause, message, hint) if the job, still pending, has used up ``startup_timeout``."""
    if status.state is not JobState.PENDING:
        return None
    if status.reason == "Queued":  # Kueue's turn, not the cluster's: queue_timeout bounds it
        return queue_failure(job, status, submitted_at)
    if startup_timeout is None:
        return None
    # a job Kueue admitted starts its startup_timeout then: the queue wait was not the cluster's
    since = status.details.get("admitted_at") or submitted_at
    waited = time.time() - since
    if waited <= startup_timeout:
        return None
    within = f"within startup_timeout={startup_timeout:.0f}s"
    if status.reason == "Unschedulable":
        k8s = job.k8s or K8sFields()
        selectors = json.dumps(k8s.node_selectors or {}, sort_keys=True)
        if k8s.chips_per_host:
            selectors += f" and {k8s.chips_per_host} google.com/tpu chips per host"
        return (
            "unschedulable",
            f"the job could not be scheduled {within}: no node matches its nodeSelector {selectors} "
            f"({status.message})",
            "Create a node pool with these labels (or enable node auto-provisioning), check "
            "accelerator quota in the zone, or pick another accelerator.",
        )
    if status.reason == "FailedCreate":
        kind = str(status.details.get("refusal") or "admission")
        return (
            "pod_create_refused",
            f"no pod of the job could be created {within}: {status.message}",
            _REFUSAL_HINTS.get(kind, _REFUSAL_HINTS["admission"]),
        )
    if status.reason == "ImagePullBackOff":
        return (
            "image_pull",
            f"the image {status.details.get('image')!r} cannot be pulled: the kubelet's back-off "
            f"lasted past startup_timeout={startup_timeout:.0f}s ({status.message})",
            "Check the image name and tag (container_image= or [kinetic] container_image) and that the "
            "cluster's node service account may pull from the registry.",
        )
    detail = f"{status.reason}: {status.message}" if status.message else str(status.reason or "Pending")
    return (
        "startup_timeout",
        f"the job did not start {within} (still pending: {detail})",
        "Raise startup_timeout= if the cluster needs longer to provide the nodes, or look at the "
        "job's pods and events (`kubectl describe`).",
    )


def queue_failure(job: JobRef, status: BackendStatus, submitted_at: float) -> tuple[str, str, str] | None:
    """(cause, message, hint) if a job still in its Kueue queue has waited past ``queue_timeout``."""
    queue_timeout = (job.k8s or K8sFields()).queue_timeout
    if not queue_timeout or time.time() - submitted_at <= queue_timeout:
        return None
    return (
        "queue_timeout",
        f"the job was not admitted within queue_timeout={queue_timeout:.0f}s: {status.message}",
        "Kueue admits it when its ClusterQueue has quota for it: raise queue_timeout=, give the job a "
        "higher priority_class=, or ask the queue's administrator for quota "
        "(`kubectl describe clusterqueue`, `kubectl get workloads -n <namespace>`).",
    )
