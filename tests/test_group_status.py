"""A multi-host group's status from its pods' API dicts: a host whose replacement pod refused
to run the attempt again is a lost host, also for a watcher that never saw the pod it replaced."""

from __future__ import annotations

from typing import Any

from kinetic_airflow.backends.base import JobState
from kinetic_airflow.backends.gke.group_status import HostMemory, classify_group
from kinetic_airflow.backends.gke.lws_manifest import WORKER_INDEX_LABEL
from kinetic_airflow.job.envelope import RERUN_REFUSED_EXIT


def _pod(host: int, *, last_exit: int | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"state": {"running": {"startedAt": "2026-12-06T06:33:46Z"}}}
    if last_exit is not None:
        status = {
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": last_exit, "reason": "Error"}},
            "restartCount": 1,
        }
    return {
        "metadata": {"name": f"g-0-{host}", "uid": f"uid-{host}", "labels": {WORKER_INDEX_LABEL: str(host)}},
        "spec": {"nodeName": "node-a"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "kinetic-worker", "ready": last_exit is None, **status}],
        },
    }


GROUP = {"metadata": {"name": "g", "uid": "lws-uid"}}


def test_a_replacement_that_refused_to_rerun_is_a_lost_host_for_a_new_watcher() -> None:
    pods = [_pod(0), _pod(1, last_exit=RERUN_REFUSED_EXIT), _pod(2), _pod(3)]
    status = classify_group(GROUP, pods, 4, HostMemory())  # a trigger that never saw host 1's first pod
    assert status.state is JobState.FAILED and status.reason == "Preempted", status
    assert status.details == {"preempted": True, "host": 1}
    assert "host 1 was lost" in (status.message or "")


def test_a_host_whose_runner_failed_is_still_a_failure_not_a_loss() -> None:
    pods = [_pod(0), _pod(1, last_exit=1), _pod(2), _pod(3)]
    status = classify_group(GROUP, pods, 4, HostMemory())
    assert status.state is JobState.FAILED and status.reason == "Error", status
    assert status.details["failed_hosts"] == [1]


def test_all_hosts_running_is_running() -> None:
    status = classify_group(GROUP, [_pod(h) for h in range(4)], 4, HostMemory())
    assert status.state is JobState.RUNNING, status
