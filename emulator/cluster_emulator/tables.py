"""Server-side printing (``meta.k8s.io/v1 Table``) so ``kubectl get`` shows the usual columns.

kubectl asks for ``application/json;as=Table;v=v1;g=meta.k8s.io``; the columns
mirror kubectl's own printers for the resources the emulator serves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._util import human_duration, parse_time, utcnow
from .resources import EVENTS, JOBS, JOBSETS, LWS, NAMESPACES, NODES, PODS, WORKLOADS, ResourceType


def _col(
    name: str, ctype: str = "string", fmt: str = "", priority: int = 0, desc: str = ""
) -> dict[str, Any]:
    return {"name": name, "type": ctype, "format": fmt, "description": desc or name, "priority": priority}


def _age(obj: dict[str, Any]) -> str:
    created = obj["metadata"].get("creationTimestamp")
    if not created:
        return "<unknown>"
    return human_duration((utcnow() - parse_time(created)).total_seconds())


def pod_status_reason(pod: dict[str, Any]) -> str:
    """kubectl's STATUS column for a pod (Running, ContainerCreating, ErrImagePull, Completed, ...)."""
    status = pod.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Unknown"
    initializing = False
    init_statuses = status.get("initContainerStatuses") or []
    init_total = len((pod.get("spec") or {}).get("initContainers") or [])
    for i, cs in enumerate(init_statuses):
        state = cs.get("state") or {}
        term = state.get("terminated")
        waiting = state.get("waiting")
        if term and term.get("exitCode") == 0:
            continue
        if term:
            reason = f"Init:{term.get('reason') or 'ExitCode:' + str(term.get('exitCode'))}"
        elif waiting and waiting.get("reason") and waiting["reason"] != "PodInitializing":
            reason = f"Init:{waiting['reason']}"
        else:
            reason = f"Init:{i}/{init_total}"
        initializing = True
        break
    if not initializing:
        has_running = False
        for cs in reversed(status.get("containerStatuses") or []):
            state = cs.get("state") or {}
            if state.get("waiting", {}).get("reason"):
                reason = state["waiting"]["reason"]
            elif state.get("terminated"):
                term = state["terminated"]
                reason = term.get("reason") or f"ExitCode:{term.get('exitCode')}"
            elif state.get("running") and cs.get("ready"):
                has_running = True
        if reason == "Completed" and has_running:
            reason = "Running"
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    return reason


def _pod_row(pod: dict[str, Any]) -> list[Any]:
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or [])
    ready = sum(1 for cs in statuses if cs.get("ready"))
    restarts = sum(int(cs.get("restartCount") or 0) for cs in statuses)
    return [
        pod["metadata"]["name"],
        f"{ready}/{total}",
        pod_status_reason(pod),
        str(restarts),
        _age(pod),
        status.get("podIP") or "<none>",
        (pod.get("spec") or {}).get("nodeName") or "<none>",
        "<none>",
        "<none>",
    ]


def _job_status(job: dict[str, Any]) -> str:
    conditions = (job.get("status") or {}).get("conditions") or []
    true = {c.get("type") for c in conditions if c.get("status") == "True"}
    for ctype in ("Failed", "Complete", "FailureTarget", "SuccessCriteriaMet", "Suspended"):
        if ctype in true:
            return ctype
    return "Running"


def _job_row(job: dict[str, Any]) -> list[Any]:
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    completions = spec.get("completions")
    succeeded = status.get("succeeded", 0)
    shown = (
        f"{succeeded}/{completions}"
        if completions is not None
        else f"{succeeded}/1 of {spec.get('parallelism', 1)}"
    )
    duration = ""
    if status.get("startTime"):
        end = parse_time(status["completionTime"]) if status.get("completionTime") else utcnow()
        duration = human_duration((end - parse_time(status["startTime"])).total_seconds())
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    return [
        job["metadata"]["name"],
        _job_status(job),
        shown,
        duration,
        _age(job),
        ",".join(c.get("name", "") for c in containers),
        ",".join(c.get("image", "") for c in containers),
        ",".join(f"{k}={v}" for k, v in ((spec.get("selector") or {}).get("matchLabels") or {}).items()),
    ]


def _lws_row(lws: dict[str, Any]) -> list[Any]:
    status = lws.get("status") or {}
    return [
        lws["metadata"]["name"],
        status.get("readyReplicas", 0),
        (lws.get("spec") or {}).get("replicas", 1),
        status.get("updatedReplicas", 0),
        _age(lws),
    ]


