"""Run real Airflow 3.3 services (api-server, scheduler, dag-processor, triggerer) for tests.

``AirflowServices`` makes a throwaway AIRFLOW_HOME, migrates its metadata DB,
starts the four services as subprocesses with an explicit environment, waits
until ``/api/v2/monitor/health`` reports them all healthy, and stops them again.
The REST API runs with the simple auth manager in "all admins" mode, so requests
need no token.

The metadata DB is SQLite in the home by default (Airflow 3 accepts SQLite with
the LocalExecutor: task processes reach the DB only through the api-server's
execution API, and ``airflow standalone`` runs the same shape). Production runs
on PostgreSQL, so pass ``database_url=`` (e.g. from
``tests/components/postgres.py``'s ``PostgresServer.create_database``) to run the
services on it; Airflow derives its async (asyncpg) URL from it.

Several instances may run at once: each has its own home, api port, log-server
ports, bundle storage dir and PID files (Airflow writes those under
AIRFLOW_HOME); on PostgreSQL give each its own database.

With ``executor="CeleryExecutor"`` (and ``celery_broker_url=``, e.g. from
``tests/components/redis_server.py``) it also starts ``celery_workers`` Celery
workers (``airflow celery worker``, distinct hostnames ``kn-worker-<n>@<host>``,
``worker_concurrency`` pool processes each); the Celery result backend is the
metadata DB (``db+`` its URL), as Airflow's own default does.

Each service runs in its own session (process group). ``stop`` sends SIGTERM to
every service, waits for each, and then SIGKILLs whatever is left in their
process groups (LocalExecutor workers, parsing processes, uvicorn workers).
Everything the services start inherits a marker variable, so
``leftover_processes()`` also finds processes that left those groups (kinetic's
detached local-backend jobs) and ``kill_leftovers()`` ends them.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from kinetic_airflow.backends.local import process_alive

from .processes import MARKER_VAR, kill_marked, marked_processes, new_marker

__all__ = ["AirflowServices", "ServiceError", "poll", "process_alive"]

T = TypeVar("T")

SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer")
# Stop the producers of work first; the api-server serves the execution API to running tasks.
STOP_ORDER = ("scheduler", "triggerer", "dag-processor", "api-server")
EXECUTORS = ("LocalExecutor", "CeleryExecutor")
CELERY_WORKER_PREFIX = "celery-worker-"


class ServiceError(AssertionError):
    """A service did not come up, died, or a wait timed out (message carries diagnostics)."""


# Ports handed out by free_port in this process: the probe socket is closed before the service binds, so
# without this two AirflowServices built back to back could be given the same "free" port.
_handed_out: set[int] = set()


def free_port() -> int:
    """A free 127.0.0.1 TCP port not handed out before by this process."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise ServiceError("no free port found that was not handed out already")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies keep a group "alive" for killpg(0); only count members that still run.
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def _session_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


def session_members(sid: int) -> list[int]:
    """Pids of the processes in session ``sid`` (zombies included: they are harmless to signal)."""
    return [
        int(stat.parent.name)
        for stat in Path("/proc").glob("[0-9]*/stat")
        if _session_of(int(stat.parent.name)) == sid
    ]


