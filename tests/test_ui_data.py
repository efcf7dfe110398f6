"""The Kinetic view's data layer (``kinetic_airflow.ui.data``) tells every ending as it was.

Each case is a real task instance in the metadata DB (a DAG run made by Airflow's own
models), its job record in ``task_state_store`` as the worker writes it (``save_record``),
and the job's files in storage in the formats the runner, the watcher and ``cancel_job``
write them (``job.json`` as ``publish_job`` does, so the jobs CLI finds each job too). The view
reads them as it does in the api-server (``task_rows``); its states are the CLI's.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from helpers import dag_runs_in_metastore

from kinetic_airflow.job.layout import STATE_KEY, JobIdentity, JobLayout
from kinetic_airflow.job.ref import JobRef
from kinetic_airflow.job.states import Cause
from kinetic_airflow.job.storage import open_storage
from kinetic_airflow.lifecycle import Phase, TryInfo, save_record
from kinetic_airflow.submission import publish_job

DAG_ID = "kn_ops_local"
PATHS = {
    Phase.RECORDED: [Phase.RECORDED],
    Phase.CREATED: [Phase.RECORDED, Phase.CREATED],
    Phase.WAITING: [Phase.RECORDED, Phase.CREATED, Phase.SHIPPED, Phase.WAITING],
    Phase.DELIVERED: [Phase.RECORDED, Phase.CREATED, Phase.SHIPPED, Phase.WAITING, Phase.DELIVERED],
    Phase.CANCELLED: [Phase.RECORDED, Phase.CREATED, Phase.CANCELLED],
}


class Case:
    """One task instance (``greet`` of its own DAG run) with one job."""

    def __init__(self, name: str, base: str, ti_state: str, **ref: Any) -> None:
        self.run_id = f"ui_data__{name}__{time.time_ns()}"
        self.ti_state = ti_state
        identity = JobIdentity(DAG_ID, self.run_id, "greet")
        self.ref = JobRef.from_dict(
            {
                "job_id": identity.job_id,
                "job_uri": f"{base}/jobs/{identity.job_id}",
                "base_uri": base,
                "backend": "local",
                "accelerator": "cpu",
                "identity": identity.to_dict(),
                "submitted_at": time.time() - 60,
                "local_dir": f"{base.removeprefix('file://')}/local-state/{identity.job_id}",
                **ref,
            }
        )
        self.layout = JobLayout(self.ref.job_uri)
        self.storage = open_storage(base)
        publish_job(self.storage, self.ref, "greet")  # job.json: what the jobs CLI lists
        self.phase = Phase.RECORDED
        self.extra: dict[str, Any] = {}

    def marker(self, name: str, **fields: Any) -> Case:
        self.storage.write_text(self.layout.status(name), json.dumps({"time": time.time(), **fields}))
        return self

    def summary(self, **fields: Any) -> Case:
        self.storage.write_text(self.layout.result_summary(), json.dumps(fields))
        return self

    def record(self, phase: Phase, **extra: Any) -> Case:
        self.phase, self.extra = phase, extra
        return self


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"file://{tmp_path_factory.mktemp('ui-data')}/kinetic"


@pytest.fixture(scope="module")
def rows(base: str) -> dict[str, dict[str, Any]]:
    """Every case in the metadata DB and in storage; the view's rows, by case name."""
    import kn_ops
    from airflow.models.dagrun import DagRun
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select, update

    from kinetic_airflow.ui.data import task_rows

    usage = {"chips": 8, "chip_hours": 0.214, "run_seconds": 96.3, "queue_seconds": 1.2, "spot": False}
    cases = {
        # the worker died (or was killed) between creating the job and shipping its payload
        "failed_before_start": Case("fbs", base, "failed").record(Phase.CREATED),
        # the worker's guard stopped the job when the worker failed before a watcher held it
        "worker_failed": Case("wf", base, "failed")
        .record(Phase.CANCELLED)
        .marker(
            "cancelled",
            by="worker",
            reason="the worker failed before it could watch the job: ValueError: could not convert "
            "string to float: '2s' (while building the trigger)",
        ),
        "failed_while_packaging": Case("fwp", base, "failed")
        .record(Phase.CANCELLED)
        .marker(
            "cancelled",
            by="worker",
            reason="its payload could not be built or uploaded",
            cause=Cause.PACKAGING_FAILED.value,
        ),
        # a person cancelled it from the CLI while a trigger watched it; the watcher delivered
        "cancelled": Case("cx", base, "failed")
        .record(Phase.DELIVERED, outcome="failed", usage={**usage, "chips": 0, "chip_hours": 0.0})
        .marker("cancelled", by="kinetic-airflow jobs cancel (ana@laptop)", reason="wrong data"),
        # the task failed after the job started, and nothing watched or stopped it
        "orphaned_running": Case("or", base, "failed").record(Phase.WAITING).marker("started"),
        "orphaned_finished": Case("of", base, "failed")
        .record(Phase.WAITING)
        .marker("started")
        .summary(ok=True, value_type="builtins.int", value_repr="42"),
        "live": Case("lv", base, "deferred").record(Phase.WAITING),
        # a tpu-v6e-8t sweep on the local backend, recorded as 8 chips by an older worker
        "local_tpu": Case("lt", base, "success", accelerator="tpu-v6e-8t")
        .record(Phase.DELIVERED, outcome="success", usage=usage)
        .summary(ok=True, value_type="builtins.dict", value_repr="{'loss': 0.1}"),
        "user_error": Case("ue", base, "failed")
        .record(Phase.DELIVERED, outcome="failed", usage={**usage, "chips": 0, "chip_hours": 0.0})
        .summary(ok=False, error_type="nt_fail.TrainingDiverged", error_message="loss is NaN at step 42"),
    }
    cases["live"].storage.write_text(
        cases["live"].layout.status("progress"),
        json.dumps({"state": "running", "text": "running as a local process", "running_since": time.time()}),
    )
    dag_runs_in_metastore(
        kn_ops.DAGS[DAG_ID],
        [c.run_id for c in cases.values()],
        {"greet": "success", "big": "success", "diverges": "success"},
    )
    with create_session() as session:
        for case in cases.values():
            session.execute(
                update(TaskInstance)
                .where(TaskInstance.dag_id == DAG_ID, TaskInstance.run_id == case.run_id)
                .where(TaskInstance.task_id == "greet")
                .values(state=case.ti_state)
            )

            class Store:  # what the worker's task_state_store client does, into the table
                value: Any = None

                def get(self, key: str) -> Any:
                    return self.value

                def set(self, key: str, value: Any) -> None:
                    self.value = value

            store, previous = Store(), None
            for phase in PATHS[case.phase]:
                extra = case.extra if phase is case.phase else {}
                previous = save_record(
                    store,
                    phase,
                    job=case.ref,
                    now=TryInfo(1, "", 0),
                    deadline=None,
                    previous=previous,
                    **extra,
                )
            dag_run_id = session.scalar(
                select(DagRun.id).where(DagRun.dag_id == DAG_ID, DagRun.run_id == case.run_id)
            )
            session.add(
                TaskStateStoreModel(
                    dag_run_id=dag_run_id,
                    dag_id=DAG_ID,
                    run_id=case.run_id,
                    task_id="greet",
                    map_index=-1,
                    key=STATE_KEY,
                    value=json.dumps(store.value),
                )
            )
    with create_session() as session:
        return {
            name: task_rows(session, all_jobs=True, dag_ids=None, dag_id=DAG_ID, run_id=case.run_id)[0]
            for name, case in cases.items()
        }


