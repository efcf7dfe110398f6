"""The emulator's scheduler + kubelet: binds pods to nodes and runs containers as processes.

Each container's ``command`` + ``args`` run as a local subprocess (the image is
ignored) in its own session (``start_new_session=True``) so the whole process
group can be signalled. Exits are observed with a pidfd registered on the
event loop (no watcher threads); stdout and stderr are read through pipes and
stored CRI-style (one timestamped record per line) so ``/log`` can honour
``timestamps``, ``sinceTime``, ``tailLines`` and ``follow``.

Termination follows the kubelet: SIGTERM to the container's process group,
SIGKILL after the grace period. Grace periods coming from the API
(``terminationGracePeriodSeconds``, ``gracePeriodSeconds``) are capped at the
emulator's ``max_grace_seconds`` (5 s by default) to keep tests fast.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as _dt
import hashlib
import logging
import math
import os
import re
import signal
import subprocess
import time
from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import dns
from ._util import fmt_nano, fmt_time, parse_time, utcnow, wait_event
from .nodes import find_node, scale_up_message, stocked_out_pool
from .resources import CONFIGMAPS, PODS, SECRETS, SERVICES

if TYPE_CHECKING:
    from .cluster import Cluster

log = logging.getLogger(__name__)

PREEMPTION_MESSAGE = "Pod was terminated in response to imminent node shutdown."
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"


class ConfigError(Exception):
    """A referenced ConfigMap/Secret/field is missing: ``CreateContainerConfigError``."""


class StartError(Exception):
    """The process could not be started: terminated with exit code 128, reason ``StartError``."""


# --------------------------------------------------------------------------- logs
@dataclass
class LogRecord:
    """One line (or partial line) of container output."""

    ts: str
    time: _dt.datetime
    stream: str
    complete: bool
    payload: bytes

    def render(self, timestamps: bool) -> bytes:
        """The bytes ``/log`` returns for this record."""
        data = self.payload + (b"\n" if self.complete else b"")
        return (self.ts.encode() + b" " + data) if timestamps else data


class LogFile:
    """Container log stored as ``<ts> <stream> <F|P> <payload>`` lines, with change notification."""

    MAX_PARTIAL = 16 * 1024

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "ab")
        self._partial: dict[str, bytes] = {"stdout": b"", "stderr": b""}
        self._open_streams = {"stdout", "stderr"}
        self.changed = asyncio.Event()
        self.done = False
        # Where the current log file starts: the kubelet rotates a container's log
        # (kubernetes pkg/kubelet/logs/container_log_manager.go, rotateLog) and serves a new
        # request only the file the runtime writes now (pkg/kubelet/kuberuntime/logs/logs.go,
        # ReadLogs opens the status' logPath); a reader already following keeps its place.
        self.current_start = 0

    def rotate(self) -> None:
        """Rotate: what was written so far is in an older file, never served to a new request."""
        with contextlib.suppress(OSError):
            self.current_start = self.path.stat().st_size

    def _write(self, stream: str, payload: bytes, complete: bool, now: _dt.datetime) -> None:
        tag = b"F" if complete else b"P"
        self._fh.write(fmt_nano(now).encode() + b" " + stream.encode() + b" " + tag + b" " + payload + b"\n")

    def append(self, stream: str, data: bytes) -> None:
        """Add raw output from one stream; complete lines become records immediately."""
        now = utcnow()
        buf = self._partial[stream] + data
        while True:
            idx = buf.find(b"\n")
            if idx < 0:
                break
            self._write(stream, buf[:idx], True, now)
            buf = buf[idx + 1 :]
        while len(buf) > self.MAX_PARTIAL:
            self._write(stream, buf[: self.MAX_PARTIAL], False, now)
            buf = buf[self.MAX_PARTIAL :]
        self._partial[stream] = buf
        self._fh.flush()
        self._notify()

    def close_stream(self, stream: str) -> None:
        """EOF on one stream; flushes its unterminated last line."""
        if stream not in self._open_streams:
            return
        self._open_streams.discard(stream)
        if self._partial[stream]:
            self._write(stream, self._partial[stream], False, utcnow())
            self._partial[stream] = b""
        if not self._open_streams:
            self.done = True
            with contextlib.suppress(OSError, ValueError):
                self._fh.flush()
                self._fh.close()
        else:
            self._fh.flush()
        self._notify()

    def close(self) -> None:
        """Force EOF on both streams."""
        for stream in list(self._open_streams):
            self.close_stream(stream)

    async def wait_done(self, timeout: float) -> None:
        """Wait (bounded) until both streams hit EOF, so logs are complete when status says terminated."""
        deadline = time.monotonic() + timeout
        while not self.done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            await wait_event(self.changed, remaining)

    def _notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def read(self, offset: int = 0) -> tuple[list[LogRecord], int]:
        """Complete records from byte ``offset``; returns them and the next offset."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except FileNotFoundError:
            return [], offset
        end = data.rfind(b"\n")
        if end < 0:
            return [], offset
        records = []
        for line in data[: end + 1].splitlines():
            parts = line.split(b" ", 3)
            if len(parts) < 4:
                parts += [b""] * (4 - len(parts))
            ts = parts[0].decode()
            try:
                when = parse_time(ts)
            except ValueError:
                when = utcnow()
            records.append(LogRecord(ts, when, parts[1].decode(), parts[2] == b"F", parts[3]))
        return records, offset + end + 1


# ------------------------------------------------------------------ container runs
@dataclass
class ContainerRun:
    """One start of a container's process."""

    name: str
    restart: int
    popen: subprocess.Popen[bytes]
    log: LogFile
    started_at: _dt.datetime
    container_id: str
    exited: asyncio.Future[int]
    fds: dict[int, str] = field(default_factory=dict)
    oom: bool = False
    finished_at: _dt.datetime | None = None

    @property
    def pid(self) -> int:
        """Process id (also the process group id)."""
        return self.popen.pid


