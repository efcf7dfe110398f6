"""Public entry points: :class:`ClusterEmulator` (in-process) and :class:`EmulatorAdminClient` (remote).

:class:`ClusterEmulator` runs the API server, controllers and pod processes
on a private asyncio loop in a background thread, so synchronous tests can use
the blocking ``kubernetes`` client against it. Its fault-injection methods are
thread-safe; each one hops onto the emulator loop.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import copy
import faulthandler
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from .cluster import DEFAULT_NAMESPACES, DEFAULT_SERVICE_ACCOUNTS, Cluster
from .faults import ApiFault, RequestLog
from .kubeconfig import DEFAULT_CONTEXT, DUMMY_TOKEN, kubeconfig_dict, write_kubeconfig
from .nodes import NodePool
from .rbac import UserInfo
from .resources import by_plural, check_unserved
from .selectors import parse_label_selector
from .server import ApiServer
from .tls import ServingCertificate

if TYPE_CHECKING:
    import kubernetes.client

T = TypeVar("T")


class ClusterEmulator:
    """A local Kubernetes API server that really runs pods as processes.

    Example::

        with ClusterEmulator() as k8s:
            k8s.write_kubeconfig(tmp_path / "kubeconfig")
            ...  # use kubernetes / kubernetes_asyncio / KubernetesHook / kubectl

    Args:
        node_pools: node pools the scheduler may use (default :func:`~.nodes.default_node_pools`:
            CPU and Spot CPU pools and, on-demand and Spot, one pool per GKE TPU accelerator,
            machine type and topology and per GPU type and machine type, with GKE's node labels).
        host: interface to bind (plain http).
        port: TCP port; 0 picks a free one.
        namespaces: namespaces that exist at start.
        max_grace_seconds: cap on termination grace periods coming from the API
            (``terminationGracePeriodSeconds`` defaults to 30 s in Kubernetes; 5 s here keeps tests fast).
        work_dir: where pod logs and scratch working directories go (a temp dir, removed on stop, by default).
        inherit_env: give pod processes this process's environment underneath the container ``env``
            (needed for ``PATH``/``PYTHONPATH``; set False for a clean environment with only ``PATH``).
        extra_env: variables added to every pod process (e.g. ``STORAGE_EMULATOR_HOST``).
        resolve_cluster_dns: in the environment of pod processes (and ``$(VAR)`` expansions in
            command/args), replace cluster DNS names of pods and headless Services
            (``LWS_LEADER_ADDRESS``, ``TPU_WORKER_HOSTNAMES``...) with 127.0.0.1, since there is no
            cluster DNS here; the API objects keep the real names.
        restart_backoff_seconds: first CrashLoopBackOff delay (doubles, capped at 5 s).
        job_backoff_seconds: first delay before the Job controller replaces a failed pod (doubles, 10x cap).
        image_pull_backoff_seconds: first ImagePullBackOff delay (doubles, capped at 10 s).
        tls: serve HTTPS with a self-signed certificate for ``host`` (``ca_certificate_b64``), as a
            GKE control plane: GKE-style clients (endpoint + cluster CA) can then connect.
        service_accounts: ``namespace/name`` service accounts made at start besides every
            namespace's ``default`` (default: ``default/kinetic``, as ``kinetic up`` leaves a
            cluster); a pod naming an account that does not exist is refused (FailedCreate).
        autopilot: act as a GKE Autopilot cluster: GKE Warden's admission constraints refuse pods
            with a writable hostPath volume (or one outside ``/var/log/``) or a host port, with
            Warden's message (``admission.py``, ``autopilot_violations``).
        static_tokens: bearer tokens accepted besides the admin's and minted service account
            tokens, each acting as the given :class:`~.rbac.UserInfo` (``--token-auth-file``);
            any other token is 401 Unauthorized.
    """

    def __init__(
        self,
        *,
        node_pools: Sequence[NodePool] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        namespaces: Sequence[str] = DEFAULT_NAMESPACES,
        max_grace_seconds: float = 5.0,
        work_dir: str | os.PathLike[str] | None = None,
        inherit_env: bool = True,
        extra_env: dict[str, str] | None = None,
        resolve_cluster_dns: bool = True,
        restart_backoff_seconds: float = 0.5,
        job_backoff_seconds: float = 0.2,
        image_pull_backoff_seconds: float = 0.5,
        tls: bool = False,
        service_accounts: Sequence[str] = DEFAULT_SERVICE_ACCOUNTS,
        unserved_versions: Sequence[str] = (),
        autopilot: bool = False,
        static_tokens: dict[str, UserInfo] | None = None,
    ) -> None:
        self._options = {
            "service_accounts": list(service_accounts),
            "unserved_versions": check_unserved(unserved_versions),
            "autopilot": autopilot,
            "static_tokens": dict(static_tokens or {}),
            "node_pools": list(node_pools) if node_pools is not None else None,
            "namespaces": list(namespaces),
            "max_grace_seconds": max_grace_seconds,
            "inherit_env": inherit_env,
            "extra_env": dict(extra_env or {}),
            "resolve_cluster_dns": resolve_cluster_dns,
            "restart_backoff": restart_backoff_seconds,
            "job_backoff": job_backoff_seconds,
            "image_pull_backoff": image_pull_backoff_seconds,
        }
        self._host = host
        self._port = port
        self._tls = tls
        self._certificate: ServingCertificate | None = None
        self._work_dir_arg = Path(work_dir) if work_dir is not None else None
        self._work_dir: Path | None = None
        self._owns_work_dir = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._cluster: Cluster | None = None
        self._server: ApiServer | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------- lifecycle
    def start(self, timeout: float = 30.0) -> ClusterEmulator:
        """Start serving in a background thread; returns self once the server accepts connections."""
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("ClusterEmulator already started")
            if self._work_dir_arg is not None:
                self._work_dir = self._work_dir_arg
                self._work_dir.mkdir(parents=True, exist_ok=True)
            else:
                self._work_dir = Path(tempfile.mkdtemp(prefix="k8s-emulator-"))
                self._owns_work_dir = True
            ready = threading.Event()
            failure: list[BaseException] = []
            loop = asyncio.new_event_loop()
            self._loop = loop

            def run() -> None:
                asyncio.set_event_loop(loop)
                try:
                    loop.run_until_complete(self._astart())
                except BaseException as exc:
                    failure.append(exc)
                    ready.set()
                    self._drain_loop(loop)
                    return
                ready.set()
                try:
                    loop.run_forever()
                finally:
                    self._drain_loop(loop)

            self._thread = threading.Thread(target=run, name="k8s-cluster-emulator", daemon=True)
            self._thread.start()
            if not ready.wait(timeout):
                raise TimeoutError("cluster emulator did not start in time")
            if failure:
                self._thread.join(5)
                self._thread = None
                self._loop = None
                raise failure[0]
            atexit.register(self.stop)
            return self

    @staticmethod
    def _drain_loop(loop: asyncio.AbstractEventLoop) -> None:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    async def _astart(self) -> None:
        assert self._work_dir is not None
        self._cluster = Cluster(work_dir=self._work_dir, **self._options)
        context = None
        if self._tls:
            self._certificate = ServingCertificate(self._work_dir / "tls", self._host)
            context = self._certificate.server_context()
        self._server = ApiServer(self._cluster, self._host, self._port, ssl_context=context)
        await self._cluster.start()
        self._port = await self._server.start()

    async def _astop(self) -> None:
        if self._server is not None:
            await self._server.stop()
        if self._cluster is not None:
            await self._cluster.stop()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving and kill every pod process (SIGTERM, then SIGKILL after 1 s). Idempotent."""
        with self._lock:
            loop, thread = self._loop, self._thread
            if loop is None or thread is None:
                return
            try:
                if not loop.is_closed():
                    future = asyncio.run_coroutine_threadsafe(self._astop(), loop)
                    try:
                        future.result(timeout)
                    except (TimeoutError, concurrent.futures.TimeoutError):
                        self._dump_stuck_tasks(loop)
                        raise
            finally:
                self._kill_leftover_processes()
                if not loop.is_closed():
                    loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout)
                self._loop = None
                self._thread = None
                atexit.unregister(self.stop)
                if self._owns_work_dir and self._work_dir is not None:
                    shutil.rmtree(self._work_dir, ignore_errors=True)

    @staticmethod
    def _dump_stuck_tasks(loop: asyncio.AbstractEventLoop) -> None:
        """Diagnostics when stopping times out: where every task and thread is stuck."""
        for task in list(asyncio.all_tasks(loop)):
            task.print_stack(file=sys.stderr)
        faulthandler.dump_traceback(sys.stderr, all_threads=True)

    def _kill_leftover_processes(self) -> None:
        """Last resort after a failed stop: SIGKILL every pod process group still registered."""
        cluster = self._cluster
        if cluster is None:
            return
        for _, run in list(cluster.kubelet.runs.values()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.pid, signal.SIGKILL)

    def __enter__(self) -> ClusterEmulator:
        return self.start() if self._thread is None else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """Whether the server thread is up."""
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------ addressing
    @property
    def host(self) -> str:
        """Bound interface."""
        return self._host

    @property
    def port(self) -> int:
        """Bound TCP port (after :meth:`start`)."""
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (``https://`` with ``tls=True``)."""
        return f"{'https' if self._tls else 'http'}://{self._host}:{self._port}"

    @property
    def ca_certificate_b64(self) -> str:
        """With ``tls=True``: the serving certificate (its own CA), base64 PEM as GKE's API gives it."""
        if self._certificate is None:
            raise RuntimeError("the emulator serves TLS only when started with tls=True")
        return self._certificate.ca_certificate_b64

    @property
    def work_dir(self) -> Path:
        """Directory with pod logs and scratch working directories."""
        if self._work_dir is None:
            raise RuntimeError("ClusterEmulator not started")
        return self._work_dir

    def kubeconfig(
        self, *, context: str = DEFAULT_CONTEXT, namespace: str = "default", token: str | None = None
    ) -> dict[str, Any]:
        """Kubeconfig document for this emulator (the admin's, or ``token``'s identity)."""
        return kubeconfig_dict(
            self.url, context=context, namespace=namespace, ca_data=self._ca_data(), token=token
        )

    def write_kubeconfig(
        self,
        path: str | os.PathLike[str],
        *,
        context: str = DEFAULT_CONTEXT,
        namespace: str = "default",
        token: str | None = None,
    ) -> Path:
        """Write a kubeconfig (context ``emulator``) pointing at this emulator; returns the path.
        Its user is the admin unless ``token`` (e.g. :meth:`service_account_token`) is given."""
        return write_kubeconfig(
            path, self.url, context=context, namespace=namespace, ca_data=self._ca_data(), token=token
        )

    def service_account_token(self, namespace: str, name: str, expiration_seconds: int = 86400) -> str:
        """A bearer token for the service account ``namespace/name`` (TokenRequest, as
        ``kubectl create token NAME -n NAMESPACE --duration ...``): requests with it are
        ``system:serviceaccount:NAMESPACE:NAME`` and get what its Role bindings grant."""
        body = {"spec": {"expirationSeconds": int(expiration_seconds)}}
        return self._call(self.cluster.request_token, namespace, name, body)["status"]["token"]

    def _ca_data(self) -> str | None:
        return self._certificate.ca_certificate_b64 if self._certificate is not None else None

    def api_client(self, token: str | None = None) -> kubernetes.client.ApiClient:
        """A configured official ``kubernetes`` ApiClient (caller closes it), as the admin or as
        ``token``'s identity."""
        import kubernetes.client

        config = kubernetes.client.Configuration()
        config.host = self.url
        if self._certificate is not None:
            config.ssl_ca_cert = str(self._certificate.cert_path)
        config.api_key = {"authorization": f"Bearer {token or DUMMY_TOKEN}"}
        return kubernetes.client.ApiClient(config)

    # --------------------------------------------------------------- plumbing
    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = self._loop
        if loop is None or self._cluster is None:
            raise RuntimeError("ClusterEmulator not started")

        async def run() -> T:
            return fn(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(run(), loop).result(30)

    @property
    def cluster(self) -> Cluster:
        """The in-loop :class:`~.cluster.Cluster` (only touch it via :meth:`call_in_loop`)."""
        if self._cluster is None:
            raise RuntimeError("ClusterEmulator not started")
        return self._cluster

    def call_in_loop(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on the emulator loop and return its result."""
        return self._call(fn, *args, **kwargs)

    # --------------------------------------------------------------- reading
    @property
    def request_log(self) -> RequestLog:
        """Every API request served (method, path, query, time, status); ``.count`` keeps counting."""
        return self.cluster.requests

    def get_object(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """A copy of a stored object (``resource`` is the plural, e.g. ``pods``), or None."""
        rt = by_plural(resource)

        def get() -> dict[str, Any] | None:
            obj = self.cluster.store.get(rt, namespace, name)
            return copy.deepcopy(obj) if obj is not None else None

        return self._call(get)

    def list_objects(
        self, resource: str, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Copies of stored objects of one type, optionally filtered by a label selector string."""
        rt = by_plural(resource)
        selector = parse_label_selector(label_selector)

        def items() -> list[dict[str, Any]]:
            return [
                copy.deepcopy(o)
                for o in self.cluster.store.list(rt, namespace)
                if selector.matches(o["metadata"].get("labels"))
            ]

        return self._call(items)

    def events_for(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """Events whose involvedObject is ``namespace/name``."""
        return [
            e
            for e in self.list_objects("events", namespace)
            if (e.get("involvedObject") or {}).get("name") == name
        ]

    def processes(self) -> list[dict[str, Any]]:
        """Live pod processes: ``{"namespace", "pod", "uid", "container", "pid"}``."""
        return self._call(self.cluster.kubelet.processes)

    # ---------------------------------------------------------------- faults
    def evict_workload(
        self, namespace: str, name: str, reason: str = "Preempted", message: str | None = None
    ) -> None:
        """Evict a Kueue Workload as Kueue does (``pkg/workload/evict``): condition
        ``Evicted=True`` with ``reason``/``message``, admission checks reset to Pending; the job is
        suspended (its pods killed), then the quota is released (``QuotaReserved=False``, reason
        ``Pending``) and ``Requeued`` set as Kueue sets it (True for ``Preempted`` and
        ``NodeFailures``; otherwise False with ``reason`` until the backoff or the queue's stop ends,
        see ``KueueController._requeue``)."""
        self._call(self.cluster.evict_workload, namespace, name, reason, message)

    def set_provisioning(
        self, delay_seconds: float = 0.0, fail: bool = False, message: str | None = None
    ) -> None:
        """How the emulated GKE answers ProvisioningRequests (Kueue's provisioning admission
        check): after ``delay_seconds`` ``Provisioned=True`` (message default "Provisioning Request
        was successfully provisioned."), or ``Failed=True`` (reason ``ProvisioningFailed``) with
        ``message`` when ``fail``. Applies to requests not answered yet."""
        self._call(self.cluster.set_provisioning, delay_seconds, fail, message)

    def preempt_pod(self, namespace: str, name: str, grace_seconds: float | None = None) -> None:
        """GKE node-shutdown preemption of a running pod.

        Adds condition ``DisruptionTarget=True`` (reason ``TerminationByKubelet``), SIGTERMs the
        containers and SIGKILLs them after ``grace_seconds`` (default: the pod's capped
        terminationGracePeriodSeconds). The pod ends ``Failed`` with reason ``Terminated`` and
        message "Pod was terminated in response to imminent node shutdown."
        """
        self._call(self.cluster.preempt_pod, namespace, name, grace_seconds)

    def oom_kill_pod(self, namespace: str, name: str, container: str | None = None) -> None:
        """SIGKILL the pod's container(s); they terminate with exit code 137, reason ``OOMKilled``."""
        self._call(self.cluster.oom_kill_pod, namespace, name, container)

    def rotate_container_log(self, namespace: str, name: str, container: str | None = None) -> None:
        """Rotate the pod's container log as the kubelet does: a stream already following it keeps
        going, a new request (a reconnect) gets only what is written from now on."""
        self._call(self.cluster.rotate_container_log, namespace, name, container)

    def stall_log_streams(self) -> None:
        """Make every log stream open now half-open: connected, silent, never closed by the server."""
        server = self._server
        if server is None:
            raise RuntimeError("ClusterEmulator not started")
        self._call(server.stall_log_streams)

    def end_log_streams(self) -> None:
        """End every log stream open now cleanly (EOF) although its container still runs."""
        server = self._server
        if server is None:
            raise RuntimeError("ClusterEmulator not started")
        self._call(server.end_log_streams)

    def fail_image_pulls(self, image_or_pattern: str | re.Pattern[str], times: int | None = None) -> None:
        """Make pulls of matching images fail (exact name, glob like ``gcr.io/x/*``, or compiled regex).

        Affected containers wait with ``ErrImagePull`` then ``ImagePullBackOff`` (message names the
        image) and Events ``Failed``/``BackOff`` are recorded; they start once the fault is cleared.
        ``times=N``: a transient registry error, only the next N pulls of a matching image fail
        (the kubelet backs off between them) and the one after succeeds.
        """
        faults = self.cluster.faults
        with faults.lock:
            if times is None:
                faults.image_pull_patterns.append(image_or_pattern)
            else:
                faults.image_pull_transient.append([image_or_pattern, int(times)])

    def deny_verb(self, verb: str = "watch", resource: str | None = None) -> None:
        """Answer ``verb`` requests (on ``resource``, a plural like ``jobs``; None: every resource)
        with RBAC's 403 Forbidden, as for an identity whose Role lacks that verb. The API refuses
        ``watch`` and ``list``; other verbs are refused by SelfSubjectAccessReviews only, which
        answer from the same set (``pods/log`` names the log subresource). ``clear_faults``
        restores the verb."""
        faults = self.cluster.faults
        with faults.lock:
            faults.denied_verbs.append((verb, resource))

    def clear_image_pull_failures(self) -> None:
        """Let every image be pulled again."""
        faults = self.cluster.faults
        with faults.lock:
            faults.image_pull_patterns.clear()

    def delay_scheduling(self, seconds: float) -> None:
        """Pretend node pools must scale up: pods stay Pending/Unschedulable for ``seconds`` from now.

        Pending pods get a ``TriggeredScaleUp`` event (cluster-autoscaler) and a
        ``FailedScheduling`` event, then schedule when the time is up. 0 cancels the delay.
        """
        faults = self.cluster.faults
        with faults.lock:
            faults.scale_up_seconds = seconds
            faults.scale_up_until = time.monotonic() + seconds if seconds > 0 else 0.0
        self._call(self.cluster.scheduling_changed)

    def stock_out(self, *pools: str, stocked: bool = True) -> list[str]:
        """Model capacity that never arrives: the node pools named (``fnmatch`` patterns, e.g.
        ``"*-spot"`` or ``"tpu-v6e-slice-4t-2x2-spot"``) cannot scale up, as when GCE has no VMs
        of their kind in the zone (a Spot or TPU stockout). A pod only they would fit stays
        Unschedulable, with the cluster-autoscaler's ``TriggeredScaleUp``, ``FailedScaleUp`` and
        ``NotTriggerScaleUp`` ("in backoff after failed scale-up") events; pods already bound
        keep running. ``stocked=False`` brings the capacity back. Returns the pools changed;
        a pattern that matches no pool is an error (a typo would silently model nothing)."""

        return self._call(self.cluster.stock_out, pools, stocked)

    def delay_exit_reports(self, seconds: float) -> None:
        """A container's exit reaches its pod's status ``seconds`` after its process ended (its
        followed log ends at once), as on a real node where the kubelet relists containers once
        a second and the Job controller batches pod updates for a second (``faults.py``). 0
        (the default) reports exits at once."""
        faults = self.cluster.faults
        with faults.lock:
            faults.exit_report_delay = max(0.0, float(seconds))

    def inject_api_fault(
        self,
        method: str = "*",
        path_regex: str = ".*",
        status: int = 500,
        count: int | None = 1,
        retry_after: float | None = None,
        message: str | None = None,
    ) -> None:
        """Answer the next ``count`` matching API requests (None = all) with ``status`` (500, 429, 503...).

        ``path_regex`` is searched in the path (and in ``path?query``); 429 responses carry
        ``Retry-After`` when ``retry_after`` is given, like API priority and fairness does.
        """
        faults = self.cluster.faults
        with faults.lock:
            faults.api_faults.append(
                ApiFault(method, re.compile(path_regex), int(status), count, retry_after, message)
            )

    def drop_watches(self, after_events: int | None = None, streams: int | None = 1) -> None:
        """Cut watch connections mid-stream (the chunked body never ends cleanly).

        ``after_events=None`` cuts every open watch now; otherwise the next ``streams`` watches
        opened (None = all of them until :meth:`clear_faults`) are cut after ``after_events`` events.
        """
        server = self._server
        if server is None:
            raise RuntimeError("ClusterEmulator not started")
        self._call(server.drop_watches, after_events, streams)

    def clear_faults(self) -> None:
        """Disarm every injected fault (API errors, image pulls, scheduling delay, watch drops)."""
        self.cluster.faults.clear()
        self._call(self.cluster.scheduling_changed)


class EmulatorAdminClient:
    """Fault injection over HTTP for an emulator running in another process (``python -m ...cluster``)."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.url}/_emulator/{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            return json.loads(resp.read() or b"{}")

    def health(self) -> dict[str, Any]:
        """``GET /_emulator/health``."""
        return self._request("GET", "health")

    def requests(self, since: int = 0) -> dict[str, Any]:
        """``GET /_emulator/requests?since=N``: ``{"count": total, "requests": [...]}``."""
        return self._request("GET", f"requests?since={since}")

    def clear_requests(self) -> None:
        """``DELETE /_emulator/requests``."""
        self._request("DELETE", "requests")

    def processes(self) -> list[dict[str, Any]]:
        """``GET /_emulator/processes``."""
        return self._request("GET", "processes")["processes"]

    def evict_workload(
        self, namespace: str, name: str, reason: str = "Preempted", message: str | None = None
    ) -> None:
        """``POST /_emulator/workloads/{ns}/{name}/evict``."""
        self._request("POST", f"workloads/{namespace}/{name}/evict", {"reason": reason, "message": message})

    def set_provisioning(
        self, delay_seconds: float = 0.0, fail: bool = False, message: str | None = None
    ) -> None:
        """``POST /_emulator/kueue/provisioning``."""
        self._request(
            "POST", "kueue/provisioning", {"delay_seconds": delay_seconds, "fail": fail, "message": message}
        )

    def preempt_pod(self, namespace: str, name: str, grace_seconds: float | None = None) -> None:
        """``POST /_emulator/pods/{ns}/{name}/preempt``."""
        self._request("POST", f"pods/{namespace}/{name}/preempt", {"grace_seconds": grace_seconds})

    def oom_kill_pod(self, namespace: str, name: str, container: str | None = None) -> None:
        """``POST /_emulator/pods/{ns}/{name}/oom``."""
        self._request("POST", f"pods/{namespace}/{name}/oom", {"container": container})

    def rotate_container_log(self, namespace: str, name: str, container: str | None = None) -> None:
        """``POST /_emulator/pods/{ns}/{name}/rotate-log``."""
        self._request("POST", f"pods/{namespace}/{name}/rotate-log", {"container": container})

    def stall_log_streams(self) -> None:
        """``POST /_emulator/faults/log-stall``."""
        self._request("POST", "faults/log-stall")

    def end_log_streams(self) -> None:
        """``POST /_emulator/faults/log-end``."""
        self._request("POST", "faults/log-end")

    def fail_image_pulls(self, pattern: str, regex: bool = False, times: int | None = None) -> None:
        """``POST /_emulator/faults/image-pull``."""
        self._request("POST", "faults/image-pull", {"pattern": pattern, "regex": regex, "times": times})

    def deny_verb(self, verb: str = "watch", resource: str | None = None) -> None:
        """``POST /_emulator/faults/deny-verb``."""
        self._request("POST", "faults/deny-verb", {"verb": verb, "resource": resource})

    def clear_image_pull_failures(self) -> None:
        """``DELETE /_emulator/faults/image-pull``."""
        self._request("DELETE", "faults/image-pull")

    def delay_scheduling(self, seconds: float) -> None:
        """``POST /_emulator/faults/scheduling-delay``."""
        self._request("POST", "faults/scheduling-delay", {"seconds": seconds})

    def stock_out(self, *pools: str, stocked: bool = True) -> list[str]:
        """``POST /_emulator/node-pools/stockout``."""
        answer = self._request("POST", "node-pools/stockout", {"pools": list(pools), "stocked": stocked})
        return list(answer["changed"])

    def delay_exit_reports(self, seconds: float) -> None:
        """``POST /_emulator/faults/exit-report-delay``."""
        self._request("POST", "faults/exit-report-delay", {"seconds": seconds})

    def inject_api_fault(
        self,
        method: str = "*",
        path_regex: str = ".*",
        status: int = 500,
        count: int | None = 1,
        retry_after: float | None = None,
        message: str | None = None,
    ) -> None:
        """``POST /_emulator/faults/api``."""
        self._request(
            "POST",
            "faults/api",
            {
                "method": method,
                "path_regex": path_regex,
                "status": status,
                "count": count,
                "retry_after": retry_after,
                "message": message,
            },
        )

    def drop_watches(self, after_events: int | None = None, streams: int | None = 1) -> None:
        """``POST /_emulator/faults/watch-drop``."""
        self._request("POST", "faults/watch-drop", {"after_events": after_events, "streams": streams})

    def clear_faults(self) -> None:
        """``DELETE /_emulator/faults``."""
        self._request("DELETE", "faults")