def test_a_task_that_failed_before_its_job_started_is_failed_and_says_so(rows):
    row = rows["failed_before_start"]
    assert (row["state"], row["ending"]) == ("failed", "failed_before_start")
    assert row["doing"] == (
        "failed before its job started: its task instance is failed, and the job never got its payload"
    )
    row = rows["worker_failed"]
    assert (row["state"], row["ending"]) == ("failed", "failed_before_start")
    assert row["doing"].startswith("failed before its job started: the worker failed before it could watch")
    assert "could not convert string to float: '2s' (while building the trigger)" in row["doing"]


def test_a_failure_while_packaging_is_failed_with_its_reason(rows):
    row = rows["failed_while_packaging"]
    assert (row["state"], row["ending"]) == ("failed", "failed_while_packaging")
    assert row["doing"] == "failed while packaging: its payload could not be built or uploaded"


def test_the_view_and_the_jobs_cli_give_a_job_the_same_state(rows, base, capsys):
    """One vocabulary (``job.states.status_of``): the view's state of a job is the word
    ``kinetic-airflow jobs list`` prints for it, for a lost job (its task failed after it started,
    its process is gone) and for a job whose worker failed while packaging its payload."""
    from kinetic_airflow.cli.main import main

    assert main(["jobs", "list", "--base-uri", base, "-o", "json"]) == 0
    listed = {job["job_id"]: job["state"] for job in json.loads(capsys.readouterr().out)}
    for name, state in (("orphaned_running", "lost"), ("failed_while_packaging", "failed")):
        row = rows[name]
        assert row["state"] == listed[row["job_id"]] == state, (name, row, listed)
    # and every other job of these cases: never a word the other does not know
    for name, row in rows.items():
        assert row["state"] in {"pending", "running", "succeeded", "failed", "cancelled", "lost"}, name