def _jobset_row(jobset: dict[str, Any]) -> list[Any]:
    """The CRD's additionalPrinterColumns (TerminalState, Restarts, Completed, Suspended, Age). An
    unset path is a null cell, as apiextensions' table convertor (``tableconvertor.go``) leaves
    it; kubectl prints it blank."""
    status = jobset.get("status") or {}
    completed = next(
        (c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Completed"), None
    )
    suspend = (jobset.get("spec") or {}).get("suspend")
    return [
        jobset["metadata"]["name"],
        status.get("terminalState"),
        str(status["restarts"]) if "restarts" in status else None,
        completed,
        None if suspend is None else str(suspend).lower(),
        _age(jobset),
    ]


def _node_row(node: dict[str, Any]) -> list[Any]:
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )
    info = (node.get("status") or {}).get("nodeInfo") or {}
    return [
        node["metadata"]["name"],
        "Ready" if ready else "NotReady",
        "<none>",
        _age(node),
        info.get("kubeletVersion", ""),
    ]


def _event_row(event: dict[str, Any]) -> list[Any]:
    last = event.get("lastTimestamp") or event["metadata"].get("creationTimestamp")
    seen = human_duration((utcnow() - parse_time(last)).total_seconds()) if last else "<unknown>"
    involved = event.get("involvedObject") or {}
    return [
        seen,
        event.get("type", ""),
        event.get("reason", ""),
        f"{(involved.get('kind') or '').lower()}/{involved.get('name', '')}",
        event.get("message", ""),
    ]


def _workload_row(wl: dict[str, Any]) -> list[Any]:
    conds = {c.get("type"): c.get("status", "") for c in (wl.get("status") or {}).get("conditions") or []}
    return [
        wl["metadata"]["name"],
        (wl.get("spec") or {}).get("queueName", ""),
        ((wl.get("status") or {}).get("admission") or {}).get("clusterQueue", ""),
        conds.get("Admitted", ""),
        conds.get("Finished", ""),
        _age(wl),
    ]


_TABLES: dict[ResourceType, tuple[list[dict[str, Any]], Callable[[dict[str, Any]], list[Any]]]] = {
    PODS: (
        [
            _col("Name", fmt="name"),
            _col("Ready"),
            _col("Status"),
            _col("Restarts", "string"),
            _col("Age"),
            _col("IP", priority=1),
            _col("Node", priority=1),
            _col("Nominated Node", priority=1),
            _col("Readiness Gates", priority=1),
        ],
        _pod_row,
    ),
    JOBS: (
        [
            _col("Name", fmt="name"),
            _col("Status"),
            _col("Completions"),
            _col("Duration"),
            _col("Age"),
            _col("Containers", priority=1),
            _col("Images", priority=1),
            _col("Selector", priority=1),
        ],
        _job_row,
    ),
    LWS: (
        [
            _col("Name", fmt="name"),
            _col("Ready", "integer"),
            _col("Desired", "integer"),
            _col("Up-to-date", "integer"),
            _col("Age", "date"),
        ],
        _lws_row,
    ),
    JOBSETS: (
        [
            _col("Name", fmt="name"),
            _col("TerminalState"),
            _col("Restarts"),
            _col("Completed"),
            _col("Suspended"),
            _col("Age", "date"),
        ],
        _jobset_row,
    ),
    NODES: (
        [_col("Name", fmt="name"), _col("Status"), _col("Roles"), _col("Age"), _col("Version")],
        _node_row,
    ),
    NAMESPACES: (
        [_col("Name", fmt="name"), _col("Status"), _col("Age")],
        lambda ns: [ns["metadata"]["name"], (ns.get("status") or {}).get("phase", ""), _age(ns)],
    ),
    EVENTS: ([_col("Last Seen"), _col("Type"), _col("Reason"), _col("Object"), _col("Message")], _event_row),
    # the v1beta1 CRD's additionalPrinterColumns (kueue.x-k8s.io_workloads.yaml)
    WORKLOADS: (
        [
            _col("Name", fmt="name"),
            _col("Queue"),
            _col("Reserved in"),
            _col("Admitted"),
            _col("Finished"),
            _col("Age", "date"),
        ],
        _workload_row,
    ),
}


def wants_table(accept: str) -> bool:
    """Whether the Accept header asks for a server-side Table."""
    return "as=Table" in accept


def to_table(
    rt: ResourceType, items: list[dict[str, Any]], list_meta: dict[str, Any], include_object: str = "Metadata"
) -> dict[str, Any]:
    """Render objects as a ``meta.k8s.io/v1`` Table."""
    columns, row = _TABLES.get(
        rt, ([_col("Name", fmt="name"), _col("Age")], lambda o: [o["metadata"]["name"], _age(o)])
    )
    rows = []
    for obj in items:
        entry: dict[str, Any] = {"cells": row(obj)}
        if include_object == "Object":
            entry["object"] = obj
        elif include_object != "None":
            entry["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        rows.append(entry)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": columns,
        "rows": rows,
    }
