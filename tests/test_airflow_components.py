"""One run through real Airflow services: api-server, scheduler, dag-processor, triggerer.

``dag.test()`` imports DAG files under their plain names in the test process, which
hides the by-reference pickling bug: production workers import a DAG file as
``unusual_prefix_<sha1>_<file>``, a module that does not exist in the job process,
and sibling modules of the DAG file are only importable where the DAG folder is on
``sys.path``. cloudpickle pickles module-level functions and classes by reference,
so without ``kinetic_airflow.job.payload.register_dag_modules_by_value`` the job fails
to unpickle its payload with ``ModuleNotFoundError`` and ``test_scheduler_run_*``
fails (the run ends ``failed``). The test also checks, from inside the job, that
neither module is importable there, so it cannot pass "by accident" because the
DAG folder leaked onto the job's path.

The services use a throwaway AIRFLOW_HOME, a private PostgreSQL, the LocalExecutor and a free
port on 127.0.0.1 (see tests/components/airflow_services.py).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from components.airflow_services import AirflowServices, poll, process_alive
from components.dag_runs import kill_leftover_jobs, parsed, run_path, trigger
from components.postgres import PostgresServer

DAGS = Path(__file__).resolve().parent / "components_dags"
DAG_IDS = ("kn_components", "kn_components_cancel")
RUN_TIMEOUT = 180.0

# Ceiling for the whole module fixture + one test; the polls inside time out first, with diagnostics.
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("airflow-components")
    kinetic_root = _kinetic_root(root)
    postgres = PostgresServer()  # in the system temp dir: the postgres user must reach it
    services = AirflowServices(
        root,
        DAGS,
        extra_env={"KINETIC_BASE_URI": f"file://{kinetic_root}", "KINETIC_POLL_INTERVAL": "0.5"},
        database_url=postgres.start().create_database("airflow"),
    )
    try:
        services.start()
        for dag_id in DAG_IDS:
            poll(
                lambda d=dag_id: parsed(services, d),
                timeout=90,
                what=f"DAG {dag_id} to be parsed",
                diagnostics=services.diagnostics,
            )
        yield services
    finally:
        services.stop()
        kill_leftover_jobs(kinetic_root)
        postgres.stop()


def _kinetic_root(root: Path) -> Path:
    """KINETIC_BASE_URI of the services: job files under jobs/<job_id>/."""
    return root / "kinetic"


# Helpers ---------------------------------------------------------------------------------------


def _ti_states(services: AirflowServices, dag_id: str, run_id: str) -> dict[str, str | None]:
    tis = services.api("GET", f"{run_path(dag_id, run_id)}/taskInstances")["task_instances"]
    return {ti["task_id"]: ti["state"] for ti in tis}


def _xcom(services: AirflowServices, dag_id: str, run_id: str, task_id: str) -> Any:
    path = f"{run_path(dag_id, run_id)}/taskInstances/{task_id}/xcomEntries/return_value?deserialize=true"
    return services.api("GET", path)["value"]


def _assert_stopped_gracefully(job_dir: Path, why: Callable[[], str]) -> None:
    """The function saw the stop: its checkpoint is in its output folder, and the metrics its
    stop hook reported were flushed to the job's files (the view reads them there)."""
    from kinetic_airflow.job import metrics as job_metrics
    from kinetic_airflow.job.layout import JobLayout
    from kinetic_airflow.job.storage import open_storage, uri_to_local_path

    manifest = _read_json(job_dir / "manifest.json") or {}
    checkpoint = Path(uri_to_local_path(manifest["output_dir"])) / "checkpoint.json"
    assert checkpoint.is_file(), why()
    assert json.loads(checkpoint.read_text())["step"] >= 1, why()
    storage = open_storage(f"file://{job_dir.parent.parent}")  # <base>/jobs/<job id>
    read = job_metrics.read_attempt(storage, JobLayout(f"file://{job_dir}"))
    assert read["summary"]["final_loss"]["last"] == 0.5, why()


def _job_dir(services: AirflowServices, dag_id: str, run_id: str, task_id: str) -> Path:
    """Try 1's job: its id also hashes Airflow's per-try id, so find it by the run it names."""
    from kinetic_airflow.job.layout import MAX_JOB_ID, dns_label

    head = dns_label(f"{dag_id}-{task_id}", MAX_JOB_ID - len("-0123456789-t1a1"))

    def find() -> Path | None:
        for path in (_kinetic_root(services.root) / "jobs").glob(f"{head}-*-t1a1"):
            manifest = _read_json(path / "manifest.json") or {}
            if manifest.get("identity", {}).get("run_id") == run_id:
                return path
        return None

    return poll(find, timeout=RUN_TIMEOUT, what=f"the job of {dag_id}.{task_id} in {run_id}")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _trigger_logs(services: AirflowServices, dag_id: str, run_id: str) -> list[Path]:
    """Trigger log lines land beside the task log as ``<task log>.trigger.<id>.log``."""
    return [
        p
        for p in services.task_log_files(dag_id)
        if ".trigger." in p.name and f"run_id={run_id}" in p.as_posix()
    ]


