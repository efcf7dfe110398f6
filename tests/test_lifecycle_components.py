"""The job lifecycle under real Airflow: scheduler, triggerer, LocalExecutor, api-server, PostgreSQL.

``dag.test()`` runs no executor and no separate triggerer, so none of what this
module checks can be seen there: Airflow's executor-event race, clears and backfill
re-runs with a state store that survives them, crashes of the task process and of
the triggerer, a scheduler restart. Every kinetic function of
``lifecycle_dags/kn_lifecycle.py`` appends a line per execution to its task
instance's ``KINETIC_OUTPUT_DIR/executions.jsonl``, so the tests count real
function executions; GKE-backend scenarios also count Job creations in the
cluster emulator's request log.

The settings are Airflow's and kinetic's defaults (``wait_before_defer``,
``min_deferral_seconds``), except a faster poll interval.

``tests/test_lifecycle_celery.py`` runs a subset of these scenarios, unchanged, on
CeleryExecutor (``Stack(executor="CeleryExecutor")``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cluster_emulator.kueue_setup import kueue_queue
from components.airflow_services import AirflowServices, poll, process_alive
from components.dag_runs import parsed, run_path, trigger
from components.stack import ComponentStack

from kinetic_airflow.job.layout import MAX_JOB_ID, JobIdentity, dns_label, output_dir_uri
from kinetic_airflow.job.storage import uri_to_local_path

DAG_FILE = Path(__file__).resolve().parent / "lifecycle_dags" / "kn_lifecycle.py"
RUN_TIMEOUT = 240.0
RACE_MESSAGE = "but the task instance's state attribute is"

pytestmark = pytest.mark.timeout(900)


# On CeleryExecutor a lost worker is noticed only when its task instances stop heartbeating: a
# shorter timeout than Airflow's 300 s keeps the worker-kill scenario short, and that scenario's
# job outlives the detection, so the new try still finds it running.
CELERY_ENV = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
    "KN_WORKER_CRASH_JOB_SECONDS": "70",
}


class Stack(ComponentStack):
    """Airflow on PostgreSQL + the cluster emulator + job storage on local disk."""

    def __init__(self, root: Path, executor: str = "LocalExecutor") -> None:
        super().__init__(root, executor)
        shutil.copy(DAG_FILE, self.dags / DAG_FILE.name)
        shutil.copytree(DAG_FILE.parent / "kn_lifecycle_lib", self.dags / "kn_lifecycle_lib")
        self.crash_marker = root / "crash-marker"
        self.integrity_marker = root / "code-ran"  # what a tampered pickle would write when loaded

    def start(self) -> None:
        self.pg.start()
        self.emulator.start()
        env = {
            **self.emulator.airflow_env(),
            "KINETIC_BACKEND": "local",
            "KINETIC_BASE_URI": f"file://{self.kinetic_root}",
            "KINETIC_POLL_INTERVAL": "0.5",
            "KN_CRASH_MARKER": str(self.crash_marker),
            "KN_INTEGRITY_MARKER": str(self.integrity_marker),
            **(CELERY_ENV if self.executor == "CeleryExecutor" else {}),
        }
        self.airflow = AirflowServices(
            self.root / "airflow",
            self.dags,
            extra_env=env,
            parallelism=8,
            database_url=self.pg.create_database("airflow"),
            worker_concurrency=4,  # Celery: 2 workers x 4 = the 8 slots of parallelism
            **self.executor_options(),
        )
        self.airflow.start()
        # one ClusterQueue "shared" with quota for one kinetic CPU job (1 cpu, 4Gi), as a platform
        # team would set it up (kubectl apply); the emulator's Kueue admits by it
        kueue_queue(self.emulator.api_client(), "shared", quota={"cpu": "1", "memory": "6Gi"})
        for dag_id in DAG_IDS:
            poll(
                lambda d=dag_id: parsed(self.api, d),
                timeout=120,
                what=f"DAG {dag_id} to be parsed",
                diagnostics=self.airflow.diagnostics,
            )

    def crash_worker_of(self, pid: int) -> None:
        """The worker running task process ``pid`` dies.

        LocalExecutor: the task process is SIGKILLed (its supervisor reports the try failed).
        CeleryExecutor: the whole Celery worker is — main process, pool processes, supervisors and
        task processes, as when its host is lost — and is started again after; only the heartbeat
        timeout tells the scheduler.
        """
        if self.executor == "LocalExecutor":
            os.kill(pid, signal.SIGKILL)
            return
        worker = self.api.service_of(pid)
        assert worker in self.api.workers, f"task process {pid} runs in no Celery worker ({worker})"
        self.api.kill_service(worker, whole_session=True)
        # SIGKILL is sent; a process in the middle of a system call (D state) ends when it returns.
        poll(lambda: not process_alive(pid), timeout=15, interval=0.1, what=f"task process {pid} to end")
        self.api.start_service(worker)


DAG_IDS = (
    "kn_context_args",
    "kn_race_local",
    "kn_race_gke",
    "kn_race_deferred",
    "kn_rerun",
    "kn_clear_deferred",
    "kn_clear_running",
    "kn_crash_before_payload",
    "kn_crash_after_payload",
    "kn_triggerer_crash",
    "kn_scheduler_restart",
    "kn_not_deferrable_timeout",
    "kn_slice",
    "kn_multislice",
    "kn_slice_mark_failed",
    "kn_slice_clear",
    "kn_bundle_code",
    "kn_integrity",
    "kn_queue_team_a",
    "kn_queue_team_b",
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    stack = Stack(tmp_path_factory.mktemp("lifecycle"))
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()


# Airflow helpers --------------------------------------------------------------------------------


def _tis(services: AirflowServices, dag_id: str, run_id: str) -> list[dict[str, Any]]:
    return services.api("GET", f"{run_path(dag_id, run_id)}/taskInstances?limit=1000")["task_instances"]


def _states(services: AirflowServices, dag_id: str, run_id: str) -> dict[tuple[str, int], str | None]:
    return {(ti["task_id"], ti["map_index"]): ti["state"] for ti in _tis(services, dag_id, run_id)}


def _xcom(services: AirflowServices, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> Any:
    path = (
        f"{run_path(dag_id, run_id)}/taskInstances/{task_id}/xcomEntries/return_value"
        f"?deserialize=true&map_index={map_index}"
    )
    return services.api("GET", path)["value"]


def _why(stack: Stack, dag_id: str, run_id: str | None = None) -> str:
    try:
        states: Any = _states(stack.api, dag_id, run_id) if run_id else "-"
    except Exception as exc:
        states = f"<unavailable: {exc}>"
    return f"task states of {dag_id} {run_id}: {states}\n{stack.api.diagnostics(dag_id, lines=60)}"


def _wait_run(stack: Stack, dag_id: str, run_id: str, timeout: float = RUN_TIMEOUT) -> str:
    def finished() -> str | None:
        stack.api.check_running()
        state = stack.api.api("GET", run_path(dag_id, run_id))["state"]
        return state if state in ("success", "failed") else None

    return poll(
        finished, timeout=timeout, what=f"run {run_id} of {dag_id}", diagnostics=lambda: _why(stack, dag_id)
    )


def _clear(services: AirflowServices, dag_id: str, run_id: str, task_ids: list[str]) -> None:
    services.api(
        "POST",
        f"/api/v2/dags/{dag_id}/clearTaskInstances",
        {
            "dry_run": False,
            "dag_run_id": run_id,
            "task_ids": task_ids,
            "only_failed": False,
            "reset_dag_runs": True,
        },
    )


def _airflow_cli(stack: Stack, *args: str) -> str:
    result = subprocess.run(
        ["airflow", *args], env=stack.api.env, capture_output=True, text=True, timeout=180, check=False
    )
    if result.returncode != 0:
        raise AssertionError(f"airflow {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def _race_failures(stack: Stack, dag_id: str) -> list[str]:
    """Scheduler log lines of Airflow's executor-event race that concern ``dag_id``."""
    text = (stack.api.logs / "scheduler.log").read_text(errors="replace")
    return [line for line in text.splitlines() if RACE_MESSAGE in line and dag_id in line]


