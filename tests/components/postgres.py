"""A private, throwaway PostgreSQL server for the real-components tests.

Production Airflow runs on PostgreSQL, and some bugs only show there (row locks
under the scheduler's ``SELECT ... FOR UPDATE SKIP LOCKED``, concurrent
sessions, transaction isolation, the async engine over asyncpg), so the
real-components tier must not only run on SQLite.

``PostgresServer`` never touches the machine's own cluster (``pg_ctlcluster``,
``/var/lib/postgresql``, port 5432): it runs ``initdb`` into a fresh temp dir,
starts ``postgres`` with ``pg_ctl`` on a free 127.0.0.1 port with its socket in
that dir, and ``stop()`` shuts it down and removes the dir. PostgreSQL refuses
to run as root, so when the tests run as root (CI does) the server binaries run
as the ``postgres`` OS user through ``runuser`` and the dir is chowned to it.
Durability is turned off (``fsync``, ``synchronous_commit``,
``full_page_writes``): the data is thrown away anyway and this keeps the
migrations and the scheduler loop fast on a 2-core machine.

Usage::

    with PostgresServer() as pg:
        url = pg.create_database("airflow_a")  # postgresql+psycopg2://postgres@127.0.0.1:PORT/airflow_a
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["PostgresError", "PostgresServer", "find_pg_bindir"]

# Room for several AirflowServices on one server: each of the four services keeps a sync pool
# (pool_size 5 + max_overflow 10) and the api-server an async one as well.
DEFAULT_MAX_CONNECTIONS = 200
# Unix sockets live at <dir>/.s.PGSQL.<port>; sun_path holds 107 bytes plus the terminator.
_MAX_SOCKET_PATH = 107
_DB_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_names = itertools.count(1)


class PostgresError(RuntimeError):
    """The server could not be set up, started, stopped or used (message carries the log tail)."""


def find_pg_bindir() -> Path:
    """Directory holding ``initdb``/``pg_ctl``/``postgres``: Debian does not put them on PATH.

    ``$KINETIC_TEST_PG_BINDIR`` wins; then the newest ``/usr/lib/postgresql/<version>/bin``; then
    ``pg_config --bindir``; then wherever ``initdb`` is on PATH.
    """
    override = os.environ.get("KINETIC_TEST_PG_BINDIR")
    if override:
        path = Path(override)
        if not (path / "initdb").is_file():
            raise PostgresError(f"KINETIC_TEST_PG_BINDIR={override} has no initdb")
        return path
    candidates = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]

    def version(bindir: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", bindir.parent.name)) or (0,)

    if candidates:
        return max(candidates, key=version)
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True)
            bindir = Path(out.stdout.strip())
            if (bindir / "initdb").is_file():
                return bindir
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise PostgresError(
        "PostgreSQL server binaries not found (no /usr/lib/postgresql/*/bin/initdb, pg_config or "
        "initdb on PATH): run scripts/setup.sh as root, or `apt-get install -y postgresql`"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:]) or "<empty>"


class PostgresServer:
    """One private PostgreSQL server in a temp dir; databases are created on demand.

    Trust authentication on 127.0.0.1 and the socket only (the server listens on nothing else), user
    ``postgres``. ``stop()`` is idempotent and also runs at interpreter exit, so a test session that
    dies half-way does not leave a server running.
    """

    def __init__(
        self,
        *,
        base_dir: Path | str | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        settings: dict[str, str] | None = None,
        os_user: str | None = None,
    ) -> None:
        """Describe the server; nothing runs until :meth:`start`.

        :param base_dir: where to make the temp dir (default: the system temp dir). As root it must
            be traversable by ``os_user``, which pytest's 0700 ``tmp_path`` is not.
        :param settings: extra ``postgresql.conf`` settings (values are written verbatim).
        :param os_user: OS user the server runs as; default ``postgres`` when root, else yourself.
        """
        self.bindir = find_pg_bindir()
        self.base_dir = Path(base_dir) if base_dir is not None else Path(tempfile.gettempdir())
        self.max_connections = max_connections
        self.extra_settings = dict(settings or {})
        self.os_user = os_user or ("postgres" if os.geteuid() == 0 else None)
        self.root: Path | None = None
        self.port: int | None = None
        self.host = "127.0.0.1"
        self.user = "postgres"
        self._running = False

    # Paths ------------------------------------------------------------------------------------
    @property
    def data_dir(self) -> Path:
        return self._root() / "data"

    @property
    def log_path(self) -> Path:
        return self._root() / "postgres.log"

    @property
    def socket_dir(self) -> Path:
        return self._root()

    def _root(self) -> Path:
        if self.root is None:
            raise PostgresError("PostgresServer is not started")
        return self.root

    @property
    def pid(self) -> int | None:
        """The postmaster's pid, from ``postmaster.pid`` (None when not running)."""
        try:
            return int(self.data_dir.joinpath("postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError, PostgresError):
            return None

    # Running the binaries ---------------------------------------------------------------------
    def _command(self, binary: str, *args: str) -> list[str]:
        command = [str(self.bindir / binary), *args]
        if self.os_user and self.os_user != _current_user():
            runuser = shutil.which("runuser") or "/usr/sbin/runuser"
            command = [runuser, "-u", self.os_user, "--", *command]
        return command

    def _run(self, binary: str, *args: str, what: str, timeout: float = 120.0) -> str:
        # PG* variables (PGDATA, PGPORT, PGHOST...) of the caller must not redirect us to another cluster.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        command = self._command(binary, *args)
        try:
            proc = subprocess.run(
                command,
                cwd=str(self._root()),  # runuser keeps the cwd, which must be readable by os_user
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise PostgresError(
                f"{what} timed out after {timeout:.0f}s: {' '.join(command)}\n"
                f"----- server log {self.log_path} -----\n{_tail(self.log_path)}"
            ) from exc
        if proc.returncode != 0:
            raise PostgresError(
                f"{what} failed with code {proc.returncode}: {' '.join(command)}\n"
                f"----- output -----\n{(proc.stdout + proc.stderr).strip()}\n"
                f"----- server log {self.log_path} -----\n{_tail(self.log_path)}"
            )
        return proc.stdout

    # Lifecycle --------------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> PostgresServer:
        """initdb + pg_ctl start on a free port; retries on a port taken between probe and bind."""
        if self._running:
            return self
        self.root = Path(tempfile.mkdtemp(prefix="kn-pg-", dir=self.base_dir))
        atexit.register(self.stop)
        try:
            self._prepare_root()
            self._run(
                "initdb",
                "-D",
                str(self.data_dir),
                "-U",
                self.user,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                what="initdb",
            )
            conf = self.data_dir / "postgresql.conf"
            with open(conf, "a", encoding="utf-8") as fh:
                fh.write("\ninclude 'kinetic-test.conf'\n")
            for attempt in range(3):
                self.port = _free_port()
                self._write_settings()
                try:
                    self._run(
                        "pg_ctl",
                        "start",
                        "-D",
                        str(self.data_dir),
                        "-l",
                        str(self.log_path),
                        "-w",
                        "-t",
                        str(int(timeout)),
                        what=f"pg_ctl start (port {self.port})",
                        timeout=timeout + 10,
                    )
                    break
                except PostgresError:
                    if attempt < 2 and "already in use" in _tail(self.log_path, 10):
                        continue  # someone took the port between our probe and the server's bind
                    raise
            self._running = True
            self._wait_accepting(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _prepare_root(self) -> None:
        root = self._root()
        socket_path = root / f".s.PGSQL.{65535}"
        if len(str(socket_path)) > _MAX_SOCKET_PATH:
            raise PostgresError(
                f"socket path {socket_path} is longer than {_MAX_SOCKET_PATH} bytes: use a shorter base_dir"
            )
        if self.os_user and self.os_user != _current_user():
            import pwd

            try:
                entry = pwd.getpwnam(self.os_user)
            except KeyError:
                raise PostgresError(
                    f"OS user {self.os_user!r} does not exist; PostgreSQL refuses to run as root "
                    "(install the Debian package postgresql, which creates it)"
                )
            os.chown(root, entry.pw_uid, entry.pw_gid)
            root.chmod(0o700)
            probe = subprocess.run(
                [
                    shutil.which("runuser") or "/usr/sbin/runuser",
                    "-u",
                    self.os_user,
                    "--",
                    "test",
                    "-w",
                    str(root),
                ],
                capture_output=True,
                check=False,
            )
            if probe.returncode != 0:
                raise PostgresError(
                    f"{root} is not reachable by OS user {self.os_user!r} (a parent dir is not "
                    "traversable): pass a base_dir such as /tmp"
                )

    def _write_settings(self) -> None:
        settings: dict[str, str] = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "max_connections": str(self.max_connections),
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            # Small /dev/shm in containers makes parallel query fail; the test data is tiny anyway.
            "max_parallel_workers_per_gather": "0",
            "logging_collector": "off",
            "log_min_messages": "warning",
        }
        settings.update(self.extra_settings)
        text = "".join(f"{key} = {value}\n" for key, value in settings.items())
        path = self.data_dir / "kinetic-test.conf"
        path.write_text(text)
        if self.os_user and self.os_user != _current_user():
            shutil.chown(path, self.os_user)

    def _wait_accepting(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                self.execute("postgres", "SELECT 1")
                return
            except Exception as exc:  # starting up: "the database system is starting up"
                last = exc
                time.sleep(0.1)
        raise PostgresError(
            f"PostgreSQL on port {self.port} did not accept connections in {timeout:.0f}s ({last!r})\n"
            f"----- server log {self.log_path} -----\n{_tail(self.log_path)}"
        )

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (disconnects clients, no checkpoint wait), then remove the dir. Idempotent."""
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        root = self.root
        if root is None:
            return
        try:
            pid = self.pid
            if pid is not None and _alive(pid):
                try:
                    self._run(
                        "pg_ctl",
                        "stop",
                        "-D",
                        str(self.data_dir),
                        "-m",
                        "fast",
                        "-w",
                        "-t",
                        str(int(timeout)),
                        what="pg_ctl stop",
                        timeout=timeout + 10,
                    )
                except PostgresError:
                    # A hung server must not outlive the test session: SIGQUIT is immediate shutdown.
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGQUIT)
                    deadline = time.monotonic() + 10
                    while _alive(pid) and time.monotonic() < deadline:
                        time.sleep(0.1)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        finally:
            self._running = False
            self.root = None
            shutil.rmtree(root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # Databases --------------------------------------------------------------------------------
    def url(self, database: str, *, driver: str = "psycopg2") -> str:
        """SQLAlchemy URL of ``database`` (trust auth: no password)."""
        if self.port is None:
            raise PostgresError("PostgresServer is not started")
        return f"postgresql+{driver}://{self.user}@{self.host}:{self.port}/{database}"

    def _connect(self, database: str) -> Any:
        try:
            import psycopg2
        except ImportError as exc:  # pragma: no cover - part of the test extras
            raise PostgresError("psycopg2 is missing: pip install -e '.[test]'") from exc
        conn = psycopg2.connect(
            host=self.host, port=self.port, user=self.user, dbname=database, connect_timeout=10
        )
        conn.autocommit = True  # CREATE/DROP DATABASE cannot run inside a transaction
        return conn

    def execute(self, database: str, statement: Any, params: Sequence[Any] | None = None) -> list[tuple]:
        """Run one statement in ``database`` (autocommit); returns its rows, if any."""
        with contextlib.closing(self._connect(database)) as conn, conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def create_database(self, name: str | None = None, *, exist_ok: bool = False) -> str:
        """Create a database (a fresh ``test_<n>`` when ``name`` is None) and return its SQLAlchemy URL."""
        from psycopg2 import sql

        name = name or f"test_{os.getpid()}_{next(_names)}"
        if not _DB_NAME.fullmatch(name):
            raise PostgresError(f"database name {name!r} must match {_DB_NAME.pattern}")
        exists = self.execute("postgres", "SELECT 1 FROM pg_database WHERE datname = %s", (name,))
        if exists:
            if not exist_ok:
                raise PostgresError(f"database {name!r} already exists on port {self.port}")
        else:
            self.execute("postgres", sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, disconnecting its clients first (``WITH (FORCE)``, PostgreSQL 13+)."""
        from psycopg2 import sql

        self.execute(
            "postgres", sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )

    def databases(self) -> list[str]:
        """Names of the non-template databases."""
        rows = self.execute("postgres", "SELECT datname FROM pg_database WHERE NOT datistemplate ORDER BY 1")
        return [row[0] for row in rows]

    def connection_count(self, database: str | None = None) -> int:
        """Client backends connected (to ``database``, or to any), so tests can watch max_connections."""
        query = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
        if database is None:
            return int(self.execute("postgres", query)[0][0]) - 1  # minus this query's own connection
        rows = self.execute("postgres", query + " AND datname = %s", (database,))
        return int(rows[0][0])


def _current_user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def _alive(pid: int) -> bool:
    from kinetic_airflow.backends.local import process_alive

    return process_alive(pid)
