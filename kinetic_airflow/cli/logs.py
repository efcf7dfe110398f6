"""``kinetic-airflow jobs logs JOB [--follow] [--raw]``: a job's log, wherever its backend keeps it.

A job's output is written by code the reader did not write: terminal control sequences in it
(setting the window title, clearing the screen, moving the cursor to overwrite lines) would act
on the reader's terminal. They are shown escaped (``\x1b[2J``), tabs and line ends kept;
``--raw`` prints the bytes as the job wrote them (colours, progress bars).

local     the supervisor's ``job.log`` (the job's local state directory, or its copy in storage)
gke       the Job's newest pod (``kinetic-worker`` container), through the Kubernetes API
pathways  every host's pod, each line prefixed ``[hN]``; a host whose runner ended and was
          restarted in place shows its run's (``previous``) log
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from kinetic_airflow.backends.gke.client import ApiError, KubeApi, kube_api
from kinetic_airflow.backends.gke.manifest import CONTAINER_NAME
from kinetic_airflow.backends.local import process_alive
from kinetic_airflow.backends.registry import get_backend
from kinetic_airflow.job.layout import EXIT_NAME, LAUNCH_NAME, LOG_NAME
from kinetic_airflow.job.ref import JobRef
from kinetic_airflow.job.storage import Storage
from kinetic_airflow.jobstore import JobInfo

__all__ = ["escape_controls", "print_logs"]

_POLL_SECONDS = 0.5
# C0 controls but tab and newline, DEL, and the C1 controls (U+0080-U+009F, e.g. the one-character CSI).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_raw = False  # set once per command by print_logs


def escape_controls(text: str) -> str:
    """``text`` with every terminal control character written out (``\x1b``), tabs and newlines kept."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _out(text: str) -> None:
    sys.stdout.write(text if _raw else escape_controls(text))
    sys.stdout.flush()


def print_logs(info: JobInfo, storage: Storage, *, follow: bool, raw: bool = False) -> int:
    global _raw
    _raw = raw
    ref = info.ref
    if info.backend in ("gke", "pathways", "multislice") and ref is not None:
        return _cluster_logs(info, ref, follow=follow)
    if ref is not None and ref.local_dir and Path(ref.local_dir, LOG_NAME).exists():
        return _local_logs(Path(ref.local_dir), follow=follow)
    text = storage.read_text_or_none(f"{info.job_uri}/job.log", limit=None)  # asked for: whole
    if text is None:
        print(
            f"kinetic-airflow: job {info.job_id} has no log in {info.job_uri}/job.log"
            + (" (it has not started yet)" if info.state == "pending" else ""),
            file=sys.stderr,
        )
        return 1
    _out(text)
    return 0


def _local_logs(state: Path, *, follow: bool) -> int:
    path = state / LOG_NAME
    offset = 0
    while True:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
        offset += len(data)
        _out(data.decode("utf-8", "replace"))
        if not follow:
            return 0
        ended = (state / EXIT_NAME).exists()
        if not ended:
            try:
                pid = int(json.loads((state / LAUNCH_NAME).read_text())["pid"])
                ended = not process_alive(pid)
            except (OSError, ValueError, KeyError):
                ended = True
        if ended:
            with open(path, "rb") as fh:  # what it wrote while we looked
                fh.seek(offset)
                _out(fh.read().decode("utf-8", "replace"))
            return 0
        time.sleep(_POLL_SECONDS)


def _pods(api: Any, namespace: str, name: str, selector: str | None = None) -> list[dict[str, Any]]:
    selector = selector or f"job-name={name}"
    found = api.request("GET", KubeApi.pods_path(namespace), query={"labelSelector": selector})
    return sorted(found.get("items", []), key=lambda p: p["metadata"].get("creationTimestamp") or "")


def _read(api: Any, namespace: str, pod: str, *, previous: bool = False) -> str | None:
    """The container's log, or None while it has not started (400) or the pod is gone (404)."""
    query = {"container": CONTAINER_NAME, "previous": "true" if previous else None}
    try:
        response = api.request("GET", KubeApi.pods_path(namespace, pod) + "/log", query=query, stream=True)
    except ApiError as exc:
        if exc.status in (400, 404):
            return None
        raise
    return response.data.decode("utf-8", "replace")


def _restarted(pod: dict[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any(int(cs.get("restartCount") or 0) > 0 for cs in statuses)


def _ended(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _cluster_logs(info: JobInfo, ref: JobRef, *, follow: bool) -> int:
    backend = get_backend(ref.backend)
    name = backend.object_name(ref)
    k8s = ref.on_cluster()
    namespace = k8s.namespace or "default"
    api = kube_api(k8s.cluster)
    multi = ref.backend in ("pathways", "multislice")
    shown: dict[str, int] = {}  # pod -> lines printed
    waited_for_pod = False
    while True:
        pods = _pods(api, namespace, name, backend.pod_selector(ref))
        if not multi:
            pods = pods[-1:]  # the newest pod is the attempt's current run
        if not pods and not follow:
            print(
                f"kinetic-airflow: job {info.job_id} has no pod (state {info.state}): it has not been "
                f"scheduled yet, or its pods are gone. Its whole log: {backend.full_log_hint(ref)}",
                file=sys.stderr,
            )
            return 1
        if not pods and backend.status(ref).state.value in ("not_found", "failed", "succeeded"):
            if not waited_for_pod:  # it ended (or was deleted) before a pod could be read
                print(
                    f"kinetic-airflow: job {info.job_id} has ended and has no pod any more. Its whole log: "
                    f"{backend.full_log_hint(ref)}",
                    file=sys.stderr,
                )
            return 0
        all_done = bool(pods)
        for pod in pods:
            pod_name = pod["metadata"]["name"]
            previous = multi and _restarted(pod)  # the host's run is its container's previous log
            text = _read(api, namespace, pod_name, previous=previous)
            if text is None:
                all_done = False
                continue
            lines = text.splitlines()
            start = shown.get(pod_name, 0)
            prefix = f"{backend.log_prefix(ref, backend.host_of(ref, pod))} " if multi else ""
            for line in lines[start:]:
                _out(f"{prefix}{line}\n")
            shown[pod_name] = len(lines)
            if not (_ended(pod) or previous):
                all_done = False
        if not follow:
            return 0
        waited_for_pod = waited_for_pod or bool(pods)
        if all_done:
            return 0
        if not multi and pods and pods[0]["metadata"]["name"] in shown:
            # One running container: follow its stream instead of re-reading the log.
            pod_name = pods[0]["metadata"]["name"]
            _stream(api, namespace, pod_name, skip=shown[pod_name])
            return 0
        time.sleep(_POLL_SECONDS)


def _stream(api: Any, namespace: str, pod: str, *, skip: int) -> None:
    """Print a running container's log as it is written, from line ``skip`` on, until it ends."""
    response = api.request(
        "GET",
        KubeApi.pods_path(namespace, pod) + "/log",
        query={"container": CONTAINER_NAME, "follow": "true"},
        stream=True,
        timeout=(10, None),
    )
    seen, buffer = 0, b""
    for chunk in response.stream(4096):
        *complete, buffer = (buffer + chunk).split(b"\n")
        for raw in complete:
            seen += 1
            if seen > skip:
                _out(raw.decode("utf-8", "replace") + "\n")
    if buffer and seen + 1 > skip:
        _out(buffer.decode("utf-8", "replace") + "\n")