@dataclass
class ContainerState:
    """The kubelet's view of one container, rendered into ``containerStatuses``."""

    name: str
    image: str
    state: dict[str, Any]
    last_state: dict[str, Any] = field(default_factory=dict)
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    ever_started: bool = False
    container_id: str | None = None
    image_id: str = ""
    logs: list[LogFile] = field(default_factory=list)
    last_log: LogFile | None = None  # the run in ``last_state`` (``/log?previous=true``)
    current: ContainerRun | None = None
    finished: bool = False
    exit_code: int | None = None

    def to_status(self) -> dict[str, Any]:
        """As in ``Pod.status.containerStatuses[]``."""
        out: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": self.image_id,
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": self.started,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.container_id:
            out["containerID"] = self.container_id
        return out


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][-._A-Za-z0-9]*)\)")


def expand_vars_spans(text: str, env: Mapping[str, str]) -> tuple[str, list[tuple[int, int]]]:
    """:func:`expand_vars`, plus the spans of the result that came from variables."""
    out: list[str] = []
    spans: list[tuple[int, int]] = []
    length = pos = 0
    for match in _VAR_REF.finditer(text):
        out.append(text[pos : match.start()])
        length += match.start() - pos
        pos = match.end()
        name = match.group(1)
        if match.group(0) == "$$":
            piece = "$"
        elif name in env:
            piece = env[name]
            spans.append((length, length + len(piece)))
        else:
            piece = match.group(0)
        out.append(piece)
        length += len(piece)
    out.append(text[pos:])
    return "".join(out), spans


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion (``$$`` escapes; unknown references stay as they are)."""
    return expand_vars_spans(text, env)[0]


_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def parse_quantity(text: str | int | float) -> float:
    """Parse a Kubernetes resource quantity (``500m``, ``2Gi``)."""
    match = _QUANTITY.match(str(text).strip())
    if not match or match.group(2) not in _SUFFIX:
        raise ValueError(f"invalid quantity {text!r}")
    return float(match.group(1)) * _SUFFIX[match.group(2)]


def _image_id(image: str) -> str:
    repo = image.split("@", 1)[0]
    last = repo.rsplit("/", 1)[-1]
    if ":" in last:
        repo = repo[: len(repo) - len(last)] + last.split(":", 1)[0]
    if "/" not in repo:
        repo = f"docker.io/library/{repo}"
    digest = hashlib.sha256(image.encode()).hexdigest()
    return f"{repo}@sha256:{digest}"


# ------------------------------------------------------------------------ the pod
class PodRuntime:
    """Drives one pod from Pending to a terminal phase (or to deletion)."""

    def __init__(self, kubelet: Kubelet, pod: dict[str, Any]) -> None:
        md = pod["metadata"]
        self.kubelet = kubelet
        self.cluster = kubelet.cluster
        self.uid: str = md["uid"]
        self.namespace: str = md["namespace"]
        self.name: str = md["name"]
        self.kill_event = asyncio.Event()
        self.kill_reason: str | None = None
        self.kill_deadline = math.inf
        self.kill_changed = asyncio.Event()
        self.containers: dict[str, ContainerState] = {}
        self.init_containers: dict[str, ContainerState] = {}
        self.initialized = False
        self.terminal_phase: str | None = None
        self.terminal_reason: str | None = None
        self.terminal_message: str | None = None
        self.disruption: dict[str, Any] | None = None
        self.node_name: str | None = None
        self.started_at: _dt.datetime | None = None
        self._cond_times: dict[str, tuple[str, str]] = {}
        self._events_sent: set[str] = set()
        self.task: asyncio.Task[None] | None = None
        self.dir = kubelet.work_dir / f"{self.namespace}_{self.name}_{self.uid[:8]}"

    # ---------------------------------------------------------------- helpers
    def pod(self) -> dict[str, Any] | None:
        """Current stored pod, or None once it is gone (or replaced by a same-named pod)."""
        pod = self.cluster.store.get(PODS, self.namespace, self.name)
        if pod is None or pod["metadata"].get("uid") != self.uid:
            return None
        return pod

    @property
    def killing(self) -> bool:
        """Whether termination was requested."""
        return self.kill_event.is_set()

    def request_kill(self, reason: str, grace: float) -> None:
        """Ask the pod to stop: SIGTERM now, SIGKILL once ``grace`` seconds passed."""
        deadline = time.monotonic() + max(0.0, grace)
        if self.kill_reason is None:
            self.kill_reason = reason
        elif reason == "delete":
            # A deletion after a preemption/deadline still has to remove the object.
            self.kill_reason = "delete" if self.kill_reason != "delete" else self.kill_reason
        if deadline < self.kill_deadline:
            self.kill_deadline = deadline
            self.kill_changed.set()
        self.kill_event.set()

    async def _sleep_or_kill(self, seconds: float, extra: asyncio.Event | None = None) -> bool:
        """Sleep; True when interrupted by a kill request."""
        waiters = [asyncio.ensure_future(self.kill_event.wait())]
        if extra is not None:
            waiters.append(asyncio.ensure_future(extra.wait()))
        try:
            await asyncio.wait(waiters, timeout=max(0.0, seconds), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        return self.killing

    def event(
        self, etype: str, reason: str, message: str, component: str = "kubelet", once: bool = False
    ) -> None:
        """Record an Event on this pod (``once``: at most one per reason+message)."""
        key = f"{reason}|{message}"
        if once and key in self._events_sent:
            return
        self._events_sent.add(key)
        pod = self.pod()
        if pod is not None:
            host = self.node_name if component == "kubelet" else None
            self.cluster.record_event(pod, etype, reason, message, component=component, host=host)

    def _condition(
        self, ctype: str, status: str, reason: str | None = None, message: str | None = None
    ) -> dict:
        previous = self._cond_times.get(ctype)
        if previous is None or previous[0] != status:
            self._cond_times[ctype] = (status, fmt_time())
        cond: dict[str, Any] = {
            "type": ctype,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": self._cond_times[ctype][1],
        }
        if reason:
            cond["reason"] = reason
        if message:
            cond["message"] = message
        return cond

    def _mutate(self, fn: Callable[[dict[str, Any]], None]) -> None:
        def apply(obj: dict[str, Any]) -> None:
            if obj["metadata"].get("uid") == self.uid:
                fn(obj)

        self.cluster.store.mutate(PODS, self.namespace, self.name, apply)

    # -------------------------------------------------------------- lifecycle
    async def run(self) -> None:
        """The whole life of the pod; never raises (errors are logged and shown as pod failure)."""
        try:
            pod = self.pod()
            if pod is None:
                return
            spec = pod["spec"]
            for c in spec.get("initContainers") or []:
                self.init_containers[c["name"]] = ContainerState(
                    c["name"], c.get("image", ""), {"waiting": {"reason": "PodInitializing"}}
                )
            for c in spec.get("containers") or []:
                self.containers[c["name"]] = ContainerState(
                    c["name"], c.get("image", ""), {"waiting": {"reason": "ContainerCreating"}}
                )
            self.initialized = not self.init_containers
            if await self._schedule() and await self._pull_images():
                deadline_task = self._start_deadline_timer()
                try:
                    if await self._run_init_containers():
                        await self._run_main_containers()
                finally:
                    if deadline_task is not None:
                        deadline_task.cancel()
            await self._finish()
        except asyncio.CancelledError:
            self._kill_all_now()
            raise
        except Exception as exc:  # pragma: no cover - defensive: never kill the loop
            log.exception("pod %s/%s runtime crashed", self.namespace, self.name)
            self._kill_all_now()
            self.terminal_phase = "Failed"
            self.terminal_reason = "EmulatorError"
            self.terminal_message = f"cluster emulator error: {exc!r}"
            with contextlib.suppress(Exception):
                self._publish()
        finally:
            self.kubelet.runtime_done(self)

    async def _schedule(self) -> bool:
        nodes = self.cluster.nodes
        announced_scale_up = False
        announced_no_scale_up = False
        announced_stockout = False
        while True:
            pod = self.pod()
            if pod is None or self.killing:
                return False
            spec = pod["spec"]
            if spec.get("nodeName"):
                self.node_name = spec["nodeName"]
                self._publish_scheduled()
                return True
            if spec.get("schedulingGates"):
                # kube-scheduler's SchedulingGates plugin (pkg/scheduler/framework/plugins/
                # schedulinggates, PreEnqueue): the pod is not tried until the gates are removed.
                cond = self._condition(
                    "PodScheduled",
                    "False",
                    "SchedulingGated",
                    "Scheduling is blocked due to non-empty scheduling gates",
                )

                def gated(obj: dict[str, Any], cond: dict[str, Any] = cond) -> None:
                    status = obj.setdefault("status", {})
                    status["phase"] = "Pending"
                    status["conditions"] = [cond]

                self._mutate(gated)
                if await self._sleep_or_kill(1.0, self.kubelet.nodes_changed):
                    return False
                continue
            node, message = find_node(spec, nodes)
            delay = self.cluster.faults.scheduling_delay_remaining()
            if node is not None and delay <= 0:
                self.node_name = node.name

                def bind(obj: dict[str, Any], node_name: str = node.name) -> None:
                    obj["spec"]["nodeName"] = node_name

                self._mutate(bind)
                self._publish_scheduled()
                self.event(
                    "Normal",
                    "Scheduled",
                    f"Successfully assigned {self.namespace}/{self.name} to {node.name}",
                    component="default-scheduler",
                )
                return True
            if node is not None:
                message = scale_up_message(spec, len(nodes))
                if not announced_scale_up:
                    announced_scale_up = True
                    self._announce_scale_up(node.pool.name)
            elif (stocked := stocked_out_pool(spec, nodes)) is not None:
                # find_node's message counts the stocked-out pool's node as Insufficient
                if not announced_stockout:
                    announced_stockout = True
                    self._announce_failed_scale_up(stocked.name)
            elif not announced_no_scale_up:
                announced_no_scale_up = True
                reason = message.split(": ", 1)[1].split(". preemption", 1)[0] if ": " in message else message
                self.event(
                    "Normal",
                    "NotTriggerScaleUp",
                    f"pod didn't trigger scale-up: {reason}",
                    component="cluster-autoscaler",
                )
            self._publish_unschedulable(message)
            self.event("Warning", "FailedScheduling", message, component="default-scheduler")
            wait = min(delay, 5.0) if node is not None else 5.0
            if await self._sleep_or_kill(wait, self.kubelet.nodes_changed):
                return False

    def _announce_scale_up(self, pool: str) -> None:
        """The cluster-autoscaler's ``TriggeredScaleUp`` event: the pod made it grow ``pool``'s group."""
        group = f"gke-emulator-{pool}-grp"
        self.event(
            "Normal",
            "TriggeredScaleUp",
            "pod triggered scale-up: [{https://www.googleapis.com/compute/v1/projects/emulator/"
            f"zones/us-central1-a/instanceGroups/{group} 0->1 (max: 10)}}]",
            component="cluster-autoscaler",
        )

    def _announce_failed_scale_up(self, pool: str) -> None:
        """The cluster-autoscaler's events for a pod whose only fitting pool cannot grow (GCE has
        no VMs for it: ``NodePool.stockout``): it triggers a scale-up, the scale-up fails and the
        node group goes into backoff, after which the pod no longer triggers one. Reasons and
        wording: GoogleCloudPlatform/cluster-autoscaler's GKE event processor (``FailedScaleUp``,
        "Node scale up in zones %v associated with this pod failed: %v. Pod is at risk of not
        being scheduled.", "GCE out of resources") and kubernetes/autoscaler
        cluster-autoscaler/core/scaleup/orchestrator (``BackoffReason``: "in backoff after failed
        scale-up", in ``NotTriggerScaleUp``)."""
        self._announce_scale_up(pool)
        self.event(
            "Warning",
            "FailedScaleUp",
            "Node scale up in zones us-central1-a associated with this pod failed: GCE out of resources. "
            "Pod is at risk of not being scheduled.",
            component="cluster-autoscaler",
        )
        self.event(
            "Normal",
            "NotTriggerScaleUp",
            "pod didn't trigger scale-up: 1 in backoff after failed scale-up",
            component="cluster-autoscaler",
        )

    def _publish_unschedulable(self, message: str) -> None:
        cond = self._condition("PodScheduled", "False", "Unschedulable", message)

        def apply(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            status["phase"] = "Pending"
            status["conditions"] = [cond]

        self._mutate(apply)

    def _publish_scheduled(self) -> None:
        self.started_at = self.started_at or utcnow()
        for state in self.containers.values():
            state.state = {"waiting": {"reason": "ContainerCreating"}}
        self._publish()

    async def _pull_images(self) -> bool:
        pod = self.pod()
        if pod is None:
            return False
        pulled: set[str] = set()
        specs = list(pod["spec"].get("initContainers") or []) + list(pod["spec"].get("containers") or [])
        for container in specs:
            image = container.get("image", "")
            state = self.init_containers.get(container["name"]) or self.containers[container["name"]]
            attempt = 0
            while self.cluster.faults.image_pull_fails(image):
                if self.killing:
                    return False
                detail = (
                    f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": '
                    f'failed to resolve reference "{image}": {image}: not found'
                )
                self.event("Normal", "Pulling", f'Pulling image "{image}"')
                self.event("Warning", "Failed", f'Failed to pull image "{image}": {detail}')
                self.event("Warning", "Failed", "Error: ErrImagePull")
                state.state = {"waiting": {"reason": "ErrImagePull", "message": detail}}
                self._publish()
                if await self._sleep_or_kill(self.kubelet.image_pull_backoff):
                    return False
                state.state = {
                    "waiting": {
                        "reason": "ImagePullBackOff",
                        "message": f'Back-off pulling image "{image}": ErrImagePull: {detail}',
                    }
                }
                self.event("Normal", "BackOff", f'Back-off pulling image "{image}"')
                self.event("Warning", "Failed", "Error: ImagePullBackOff")
                self._publish()
                backoff = min(self.kubelet.image_pull_backoff * (2**attempt), 10.0)
                attempt += 1
                if await self._sleep_or_kill(backoff):
                    return False
            if self.killing:
                return False
            state.image_id = _image_id(image)
            if image in pulled:
                continue
            pulled.add(image)
            if container.get("imagePullPolicy") == "Always":
                self.event("Normal", "Pulling", f'Pulling image "{image}"')
                self.event(
                    "Normal", "Pulled", f'Successfully pulled image "{image}" in 0s (0s including waiting)'
                )
            else:
                self.event("Normal", "Pulled", f'Container image "{image}" already present on machine')
        return True

    def _start_deadline_timer(self) -> asyncio.Task[None] | None:
        pod = self.pod()
        deadline = (pod or {}).get("spec", {}).get("activeDeadlineSeconds")
        if not deadline:
            return None
        started = self.started_at or utcnow()

        async def fire() -> None:
            remaining = float(deadline) - (utcnow() - started).total_seconds()
            await asyncio.sleep(max(0.0, remaining))
            if not self.killing:
                self.event("Warning", "DeadlineExceeded", DEADLINE_MESSAGE)
                self.request_kill("deadline", self.kubelet.grace_for(self.pod()))

        return asyncio.ensure_future(fire())

    async def _run_init_containers(self) -> bool:
        pod = self.pod()
        if pod is None:
            return False
        for spec in pod["spec"].get("initContainers") or []:
            if spec.get("restartPolicy") == "Always":
                # Sidecar: start it and keep it running alongside the main containers.
                self.kubelet.keep(self._supervise(spec, self.init_containers[spec["name"]], sidecar=True))
                continue
            ok = await self._supervise(spec, self.init_containers[spec["name"]], init=True)
            if not ok:
                return False
        self.initialized = True
        for state in self.containers.values():
            state.state = {"waiting": {"reason": "ContainerCreating"}}
        self._publish()
        return True

    async def _run_main_containers(self) -> None:
        pod = self.pod()
        if pod is None:
            return
        tasks = [
            asyncio.ensure_future(self._supervise(spec, self.containers[spec["name"]]))
            for spec in pod["spec"].get("containers") or []
        ]
        await asyncio.gather(*tasks)
        # Sidecars stop once the main containers are done.
        for state in self.init_containers.values():
            if state.current is not None and not state.current.exited.done():
                self._signal(state.current, signal.SIGTERM)

    def _restart_policy(self) -> str:
        pod = self.pod()
        return ((pod or {}).get("spec") or {}).get("restartPolicy", "Always")

    async def _supervise(
        self, spec: dict[str, Any], state: ContainerState, init: bool = False, sidecar: bool = False
    ) -> bool:
        """Run one container, restarting per restartPolicy; True when it finished successfully."""
        policy = "Always" if sidecar else self._restart_policy()
        if init and policy == "Always":
            policy = "OnFailure"
        while True:
            if self.killing:
                return False
            try:
                env, mapping = self._build_env(spec)
            except ConfigError as exc:
                state.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
                self.event("Warning", "Failed", f"Error: {exc}", once=True)
                self._publish()
                if await self._sleep_or_kill(1.0):
                    return False
                continue
            try:
                run = self._start_process(spec, state, env, mapping)
            except StartError as exc:
                now = fmt_time()
                state.state = {
                    "terminated": {
                        "exitCode": 128,
                        "reason": "StartError",
                        "message": str(exc),
                        "startedAt": "1970-01-01T00:00:00Z",
                        "finishedAt": now,
                    }
                }
                state.exit_code = 128
                self.event("Warning", "Failed", f"Error: {exc}")
                exit_code = 128
                run_log = None
            else:
                run_log = run.log
                state.current = run
                state.ever_started = True
                state.container_id = run.container_id
                state.state = {"running": {"startedAt": fmt_time(run.started_at)}}
                state.ready = not init
                state.started = True
                self.event("Normal", "Created", f"Created container: {state.name}")
                self.event("Normal", "Started", f"Started container {state.name}")
                self._publish()
                exit_code = await self._wait_exit(run)
                lag = self.cluster.faults.exit_report_delay  # the exit reaches the status late
                if lag > 0 and not self.killing:
                    await self._sleep_or_kill(lag)
                state.exit_code = exit_code
                if run.oom:
                    reason = "OOMKilled"
                else:
                    reason = "Completed" if exit_code == 0 else "Error"
                state.state = {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": reason,
                        "startedAt": fmt_time(run.started_at),
                        "finishedAt": fmt_time(run.finished_at or utcnow()),
                        "containerID": run.container_id,
                    }
                }
                state.ready = False
                state.started = False
            restart = not self.killing and (policy == "Always" or (policy == "OnFailure" and exit_code != 0))
            if not restart:
                state.finished = True
                self._publish()
                return exit_code == 0 and not self.killing
            delay = min(
                self.kubelet.restart_backoff * (2**state.restart_count), self.kubelet.restart_backoff_max
            )
            state.last_state = state.state
            state.last_log = run_log
            state.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {delay:g}s restarting failed container={state.name} "
                    f"pod={self.name}_{self.namespace}({self.uid})",
                }
            }
            self.event(
                "Warning",
                "BackOff",
                f"Back-off restarting failed container {state.name} in pod "
                f"{self.name}_{self.namespace}({self.uid})",
            )
            self._publish()
            if await self._sleep_or_kill(delay):
                state.state = state.last_state
                state.finished = True
                self._publish()
                return False
            state.restart_count += 1

    # ------------------------------------------------------------- processes
    def _field_ref(self, pod: dict[str, Any], path: str) -> str:
        md = pod["metadata"]
        match = re.match(r"^metadata\.(labels|annotations)\['(.+)'\]$", path)
        if match:
            return str((md.get(match.group(1)) or {}).get(match.group(2), ""))
        if path in ("metadata.labels", "metadata.annotations"):
            items = sorted((md.get(path.split(".")[1]) or {}).items())
            return "\n".join(f'{k}="{v}"' for k, v in items)
        simple = {
            "metadata.name": md.get("name", ""),
            "metadata.namespace": md.get("namespace", ""),
            "metadata.uid": md.get("uid", ""),
            "spec.nodeName": self.node_name or pod["spec"].get("nodeName", ""),
            "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
            "status.hostIP": "127.0.0.1",
            "status.hostIPs": "127.0.0.1",
            "status.podIP": "127.0.0.1",
            "status.podIPs": "127.0.0.1",
        }
        if path not in simple:
            raise ConfigError(f'unsupported fieldRef fieldPath "{path}"')
        return str(simple[path])

    def _resource_ref(self, pod: dict[str, Any], container: dict[str, Any], ref: dict[str, Any]) -> str:
        name = ref.get("containerName") or container.get("name")
        target = next((c for c in pod["spec"].get("containers") or [] if c.get("name") == name), container)
        section, _, resource = ref.get("resource", "").partition(".")
        resources = target.get("resources") or {}
        value = (resources.get(section) or {}).get(resource)
        if value is None:
            value = (resources.get("limits") or {}).get(resource) or {"cpu": "8", "memory": "32Gi"}.get(
                resource, "0"
            )
        divisor = parse_quantity(ref.get("divisor") or "1")
        return str(math.ceil(parse_quantity(value) / divisor))

    def _lookup(self, kind: str, name: str, key: str | None, optional: bool) -> dict[str, str] | str | None:
        rt = CONFIGMAPS if kind == "configmap" else SECRETS
        obj = self.cluster.store.get(rt, self.namespace, name)
        if obj is None:
            if optional:
                return None
            raise ConfigError(f'{kind} "{name}" not found')
        data: dict[str, str] = dict(obj.get("data") or {})
        if rt is SECRETS:
            data = {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in data.items()}
            data.update(obj.get("stringData") or {})
        if key is None:
            return data
        if key not in data:
            if optional:
                return None
            label = "ConfigMap" if rt is CONFIGMAPS else "Secret"
            raise ConfigError(f"couldn't find key {key} in {label} {self.namespace}/{name}")
        return data[key]

    def _headless_services(self) -> dns.Headless:
        """(namespace, name) of every headless Service, when cluster names are rewritten at all."""
        if not self.kubelet.resolve_cluster_dns:
            return set()
        return {
            (svc["metadata"]["namespace"], svc["metadata"]["name"])
            for svc in self.cluster.store.list(SERVICES)
            if (svc.get("spec") or {}).get("clusterIP") == "None"
            and not svc["metadata"].get("deletionTimestamp")
        }

    def _build_env(self, container: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
        """Process environment, and the ``$(VAR)`` mapping for command/args.

        As in the kubelet: ``envFrom`` first, then ``env`` in order, each ``value``
        expanded against the variables defined before it and the service variables
        (``KUBERNETES_SERVICE_HOST``...). The mapping holds the values as the spec
        defines them; in the process environment, cluster DNS names of pods and
        headless Services are replaced with 127.0.0.1 (see :mod:`.dns`).
        """
        pod = self.pod()
        if pod is None:
            raise ConfigError("pod deleted")
        kubelet = self.kubelet
        env: dict[str, str] = dict(os.environ) if kubelet.inherit_env else {}
        if not kubelet.inherit_env:
            env["PATH"] = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.update(kubelet.extra_env)
        spec = pod["spec"]
        hostname = spec.get("hostname") or self.name
        port = str(self.cluster.port or 0)
        service_env = {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_PORT": f"tcp://127.0.0.1:{port}",
        }
        env["HOSTNAME"] = hostname
        env.update(service_env)
        defined: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            for kind, ref in (("configmap", source.get("configMapRef")), ("secret", source.get("secretRef"))):
                if ref:
                    data = self._lookup(kind, ref.get("name", ""), None, bool(ref.get("optional")))
                    if isinstance(data, dict):
                        defined.update({prefix + k: v for k, v in data.items()})
        for item in container.get("env") or []:
            name = item["name"]
            if item.get("valueFrom"):
                source = item["valueFrom"]
                value: str | None
                if "fieldRef" in source:
                    value = self._field_ref(pod, source["fieldRef"].get("fieldPath", ""))
                elif "resourceFieldRef" in source:
                    value = self._resource_ref(pod, container, source["resourceFieldRef"])
                elif "configMapKeyRef" in source:
                    ref = source["configMapKeyRef"]
                    found = self._lookup(
                        "configmap", ref.get("name", ""), ref.get("key"), bool(ref.get("optional"))
                    )
                    value = found if isinstance(found, str) else None
                elif "secretKeyRef" in source:
                    ref = source["secretKeyRef"]
                    found = self._lookup(
                        "secret", ref.get("name", ""), ref.get("key"), bool(ref.get("optional"))
                    )
                    value = found if isinstance(found, str) else None
                else:
                    raise ConfigError(f"unsupported valueFrom for env {name}")
                if value is not None:
                    defined[name] = value
            else:
                defined[name] = expand_vars(str(item.get("value", "")), ChainMap(defined, service_env))
        headless = self._headless_services()
        mounts = self._volume_folders(pod, container)
        env.update(
            {k: _to_folder(dns.rewrite(v, self.namespace, headless), mounts) for k, v in defined.items()}
        )
        return env, {**service_env, **defined}

    def _volume_folders(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        """mountPath -> a folder of this machine, for the container's hostPath and emptyDir mounts.

        A process has no mount namespace, so a mount is a folder under the emulator's work dir
        (hostPath: one per node and path, shared by that node's pods, as on a node; emptyDir: one
        per pod), and env values that name a mount path are pointed at it. Nothing is written
        at the pod's own absolute paths on this machine.
        """
        volumes = {v.get("name"): v for v in (pod["spec"].get("volumes") or [])}
        node = pod["spec"].get("nodeName") or "node"
        folders: dict[str, str] = {}
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount.get("name")) or {}
            if "hostPath" in volume:
                rel = str(volume["hostPath"].get("path", "")).strip("/")
                folder = self.kubelet.work_dir / "hostpath" / node / rel
            elif "emptyDir" in volume:
                uid = pod["metadata"].get("uid") or self.name
                folder = self.kubelet.work_dir / "emptydir" / uid / str(mount.get("name"))
            else:
                continue
            folder.mkdir(parents=True, exist_ok=True)
            folders[str(mount.get("mountPath", "")).rstrip("/")] = str(folder)
        return folders

    def _start_process(
        self, container: dict[str, Any], state: ContainerState, env: dict[str, str], mapping: dict[str, str]
    ) -> ContainerRun:
        headless = self._headless_services()
        argv = []
        for arg in (container.get("command") or []) + (container.get("args") or []):
            # Only names that came from $(VAR) expansion are rewritten: literal text in the
            # command may be code (python -c ...) that merely mentions a name.
            text, spans = expand_vars_spans(str(arg), mapping)
            argv.append(dns.rewrite(text, self.namespace, headless, only=spans))
        if not argv:
            raise StartError(
                "failed to create containerd task: the cluster emulator runs the container's command "
                "and args as a local process and cannot run image entrypoints: set command"
            )
        workdir = container.get("workingDir")
        if workdir:
            if not os.path.isdir(workdir):
                raise StartError(
                    "failed to create containerd task: OCI runtime create failed: "
                    f'chdir to cwd ("{workdir}") '
                    "set in config.json failed: no such file or directory (the emulator does not create "
                    "workingDir on the host)"
                )
            cwd = workdir
        else:
            cwd = str(self.dir / "workdir")
            os.makedirs(cwd, exist_ok=True)
        log_file = LogFile(self.dir / "logs" / f"{state.name}-{state.restart_count}.log")
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        try:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=w_out,
                stderr=w_err,
                env=env,
                cwd=cwd,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            # Only the read ends: the finally below closes the write ends, and a second close of
            # a descriptor number another thread may have reused meanwhile would close its file.
            for fd in (r_out, r_err):
                os.close(fd)
            log_file.close()
            raise StartError(
                "failed to create containerd task: failed to create shim task: OCI runtime create failed: "
                "runc create failed: unable to start container process: "
                f'exec: "{argv[0]}": {exc.strerror}: unknown'
            ) from exc
        finally:
            with contextlib.suppress(OSError):
                os.close(w_out)
            with contextlib.suppress(OSError):
                os.close(w_err)
        loop = asyncio.get_running_loop()
        container_id = (
            "containerd://" + hashlib.sha256(f"{self.uid}/{state.name}/{popen.pid}".encode()).hexdigest()
        )
        run = ContainerRun(
            state.name, state.restart_count, popen, log_file, utcnow(), container_id, loop.create_future()
        )
        state.logs.append(log_file)
        self.kubelet.register_run(self, run)
        for fd, stream in ((r_out, "stdout"), (r_err, "stderr")):
            os.set_blocking(fd, False)
            run.fds[fd] = stream
            loop.add_reader(fd, self.kubelet.on_output, run, fd, stream)
        self.kubelet.watch_exit(run)
        return run

    def _signal(self, run: ContainerRun, sig: int) -> None:
        if run.exited.done():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.pid, sig)

    async def _wait_exit(self, run: ContainerRun) -> int:
        """Wait for the process; on a kill request: SIGTERM, then SIGKILL after the grace period."""
        kill_wait = asyncio.ensure_future(self.kill_event.wait())
        try:
            await asyncio.wait({run.exited, kill_wait}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            kill_wait.cancel()
        if run.exited.done():
            await run.log.wait_done(1.5)
            return run.exited.result()
        self.event("Normal", "Killing", f"Stopping container {run.name}", once=True)
        self._signal(run, signal.SIGTERM)
        while not run.exited.done():
            remaining = self.kill_deadline - time.monotonic()
            if remaining <= 0:
                self._signal(run, signal.SIGKILL)
                break
            self.kill_changed.clear()
            changed = asyncio.ensure_future(self.kill_changed.wait())
            try:
                await asyncio.wait(
                    {run.exited, changed}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                changed.cancel()
        code = await run.exited
        await run.log.wait_done(1.5)
        return code

    def oom_kill(self, container: str | None) -> bool:
        """SIGKILL a container as the kernel OOM killer would (exit 137, reason OOMKilled)."""
        states = list(self.containers.values())
        if container is not None:
            states = [s for s in states if s.name == container]
        killed = False
        for state in states:
            run = state.current
            if run is not None and not run.exited.done():
                run.oom = True
                self._signal(run, signal.SIGKILL)
                killed = True
        return killed

    def _kill_all_now(self) -> None:
        for state in list(self.containers.values()) + list(self.init_containers.values()):
            if state.current is not None:
                self._signal(state.current, signal.SIGKILL)

    # ---------------------------------------------------------------- status
    def _publish(self) -> None:
        pod = self.pod()
        if pod is None:
            return
        states = list(self.containers.values())
        init_states = list(self.init_containers.values())
        all_ready = bool(states) and all(s.ready for s in states)
        if self.terminal_phase:
            phase = self.terminal_phase
        elif any(s.ever_started for s in states):
            phase = "Running"
        else:
            phase = "Pending"
        unready = [s.name for s in states if not s.ready]
        if phase in ("Succeeded", "Failed"):
            ready_reason, ready_message = "PodCompleted", None
            all_ready = False
        elif all_ready:
            ready_reason, ready_message = None, None
        else:
            ready_reason = "ContainersNotReady"
            ready_message = f"containers with unready status: [{' '.join(unready)}]"
        init_done = self.initialized
        incomplete = " ".join(s.name for s in init_states if not s.finished)
        conditions = [
            self._condition("PodReadyToStartContainers", "False" if self.terminal_phase else "True"),
            self._condition(
                "Initialized",
                "True" if init_done else "False",
                None if init_done else "ContainersNotInitialized",
                None if init_done else f"containers with incomplete status: [{incomplete}]",
            ),
            self._condition("Ready", "True" if all_ready else "False", ready_reason, ready_message),
            self._condition("ContainersReady", "True" if all_ready else "False", ready_reason, ready_message),
            self._condition("PodScheduled", "True"),
        ]
        if self.disruption is not None:
            conditions.insert(0, self.disruption)
        started = fmt_time(self.started_at) if self.started_at else None

        def apply(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            status["phase"] = phase
            status["conditions"] = conditions
            status["hostIP"] = "127.0.0.1"
            status["hostIPs"] = [{"ip": "127.0.0.1"}]
            status["podIP"] = "127.0.0.1"
            status["podIPs"] = [{"ip": "127.0.0.1"}]
            if started:
                status["startTime"] = started
            status["containerStatuses"] = [s.to_status() for s in states]
            if init_states:
                status["initContainerStatuses"] = [s.to_status() for s in init_states]
            if self.terminal_reason:
                status["reason"] = self.terminal_reason
                status["message"] = self.terminal_message
            status.setdefault("qosClass", "BestEffort")

        self._mutate(apply)

    def set_disruption(self, reason: str, message: str) -> None:
        """Add the ``DisruptionTarget`` condition (preemption / node shutdown)."""
        self.disruption = self._condition("DisruptionTarget", "True", reason, message)
        self._publish()

    async def _finish(self) -> None:
        reason = self.kill_reason
        states = list(self.containers.values())
        for state in states:
            if "terminated" not in state.state and state.ever_started:
                state.state = {
                    "terminated": {
                        "exitCode": 137,
                        "reason": "Error",
                        "startedAt": fmt_time(self.started_at),
                        "finishedAt": fmt_time(),
                    }
                }
            state.ready = False
            state.started = False
        if reason == "shutdown":
            return
        if reason == "preempt" or (reason == "delete" and self.disruption is not None):
            self.terminal_phase = "Failed"
            self.terminal_reason = "Terminated"
            self.terminal_message = PREEMPTION_MESSAGE
        elif reason == "deadline":
            self.terminal_phase = "Failed"
            self.terminal_reason = "DeadlineExceeded"
            self.terminal_message = DEADLINE_MESSAGE
        elif self.node_name is not None:
            all_ok = bool(states) and self.initialized and all(s.exit_code == 0 for s in states)
            if reason == "delete" and self._restart_policy() == "Always":
                all_ok = False
            self.terminal_phase = "Succeeded" if all_ok else "Failed"
        if self.terminal_phase is not None:
            self._publish()
        if reason == "delete":
            self.cluster.finish_pod_deletion(self.namespace, self.name, self.uid)


# ------------------------------------------------------------------------ kubelet
def _to_folder(value: str, mounts: dict[str, str]) -> str:
    """``value`` with a leading mount path replaced by the folder that stands in for it."""
    for path, folder in mounts.items():
        if path and (value == path or value.startswith(path + "/")):
            return folder + value[len(path) :]
    return value


class Kubelet:
    """Owns every pod runtime and its processes."""

    def __init__(
        self,
        cluster: Cluster,
        work_dir: Path,
        *,
        max_grace_seconds: float,
        inherit_env: bool,
        extra_env: dict[str, str],
        resolve_cluster_dns: bool = True,
        restart_backoff: float = 0.5,
        restart_backoff_max: float = 5.0,
        image_pull_backoff: float = 0.5,
    ) -> None:
        self.cluster = cluster
        self.work_dir = work_dir
        self.max_grace_seconds = max_grace_seconds
        self.inherit_env = inherit_env
        self.extra_env = dict(extra_env)
        self.resolve_cluster_dns = resolve_cluster_dns
        self.restart_backoff = restart_backoff
        self.restart_backoff_max = restart_backoff_max
        self.image_pull_backoff = image_pull_backoff
        self.runtimes: dict[str, PodRuntime] = {}
        self.finished: dict[str, PodRuntime] = {}
        self.runs: dict[int, tuple[PodRuntime, ContainerRun]] = {}
        self.nodes_changed = asyncio.Event()
        self._closing = False
        self._background: set[asyncio.Future[Any]] = set()

    def keep(self, coro: Any) -> asyncio.Future[Any]:
        """Run a helper coroutine, keeping a reference so it is not garbage collected mid-flight."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # ------------------------------------------------------------ pod events
    def pod_added(self, pod: dict[str, Any]) -> None:
        """Start running a newly created pod."""
        if self._closing:
            return
        runtime = PodRuntime(self, pod)
        self.runtimes[runtime.uid] = runtime
        runtime.task = asyncio.ensure_future(runtime.run())

    def runtime_done(self, runtime: PodRuntime) -> None:
        """Called when a pod's runtime coroutine ends (processes are gone)."""
        self.runtimes.pop(runtime.uid, None)
        self.finished[runtime.uid] = runtime

    def runtime_for(self, uid: str) -> PodRuntime | None:
        """Live or finished runtime for a pod uid (finished ones keep the logs)."""
        return self.runtimes.get(uid) or self.finished.get(uid)

    def forget(self, uid: str) -> None:
        """Drop a deleted pod's bookkeeping."""
        self.finished.pop(uid, None)

    def is_active(self, uid: str) -> bool:
        """Whether the pod still has a runtime that could have processes."""
        return uid in self.runtimes

    def grace_for(self, pod: dict[str, Any] | None, requested: float | None = None) -> float:
        """Grace period: requested or ``terminationGracePeriodSeconds`` (default 30), capped."""
        if requested is None:
            requested = float(((pod or {}).get("spec") or {}).get("terminationGracePeriodSeconds", 30))
        return max(0.0, min(float(requested), self.max_grace_seconds))

    def kill_pod(self, uid: str, reason: str, grace: float) -> bool:
        """Request termination of a running pod; False when it has no runtime."""
        runtime = self.runtimes.get(uid)
        if runtime is None:
            return False
        runtime.request_kill(reason, grace)
        return True

    def preempt(self, pod: dict[str, Any], grace: float) -> None:
        """GKE node-shutdown preemption: DisruptionTarget, SIGTERM, SIGKILL after ``grace``."""
        runtime = self.runtimes.get(pod["metadata"]["uid"])
        if runtime is None:
            raise LookupError(f"pod {pod['metadata']['namespace']}/{pod['metadata']['name']} is not running")
        runtime.set_disruption("TerminationByKubelet", PREEMPTION_MESSAGE)
        runtime.event("Normal", "Shutdown", "Node is shutting down, evicting pods", once=True)
        runtime.request_kill("preempt", grace)

    def rotate_log(self, pod: dict[str, Any], container: str | None) -> None:
        """Rotate the current log of the pod's container(s) (see ``LogFile.rotate``)."""
        runtime = self.runtime_for(pod["metadata"]["uid"])
        states = list(runtime.containers.values()) if runtime is not None else []
        states = [s for s in states if container is None or s.name == container]
        if not any(s.logs for s in states):
            raise LookupError(f"pod {pod['metadata']['namespace']}/{pod['metadata']['name']} has no log yet")
        for state in states:
            if state.logs:
                state.logs[-1].rotate()

    def oom_kill(self, pod: dict[str, Any], container: str | None) -> None:
        """Kill a container with exit code 137 / OOMKilled."""
        runtime = self.runtimes.get(pod["metadata"]["uid"])
        if runtime is None or not runtime.oom_kill(container):
            raise LookupError(
                f"pod {pod['metadata']['namespace']}/{pod['metadata']['name']} has no running container"
            )

    # -------------------------------------------------------------- processes
    def register_run(self, runtime: PodRuntime, run: ContainerRun) -> None:
        """Track a started process (for shutdown and the process listing)."""
        self.runs[run.pid] = (runtime, run)

    def on_output(self, run: ContainerRun, fd: int, stream: str) -> None:
        """Loop reader callback: move pipe data into the log."""
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            run.log.append(stream, data)
            return
        self._close_fd(run, fd)
        run.log.close_stream(stream)

    def _close_fd(self, run: ContainerRun, fd: int) -> None:
        if fd in run.fds:
            del run.fds[fd]
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    def _close_all_fds(self, run: ContainerRun) -> None:
        for fd, stream in list(run.fds.items()):
            # Drain what is left before closing.
            with contextlib.suppress(OSError):
                while True:
                    data = os.read(fd, 65536)
                    if not data:
                        break
                    run.log.append(stream, data)
            self._close_fd(run, fd)
        run.log.close()

    def watch_exit(self, run: ContainerRun) -> None:
        """Observe process exit via pidfd on the loop (falls back to polling)."""
        loop = asyncio.get_running_loop()
        pidfd_open = getattr(os, "pidfd_open", None)
        pidfd = -1
        if pidfd_open is not None:
            try:
                pidfd = pidfd_open(run.pid)
            except OSError:
                pidfd = -1
        if pidfd < 0:
            self.keep(self._poll_exit(run))
            return

        def ready() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self._reap(run)

        loop.add_reader(pidfd, ready)

    async def _poll_exit(self, run: ContainerRun) -> None:
        while run.popen.poll() is None:
            await asyncio.sleep(0.05)
        self._reap(run)

    def _reap(self, run: ContainerRun) -> None:
        # The container ends with its main process: kill whatever else is left in its
        # session (before reaping, so the process group id cannot be reused meanwhile).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.pid, signal.SIGKILL)
        code = run.popen.wait()
        run.finished_at = utcnow()
        exit_code = 128 - code if code < 0 else code
        self.runs.pop(run.pid, None)
        if not run.exited.done():
            run.exited.set_result(exit_code)
        if run.fds:
            loop = asyncio.get_running_loop()
            loop.call_later(1.0, self._close_all_fds, run)
        else:
            run.log.close()

    def processes(self) -> list[dict[str, Any]]:
        """Live container processes: namespace, pod, container, pid."""
        return [
            {"namespace": rt.namespace, "pod": rt.name, "uid": rt.uid, "container": run.name, "pid": run.pid}
            for rt, run in list(self.runs.values())
        ]

    async def shutdown(self, grace: float = 1.0) -> None:
        """Stop every pod: SIGTERM, SIGKILL after ``grace``; wait for the runtimes to end."""
        self._closing = True
        runtimes = list(self.runtimes.values())
        for runtime in runtimes:
            runtime.request_kill("shutdown", grace)
        tasks = [r.task for r in runtimes if r.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace + 3.0)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=2.0)
        for _, run in list(self.runs.values()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                run.popen.wait(timeout=2.0)
            self.runs.pop(run.pid, None)
        for runtime in list(self.finished.values()) + runtimes:
            for state in list(runtime.containers.values()) + list(runtime.init_containers.values()):
                if state.current is not None:
                    for fd in list(state.current.fds):
                        self._close_fd(state.current, fd)
                    state.current.log.close()
