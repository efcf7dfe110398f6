"""The real-components test infrastructure works: private PostgreSQL, Airflow services on it, the emulator.

These are the pieces the scheduler-driven tests stand on (tests/components/). If
one of them breaks, this file says which one in seconds, instead of a component
test timing out with a wall of service logs:

* ``PostgresServer`` starts a private server (never the machine's cluster),
  creates databases SQLAlchemy can use, and leaves nothing behind on stop;
* two ``AirflowServices`` on PostgreSQL at once (own databases, ports, homes)
  both become healthy, and stop leaves no process behind;
* ``EmulatorProcess`` runs a Job POSTed by the kubernetes client to completion,
  its request-log counter sees exactly that one Job creation, and stop ends it
  and its pods;
* with ``EmulatorProcess.airflow_env()``, a ``@task.kinetic`` task run by the
  scheduler goes through kinetic's GKE backend into the emulator: one Job;
* ``RedisServer`` (the Celery broker) answers on its own port, keeps nothing on
  disk, and says how to install ``redis-server`` when it is missing.
"""

from __future__ import annotations

import json
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import sqlalchemy
from components.airflow_services import AirflowServices, group_alive, poll, process_alive
from components.emulator_process import EmulatorProcess
from components.postgres import PostgresError, PostgresServer
from components.redis_server import RedisError, RedisServer

pytestmark = pytest.mark.timeout(240)

GKE_DAG = '''
"""One kinetic task; the backend comes from KINETIC_BACKEND=gke in the services' environment."""

import pendulum
from airflow.sdk import dag, task


@task.kinetic(accelerator="cpu")
def double(x: int) -> dict:
    import os

    return {"value": x * 2, "job": os.environ.get("KINETIC_JOB_ID")}


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def kn_infra_gke():
    double(21)


kn_infra_gke()
'''


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()


# PostgreSQL --------------------------------------------------------------------------------------
def test_postgres_database_is_reachable_with_sqlalchemy(postgres: PostgresServer) -> None:
    url = postgres.create_database("infra_reachable")
    assert url == f"postgresql+psycopg2://postgres@127.0.0.1:{postgres.port}/infra_reachable"
    assert postgres.port != 5432, "must not be (or collide with) the machine's own cluster"
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text("CREATE TABLE t (id int PRIMARY KEY, name text)"))
            conn.execute(sqlalchemy.text("INSERT INTO t VALUES (1, 'kinetic')"))
        with engine.connect() as conn:
            assert conn.execute(sqlalchemy.text("SELECT name FROM t WHERE id = 1")).scalar() == "kinetic"
            settings = dict(
                conn.execute(
                    sqlalchemy.text(
                        "SELECT name, setting FROM pg_settings WHERE name IN "
                        "('max_connections', 'fsync', 'listen_addresses', 'data_directory')"
                    )
                ).all()
            )
    finally:
        engine.dispose()
    assert int(settings["max_connections"]) >= 200
    assert settings["fsync"] == "off"
    assert settings["listen_addresses"] == "127.0.0.1"
    assert settings["data_directory"] == str(postgres.data_dir)
    assert "infra_reachable" in postgres.databases()
    with pytest.raises(PostgresError, match="already exists"):
        postgres.create_database("infra_reachable")
    assert postgres.create_database("infra_reachable", exist_ok=True) == url
    postgres.drop_database("infra_reachable")
    assert "infra_reachable" not in postgres.databases()


def test_postgres_stop_ends_the_server_and_removes_its_dir() -> None:
    server = PostgresServer().start()
    root, pid = server.root, server.pid
    assert root is not None and pid is not None and process_alive(pid)
    server.create_database()  # a fresh test_<n> name
    server.stop()
    assert not root.exists()
    poll(lambda: not process_alive(pid), timeout=10, what=f"postmaster {pid} to exit")
    server.stop()  # idempotent


# Redis (the Celery broker) -----------------------------------------------------------------------
def test_redis_server_serves_a_client_and_stop_removes_everything() -> None:
    import redis

    server = RedisServer().start()
    try:
        client = redis.Redis.from_url(server.url)
        client.lpush("q", b"task")
        assert client.rpop("q") == b"task"
        assert (
            client.config_get("save") == {"save": ""}
            and client.config_get("appendonly")["appendonly"] == "no"
        )
        root, pid = server.dir, server.proc.pid
    finally:
        server.stop()
    assert root is not None and not root.exists()
    assert not process_alive(pid)
    server.stop()  # idempotent


