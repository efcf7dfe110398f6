"""The Kubernetes cluster emulator as a separate process, for real Airflow services to use.

The in-process ``ClusterEmulator`` serves the test process only; the scheduler,
triggerer and task workers of ``AirflowServices`` are other processes and need a
cluster they can reach through a kubeconfig, as they would reach GKE. This runs
``python -m cluster_emulator`` (see that package's README),
waits for its ``READY <url>`` line, and gives the tests:

* ``product_kubeconfig`` and ``airflow_env()``: what the services need so kinetic's GKE
  backend talks to this emulator (the same settings as tests/test_gke_backend.py's
  ``gke_env`` fixture, plus ``KINETIC_BACKEND=gke``), as the service account bound to exactly
  the Role ``kinetic-airflow doctor --print-rbac`` prints (tests/emulated_cluster.py), in
  ``default`` and every namespace given; ``kubeconfig`` and ``api_client()`` are the admin's;
* ``admin`` (``EmulatorAdminClient``: faults, processes) and ``job_creations()``,
  which counts Job creations in the emulator's request log, e.g. to prove a retry
  or a triggerer restart did not submit a Job twice;
* ``stop()``: SIGTERM (the emulator then kills every pod process and exits 0),
  SIGKILL of its process group after a timeout, and a sweep for pod processes
  that outlived it (pods run in sessions of their own, so only the marker
  variable of ``processes.py`` finds them).

Pods inherit the emulator's environment, so it starts from the caller's minus
every ``AIRFLOW_*`` / ``KINETIC_*`` / ``PYTEST_*`` variable: a job must not work
only because the test process's Airflow settings leaked into it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from cluster_emulator import NodePool
from cluster_emulator.emulator import EmulatorAdminClient
from emulated_cluster import grant_printed_role, product_token

from .processes import MARKER_VAR, kill_marked, marked_processes, new_marker

__all__ = ["DEFAULT_NODE_POOLS", "EmulatorError", "EmulatorProcess", "RequestRecord"]

# As tests/test_gke_backend.py: CPU (on-demand and Spot), an L4 GPU pool, and a v6e TPU pool of any topology.
DEFAULT_NODE_POOLS: tuple[NodePool, ...] = (
    NodePool("cpu", {}),
    NodePool("cpu-spot", {"cloud.google.com/gke-spot": "true"}),
    NodePool("l4", {"cloud.google.com/gke-accelerator": "nvidia-l4"}),
    NodePool(
        "v6e",
        {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice", "cloud.google.com/gke-tpu-topology": "*"},
    ),
)
DEFAULT_CONN_ID = "kinetic_emulator"
DEFAULT_IMAGE = "kinetic-runner:test"

# Collection paths: /api/v1/namespaces/<ns>/pods, /apis/batch/v1/namespaces/<ns>/jobs, ...
_COLLECTION = re.compile(
    r"^/apis?/(?:(?P<group>[^/]+)/)?(?P<version>v[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<res>[^/]+)/?$"
)


class EmulatorError(AssertionError):
    """The emulator did not start, died, or did not stop (message carries its log tail)."""


@dataclass(frozen=True)
class RequestRecord:
    """One Kubernetes API request the emulator served (its admin API is not recorded)."""

    seq: int
    method: str
    path: str
    query: str
    status: int | None
    watch: bool

    @property
    def dry_run(self) -> bool:
        return "dryRun=" in self.query


def _pool_dict(pool: NodePool | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(pool, Mapping):
        return dict(pool)
    return {
        "name": pool.name,
        "labels": dict(pool.labels),
        "taints": [t.to_dict() for t in pool.taint_objects()],
        "node_count": pool.node_count,
    }


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:]) or "<empty>"


class EmulatorProcess:
    """``python -m cluster_emulator`` in its own session, with a kubeconfig in ``root``."""

    def __init__(
        self,
        root: Path | str,
        *,
        node_pools: Sequence[NodePool | Mapping[str, Any]] = DEFAULT_NODE_POOLS,
        namespaces: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_level: str = "WARNING",
        max_grace_seconds: float | None = None,
    ) -> None:
        """Describe the emulator; nothing runs until :meth:`start`.

        :param root: a directory of its own: kubeconfig, node-pools.json, emulator.log, pod logs (work/).
        :param namespaces: created besides default, kube-system, kube-public, kube-node-lease.
        :param env: added to the emulator's (and so every pod's) environment.
        """
        self.root = Path(root)
        self.kubeconfig = self.root / "kubeconfig"  # the admin's
        self.product_kubeconfig = self.root / "kubeconfig-kinetic"  # the printed Role's account
        self.log_path = self.root / "emulator.log"
        self.work_dir = self.root / "work"
        self.node_pools = [_pool_dict(p) for p in node_pools]
        self.namespaces = list(namespaces)
        self.extra_env = dict(env or {})
        self.log_level = log_level
        self.max_grace_seconds = max_grace_seconds
        self.marker = new_marker("emulator")
        self.proc: subprocess.Popen[bytes] | None = None
        self.url: str | None = None
        self._admin: EmulatorAdminClient | None = None

    # Lifecycle --------------------------------------------------------------------------------
    def _environment(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AIRFLOW_", "AIRFLOW__", "KINETIC_", "PYTEST_", MARKER_VAR))
        }
        venv_bin = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "/usr/bin:/bin")])
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        env[MARKER_VAR] = self.marker
        return env

    def command(self) -> list[str]:
        """The emulator's command line (``--port 0``: it binds a free port and prints it)."""
        command = [
            sys.executable,
            "-m",
            "cluster_emulator",
            "--port",
            "0",
            "--kubeconfig",
            str(self.kubeconfig),
            "--work-dir",
            str(self.work_dir),
            "--node-pools",
            str(self.root / "node-pools.json"),
            "--log-level",
            self.log_level,
        ]
        for namespace in self.namespaces:
            command += ["--create-namespace", namespace]
        if self.max_grace_seconds is not None:
            command += ["--max-grace-seconds", str(self.max_grace_seconds)]
        return command

    def start(self, timeout: float = 30.0) -> EmulatorProcess:
        """Start it and wait for ``READY <url>`` (about a second); raise EmulatorError with its log."""
        if self.proc is not None:
            return self
        self.root.mkdir(parents=True, exist_ok=True)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        (self.root / "node-pools.json").write_text(json.dumps(self.node_pools, indent=2))
        # stdout to a file, not a pipe: nobody would drain a pipe after READY, and a full pipe blocks.
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                env=self._environment(),
                cwd=str(self.root),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self.url = self._wait_ready(timeout)
            self._admin = EmulatorAdminClient(self.url)
            self.admin.health()
            self._grant_product_role()
        except BaseException:
            self.stop()
            raise
        return self

    def _grant_product_role(self) -> None:
        """kinetic's identity: the printed Role in default and each extra namespace, and a
        kubeconfig holding its service account's token beside the admin's."""
        assert self.url is not None
        for namespace in dict.fromkeys(["default", *self.namespaces]):
            grant_printed_role(self.url, namespace)
        config = yaml.safe_load(self.kubeconfig.read_text())
        config["users"][0]["user"] = {"token": product_token(self.url)}
        self.product_kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        self.product_kubeconfig.chmod(0o600)

    def _wait_ready(self, timeout: float) -> str:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError):
                for line in self.log_path.read_text(errors="replace").splitlines():
                    if line.startswith("READY "):
                        return line.split(None, 1)[1].strip()
            if self.proc.poll() is not None:
                raise EmulatorError(
                    f"cluster emulator exited with code {self.proc.returncode} before READY\n"
                    f"{' '.join(self.command())}\n----- {self.log_path} -----\n{_tail(self.log_path)}"
                )
            if time.monotonic() >= deadline:
                raise EmulatorError(
                    f"cluster emulator printed no READY line in {timeout:.0f}s\n"
                    f"----- {self.log_path} -----\n{_tail(self.log_path)}"
                )
            time.sleep(0.05)

    def check_running(self) -> None:
        """Raise EmulatorError if the emulator process has exited."""
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise EmulatorError(f"cluster emulator is not running (code {code})\n{_tail(self.log_path)}")

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait (it kills its pods first); SIGKILL its group on timeout; sweep leftover pods.

        Returns the emulator's exit code (0 after a clean shutdown). Idempotent.
        """
        proc = self.proc
        if proc is None:
            return None
        code: int | None = None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait(timeout=10)
        else:
            code = proc.returncode
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything left in its own group
        kill_marked(self.marker, grace=2.0)  # pods: each in a session of its own
        self.proc = None
        self._admin = None
        return code

    def leftover_processes(self) -> list[int]:
        """Live processes started by the emulator (itself, pods), e.g. to assert none after stop."""
        return marked_processes(self.marker)

    def __enter__(self) -> EmulatorProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # Talking to it ----------------------------------------------------------------------------
    @property
    def admin(self) -> EmulatorAdminClient:
        """Admin/fault API of the running emulator (``/_emulator/...``)."""
        if self._admin is None:
            raise EmulatorError("cluster emulator is not started")
        return self._admin

    def airflow_env(
        self,
        *,
        conn_id: str = DEFAULT_CONN_ID,
        namespace: str = "default",
        image: str = DEFAULT_IMAGE,
        runner_python: str | None = None,
    ) -> dict[str, str]:
        """Environment for AirflowServices (``extra_env=``) so kinetic's GKE backend uses this emulator.

        A kubernetes connection with the path of the kubeconfig of kinetic's service account (no
        GCP credentials), the pod's Python is this venv's (pods are local processes, the image is
        ignored).
        The job storage (``KINETIC_BASE_URI``) stays the caller's choice.
        """
        conn = {
            "conn_type": "kubernetes",
            "extra": {"kube_config_path": str(self.product_kubeconfig), "namespace": namespace},
        }
        return {
            f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(conn),
            "KINETIC_KUBERNETES_CONN_ID": conn_id,
            "KINETIC_BACKEND": "gke",
            "KINETIC_NAMESPACE": namespace,
            "KINETIC_RUNNER_PYTHON": runner_python or sys.executable,
            "KINETIC_CONTAINER_IMAGE": image,
        }

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for this emulator, from its kubeconfig."""
        import kubernetes

        return kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))

    # Request log ------------------------------------------------------------------------------
    def request_mark(self) -> int:
        """Sequence number of the last request served so far: pass to ``since=`` to count from now."""
        return int(self.admin.requests(since=2**62)["count"])

    def requests(self, since: int = 0) -> list[RequestRecord]:
        """Requests recorded after sequence number ``since`` (the log keeps the last 200,000)."""
        raw = self.admin.requests(since=since)["requests"]
        return [
            RequestRecord(
                seq=int(r["seq"]),
                method=str(r["method"]),
                path=str(r["path"]),
                query=str(r.get("query") or ""),
                status=r.get("status"),
                watch=bool(r.get("watch")),
            )
            for r in raw
        ]

    def creations(
        self,
        resource: str = "jobs",
        *,
        namespace: str | None = None,
        since: int = 0,
        successful: bool = True,
    ) -> list[RequestRecord]:
        """POSTs creating ``resource`` (plural, e.g. ``jobs``, ``leaderworkersets``, ``pods``).

        ``successful`` keeps only those answered 201 (a refused duplicate, 409, created nothing);
        dry runs never count.
        """
        found = []
        for record in self.requests(since):
            match = _COLLECTION.match(record.path)
            if record.method != "POST" or not match or match["res"] != resource or record.dry_run:
                continue
            if namespace is not None and match["ns"] != namespace:
                continue
            if successful and record.status != 201:
                continue
            found.append(record)
        return found

    def job_creations(self, namespace: str | None = None, *, since: int = 0) -> int:
        """How many batch/v1 Jobs were created (201) since request ``since``, in ``namespace`` or any."""
        return len(self.creations("jobs", namespace=namespace, since=since))

    def diagnostics(self, lines: int = 40) -> str:
        """The emulator's log tail and its live pod processes, for assertion messages."""
        parts = [f"----- {self.log_path}, last {lines} lines -----", _tail(self.log_path, lines)]
        with contextlib.suppress(Exception):
            parts.append(f"----- pod processes -----\n{json.dumps(self.admin.processes(), indent=1)}")
        return "\n".join(parts)