def poll(
    check: Callable[[], T],
    *,
    timeout: float,
    what: str,
    interval: float = 0.5,
    diagnostics: Callable[[], str] | None = None,
) -> T:
    """Call ``check`` until it returns a truthy value; raise ServiceError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = check()
        except ServiceError:
            raise
        except Exception as exc:  # not ready yet (connection refused, 404, half-written file)
            value, last_error = None, exc
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            extra = f"\n{diagnostics()}" if diagnostics else ""
            raise ServiceError(f"timed out after {timeout:.0f}s waiting for {what}{detail}{extra}")
        time.sleep(interval)


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


class AirflowServices:
    """The Airflow 3 services of one throwaway deployment (LocalExecutor, or CeleryExecutor with its
    workers), driven over REST."""

    def __init__(
        self,
        root: Path,
        dags_folder: Path,
        *,
        extra_env: dict[str, str] | None = None,
        parallelism: int = 4,
        database_url: str | None = None,
        niceness: dict[str, int] | None = None,
        executor: str = "LocalExecutor",
        celery_broker_url: str | None = None,
        celery_workers: int = 2,
        worker_concurrency: int = 2,
    ) -> None:
        """Describe the deployment; nothing runs until :meth:`start`.

        :param root: a directory of its own (home, service logs); must not be shared with another instance.
        :param extra_env: added last to the services' environment, so it can override any setting.
        :param parallelism: ``[core] parallelism``, the LocalExecutor's worker count.
        :param database_url: SQLAlchemy URL of an empty metadata DB (e.g. PostgreSQL); default SQLite.
        :param niceness: service name -> ``nice`` value it (and every process it starts) runs at.
        :param executor: ``LocalExecutor`` (default) or ``CeleryExecutor``.
        :param celery_broker_url: the Celery broker (required with ``CeleryExecutor``).
        :param celery_workers: how many ``airflow celery worker`` processes to start.
        :param worker_concurrency: each Celery worker's pool size (``--concurrency``).
        """
        if executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, not {executor!r}")
        if executor == "CeleryExecutor" and not celery_broker_url:
            raise ValueError("CeleryExecutor needs celery_broker_url= (tests/components/redis_server.py)")
        self.root = Path(root)
        self.home = self.root / "airflow-home"
        self.logs = self.root / "service-logs"
        self.dags_folder = Path(dags_folder)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.database_url = database_url or f"sqlite:///{self.home / 'airflow.db'}"
        self.marker = new_marker("airflow")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.executor = executor
        self.worker_concurrency = worker_concurrency
        workers = celery_workers if executor == "CeleryExecutor" else 0
        self.workers = tuple(f"{CELERY_WORKER_PREFIX}{n}" for n in range(1, workers + 1))
        self.services = (*SERVICES, *self.workers)
        self.env = self._environment(extra_env or {}, parallelism, celery_broker_url)
        self.niceness = dict(niceness or {})

    # Environment ------------------------------------------------------------------------------
    def _environment(self, extra: dict[str, str], parallelism: int, broker_url: str | None) -> dict[str, str]:
        # Start from the caller's environment minus every Airflow/kinetic setting: the in-process
        # tests (tests/conftest.py) set their own AIRFLOW_HOME etc. in os.environ.
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AIRFLOW_", "AIRFLOW__", "KINETIC_", "PYTEST_"))
        }
        venv_bin = str(Path(sys.executable).parent)  # airflow's console scripts; not resolved on purpose
        env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "/usr/bin:/bin")])
        fernet_key = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()
        env.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
                "AIRFLOW__CORE__EXECUTOR": self.executor,
                "AIRFLOW__CORE__PARALLELISM": str(parallelism),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__FERNET_KEY": fernet_key,
                "AIRFLOW__CORE__ALLOWED_DESERIALIZATION_CLASSES": "airflow.* kinetic_airflow.*",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
                "AIRFLOW__CORE__AUTH_MANAGER": (
                    "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
                ),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.database_url,
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__BASE_URL": self.base_url,
                "AIRFLOW__API__WORKERS": "1",
                # One secret for every process: the scheduler signs the task JWTs the api-server checks.
                "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
                "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
                "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
                "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
                # Off by default, but it would bind the fixed port 8974 in every instance.
                "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
                # Default is <tmp>/airflow/dag_bundles, shared by every Airflow on the machine.
                "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_STORAGE_PATH": str(self.home / "dag-bundles"),
                "PYTHONUNBUFFERED": "1",
                MARKER_VAR: self.marker,
            }
        )
        if self.executor == "CeleryExecutor":
            assert broker_url is not None
            env.update(
                {
                    "AIRFLOW__CELERY__BROKER_URL": broker_url,
                    # Task states in the metadata DB (PostgreSQL), where the scheduler reads them.
                    "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{self.database_url}",
                    "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(self.worker_concurrency),
                    # Airflow's default (a day), said explicitly: its absence is logged as a warning.
                    "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "86400",
                }
            )
        env.update(extra)
        return env

    # Lifecycle --------------------------------------------------------------------------------
    def migrate(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        out = self.logs / "db-migrate.log"
        with open(out, "wb") as fh:
            code = subprocess.run(
                ["airflow", "db", "migrate"], env=self.env, stdout=fh, stderr=subprocess.STDOUT, check=False
            ).returncode
        if code != 0:
            raise ServiceError(f"airflow db migrate failed with code {code}:\n{_tail(out, 60)}")

    def start(self, timeout: float = 120.0) -> None:
        self.migrate()
        for name in self.services:
            self._spawn(name)
        self.wait_healthy(timeout)

    def _command(self, name: str) -> list[str]:
        if name in self.workers:
            return [
                "airflow", "celery", "worker",
                "--celery-hostname", f"kn-worker-{name.removeprefix(CELERY_WORKER_PREFIX)}@%h",
                "--concurrency", str(self.worker_concurrency),
                # Not the default, AIRFLOW_HOME/airflow-worker.pid: the workers share the home.
                "--pid", str(self.root / f"{name}.pid"),
                "--skip-serve-logs",
            ]  # fmt: skip
        command = ["airflow", name]
        if name in ("scheduler", "triggerer"):
            command.append("--skip-serve-logs")  # the tests read log files directly
        return command

    def _spawn(self, name: str) -> None:
        command = self._command(name)
        if name in self.niceness:
            command = ["nice", "-n", str(self.niceness[name]), *command]
        with open(self.logs / f"{name}.log", "ab") as fh:
            self.procs[name] = subprocess.Popen(
                command,
                env=self.env,
                cwd=str(self.root),
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill_service(
        self, name: str, sig: int = signal.SIGKILL, timeout: float = 30.0, *, whole_session: bool = False
    ) -> None:
        """Crash (SIGKILL, default) or stop (SIGTERM) one service and everything in its process group.

        The LocalExecutor's workers live in the scheduler's group, so killing the scheduler also
        kills the task processes it runs (as a crashed scheduler host would). A task process puts
        itself in a process group of its own (Airflow's supervisor does ``setpgid``) but stays in
        the service's session: ``whole_session=True`` kills those too, as a crashed worker host
        would (kinetic's local-backend jobs start sessions of their own and survive, as a remote
        job would).
        """
        proc = self.procs[name]
        if whole_session:
            for pid in session_members(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        poll(lambda: not group_alive(proc.pid), timeout=10, interval=0.1, what=f"{name}'s processes to exit")

    def start_service(self, name: str, timeout: float = 120.0) -> None:
        """Start one service again (after ``kill_service``) and wait until everything is healthy."""
        self._spawn(name)
        self.wait_healthy(timeout)

    def service_of(self, pid: int) -> str | None:
        """The service whose session ``pid`` runs in (e.g. the Celery worker of a task process)."""
        sid = _session_of(pid)
        return next((name for name, proc in self.procs.items() if proc.pid == sid), None)

    def check_running(self) -> None:
        dead = {name: p.returncode for name, p in self.procs.items() if p.poll() is not None}
        if dead:
            raise ServiceError(f"Airflow services exited: {dead}\n{self.diagnostics()}")

    def wait_healthy(self, timeout: float) -> dict[str, Any]:
        def healthy() -> dict[str, Any] | None:
            self.check_running()
            health = self.api("GET", "/api/v2/monitor/health")
            parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
            ok = all((health.get(p) or {}).get("status") == "healthy" for p in parts)
            return health if ok and all(self._worker_ready(w) for w in self.workers) else None

        return poll(
            healthy, timeout=timeout, what="all Airflow services healthy", diagnostics=self.diagnostics
        )

    def _worker_ready(self, name: str) -> bool:
        """A Celery worker logs ``<hostname> ready.`` once it consumes its queue; ours log to a file
        per start (appended), so the last start's line is after the last ``[config]`` banner."""
        text = _tail(self.logs / f"{name}.log", 400)
        return " ready." in text.rsplit("[config]", 1)[-1]

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM each service, wait, then SIGKILL anything left in its process group."""
        # Celery workers after the scheduler (no new work) and before the api-server (their tasks'
        # execution API); SIGTERM is a Celery worker's warm shutdown: it waits for running tasks.
        order = (STOP_ORDER[0], *self.workers, *STOP_ORDER[1:])
        for name in order:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name in order:
            proc = self.procs.get(name)
            if proc is None:
                continue
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        # The leaders are gone; their children (task workers, parsers, uvicorn workers) must be too.
        for name in order:
            proc = self.procs.get(name)
            if proc is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(ServiceError):
                poll(lambda p=proc: not group_alive(p.pid), timeout=5, interval=0.2, what="group exit")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def leftover_processes(self) -> list[int]:
        """Pids of live processes started by these services (any session), e.g. to assert none after stop."""
        return marked_processes(self.marker)

    def kill_leftovers(self, grace: float = 3.0) -> list[int]:
        """End every process the services started, detached job processes included; returns their pids.

        Not part of :meth:`stop`: a test that restarts the services may want a job to outlive them.
        """
        return kill_marked(self.marker, grace=grace)

    # REST API ---------------------------------------------------------------------------------
    def auth_headers(self, path: str) -> dict[str, str]:
        """Credentials for a REST call; none by default (all-admins mode)."""
        return {}

    def api(self, method: str, path: str, body: Any = None, *, timeout: float = 30.0) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json",
                **self.auth_headers(path),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise RuntimeError(f"{method} {path} -> HTTP {exc.code}: {detail}") from None
        return json.loads(text) if text else None

    # Diagnostics ------------------------------------------------------------------------------
    def task_log_files(self, dag_id: str | None = None) -> list[Path]:
        base = self.home / "logs"
        pattern = f"dag_id={dag_id}/**/*.log" if dag_id else "dag_id=*/**/*.log"
        return sorted(base.glob(pattern))

    def diagnostics(self, dag_id: str | None = None, lines: int = 40, extra: Iterable[Path] = ()) -> str:
        parts = []
        for name in self.services:
            proc = self.procs.get(name)
            state = "not started" if proc is None else f"pid {proc.pid}, returncode {proc.poll()}"
            parts.append(f"----- {name} ({state}), last {lines} lines -----")
            parts.append(_tail(self.logs / f"{name}.log", lines))
        for path in [*self.task_log_files(dag_id), *extra]:
            parts.append(f"----- {path} -----")
            parts.append(_tail(path, lines))
        return "\n".join(parts)
