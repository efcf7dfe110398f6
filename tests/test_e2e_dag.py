"""End to end through real Airflow (dag.test) on the local backend, file:// and gs:// storage."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import metadata_db_files_containing, ti_states, ti_try_numbers, xcom


def _dag(name: str):
    import kn_e2e

    return getattr(kn_e2e, name)()


def test_values_multiple_outputs_expand_arrays_env_volumes(base_uri, monkeypatch, capfd):
    monkeypatch.setenv("KN_TEST_SECRET_TOKEN", "s3cr3t-v4lue")
    monkeypatch.setenv("KN_TEST_COLOR", "blue")
    dr = _dag("kn_values").test()
    assert dr.state == "success", ti_states(dr)
    assert xcom(dr, "add") == 5
    assert xcom(dr, "stats", key="mean") == 3.0
    assert xcom(dr, "stats", key="n") == 4
    assert [xcom(dr, "square", map_index=i) for i in range(4)] == [1, 4, 9, 16]
    ref = xcom(dr, "make_array")
    assert ref["__kinetic_result_ref__"].startswith(base_uri)
    assert ref["type"] == "numpy.ndarray"
    assert xcom(dr, "array_total") == sum(range(1000))
    assert xcom(dr, "plain_total") == sum(range(1000))
    assert xcom(dr, "read_env") == {
        "names": ["KN_TEST_COLOR", "KN_TEST_SECRET_TOKEN"],
        "color": "blue",
        "secret_ok": True,
    }
    # No secret in the task logs (stdout here) nor anywhere in the metadata DB
    # (XCom, trigger kwargs, next_kwargs events, rendered fields).
    out, err = capfd.readouterr()
    assert "s3cr3t-v4lue" not in out + err
    assert metadata_db_files_containing("s3cr3t-v4lue") == []
    assert metadata_db_files_containing("KN_TEST_SECRET_TOKEN")  # the check reads the DB (and its log)
    volume = xcom(dr, "read_volume")
    assert volume["mounted"] == ["lines.txt", "sub/inner.txt"]
    assert volume["arg_lines"] == ["alpha", "beta", "gamma"]


def test_failures_keep_type_message_and_cause(base_uri, tmp_path, monkeypatch):
    out = tmp_path / "failures"
    out.mkdir()
    monkeypatch.setenv("KN_TEST_FAILURES", str(out))
    dr = _dag("kn_failures").test()
    states = ti_states(dr)
    assert states == {
        "diverge": "failed",
        "exits_nonzero": "failed",
        "exits_zero": "success",
        "returns_unpicklable": "failed",
    }
    kind, message = (out / "diverge.txt").read_text().split("\n", 1)
    assert kind.endswith("TrainingDiverged")
    assert message.startswith("loss is NaN at step 42")
    kind, message = (out / "exits_nonzero.txt").read_text().split("\n", 1)
    assert kind == "kinetic_airflow.results.KineticRemoteError"
    assert "sys.exit(3)" in message and "Only sys.exit(0) counts as success" in message
    kind, message = (out / "returns_unpicklable.txt").read_text().split("\n", 1)
    assert kind == "kinetic_airflow.results.KineticJobError"
    assert "phase 'upload'" in message
    assert "cannot be pickled" in message and "_thread.lock" in message


def test_retry_finds_checkpoint_in_output_dir(base_uri):
    dr = _dag("kn_retry").test()
    assert dr.state == "success", ti_states(dr)
    assert ti_try_numbers(dr)["resumable_training"] == 2
    value = xcom(dr, "resumable_training")
    assert value["resumed_from"].startswith("step-100 written by job ")
    first_job = value["resumed_from"].rsplit(" ", 1)[1]
    assert first_job.endswith("-t1a1") and value["job"].endswith("-t2a1")


def _local_dir(base_uri: str, job: str) -> Path:
    if base_uri.startswith("file://"):
        return Path(base_uri[len("file://") :]) / "jobs" / job
    return Path(os.environ["KINETIC_LOCAL_STATE_DIR"]) / job


def _job_dirs(base_uri: str, task_id: str) -> list[str]:
    """Job ids of ``task_id``'s jobs, by the identity in each job's manifest (ids are shortened)."""
    from kinetic_airflow.job.storage import open_storage

    storage = open_storage(base_uri)
    jobs = {uri.split("/jobs/", 1)[1].split("/", 1)[0] for uri in storage.list(base_uri + "/jobs")}
    found = []
    for job in jobs:
        text = storage.read_text_or_none(f"{base_uri}/jobs/{job}/manifest.json")
        if text and json.loads(text).get("identity", {}).get("task_id") == task_id:
            found.append(job)
    return sorted(found)


# What this checks (a duplicate execute, the timeout, the in-worker wait) is Airflow's and the
# driver's, the same on either storage: on GCS (fake-gcs-server), the product's storage.
@pytest.mark.parametrize("base_uri", ["gs"], indirect=True)
def test_duplicate_execute_timeout_and_in_worker_wait(base_uri, tmp_path, monkeypatch):
    out = tmp_path / "failures"
    out.mkdir()
    monkeypatch.setenv("KN_TEST_FAILURES", str(out))
    dr = _dag("kn_semantics").test()
    assert ti_states(dr) == {
        "slow_once": "success",
        "runs_too_long": "failed",
        "in_worker": "success",
        "classic_lambda": "success",
        "classic_partial": "success",
    }
    assert xcom(dr, "classic_lambda") == 42 and xcom(dr, "classic_partial") == 1024

    # execute ran twice for slow_once (pre_execute hook): one job, and the value is from it
    jobs = _job_dirs(base_uri, "slow_once")
    assert len(jobs) == 1, jobs
    assert isinstance(xcom(dr, "slow_once"), int)

    # execution_timeout while deferred: the task fails with a timeout and the job is stopped
    kind, message = (out / "runs_too_long.txt").read_text().split("\n", 1)
    assert kind == "airflow.sdk.exceptions.AirflowTaskTimeout"
    assert "execution_timeout passed" in message and "the job was stopped" in message
    (job,) = _job_dirs(base_uri, "runs_too_long")
    from kinetic_airflow.job.storage import open_storage

    summary = open_storage(base_uri).read_text_or_none(f"{base_uri}/jobs/{job}/result.json")
    assert summary is None  # it never finished on its own
    exit_record = json.loads((_local_dir(base_uri, job) / "exit.json").read_text())
    assert exit_record["cancelled"] is True and exit_record["returncode"] != 0
    assert xcom(dr, "in_worker") == 42
