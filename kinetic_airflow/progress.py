"""What a job is doing right now, in words: one task-log line per change, and ``status/progress.json``.

While a task is deferred, Airflow shows only "Deferred"; an unschedulable job would look
like a training one until ``startup_timeout``. The watcher feeds every status it reads to
a ``ProgressTracker``, which turns it into one of a few states a person acts on::

    state             when                                           says
    ----------------  ---------------------------------------------  ------------------------------
    launching         local process being started                    starting the local process
    creating_pod      the Job exists, its pod does not yet           waiting for the Job's pod
    waiting_for_node  no node fits (the autoscaler may be adding one) the nodeSelector and why
    pulling_image     scheduled; the kubelet pulls / starts it       image and node
    starting          multi-host: some hosts run, others start       "2 of 4 hosts running"
    running           the process / every pod runs                   node(s)
    heartbeat_stale   the log is silent and the heartbeat is old     its age and the timeout
    preempted         the node was lost; a new attempt follows       the cause
    finished          the job ended                                  succeeded / failed, why

A line is written only when the state (or its node, image or reason) changes, never per
look. The same changes go to ``status/progress.json`` (one small write per change), which
the Kinetic view reads: it holds public facts only (names, times, node, image).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kinetic_airflow.backends.base import BackendStatus, JobState
from kinetic_airflow.job.ref import JobRef, K8sFields
from kinetic_airflow.job.states import Stage

__all__ = ["PROGRESS_NAME", "Progress", "ProgressTracker", "progress_of"]

log = logging.getLogger(__name__)

PROGRESS_NAME = "progress"  # status/progress.json
_HISTORY = 50  # changes kept in progress.json
_TIMES = ("time", "since", "running_since")  # epoch seconds


def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e11


@dataclass(frozen=True)
class Progress:
    state: Stage
    text: str
    node: str = ""
    outcome: str = ""  # the ending event's status (success, failed, timeout, ...); "" while live

    @property
    def key(self) -> tuple[str, str]:
        return (self.state, self.text)


def _selectors(k8s: K8sFields) -> str:
    text = json.dumps(k8s.node_selectors or {}, sort_keys=True)
    if k8s.chips_per_host:
        text += f" with {k8s.chips_per_host} google.com/tpu chips per host"
    return text


def progress_of(status: BackendStatus, job: JobRef) -> Progress | None:
    """The state a backend status puts a live job in; None for an end (the watcher says it)."""
    details = status.details or {}
    if status.state is JobState.RUNNING:
        if job.backend == "local":
            return Progress(Stage.RUNNING, "running as a local process")
        nodes = details.get("nodes") or ([details["node"]] if details.get("node") else [])
        hosts = int(job.hosts or 1)
        if hosts > 1:
            on = f" on {', '.join(nodes)}" if nodes else ""
            return Progress(Stage.RUNNING, f"running on all {hosts} hosts{on}", ",".join(nodes))
        node = nodes[0] if nodes else ""
        return Progress(Stage.RUNNING, f"running on node {node}" if node else "running", node)
    if status.state is not JobState.PENDING:
        return None
    if status.reason == "Queued":  # queued in team-a (position 2, pending admission: ...)
        return Progress(Stage.QUEUED, status.message)
    if status.reason == "Launching":
        return Progress(Stage.LAUNCHING, "starting the local process")
    if status.reason == "NoPod":
        return Progress(Stage.CREATING_POD, "waiting for the Job's pod to be created")
    if status.reason == "Starting":
        node, image = details.get("node", ""), details.get("image", "")
        if details.get("waiting") == "PodInitializing":
            return Progress(Stage.PULLING_IMAGE, f"initializing on node {node} ({image})", node)
        return Progress(Stage.PULLING_IMAGE, f"pulling {image} and starting on node {node}", node)
    if status.reason == "GroupStarting":
        return Progress(Stage.STARTING, f"starting the slice: {status.message}")
    if status.reason in ("Unschedulable", "SchedulingGated"):
        why = f": {status.message}" if status.message else ""
        wanted = "a node with room for it"
        if job.k8s is not None and job.k8s.node_selectors:
            wanted = f"a node matching {_selectors(job.k8s)}"
        return Progress(Stage.WAITING_FOR_NODE, f"waiting for {wanted} (scale-up){why}")
    why = f": {status.message}" if status.message else ""
    return Progress(Stage.PENDING, f"pending ({status.reason or 'Pending'}{why})")


class ProgressTracker:
    """Remembers the last state told; says and records only changes.

    ``write`` stores ``status/progress.json``; a failed write is logged, never raised: a
    job must not fail because its progress could not be recorded.
    """

    def __init__(
        self,
        job: JobRef,
        emit: Callable[[str], None],
        write: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.job = job
        self.emit = emit
        self.write = write
        self.record: dict[str, Any] = {"history": []}

    def resume(self, record: dict[str, Any]) -> None:
        """Go on from an earlier watcher's record (worker, then triggerer): its last state is
        not said again. Fields a watcher does not write so (a time that is no number, a history
        that is no list of changes: job storage is writable by others) are dropped, not carried on."""
        kept = {k: v for k, v in record.items() if k not in _TIMES or _is_time(v)}
        history = record.get("history")
        changes = [h for h in history if isinstance(h, dict)] if isinstance(history, list) else []
        self.record = {**kept, "history": changes[-_HISTORY:]}

    async def observe(self, status: BackendStatus) -> None:
        progress = progress_of(status, self.job)
        node = (status.details or {}).get("ran_on")
        if progress is None and node and not self.record.get("running_since"):
            # it started and ended between two looks: where it ran is still worth saying
            progress = Progress(Stage.RUNNING, f"running on node {node}", node)
        if progress is not None:
            await self.tell(progress)

    async def tell(self, progress: Progress) -> None:
        if progress.key == (self.record.get("state"), self.record.get("text")):
            return
        self.emit(f"[kinetic] {progress.text}")
        now = time.time()
        if progress.state != self.record.get("state"):
            self.record["since"] = now
        if progress.state == Stage.RUNNING and not self.record.get("running_since"):
            self.record["running_since"] = now
        self.record.update(
            {
                "job_id": self.job.job_id,
                "state": progress.state,
                "text": progress.text,
                "node": progress.node or self.record.get("node", ""),
                "outcome": progress.outcome,
                "time": now,
            }
        )
        history = self.record["history"]
        history.append({"state": progress.state, "text": progress.text, "time": now})
        del history[:-_HISTORY]
        if self.write is not None:
            try:
                await self.write(json.dumps(self.record, sort_keys=True))
            except Exception as exc:
                log.warning("could not record the progress of job %s: %s", self.job.job_id, exc)