def test_a_cancel_names_who_and_why(rows):
    row = rows["cancelled"]
    assert (row["state"], row["ending"]) == ("cancelled", "cancelled")
    assert row["doing"] == "cancelled by kinetic-airflow jobs cancel (ana@laptop): wrong data"


def test_a_job_whose_task_ended_without_it_is_orphaned(rows):
    row = rows["orphaned_running"]
    assert (row["state"], row["ending"]) == ("lost", "orphaned")  # nobody will deliver its outcome
    assert (
        "its task instance is failed without its outcome; the job started and may still run" in row["doing"]
    )
    assert f"kinetic-airflow jobs cancel {row['job_id']}" in row["doing"]
    row = rows["orphaned_finished"]
    assert (row["state"], row["ending"]) == ("succeeded", "orphaned")  # it did; its task never knew
    assert row["doing"] == "returned int, but its task instance is failed and never received it"


def test_a_watched_job_is_live_and_the_user_error_is_the_job_failure(rows):
    row = rows["live"]
    assert (row["state"], row["ending"], row["doing"]) == ("running", "", "running as a local process")
    row = rows["user_error"]
    assert (row["state"], row["ending"]) == ("failed", "failed")
    assert row["doing"] == "nt_fail.TrainingDiverged: loss is NaN at step 42"


def test_a_local_run_shows_its_cpu_and_bills_no_accelerator(rows):
    row = rows["local_tpu"]
    assert row["accelerator"] == "tpu-v6e-8t" and row["device"] == "local CPU"
    assert row["chip_hours"] == 0 and row["run_seconds"] == pytest.approx(96.3)  # wall time stays
    (job,) = row["jobs"]
    assert job["chips"] == 0 and job["chip_hours"] == 0 and job["spot"] is False
    assert job["duration_seconds"] == pytest.approx(96.3)


def test_the_cost_table_sums_the_rows_it_is_given(rows):
    from kinetic_airflow.ui.data import run_costs

    failed = [r for r in rows.values() if r["state"] == "failed"]
    costs = run_costs(failed)
    assert sorted(c["run_id"] for c in costs) == sorted(r["run_id"] for r in failed)
    assert all(set(c["states"]) == {"failed"} for c in costs)
    # packaging and before-start failures are failures: a State=failed filter lists them
    assert {r["ending"] for r in failed} == {"failed_before_start", "failed_while_packaging", "failed"}


def test_chips_of_a_local_job_are_none_whatever_its_accelerator(tmp_path):
    from kinetic_airflow.usage import attempt_usage, chips_of

    assert chips_of(JobRef("j", "local", "file:///j", accelerator="tpu-v6e-8t")) == (0, False)
    assert chips_of(JobRef("j", "gke", "gs://b/jobs/j", accelerator="tpu-v6e-8t")) == (8, False)
    identity = JobIdentity("d", "r", "t")
    ref = JobRef(
        job_id=identity.job_id,
        job_uri=f"file://{tmp_path}/jobs/{identity.job_id}",
        identity=identity,
        backend="local",
        accelerator="tpu-v6e-8t",
        submitted_at=1000.0,
    )
    storage = open_storage(f"file://{tmp_path}")
    layout = JobLayout(ref.job_uri)
    storage.write_text(layout.status("started"), json.dumps({"time": 1010.0}))
    storage.write_text(layout.status("finished"), json.dumps({"time": 1010.0 + 771}))
    usage = attempt_usage(storage, ref, "success")
    assert (usage["chips"], usage["chip_hours"], usage["device"]) == (0, 0.0, "local CPU")
    assert usage["run_seconds"] == 771.0 and usage["queue_seconds"] == 10.0
