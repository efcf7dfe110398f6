"""Manifest builders and polling helpers shared by the emulator tests."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from cluster_emulator import wait_until
from kubernetes import client
from kubernetes.client.rest import ApiException

PY = sys.executable
NS = "default"


def container(code: str, name: str = "main", image: str = "python:3.11-slim", **extra: Any) -> dict[str, Any]:
    """A container running ``python -c code``."""
    return {"name": name, "image": image, "command": [PY, "-c", code], **extra}


def pod_manifest(
    name: str, code: str = "pass", labels: dict[str, str] | None = None, restart: str = "Never", **spec: Any
) -> dict[str, Any]:
    """A bare Pod running ``python -c code``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"restartPolicy": restart, "containers": [container(code)], **spec},
    }


def job_manifest(
    name: str,
    code: str,
    *,
    backoff_limit: int = 0,
    restart: str = "Never",
    pod_spec: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A batch/v1 Job whose single container runs ``python -c code``."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"app": "emulator-test"}},
        "spec": {
            "backoffLimit": backoff_limit,
            "template": {
                "spec": {"restartPolicy": restart, "containers": [container(code)], **(pod_spec or {})}
            },
            **spec,
        },
    }


def condition(obj: Any, ctype: str) -> Any:
    """The condition of a typed client object (job or pod), or None."""
    for cond in (obj.status.conditions or []) if obj.status else []:
        if cond.type == ctype:
            return cond
    return None


def wait_job(batch: client.BatchV1Api, name: str, ctype: str, timeout: float = 30) -> client.V1Job:
    """Wait until the Job has condition ``ctype`` True."""

    def check() -> client.V1Job | None:
        job = batch.read_namespaced_job_status(name, NS)
        cond = condition(job, ctype)
        return job if cond is not None and cond.status == "True" else None

    return wait_until(check, timeout, message=f"job {name} condition {ctype}")


def wait_pod(core: client.CoreV1Api, name: str, phase: str, timeout: float = 30) -> client.V1Pod:
    """Wait until the pod is in ``phase``."""

    def check() -> client.V1Pod | None:
        pod = core.read_namespaced_pod(name, NS)
        return pod if pod.status.phase == phase else None

    return wait_until(check, timeout, message=f"pod {name} phase {phase}")


def job_pods(core: client.CoreV1Api, job: str) -> list[client.V1Pod]:
    """Pods of a Job, by the ``job-name`` label."""
    return core.list_namespaced_pod(NS, label_selector=f"job-name={job}").items


def read_log(core: client.CoreV1Api, pod: str, **kwargs: Any) -> str:
    """Pod log as text (``_preload_content=False`` avoids the client's ``b'...'`` quirk)."""
    resp = core.read_namespaced_pod_log(pod, NS, _preload_content=False, **kwargs)
    return resp.data.decode()


def api_error(exc: ApiException) -> dict[str, Any]:
    """The Status body of an ApiException."""
    return json.loads(exc.body)


def pid_alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1].split(" ", 1)[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
