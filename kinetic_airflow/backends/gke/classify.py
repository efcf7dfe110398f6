"""Job + pods (as API dicts) -> BackendStatus with a cause a person can act on.

The order of checks matters: a preempted pod also has a non-zero exit code, and
an OOM-killed one was "killed", so the most specific explanation wins.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kinetic_airflow.backends.base import BackendStatus, JobState

__all__ = [
    "IMAGE_PULL_REASONS",
    "classify",
    "pod_status",
    "refusal_kind",
    "with_refusal",
]

IMAGE_PULL_REASONS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
# The kubelet retries these with back-off (a registry hiccup, a node still authenticating): the
# job waits, and fails only if the back-off lasts past startup_timeout (watch.py). The others
# cannot get better by waiting.
RETRIED_PULL_REASONS = {"ErrImagePull", "ImagePullBackOff"}


def refusal_kind(message: str) -> str:
    """Which admission rule refused a pod, from the API server's sentence in a FailedCreate event."""
    if "error looking up service account" in message:
        return "service_account"
    if "exceeded quota" in message or "failed quota" in message:
        return "quota"
    if "violates PodSecurity" in message:
        return "pod_security"
    if "is invalid" in message:
        return "invalid"
    return "admission"


def with_refusal(
    found: dict[str, Any] | None, status: BackendStatus, events: list[dict[str, Any]]
) -> BackendStatus:
    """``status`` of a job missing pods, with the newest FailedCreate event said since the
    object was made (the Job controller or a StatefulSet's: quota, admission, service account)."""
    created = ((found or {}).get("metadata") or {}).get("creationTimestamp") or ""
    fresh = [e for e in events if (e.get("lastTimestamp") or e.get("eventTime") or "") >= created]
    if not fresh:
        return status
    event = max(fresh, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    involved = event.get("involvedObject") or {}
    message = str(event.get("message") or "")
    return BackendStatus(
        JobState.PENDING,
        reason="FailedCreate",
        message=f"the {involved.get('kind', 'controller')} {involved.get('name', '')} cannot create "
        f"pods: {message}",
        details={**status.details, "refusal": refusal_kind(message), "object": involved.get("name")},
    )


# Pod-level reasons GKE/kubelet use when a node goes away or shuts down.
_NODE_LOSS_REASONS = {"Terminated", "NodeShutdown", "NodeLost", "Shutdown", "Evicted", "NodeAffinity"}


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type"): c for c in (obj.get("status", {}).get("conditions") or [])}


def _newest(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not pods:
        return None
    return max(pods, key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))


def _container_states(pod: dict[str, Any]) -> list[dict[str, Any]]:
    status = pod.get("status", {})
    return list(status.get("initContainerStatuses") or []) + list(status.get("containerStatuses") or [])


def pod_status(pod: dict[str, Any]) -> BackendStatus | None:
    """A terminal or otherwise decisive status read off one pod; None if it is just running."""
    name = pod["metadata"]["name"]
    status = pod.get("status", {})
    conditions = _conditions(pod)
    disruption = conditions.get("DisruptionTarget")
    if disruption and disruption.get("status") == "True":
        return BackendStatus(
            JobState.FAILED,
            reason="Preempted",
            message=f"pod {name} was disrupted ({disruption.get('reason')}: {disruption.get('message', '')})",
            details={"preempted": True, "pod": name},
        )
    for cs in _container_states(pod):
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in RETRIED_PULL_REASONS:
            return BackendStatus(
                JobState.PENDING,
                reason="ImagePullBackOff",
                message=(
                    f"the image {cs.get('image')!r} is not pulled yet ({waiting.get('reason')}: "
                    f"{waiting.get('message', '')}); the kubelet retries with back-off"
                ),
                details={"image": cs.get("image"), "pod": name},
            )
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            return BackendStatus(
                JobState.FAILED,
                reason="ImagePullFailed",
                message=(
                    f"the image {cs.get('image')!r} cannot be pulled ({waiting.get('reason')}: "
                    f"{waiting.get('message', '')})"
                ),
                details={"image": cs.get("image"), "pod": name},
            )
        terminated = state.get("terminated") or {}
        if terminated.get("reason") == "OOMKilled":
            return BackendStatus(
                JobState.FAILED,
                exit_code=terminated.get("exitCode", 137),
                reason="OOMKilled",
                message=f"container {cs.get('name')} of pod {name} was OOMKilled (exit code 137)",
                details={"pod": name},
            )
    phase = status.get("phase")
    if phase == "Failed":
        if status.get("reason") in _NODE_LOSS_REASONS:
            return BackendStatus(
                JobState.FAILED,
                reason="Preempted",
                message=f"pod {name} failed with {status.get('reason')}: {status.get('message', '')}",
                details={"preempted": True, "pod": name},
            )
        codes = [
            (cs.get("state") or {}).get("terminated", {}).get("exitCode")
            for cs in _container_states(pod)
            if (cs.get("state") or {}).get("terminated")
        ]
        code = next((c for c in codes if c), None)
        return BackendStatus(
            JobState.FAILED,
            exit_code=code,
            reason="Error",
            message=f"pod {name} failed (exit code {code})",
            details={"pod": name},
        )
    if phase == "Succeeded":
        return BackendStatus(JobState.SUCCEEDED, exit_code=0, details={"pod": name})
    if phase == "Unknown":
        return BackendStatus(
            JobState.FAILED,
            reason="Preempted",
            message=f"the node of pod {name} stopped reporting (phase Unknown)",
            details={"preempted": True, "pod": name},
        )
    scheduled = conditions.get("PodScheduled")
    if phase == "Pending" and scheduled and scheduled.get("status") == "False":
        return BackendStatus(
            JobState.PENDING,
            reason=scheduled.get("reason") or "Unschedulable",
            message=scheduled.get("message", ""),
            details={"pod": name},
        )
    return None


def ran_and_ended(container_status: dict[str, Any]) -> bool:
    """Whether a container ran and has ended: it may start and end between two looks.

    A container the kubelet could not start (``StartError``) ends with the zero time as
    ``startedAt`` (kubelet's ``kuberuntime_container.go``); it never ran.
    """
    started = str(((container_status.get("state") or {}).get("terminated") or {}).get("startedAt") or "")
    return bool(started) and not started.startswith("1970-")


def ran_on(pod: dict[str, Any] | None) -> str:
    """The node whose container ran and ended (``ran_and_ended``)."""
    if pod is None:
        return ""
    if any(ran_and_ended(cs) for cs in _container_states(pod)):
        return pod.get("spec", {}).get("nodeName") or ""
    return ""


def classify(job: dict[str, Any] | None, pods: list[dict[str, Any]]) -> BackendStatus:
    status = _classify(job, pods)
    if status.state.terminal:
        node = ran_on(_newest(pods))
        if node:
            return replace(status, details={**status.details, "ran_on": node})
    return status


def _classify(job: dict[str, Any] | None, pods: list[dict[str, Any]]) -> BackendStatus:
    if job is None:
        return BackendStatus(JobState.NOT_FOUND)
    conditions = _conditions(job)
    if job.get("metadata", {}).get("deletionTimestamp") and not any(
        conditions.get(c, {}).get("status") == "True" for c in ("Complete", "Failed")
    ):
        # Being deleted (a cancel, or someone's kubectl delete): it will not finish on its own.
        return BackendStatus(
            JobState.FAILED,
            reason="Cancelled",
            message=f"the Job is being deleted (since {job['metadata']['deletionTimestamp']})",
        )
    pod = _newest(pods)
    decisive = pod_status(pod) if pod is not None else None
    if conditions.get("Complete", {}).get("status") == "True":
        return BackendStatus(JobState.SUCCEEDED, exit_code=0)
    failed = conditions.get("Failed") or conditions.get("FailureTarget")
    if failed and failed.get("status") == "True":
        if failed.get("reason") == "DeadlineExceeded":
            return BackendStatus(
                JobState.FAILED,
                reason="DeadlineExceeded",
                message=f"the Job exceeded activeDeadlineSeconds ({failed.get('message', '')})",
            )
        if decisive is not None and decisive.state is JobState.FAILED:
            return decisive
        if failed.get("reason") == "PodFailurePolicy" and "condition DisruptionTarget" in str(
            failed.get("message") or ""
        ):
            # the Job's podFailurePolicy (manifest.PREEMPTION_FAILURE_POLICY) kept the verdict of a
            # pod that is gone now: it was disrupted (preempted, its node shut down or drained)
            return BackendStatus(
                JobState.FAILED,
                reason="Preempted",
                message=f"the Job's pod was disrupted ({failed.get('message', '')})",
                details={"preempted": True},
            )
        return BackendStatus(
            JobState.FAILED, reason=failed.get("reason") or "Failed", message=failed.get("message", "")
        )
    if decisive is not None:
        return decisive
    if pod is None:
        return BackendStatus(
            JobState.PENDING, reason="NoPod", message="waiting for the Job's pod to be created"
        )
    where = _placement(pod)
    if pod.get("status", {}).get("phase") == "Running":
        return BackendStatus(JobState.RUNNING, details={"pod": pod["metadata"]["name"], **where})
    if where.get("node"):  # scheduled: the kubelet pulls the image and starts the container
        return BackendStatus(JobState.PENDING, reason="Starting", message=where["waiting"], details=where)
    return BackendStatus(JobState.PENDING, reason=pod.get("status", {}).get("phase") or "Pending")


def _placement(pod: dict[str, Any]) -> dict[str, Any]:
    """Which node a pod is on, its image, and what its container waits for (for progress lines)."""
    statuses = _container_states(pod)
    waiting = next(
        ((cs.get("state") or {}).get("waiting", {}).get("reason") for cs in statuses if cs.get("state")), None
    )
    containers = pod.get("spec", {}).get("containers") or [{}]
    return {
        "pod": pod["metadata"]["name"],
        "node": pod.get("spec", {}).get("nodeName") or "",
        "image": containers[0].get("image", ""),
        "waiting": waiting or "",
    }
