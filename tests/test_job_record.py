"""The job record has one decoder (``lifecycle.decode_record``), and every reader uses it.

The record reaches its readers in three forms: the object (the worker's ``task_state_store``
client), its JSON text (the ``task_state_store`` table, read by the listener and the Kinetic
view) and, from some stores, that text encoded once more. A reader that misses a form sees no
job: a mark-failed would then leave the job running.
"""

from __future__ import annotations

import json
import sys
import time

import cloudpickle
import pytest
from helpers import dag_runs_in_metastore
from jobkit import key_of, make_job

from kinetic_airflow.backends.local import LocalBackend
from kinetic_airflow.job.layout import STATE_KEY, JobIdentity
from kinetic_airflow.job.ref import JobRef
from kinetic_airflow.job.storage import open_storage, uri_to_local_path
from kinetic_airflow.lifecycle import Phase, TryInfo, decode_record, load_record, save_record

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Store:
    def __init__(self, value: object) -> None:
        self.value = value

    def get(self, key: str) -> object:
        return self.value if key == STATE_KEY else None


def _record(job: JobRef) -> dict:
    return save_record(None, Phase.WAITING, job=job, now=TryInfo(1, "ti-1", 0), deadline=None)


def _forms(record: dict) -> dict[str, object]:
    text = json.dumps(record)
    return {
        "object": record,
        "JSON text": text,
        "JSON text encoded again": json.dumps(text),
        "bytes": text.encode(),
    }


@pytest.mark.parametrize("form", ["object", "JSON text", "JSON text encoded again", "bytes"])
def test_every_form_of_the_record_decodes_to_the_record(form):
    record = _record(JobRef.from_dict({"job_id": "j-1", "job_uri": "file:///x/j-1", "backend": "local"}))
    value = _forms(record)[form]
    assert decode_record(value) == record
    assert load_record(Store(value)) == record


def test_no_record_and_a_damaged_record():
    assert decode_record(None) is None and load_record(None) is None
    assert decode_record(json.dumps({"something": "else"})) is None  # another key's value
    assert decode_record(json.dumps({"job": "not an object"})) is None
    with pytest.raises(ValueError, match=r"the kinetic job record .* is not JSON: '\{half'"):
        decode_record("{half")


def test_the_view_reads_a_double_encoded_record():
    from kinetic_airflow.ui import data

    record = _record(JobRef.from_dict({"job_id": "j-1", "job_uri": "file:///x/j-1", "backend": "local"}))

    class Row:  # a task_state_store row as SQLAlchemy hands it to the view
        dag_id, run_id, task_id = "d", "r", "t"
        value = json.dumps(json.dumps(record))

    assert data._record_of(Row()) == record
    Row.value = "{half"
    assert data._record_of(Row()) is None  # one damaged record does not blank the page


def test_marking_failed_stops_the_job_of_a_double_encoded_record(tmp_path):
    """The real path of a manual mark-failed in the API server (Airflow's own hook call, with
    kinetic's listener registered by its plugin) on a record stored as JSON text of JSON text."""
    import kn_ops
    from airflow.api_fastapi.core_api.services.public.task_instances import _emit_state_listener_hooks
    from airflow.models.dagrun import DagRun
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import select

    dag = kn_ops.DAGS["kn_ops_local"]
    run_id = f"double_encoded__{time.time_ns()}"
    dag_runs_in_metastore(dag, [run_id], {"greet": "deferred", "big": "success", "diverges": "success"})

    base = f"file://{tmp_path}/kinetic"
    identity = JobIdentity(dag.dag_id, run_id, "greet")
    layout = make_job(base, time.sleep, (600,), job_id=identity.job_id)
    job = JobRef(
        backend="local",
        job_id=identity.job_id,
        job_uri=layout.job_uri,
        local_dir=uri_to_local_path(layout.job_uri),
        python=sys.executable,
        identity=identity,
    )
    backend = LocalBackend()
    backend.submit(job, job_key=key_of(job.job_uri))
    try:
        with create_session() as session:
            dag_run_id = session.scalar(
                select(DagRun.id).where(DagRun.dag_id == dag.dag_id, DagRun.run_id == run_id)
            )
            session.add(
                TaskStateStoreModel(
                    dag_run_id=dag_run_id,
                    dag_id=dag.dag_id,
                    run_id=run_id,
                    task_id="greet",
                    map_index=-1,
                    key=STATE_KEY,
                    value=json.dumps(json.dumps(_record(job))),  # a store that encodes twice
                )
            )
        with create_session() as session:
            ti = session.scalar(
                select(TaskInstance).where(
                    TaskInstance.dag_id == dag.dag_id,
                    TaskInstance.run_id == run_id,
                    TaskInstance.task_id == "greet",
                )
            )
            _emit_state_listener_hooks([ti], TaskInstanceState.FAILED)

        storage = open_storage(base)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and backend.status(job).state.value in ("pending", "running"):
            time.sleep(0.2)
        marker = json.loads(storage.read_text(f"{layout.job_uri}/status/cancelled.json"))
        assert marker["by"] == "listener" and "marked failed or success by a user" in marker["reason"]
        assert backend.status(job).state.value not in ("pending", "running")
    finally:
        backend.cancel(job)  # never leave a sleeping job behind, whatever failed above