def _diagnostics(services: AirflowServices, dag_id: str, run_id: str, job_dir: Path | None = None) -> str:
    """Task states, tails of the service logs, task and trigger logs, and the job's files."""
    try:
        states: Any = _ti_states(services, dag_id, run_id)
    except Exception as exc:  # the api-server may be the thing that broke
        states = f"<unavailable: {exc}>"
    extra = []
    if job_dir is not None and job_dir.is_dir():
        extra = sorted(p for p in job_dir.rglob("*") if p.is_file() and p.suffix in (".json", ".log"))
    return f"task states of {dag_id} {run_id}: {states}\n{services.diagnostics(dag_id, extra=extra)}"


def _wait_run_finished(services: AirflowServices, dag_id: str, run_id: str) -> str:
    def finished() -> str | None:
        services.check_running()
        state = services.api("GET", run_path(dag_id, run_id))["state"]
        return state if state in ("success", "failed") else None

    return poll(
        finished,
        timeout=RUN_TIMEOUT,
        what=f"run {run_id} of {dag_id} to finish",
        diagnostics=lambda: _diagnostics(services, dag_id, run_id),
    )


# Tests -----------------------------------------------------------------------------------------
def test_scheduler_run_pickles_dag_file_and_sibling_module_by_value(airflow: AirflowServices) -> None:
    dag_id = "kn_components"
    run_id = trigger(airflow, dag_id)
    state = _wait_run_finished(airflow, dag_id, run_id)
    job_dir = _job_dir(airflow, dag_id, run_id, "compute")

    def why() -> str:
        return _diagnostics(airflow, dag_id, run_id, job_dir)

    assert state == "success", why()
    assert _ti_states(airflow, dag_id, run_id) == {"compute": "success", "check": "success"}, why()

    value = _xcom(airflow, dag_id, run_id, "compute")
    # What the DAG file's helper and class and the sibling module's function and class produce.
    expected = {
        "helper": 40,
        "dag_class": 44,
        "lib_function": "hello kinetic from the sibling module",
        "lib_class": 7,
        "lib_module": "kn_components_lib",
        "job_id": job_dir.name,
    }
    assert {k: value.get(k) for k in expected} == expected, why()
    # The worker imported the DAG file the production way, and the job got its code by value: the
    # generated module cannot be imported in the job process. The sibling module can, since the
    # DAG folder's code archive is on the job's sys.path (an import in a function body needs it).
    assert value["dag_module"].startswith("unusual_prefix_"), value
    assert value["dag_module"].endswith("_kn_components"), value
    assert value["class_module"] == value["dag_module"], value
    assert value["importable_in_job"] == {value["dag_module"]: False, "kn_components_lib": True}, value

    # It ran as a separate local job process: the runner that wrote the job's markers returned
    # its own pid, its parent is the supervisor recorded in launch.json, and it exited cleanly.
    launch = _read_json(job_dir / "launch.json")
    started = _read_json(job_dir / "status" / "started.json")
    exit_record = _read_json(job_dir / "exit.json")
    assert launch and started and exit_record, why()
    assert (job_dir / "result.json").is_file(), why()
    assert started["pid"] == value["pid"], (started, value)
    assert launch["pid"] == value["ppid"], (launch, value)
    assert exit_record["returncode"] == 0 and not exit_record["cancelled"], why()

    # The downstream plain task ran on a worker (another process) and saw the same value.
    echoed = _xcom(airflow, dag_id, run_id, "check")
    assert echoed == {**value, "checked_by_pid": echoed["checked_by_pid"]}, echoed
    assert echoed["checked_by_pid"] not in (value["pid"], value["ppid"]), echoed