# kinetic helpers --------------------------------------------------------------------------------
def _executions(stack: Stack, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> list[dict]:
    """Every real execution of the function of this task instance, in order."""
    identity = JobIdentity(dag_id, run_id, task_id, map_index)
    path = Path(uri_to_local_path(output_dir_uri(f"file://{stack.kinetic_root}", identity)))
    path = path / "executions.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _job_dirs(stack: Stack, dag_id: str, task_id: str, try_number: int) -> list[Path]:
    """Local job directories of this task's jobs of one try number (any run, any attempt)."""
    head = dns_label(f"{dag_id}-{task_id}", MAX_JOB_ID - len(f"-0123456789-t{try_number}a1"))
    return sorted(
        p
        for p in (stack.kinetic_root / "jobs").glob(f"{head}-*-t{try_number}a*")
        if (p / "launch.json").exists()
    )


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _task_log_text(stack: Stack, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """Task logs and trigger logs of every try of one task instance, concatenated."""
    parts = []
    for path in stack.api.task_log_files(dag_id):
        posix = path.as_posix()
        if f"run_id={run_id}/" not in posix or f"task_id={task_id}/" not in posix:
            continue
        if map_index >= 0 and f"map_index={map_index}/" not in posix:
            continue
        parts.append(path.read_text(errors="replace"))
    return "\n".join(parts)


# The executor-event race ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dag_id", "task_id", "runs"),
    [
        ("kn_race_local", "zero_local", 1),
        ("kn_race_gke", "zero_gke", 1),
        ("kn_race_deferred", "short_local", 1),
    ],
)
def test_short_jobs_never_fail_under_the_scheduler(
    stack: Stack, dag_id: str, task_id: str, runs: int
) -> None:
    """20 kinetic tasks per run whose jobs end at once.

    Before kinetic dealt with the race, about half of the zero-second local tasks failed (all
    of them with the scheduler's state-mismatch message): 20 per run make a run with no
    failure a one-in-millions event, so one run per DAG is enough. ``kn_race_deferred``'s jobs
    end 1-2 s after deferring.
    """
    mark = stack.emulator.request_mark()
    run_ids = [trigger(stack.api, dag_id) for _ in range(runs)]
    for run_id in run_ids:
        state = _wait_run(stack, dag_id, run_id)
        assert state == "success", f"{_race_failures(stack, dag_id)}\n{_why(stack, dag_id, run_id)}"
    assert _race_failures(stack, dag_id) == []
    for run_id in run_ids:
        states = _states(stack.api, dag_id, run_id)
        assert sorted(states) == [(task_id, i) for i in range(20)], states
        assert set(states.values()) == {"success"}, _why(stack, dag_id, run_id)
        for i in range(20):
            executions = _executions(stack, dag_id, run_id, task_id, i)
            assert len(executions) == 1, (i, executions)
            value = _xcom(stack.api, dag_id, run_id, task_id, i)
            assert value["i"] == i and value["job_id"] == executions[0]["job_id"], value
    if dag_id == "kn_race_gke":
        assert stack.emulator.job_creations(since=mark) == 20 * runs
    if dag_id == "kn_race_deferred":  # these went through the triggerer, and were held back
        log = _task_log_text(stack, dag_id, run_ids[0], task_id, 0)
        # the triggerer shares the workers' host, so not the fixed bound for an unseen process:
        # under LocalExecutor held until the scheduler had read the deferring process's exit,
        # seen in its worker; under Celery until that process was reaped, plus the margin
        if stack.executor == "LocalExecutor":
            assert "the task resumes once the scheduler has read the exit of the process that" in log, log[
                -3000:
            ]
        else:
            assert "the task resumes once the process that deferred it (pid" in log, log[-3000:]
        assert "cannot see" not in log, log[-3000:]


# TaskFlow context arguments ---------------------------------------------------------------------
def test_context_arguments_reach_the_function_under_the_scheduler(stack: Stack) -> None:
    dag_id, task_id = "kn_context_args", "context_values"
    stack.api.api("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
    run = {"logical_date": "2026-03-04T05:06:00+00:00", "conf": {"epochs": 5}}
    run_id = stack.api.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", run)["dag_run_id"]
    assert _wait_run(stack, dag_id, run_id) == "success", _why(stack, dag_id, run_id)
    value = _xcom(stack.api, dag_id, run_id, task_id)
    assert (value["lr"], value["ds"], value["run_id"]) == (0.5, "2026-03-04", run_id)
    assert value["ts"] == "2026-03-04T05:06:00+00:00"
    assert value["params"] == {"scale": 3, "epochs": 5} and value["conf"] == {"epochs": 5}
    assert len(_executions(stack, dag_id, run_id, task_id)) == 1


# Re-runs ----------------------------------------------------------------------------------------
def test_clearing_a_succeeded_task_runs_a_new_job(stack: Stack) -> None:
    dag_id, task_id = "kn_rerun", "sweep"
    run_id = trigger(stack.api, dag_id)
    assert _wait_run(stack, dag_id, run_id) == "success", _why(stack, dag_id, run_id)
    first = {i: _executions(stack, dag_id, run_id, task_id, i) for i in range(3)}
    assert all(len(e) == 1 for e in first.values()), first

    _clear(stack.api, dag_id, run_id, [task_id])
    poll(
        lambda: stack.api.api("GET", run_path(dag_id, run_id))["state"] != "success",
        timeout=30,
        what="the cleared run to restart",
    )
    assert _wait_run(stack, dag_id, run_id) == "success", _why(stack, dag_id, run_id)
    for i in range(3):
        executions = _executions(stack, dag_id, run_id, task_id, i)
        assert [e["try_number"] for e in executions] == [1, 2], executions
        assert executions[0]["job_id"] != executions[1]["job_id"], executions
        assert _xcom(stack.api, dag_id, run_id, task_id, i)["job_id"] == executions[1]["job_id"]


@pytest.mark.parametrize(
    ("dag_id", "state", "stopped_by"),
    [
        ("kn_clear_deferred", "deferred", ("a new try", "trigger.on_kill")),
        ("kn_clear_running", "running", ("operator.on_kill", "a new try")),
    ],
)
def test_clearing_a_live_task_stops_its_job_and_runs_a_new_one(
    stack: Stack, dag_id: str, state: str, stopped_by: tuple[str, ...]
) -> None:
    task_id = "slow_first_try"
    run_id = trigger(stack.api, dag_id)

    def live_with_job() -> dict | None:
        stack.api.check_running()
        if _states(stack.api, dag_id, run_id).get((task_id, -1)) != state:
            return None
        executions = _executions(stack, dag_id, run_id, task_id)
        return executions[0] if executions else None

    first = poll(live_with_job, timeout=RUN_TIMEOUT, what=f"try 1 {state} with its job running")
    (first_dir,) = _job_dirs(stack, dag_id, task_id, 1)
    assert first_dir.name == first["job_id"]
    _clear(stack.api, dag_id, run_id, [task_id])
    assert _wait_run(stack, dag_id, run_id) == "success", _why(stack, dag_id, run_id)

    executions = _executions(stack, dag_id, run_id, task_id)
    assert [e["try_number"] for e in executions] == [1, 2], executions
    assert _xcom(stack.api, dag_id, run_id, task_id)["job_id"] == executions[1]["job_id"]
    # The old job was stopped, on purpose, and its process is gone.
    exit_record = poll(lambda: _read_json(first_dir / "exit.json"), timeout=60, what="try 1's job to stop")
    assert exit_record["cancelled"] is True, exit_record
    assert not process_alive(first["pid"])
    marker = _read_json(first_dir / "status" / "cancelled.json")
    assert marker and marker["by"] in stopped_by, marker
    assert not (first_dir / "result.json").exists()


def test_backfill_reprocess_and_a_recreated_run_run_new_jobs_with_current_code(stack: Stack) -> None:
    dag_id, task_id = "kn_rerun", "sweep"
    dates = ("2026-02-02", "2026-02-03", "2026-02-04")
    run_ids = [f"backfill__{d}T00:00:00+00:00" for d in dates]

    def backfill(first: str, last: str, *extra: str) -> None:
        """``airflow backfill create``, after the previous backfill is over (one at a time per DAG)."""
        poll(
            lambda: all(
                b.get("completed_at")
                for b in stack.api.api("GET", f"/api/v2/backfills?dag_id={dag_id}")["backfills"]
            ),
            timeout=120,
            what="the previous backfill to complete",
        )
        _airflow_cli(
            stack, "backfill", "create", "--dag-id", dag_id, "--from-date", first, "--to-date", last, *extra
        )

    def all_done(expected_try: int) -> bool:
        """Every task instance succeeded on that try, and the scheduler has closed every run."""
        for run_id in run_ids:
            if stack.api.api("GET", run_path(dag_id, run_id))["state"] != "success":
                return False
            tis = _tis(stack.api, dag_id, run_id)
            if len(tis) != 3 or any(
                ti["state"] != "success" or ti["try_number"] != expected_try for ti in tis
            ):
                return False
        return True

    def set_code_version(version: int) -> None:
        path = stack.dags / DAG_FILE.name
        text = re.sub(r"^CODE_VERSION = \d+$", f"CODE_VERSION = {version}", path.read_text(), flags=re.M)
        path.write_text(text)

    stack.api.api("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
    backfill(dates[0], dates[-1])
    poll(
        lambda: all_done(1),
        timeout=RUN_TIMEOUT,
        what="the first backfill",
        diagnostics=lambda: _why(stack, dag_id),
    )
    set_code_version(2)
    backfill(dates[0], dates[-1], "--reprocess-behavior", "completed")
    poll(
        lambda: all_done(2),
        timeout=RUN_TIMEOUT,
        what="the reprocessing backfill",
        diagnostics=lambda: _why(stack, dag_id),
    )
    for run_id in run_ids:
        for i in range(3):
            executions = _executions(stack, dag_id, run_id, task_id, i)
            assert [(e["try_number"], e["code_version"]) for e in executions] == [(1, 1), (2, 2)], executions
            assert executions[0]["job_id"] != executions[1]["job_id"]
            assert _xcom(stack.api, dag_id, run_id, task_id, i)["code_version"] == 2

    # A deleted DAG run, recreated after the code changed: its try 1 is a new job too.
    set_code_version(3)
    stack.api.api("DELETE", run_path(dag_id, run_ids[1]))
    backfill(dates[1], dates[1])
    poll(
        lambda: [ti["state"] for ti in _tis(stack.api, dag_id, run_ids[1])] == ["success"] * 3,
        timeout=RUN_TIMEOUT,
        what="the recreated run",
        diagnostics=lambda: _why(stack, dag_id),
    )
    for i in range(3):
        executions = _executions(stack, dag_id, run_ids[1], task_id, i)
        assert [(e["try_number"], e["code_version"]) for e in executions] == [(1, 1), (2, 2), (1, 3)]
        assert len({e["job_id"] for e in executions}) == 3, executions
        assert _xcom(stack.api, dag_id, run_ids[1], task_id, i)["code_version"] == 3


# Crashes ----------------------------------------------------------------------------------------
def test_task_killed_between_job_creation_and_payload_upload_still_succeeds_once(stack: Stack) -> None:
    dag_id, task_id = "kn_crash_before_payload", "survives_crash_before_payload"
    run_id = trigger(stack.api, dag_id)
    assert _wait_run(stack, dag_id, run_id) == "success", _why(stack, dag_id, run_id)
    assert stack.crash_marker.exists(), "the task process was never killed"
    executions = _executions(stack, dag_id, run_id, task_id)
    assert [e["try_number"] for e in executions] == [2], executions
    # Try 1's job was created (its process waited for a payload that never came) and then stopped.
    (first_dir,) = _job_dirs(stack, dag_id, task_id, 1)
    assert not (first_dir / "manifest.json").exists()
    exit_record = poll(lambda: _read_json(first_dir / "exit.json"), timeout=60, what="try 1's job to stop")
    assert exit_record["cancelled"] is True
    assert "never got its payload" in _task_log_text(stack, dag_id, run_id, task_id)


def _running_task_pid(stack: Stack, dag_id: str, run_id: str, task_id: str) -> int | None:
    ti = stack.api.api("GET", f"{run_path(dag_id, run_id)}/taskInstances/{task_id}")
    return int(ti["pid"]) if ti["state"] == "running" and ti.get("pid") else None


def test_task_killed_after_payload_upload_reattaches(stack: Stack) -> None:
    dag_id, task_id = "kn_crash_after_payload", "runs_through_worker_crash"
    run_id = trigger(stack.api, dag_id)

    def running_with_job() -> int | None:
        dirs = _job_dirs(stack, dag_id, task_id, 1)
        if not dirs or "crash-after-payload pid=" not in _read_text(dirs[0] / "job.log"):
            return None
        return _running_task_pid(stack, dag_id, run_id, task_id)

    pid = poll(running_with_job, timeout=RUN_TIMEOUT, what="try 1 waiting in the worker for its job")
    stack.crash_worker_of(pid)
    assert _wait_run(stack, dag_id, run_id) == "success", _why(stack, dag_id, run_id)
    executions = _executions(stack, dag_id, run_id, task_id)
    assert len(executions) == 1 and executions[0]["try_number"] == 1, executions
    tis = _tis(stack.api, dag_id, run_id)
    assert tis[0]["try_number"] == 2, tis
    assert "reattaching" in _task_log_text(stack, dag_id, run_id, task_id)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def test_triggerer_crash_shows_every_job_line_exactly_once(stack: Stack) -> None:
    dag_id, task_id = "kn_triggerer_crash", "chatty"
    run_id = trigger(stack.api, dag_id)
    streamed = re.compile(r"^kn-line task=(\d+) n=(\d+)$")  # the job's own line, as printed

    def lines_seen(i: int) -> list[int]:
        """The job lines streamed into task i's log (task log and trigger logs, every entry)."""
        seen = []
        for entry in _task_log_text(stack, dag_id, run_id, task_id, i).splitlines():
            with contextlib.suppress(ValueError, AttributeError):
                match = streamed.match(json.loads(entry).get("event", ""))
                if match:
                    assert int(match.group(1)) == i, entry
                    seen.append(int(match.group(2)))
        return seen

    def quiet_and_deferred() -> bool:
        """All 5 deferred, each has shown a whole burst past the deferral and is in a pause."""
        states = _states(stack.api, dag_id, run_id)
        if len(states) != 5 or set(states.values()) != {"deferred"}:
            return False
        for i in range(5):
            seen = lines_seen(i)
            if not seen or max(seen) < 29 or max(seen) % 10 != 9:
                return False
        return True

    poll(quiet_and_deferred, timeout=RUN_TIMEOUT, interval=0.1, what="5 deferred tasks between bursts")
    stack.api.kill_service("triggerer")
    stack.api.start_service("triggerer")
    assert _wait_run(stack, dag_id, run_id) == "success", _why(stack, dag_id, run_id)
    for i in range(5):
        assert lines_seen(i) == list(range(60)), i
        # Nor does a line come back inside the event the triggerer logs when the job ends.
        assert f"kn-line task={i} n=59" not in _event_lines(stack, dag_id, run_id, task_id, i)


def _event_lines(stack: Stack, dag_id: str, run_id: str, task_id: str, map_index: int) -> str:
    text = _task_log_text(stack, dag_id, run_id, task_id, map_index)
    return "\n".join(line for line in text.splitlines() if "Trigger fired event" in line)


def test_scheduler_restart_keeps_one_job(stack: Stack) -> None:
    dag_id, task_id = "kn_scheduler_restart", "steady"
    run_id = trigger(stack.api, dag_id)
    poll(
        lambda: _states(stack.api, dag_id, run_id).get((task_id, -1)) == "deferred",
        timeout=RUN_TIMEOUT,
        what="the task to defer",
    )
    stack.api.kill_service("scheduler")
    stack.api.start_service("scheduler")
    assert _wait_run(stack, dag_id, run_id) == "success", _why(stack, dag_id, run_id)
    assert len(_executions(stack, dag_id, run_id, task_id)) == 1
    assert len(_job_dirs(stack, dag_id, task_id, 1)) + len(_job_dirs(stack, dag_id, task_id, 2)) == 1


def test_not_deferrable_timeout_stops_the_job(stack: Stack) -> None:
    dag_id, task_id = "kn_not_deferrable_timeout", "too_slow_in_worker"
    run_id = trigger(stack.api, dag_id)
    assert _wait_run(stack, dag_id, run_id) == "failed", _why(stack, dag_id, run_id)
    (job_dir,) = _job_dirs(stack, dag_id, task_id, 1)
    executions = _executions(stack, dag_id, run_id, task_id)
    assert len(executions) == 1
    exit_record = poll(lambda: _read_json(job_dir / "exit.json"), timeout=30, what="the job to stop")
    assert exit_record["cancelled"] is True
    assert not process_alive(executions[0]["pid"])
    assert (_read_json(job_dir / "status" / "cancelled.json") or {}).get("by") == "operator.on_kill"
    assert "Timeout" in _task_log_text(stack, dag_id, run_id, task_id)


# Multi-host slices (LeaderWorkerSets) --------------------------------------------------------------
def _slice_objects(stack: Stack, task_id: str) -> tuple[list[str], list[str]]:
    """Names of the LeaderWorkerSets and JobSets and pods of a task's slices in the emulator."""
    import kubernetes

    client = stack.emulator.api_client()
    selector = f"kinetic.airflow/task-id={task_id.replace('_', '-')}"
    custom = kubernetes.client.CustomObjectsApi(client)
    groups = [
        *custom.list_namespaced_custom_object(
            "leaderworkerset.x-k8s.io", "v1", "default", "leaderworkersets", label_selector=selector
        )["items"],
        *custom.list_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", label_selector=selector
        )["items"],
    ]
    pods = kubernetes.client.CoreV1Api(client).list_namespaced_pod("default", label_selector=selector).items
    return [g["metadata"]["name"] for g in groups], [p.metadata.name for p in pods]


def test_two_dags_share_a_cluster_queue_the_second_waits_queued_then_runs(stack: Stack) -> None:
    runs = {dag_id: trigger(stack.api, dag_id) for dag_id in ("kn_queue_team_a", "kn_queue_team_b")}
    for dag_id, run_id in runs.items():
        assert _wait_run(stack, dag_id, run_id) == "success", _why(stack, dag_id, run_id)
    done = {dag_id: _executions(stack, dag_id, run_id, "queued_training") for dag_id, run_id in runs.items()}
    assert all(len(entries) == 1 for entries in done.values()), done
    first, second = sorted((entries[0] for entries in done.values()), key=lambda e: e["started"])
    assert second["started"] >= first["ended"] - 0.5, (first, second)  # one at a time: the quota
    waited = next(d for d, entries in done.items() if entries[0] is second)
    log = _task_log_text(stack, waited, runs[waited], "queued_training")
    assert "[kinetic] queued in shared (position 1, pending admission: " in log, log[-3000:]
    assert "insufficient unused quota for cpu" in log, log[-3000:]


def _slice_running(stack: Stack, task_id: str) -> bool:
    groups, pods = _slice_objects(stack, task_id)
    return len(groups) == 1 and len(pods) == 4


def test_a_four_host_slice_runs_its_collective_under_the_scheduler(stack: Stack) -> None:
    dag_id, task_id = "kn_slice", "slice_collective"
    run_id = trigger(stack.api, dag_id)
    assert _wait_run(stack, dag_id, run_id) == "success", _why(stack, dag_id, run_id)
    assert _xcom(stack.api, dag_id, run_id, task_id) == [1, 2, 3, 4]
    assert len(_executions(stack, dag_id, run_id, task_id)) == 1
    log = _task_log_text(stack, dag_id, run_id, task_id)
    for host in range(4):  # every host's output reached the task log, through the triggerer
        assert f"[h{host}] kn-slice process {host} gathered [1, 2, 3, 4]" in log, log[-3000:]
    poll(lambda: _slice_objects(stack, task_id) == ([], []), timeout=60, what="the slice to be released")


def test_two_slices_run_one_jax_collective_under_the_scheduler(stack: Stack) -> None:
    """slices=2 of tpu-v6e-16: one JobSet, 8 processes, one global all-gather; every host's line
    reaches the task log through the triggerer, tagged with its slice and host."""
    dag_id, task_id = "kn_multislice", "multislice_collective"
    run_id = trigger(stack.api, dag_id)
    assert _wait_run(stack, dag_id, run_id) == "success", _why(stack, dag_id, run_id)
    assert _xcom(stack.api, dag_id, run_id, task_id) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert len(_executions(stack, dag_id, run_id, task_id)) == 1
    log = _task_log_text(stack, dag_id, run_id, task_id)
    for host in range(8):
        s, h = divmod(host, 4)
        line = f"[s{s} h{h}] kn-multislice process {host} (slice {s}) gathered [1, 2, 3, 4, 5, 6, 7, 8]"
        assert line in log, log[-3000:]
    poll(lambda: _slice_objects(stack, task_id) == ([], []), timeout=60, what="the JobSet to be released")


@pytest.mark.parametrize(("dag_id", "how"), [("kn_slice_mark_failed", "mark"), ("kn_slice_clear", "clear")])
def test_mark_failed_and_clear_delete_the_slice_and_all_its_pods(stack: Stack, dag_id: str, how: str) -> None:
    task_id = "slice_slow_first_try"
    run_id = trigger(stack.api, dag_id)

    def deferred_with_slice() -> bool:
        stack.api.check_running()
        deferred = _states(stack.api, dag_id, run_id).get((task_id, -1)) == "deferred"
        return (
            deferred and _slice_running(stack, task_id) and bool(_executions(stack, dag_id, run_id, task_id))
        )

    poll(deferred_with_slice, timeout=RUN_TIMEOUT, what="try 1 deferred with its 4 hosts running")
    (first_group,), _ = _slice_objects(stack, task_id)
    if how == "mark":
        stack.api.api("PATCH", f"{run_path(dag_id, run_id)}/taskInstances/{task_id}", {"new_state": "failed"})
        poll(
            lambda: _slice_objects(stack, task_id) == ([], []),
            timeout=60,
            what="the LeaderWorkerSet and its pods to be deleted",
        )
        assert _states(stack.api, dag_id, run_id)[(task_id, -1)] == "failed"
        return
    _clear(stack.api, dag_id, run_id, [task_id])
    assert _wait_run(stack, dag_id, run_id) == "success", _why(stack, dag_id, run_id)
    executions = _executions(stack, dag_id, run_id, task_id)
    assert [e["try_number"] for e in executions] == [1, 2], executions
    poll(lambda: _slice_objects(stack, task_id) == ([], []), timeout=60, what="both slices to be gone")
    assert first_group not in _slice_objects(stack, task_id)[0]


# What the function needs arrives with it --------------------------------------------------------
def test_a_dag_folder_package_imported_in_the_body_reaches_the_job(stack: Stack) -> None:
    """The scheduler's worker imports the DAG under Airflow's module name; the package beside it
    is imported only inside the function, so only the shipped code archive can provide it."""
    dag_id, task_id = "kn_bundle_code", "imports_dag_folder_package"
    run_id = trigger(stack.api, dag_id)
    assert _wait_run(stack, dag_id, run_id) == "success", _why(stack, dag_id, run_id)
    assert _xcom(stack.api, dag_id, run_id, task_id) == 42
    assert len(list((stack.kinetic_root / "cache" / "code").glob("*.zip"))) >= 1


def test_a_bucket_writer_cannot_run_code_in_the_worker_or_a_downstream_task(stack: Stack) -> None:
    """Real worker, triggerer and scheduler: an envelope replaced between the runner and the worker
    (the task deferred; the worker reads it when the trigger fires) and one replaced after its
    reference went to XCom are refused, and the pickle never runs (issue 24)."""
    run_id = trigger(stack.api, "kn_integrity")
    assert _wait_run(stack, "kn_integrity", run_id) == "failed"
    assert _states(stack.api, "kn_integrity", run_id) == {
        ("tampered_before_the_worker_loads_it", -1): "failed",
        ("produce_bytes", -1): "success",
        ("overwrite_the_stored_result", -1): "success",
        ("load_it", -1): "failed",
    }
    # task logs are JSON lines: the task's error is its error_detail's exc_type and exc_value
    worker_log = _task_log_text(stack, "kn_integrity", run_id, "tampered_before_the_worker_loads_it")
    assert '"exc_type":"IntegrityError","exc_value":"the result envelope file://' in worker_log, worker_log[
        -3000:
    ]
    assert "/result.pkl is not vouched for by its job" in worker_log
    load_log = _task_log_text(stack, "kn_integrity", run_id, "load_it")
    assert '"exc_type":"IntegrityError"' in load_log, load_log[-3000:]
    assert "but its XCom reference (the digest the worker verified with the job key) expects" in load_log
    assert not stack.integrity_marker.exists(), "a tampered pickle ran code"
