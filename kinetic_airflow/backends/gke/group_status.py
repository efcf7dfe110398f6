"""A LeaderWorkerSet group (as API dicts) -> one BackendStatus that names the host it is about.

Status comes from every pod, not only the leader's: a worker can fail while the leader
waits in a collective. LWS pods restart in place (``restartPolicy: Always``), so a host
whose runner ended shows it in ``lastState.terminated`` while its restarted runner waits.
The most specific explanation wins, in this order: the group being deleted, a lost or
preempted host, OOM on any host, an image that cannot be pulled, a host that failed, all
hosts done, a host that cannot be scheduled, all running.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kinetic_airflow.backends.base import BackendStatus, JobState
from kinetic_airflow.backends.gke.classify import IMAGE_PULL_REASONS, pod_status
from kinetic_airflow.backends.gke.lws_manifest import WORKER_INDEX_LABEL
from kinetic_airflow.job.envelope import RERUN_REFUSED_EXIT

__all__ = ["HostMemory", "classify_group", "host_index"]


def host_index(pod: dict[str, Any]) -> int:
    try:
        return int((pod["metadata"].get("labels") or {}).get(WORKER_INDEX_LABEL, "-1"))
    except ValueError:
        return -1


def _ended(pod: dict[str, Any]) -> tuple[bool, int | None, str]:
    """(ended, exit code, reason) of the runner's first run in this pod."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        for where in ("lastState", "state"):
            terminated = (cs.get(where) or {}).get("terminated")
            if terminated:
                return True, terminated.get("exitCode"), terminated.get("reason") or ""
    return False, None, ""


class HostMemory:
    """Which pod each host had: a host whose pod went away or was replaced was lost.

    The LWS controller recreates a deleted pod under the same name, so only its uid tells
    a replacement from the original. Kept per watcher; a watcher started after the
    replacement learns it from the replacement's runner, which ends with
    ``RERUN_REFUSED_EXIT`` (``classify_group``).
    """

    def __init__(self) -> None:
        self.uids: dict[int, str] = {}

    def lost_host(self, pods: dict[int, dict[str, Any]]) -> tuple[int, str] | None:
        lost = None
        for host, uid in sorted(self.uids.items()):
            pod = pods.get(host)
            if pod is None:
                lost = lost or (host, "its pod was deleted")
            elif pod["metadata"].get("uid") != uid:
                lost = lost or (host, "its pod was deleted and recreated")
        for host, pod in pods.items():
            self.uids.setdefault(host, pod["metadata"].get("uid") or "")
        return lost


def classify_group(
    group: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    hosts: int,
    memory: HostMemory,
    *,
    index_of: Callable[[dict[str, Any]], int] = host_index,
    name_host: Callable[[int], str] = "host {}".format,
    kind: str = "LeaderWorkerSet",
) -> BackendStatus:
    """``index_of`` / ``name_host``: a pod's host index and its name in messages (a multislice
    JobSet counts hosts across slices and names the slice too); ``kind``: what ``group`` is."""
    if group is None:
        return BackendStatus(JobState.NOT_FOUND)
    meta = group.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return BackendStatus(
            JobState.FAILED,
            reason="Cancelled",
            message=f"the {kind} is being deleted (since {meta['deletionTimestamp']})",
        )
    by_host = {index_of(p): p for p in pods if index_of(p) >= 0}
    decisive = {host: pod_status(pod) for host, pod in sorted(by_host.items())}
    for host, status in decisive.items():
        if status is not None and status.reason == "Preempted":
            return _about(status, host, name_host)
    ended = {host: _ended(pod) for host, pod in by_host.items()}
    # A replacement pod's runner refuses to run its host's function twice (RERUN_REFUSED_EXIT):
    # the host was lost, whether or not this watcher saw the pod it replaced.
    refused = [host for host, (done, code, _) in sorted(ended.items()) if done and code == RERUN_REFUSED_EXIT]
    lost = memory.lost_host(by_host)
    if lost is None and refused:
        lost = (refused[0], "its pod was deleted and recreated, and the new pod found the attempt run there")
    if lost is not None:
        return BackendStatus(
            JobState.FAILED,
            reason="Preempted",
            message=f"{name_host(lost[0])} was lost: {lost[1]} (preemption, maintenance or node loss)",
            details={"preempted": True, "host": lost[0]},
        )
    for host, (done, code, reason) in sorted(ended.items()):
        if done and reason == "OOMKilled":
            return BackendStatus(
                JobState.FAILED,
                exit_code=code,
                reason="OOMKilled",
                message=f"{name_host(host)} (pod {by_host[host]['metadata']['name']}) was OOMKilled",
                details={"host": host, "pod": by_host[host]["metadata"]["name"], "failed_hosts": [host]},
            )
    for host, status in decisive.items():
        if status is not None and status.reason == "ImagePullFailed":
            return _about(status, host, name_host)
    failed = sorted(host for host, (done, code, _) in ended.items() if done and code != 0)
    if failed:
        codes = {host: ended[host][1] for host in failed}
        return BackendStatus(
            JobState.FAILED,
            exit_code=codes[failed[0]],
            reason="Error",
            message=f"{name_host(failed[0])} failed (exit code {codes[failed[0]]})"
            + (f"; also failed: hosts {', '.join(map(str, failed[1:]))}" if failed[1:] else ""),
            details={"host": failed[0], "failed_hosts": failed, "exit_codes": codes},
        )
    done = sorted(host for host, (ok, _, _) in ended.items() if ok)
    if len(done) == hosts:
        return BackendStatus(JobState.SUCCEEDED, exit_code=0, details={"ended_hosts": done})
    for host, status in decisive.items():
        if status is not None and status.state is JobState.PENDING:
            return _about(status, host, name_host)
    waiting = [
        cs
        for pod in by_host.values()
        for cs in (pod.get("status") or {}).get("containerStatuses") or []
        if ((cs.get("state") or {}).get("waiting") or {}).get("reason") in IMAGE_PULL_REASONS
    ]
    running = [h for h, p in by_host.items() if (p.get("status") or {}).get("phase") == "Running"]
    nodes = sorted({(p.get("spec") or {}).get("nodeName") or "" for p in by_host.values()} - {""})
    if len(by_host) == hosts and len(running) == hosts and not waiting:
        return BackendStatus(JobState.RUNNING, details={"ended_hosts": done, "hosts": hosts, "nodes": nodes})
    return BackendStatus(
        JobState.PENDING,
        reason="GroupStarting",
        message=f"{len(running)} of {hosts} hosts running",
        details={"ended_hosts": done, "nodes": nodes},
    )


def _about(status: BackendStatus, host: int, name_host: Callable[[int], str]) -> BackendStatus:
    details = {**status.details, "host": host}
    return BackendStatus(
        status.state, status.exit_code, status.reason, f"{name_host(host)}: {status.message}", details
    )