def test_marking_deferred_task_failed_kills_the_job(airflow: AirflowServices) -> None:
    dag_id, task_id = "kn_components_cancel", "sleep_long"
    run_id = trigger(airflow, dag_id)
    job_dir = _job_dir(airflow, dag_id, run_id, task_id)

    def why() -> str:
        return _diagnostics(airflow, dag_id, run_id, job_dir)

    def deferred_and_running() -> tuple[int, int] | None:
        airflow.check_running()
        if _ti_states(airflow, dag_id, run_id).get(task_id) != "deferred":
            return None
        launch = _read_json(job_dir / "launch.json")
        if not launch or not process_alive(int(launch["pid"])):
            return None
        log = (job_dir / "job.log").read_text(errors="replace") if (job_dir / "job.log").exists() else ""
        marker = "kn-components sleeping pid="
        if marker not in log:  # the function itself is running, not just the supervisor
            return None
        # The triggerer must be running the trigger: on_kill only reaches a trigger it has started
        # (a task marked failed before the triggerer picks its trigger up leaves the job running).
        watching = f"watching kinetic job {job_dir.name}"
        if not any(watching in p.read_text(errors="replace") for p in _trigger_logs(airflow, dag_id, run_id)):
            return None
        runner_pid = int(log.split(marker, 1)[1].split()[0])
        return int(launch["pid"]), runner_pid

    supervisor_pid, runner_pid = poll(
        deferred_and_running,
        timeout=RUN_TIMEOUT,
        what="the task deferred with its job running",
        diagnostics=why,
    )
    assert process_alive(runner_pid), why()
    assert _read_json(job_dir / "exit.json") is None, why()

    # Mark the deferred task instance failed: the triggerer cancels the trigger as a user action
    # and calls BaseTrigger.on_kill (Airflow 3.3), which must stop the job.
    patched = airflow.api(
        "PATCH", f"{run_path(dag_id, run_id)}/taskInstances/{task_id}", {"new_state": "failed"}
    )
    assert patched["task_instances"][0]["state"] == "failed", patched

    def job_stopped() -> dict[str, Any] | None:
        exit_record = _read_json(job_dir / "exit.json")
        if exit_record is None or process_alive(supervisor_pid) or process_alive(runner_pid):
            return None
        return exit_record

    exit_record = poll(job_stopped, timeout=90, what="the job process to be killed", diagnostics=why)
    assert exit_record["cancelled"] is True, why()
    # cancel.json is written only by LocalBackend.cancel. Two paths call it and race here: the
    # trigger's on_kill (Airflow 3.3) and kinetic's listener in the API server; either must do.
    assert (job_dir / "cancel.json").is_file(), why()

    def stopped_by() -> str | None:
        if any(
            "invoking on_kill" in p.read_text(errors="replace")
            for p in _trigger_logs(airflow, dag_id, run_id)
        ):
            return "on_kill"
        api_log = (airflow.logs / "api-server.log").read_text(errors="replace")
        return "listener" if f"cancelled kinetic job {job_dir.name}" in api_log else None

    poll(stopped_by, timeout=30, what="on_kill or the listener to report the cancel", diagnostics=why)
    _assert_stopped_gracefully(job_dir, why)
    assert _ti_states(airflow, dag_id, run_id)[task_id] == "failed", why()
    assert _wait_run_finished(airflow, dag_id, run_id) == "failed", why()


def test_marking_failed_before_the_triggerer_watches_still_kills_the_job(airflow: AirflowServices) -> None:
    """The window on_kill cannot cover: the task deferred but no triggerer runs its trigger yet.

    kinetic's listener (a provider plugin) runs in the API server on the manual state change and
    cancels the job recorded in task_state_store.
    """
    dag_id, task_id = "kn_components_cancel", "sleep_long"
    run_id = trigger(airflow, dag_id)
    job_dir = _job_dir(airflow, dag_id, run_id, task_id)

    def why() -> str:
        return _diagnostics(airflow, dag_id, run_id, job_dir)

    def deferred() -> int | None:
        airflow.check_running()
        launch = _read_json(job_dir / "launch.json")
        if _ti_states(airflow, dag_id, run_id).get(task_id) != "deferred" or not launch:
            return None
        return int(launch["pid"])

    # Freeze the triggerer so that no trigger runs (as while it is down or busy), then defer.
    triggerer = airflow.procs["triggerer"].pid
    os.killpg(triggerer, signal.SIGSTOP)
    try:
        supervisor_pid = poll(deferred, timeout=RUN_TIMEOUT, what="the task to defer", diagnostics=why)
        airflow.api("PATCH", f"{run_path(dag_id, run_id)}/taskInstances/{task_id}", {"new_state": "failed"})

        def job_stopped() -> dict[str, Any] | None:
            exit_record = _read_json(job_dir / "exit.json")
            return None if exit_record is None or process_alive(supervisor_pid) else exit_record

        exit_record = poll(job_stopped, timeout=90, what="the job process to be killed", diagnostics=why)
    finally:
        os.killpg(triggerer, signal.SIGCONT)
    assert exit_record["cancelled"] is True, why()
    assert (job_dir / "cancel.json").is_file(), why()

    def listener_reported() -> bool:
        # logged once its cancel returns, a moment after the job's exit record is written
        api_log = (airflow.logs / "api-server.log").read_text(errors="replace")
        return f"cancelled kinetic job {job_dir.name}" in api_log

    poll(listener_reported, timeout=30, what="the listener to report the cancel", diagnostics=why)
    _assert_stopped_gracefully(job_dir, why)
