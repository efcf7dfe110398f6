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
from kinetic_airflow.lifecycle import JobRecord, Phase, TryInfo, decode_record, load_record, save_record

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Store:
    def __init__(self, value: object) -> None:
        self.value = value

    def get(self, key: str) -> object:
        return self.value if key == STATE_KEY else None


def _record(job: JobRef) -> JobRecord:
    return save_record(None, Phase.WAITING, job=job, now=TryInfo(1, "ti-1", 0), deadline=None)


def _forms(record: JobRecord) -> dict[str, object]:
    text = json.dumps(record.to_dict())
    return {
        "object": record.to_dict(),
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
        value = json.dumps(json.dumps(record.to_dict()))

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
                    value=json.dumps(json.dumps(_record(job).to_dict())),  # a store that encodes twice
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


# One typed record: every stored form decodes, and encodes back to what was stored ------------------
# the reference as JobRef writes it (its own form is test_job_ref's business)
_JOB = JobRef.from_dict({"job_id": "j-1", "job_uri": "file:///x/j-1", "backend": "local"}).to_dict()

EARLIER_FORMS = {
    # written before the lifecycle: just before the job was created, never updated
    "no phase, no version": {"job": _JOB, "try_number": 1},
    # the first lifecycle records: no history, no key
    "version 1": {
        "version": 1,
        "phase": "waiting",
        "job": _JOB,
        "try_number": 2,
        "ti_id": "ti-2",
        "max_tries": 3,
        "deadline": None,
        "updated": 1700000000.5,
    },
    # today's record, in the order save_record writes it, with what delivering adds
    "version 2": {
        "version": 2,
        "phase": "delivered",
        "job": _JOB,
        "try_number": 1,
        "ti_id": "ti-1",
        "max_tries": None,
        "deadline": 1700000600,
        "updated": 1700000000.5,
        "outcome": "success",
        "usage": {"chip_hours": 0.0, "try_number": 1},
        "integrity": {"job_id": "j-1", "key": "k" * 64, "payload_sha256": "s" * 64},
        "jobs": [{"job_id": "j-1", "phase": "delivered", "outcome": "success"}],
    },
    # a key a newer version writes is kept
    "an unknown key": {"version": 3, "phase": "cancelled", "job": _JOB, "newer": {"x": [1]}},
}


@pytest.mark.parametrize("form", list(EARLIER_FORMS))
def test_every_earlier_record_decodes_and_encodes_back_byte_for_byte(form):
    stored = EARLIER_FORMS[form]
    record = JobRecord.from_dict(stored)
    assert record.job == JobRef.from_dict(_JOB)
    assert json.dumps(record.to_dict()) == json.dumps(stored)  # absent stays absent, order kept
    assert decode_record(json.dumps(stored)) == record
    assert JobRecord.from_dict(record.to_dict()) == record


def test_what_the_typed_fields_say():
    old = JobRecord.from_dict(EARLIER_FORMS["no phase, no version"])
    assert old.phase is None and old.current_phase is Phase.WAITING and old.version is None
    assert "outcome" not in old.present and "deadline" not in old.present
    delivered = JobRecord.from_dict(EARLIER_FORMS["version 2"])
    assert delivered.phase is Phase.DELIVERED and delivered.outcome == "success"
    assert delivered.integrity["key"] == "k" * 64 and delivered.jobs[0].job_id == "j-1"
    assert JobRecord.from_dict(EARLIER_FORMS["an unknown key"]).unknown == {"newer": {"x": [1]}}


def test_a_change_to_a_decoded_record_adds_its_key_and_keeps_the_rest():
    record = JobRecord.from_dict(EARLIER_FORMS["version 1"]).replace(outcome="failed")
    assert record.to_dict() == {**EARLIER_FORMS["version 1"], "outcome": "failed"}


def test_a_saved_record_is_stored_as_it_always_was():
    stored: dict[str, object] = {}

    class Recording:
        def get(self, key: str) -> object:
            return stored.get(key)

        def set(self, key: str, value: object) -> None:
            stored[key] = value

    job = JobRef.from_dict(_JOB)
    record = save_record(Recording(), Phase.RECORDED, job=job, now=TryInfo(1, "ti-1", 0), deadline=None)
    value = stored[STATE_KEY]
    assert isinstance(value, dict) and json.loads(json.dumps(value)) == value  # plain JSON
    assert list(value) == [
        "version", "phase", "job", "try_number", "ti_id", "max_tries", "deadline", "updated", "jobs"
    ]  # fmt: skip
    assert value["phase"] == "recorded" and value["job"] == job.to_dict()
    assert load_record(Recording()) == record


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("phase", "finished"),
        ("try_number", "1"),
        ("try_number", True),
        ("ti_id", 7),
        ("max_tries", 1.5),
        ("deadline", "soon"),
        ("outcome", {"ok": True}),
        ("integrity", "k"),
        ("cancelled", ["by"]),
        ("jobs", {"job_id": "j-1"}),
        ("jobs", ["j-1"]),
    ],
)
def test_a_bad_value_is_refused_naming_its_field(field, value):
    with pytest.raises(ValueError, match=f"record's '{field}' is"):
        JobRecord.from_dict({"version": 2, "phase": "waiting", "job": _JOB, field: value})
    with pytest.raises(ValueError, match=f"'{field}'"):  # and through the one decoder
        decode_record(json.dumps({"job": _JOB, field: value}))


def test_a_bad_job_reference_is_refused():
    with pytest.raises(ValueError):
        JobRecord.from_dict({"job": {"backend": "local"}})