def test_redis_server_takes_another_port_when_its_port_is_taken_before_it_binds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The probe socket is closed before redis binds: a server of another xdist process can take the
    port in between. The first port handed out here is held by a listening socket."""
    import socket

    import components.redis_server as redis_server

    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    ports = iter([taken])
    real_free_port = redis_server.free_port
    monkeypatch.setattr(redis_server, "free_port", lambda: next(ports, None) or real_free_port())
    server = RedisServer()
    try:
        server.start()
        assert server.port != taken and server.ping()
    finally:
        server.stop()
        holder.close()


def test_missing_redis_server_names_the_install_script(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(Path, "is_file", lambda self: False)
    with pytest.raises(RedisError, match=r"scripts/debian-install\.sh Redis redis-server"):
        RedisServer().start()


# Airflow services on PostgreSQL ------------------------------------------------------------------
def test_two_airflow_deployments_on_postgres_are_healthy_and_stop_clean(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    deployments = [
        AirflowServices(tmp_path / name, dags, database_url=postgres.create_database(name), parallelism=4)
        for name in ("airflow_a", "airflow_b")
    ]
    a, b = deployments
    assert a.port != b.port
    for key in ("AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT", "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"):
        assert a.env[key] != b.env[key]
    errors: dict[str, BaseException] = {}

    def start(services: AirflowServices) -> None:
        try:
            services.start(timeout=150)
        except BaseException as exc:
            errors[services.root.name] = exc

    try:
        threads = [threading.Thread(target=start, args=(s,)) for s in deployments]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, "\n\n".join(f"{name}: {exc}" for name, exc in errors.items())
        for services in deployments:
            health = services.wait_healthy(30)
            assert health["metadatabase"]["status"] == "healthy"
            database = services.database_url.rsplit("/", 1)[1]
            # The metadata really is in this deployment's PostgreSQL database, not in a SQLite file.
            assert postgres.execute(database, "SELECT count(*) FROM alembic_version")[0][0] == 1
            jobs = postgres.execute(database, "SELECT DISTINCT job_type FROM job WHERE state = 'running'")
            assert {row[0] for row in jobs} >= {"SchedulerJob", "TriggererJob", "DagProcessorJob"}
            assert not list(services.home.glob("*.db"))
        assert postgres.connection_count() < postgres.max_connections // 2
    finally:
        for services in deployments:
            services.stop()
    for services in deployments:
        for name, proc in services.procs.items():
            assert proc.returncode is not None, f"{name} still running"
            assert not group_alive(proc.pid), f"{name}'s process group {proc.pid} still has members"
        leftovers = services.leftover_processes()
        assert not leftovers, f"processes left behind by {services.root.name}: {leftovers}"


# Cluster emulator as a process -------------------------------------------------------------------
def _job_manifest(name: str, command: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"app": "infra-test"}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "ignored:latest", "command": command}],
                }
            },
        },
    }


def test_emulator_process_runs_a_job_and_counts_one_creation(tmp_path: Path) -> None:
    import kubernetes

    emulator = EmulatorProcess(tmp_path / "emulator").start()
    try:
        assert emulator.kubeconfig.is_file()
        api = emulator.api_client()
        batch = kubernetes.client.BatchV1Api(api)
        core = kubernetes.client.CoreV1Api(api)
        nodes = {n.metadata.labels.get("cloud.google.com/gke-nodepool") for n in core.list_node().items}
        assert {"cpu", "cpu-spot", "l4", "v6e"} <= nodes
        mark = emulator.request_mark()
        batch.create_namespaced_job(
            "default", _job_manifest("infra-hello", ["sh", "-c", "echo hello; sleep 0.5"])
        )
        # Neither a refused duplicate (409) nor a dry run creates a Job: the counter must not count them.
        with pytest.raises(kubernetes.client.ApiException) as refused:
            batch.create_namespaced_job("default", _job_manifest("infra-hello", ["true"]))
        assert refused.value.status == 409
        batch.create_namespaced_job("default", _job_manifest("infra-dry", ["true"]), dry_run="All")

        def complete() -> Any:
            job = batch.read_namespaced_job_status("infra-hello", "default")
            if job.status.failed:
                raise AssertionError(f"job failed: {job.status}\n{emulator.diagnostics()}")
            return job if job.status.succeeded == 1 else None

        poll(
            complete,
            timeout=30,
            interval=0.2,
            what="Job infra-hello to complete",
            diagnostics=emulator.diagnostics,
        )
        (pod,) = core.list_namespaced_pod("default", label_selector="job-name=infra-hello").items
        log = core.read_namespaced_pod_log(pod.metadata.name, "default", _preload_content=False).data.decode()
        assert "hello" in log
        assert emulator.job_creations(since=mark) == 1
        assert emulator.job_creations("default", since=mark) == 1
        assert emulator.job_creations("kube-system", since=mark) == 0
        assert (
            len(emulator.creations("jobs", since=mark, successful=False)) == 2
        )  # + the 409, not the dry run
        # A pod still running at stop is killed by the emulator (or by the sweep), never left behind.
        batch.create_namespaced_job("default", _job_manifest("infra-sleeper", ["sleep", "300"]))
        poll(lambda: emulator.admin.processes(), timeout=15, interval=0.1, what="the sleeper pod to run")
        assert emulator.leftover_processes()
    finally:
        code = emulator.stop()
    assert code == 0, emulator.diagnostics()
    assert not emulator.leftover_processes()


# Both together: kinetic's GKE backend from a scheduler-run task ----------------------------------
def test_scheduler_run_task_creates_one_job_in_the_emulator_process(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    import kubernetes

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "kn_infra_gke.py").write_text(textwrap.dedent(GKE_DAG))
    emulator = EmulatorProcess(tmp_path / "emulator").start()
    services = AirflowServices(
        tmp_path / "airflow",
        dags,
        database_url=postgres.create_database("airflow_gke"),
        extra_env={
            **emulator.airflow_env(),
            "KINETIC_BASE_URI": f"file://{tmp_path / 'kinetic'}",
            "KINETIC_POLL_INTERVAL": "0.5",
        },
    )

    def why() -> str:
        return f"{services.diagnostics('kn_infra_gke')}\n{emulator.diagnostics()}"

    try:
        services.start()
        poll(
            lambda: services.api("GET", "/api/v2/dags/kn_infra_gke")["dag_id"],
            timeout=90,
            what="DAG kn_infra_gke to be parsed",
            diagnostics=lambda: json.dumps(services.api("GET", "/api/v2/importErrors"), indent=1) + why(),
        )
        mark = emulator.request_mark()
        services.api("PATCH", "/api/v2/dags/kn_infra_gke", {"is_paused": False})
        run_id = services.api(
            "POST", "/api/v2/dags/kn_infra_gke/dagRuns", {"logical_date": None, "conf": {}}
        )["dag_run_id"]
        run_path = f"/api/v2/dags/kn_infra_gke/dagRuns/{quote(run_id, safe='')}"

        def finished() -> str | None:
            state = services.api("GET", run_path)["state"]
            return state if state in ("success", "failed") else None

        state = poll(finished, timeout=150, interval=1.0, what="the run to finish", diagnostics=why)
        assert state == "success", why()
        xcom = services.api(
            "GET", f"{run_path}/taskInstances/double/xcomEntries/return_value?deserialize=true"
        )["value"]
        assert xcom["value"] == 42, xcom
        assert emulator.job_creations("default", since=mark) == 1, why()
        jobs = kubernetes.client.BatchV1Api(emulator.api_client()).list_namespaced_job(
            "default", label_selector="app=kinetic"
        )
        assert len(jobs.items) == 1 and jobs.items[0].status.succeeded == 1
    finally:
        services.stop()
        services.kill_leftovers()
        code = emulator.stop()
    assert code == 0
    assert not services.leftover_processes() and not emulator.leftover_processes()


def test_airflow_services_still_default_to_sqlite(tmp_path: Path) -> None:
    """Existing callers pass no database_url: they keep a SQLite DB in the home (nothing is started here)."""
    services = AirflowServices(tmp_path, tmp_path / "dags", extra_env={"AIRFLOW__CORE__PARALLELISM": "8"})
    assert services.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{services.home / 'airflow.db'}"
    assert services.env["AIRFLOW__CORE__PARALLELISM"] == "8"
