"""Reusing a result (issue 41 item 2): ``cache=True`` through real Airflow (dag.test), on the local
backend with file:// and gs:// (fake-gcs-server) storage.

A DAG run twice with the same inputs launches one job; the second task's log, its XCom
``kinetic_cache`` and the Kinetic view name the reused job; changing an argument, the code or
``cache_version`` launches a new one; a run whose conf asks for a fresh run launches one too; a
result replaced in job storage after it was verified (what a bucket writer can do) is refused
and the task runs a new job; a failed try never enters a result, and its retry runs a job.
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from helpers import ti_states, xcom
from ops_support import cluster, gke_env

from kinetic_airflow.job.layout import RECORD_NAME, JobLayout
from kinetic_airflow.job.storage import join_uri, open_storage

__all__ = ["cluster", "gke_env"]  # fixtures


def _jobs(base_uri: str, prefix: str = "") -> list[str]:
    """The ids of every job launched under ``base_uri`` (each has its ``job.json``) that start with
    ``prefix`` (the parameters of one test share its fake-GCS bucket)."""
    storage = open_storage(base_uri)
    listed = storage.list(join_uri(base_uri, "jobs"))
    ids = (uri.rsplit("/", 2)[-2] for uri in listed if uri.endswith("/" + RECORD_NAME))
    return sorted(i for i in ids if i.startswith(prefix))


def _run(capsys, dag, **kwargs):
    capsys.readouterr()
    dr = dag.test(**kwargs)
    out, err = capsys.readouterr()
    return dr, out + err


def _variable(name: str) -> dict:
    from airflow.models.variable import Variable

    return json.loads(Variable.get(name))


def _view_row(dr) -> dict:
    from airflow.utils.session import create_session

    from kinetic_airflow.ui.data import job_details

    with create_session() as session:
        return job_details(session, dr.dag_id, dr.run_id, "square", -1)


@pytest.mark.parametrize("base_uri", ["file", "gs"], indirect=True)
def test_a_dag_run_twice_launches_one_job_and_the_second_names_it(base_uri, tmp_path, capsys):
    import kn_cache

    dag = kn_cache.cache_dag("kn_cache_twice", str(tmp_path), 7)
    first, first_log = _run(capsys, dag)
    assert ti_states(first) == {"square": "success"}
    launched = _jobs(base_uri)
    assert len(launched) == 1
    value = xcom(first, "square")
    assert value["square"] == 49
    recorded = xcom(first, "square", key="kinetic_cache")
    assert recorded["reused"] is False
    assert "[kinetic] cache: recorded the result of job" in first_log
    entry = _variable(recorded["variable"])
    assert entry["job_id"] == launched[0] and entry["run_id"] == first.run_id
    assert len(entry["result_sha256"]) == 64

    second, second_log = _run(capsys, dag)
    assert ti_states(second) == {"square": "success"}
    assert _jobs(base_uri) == launched  # no job was launched
    assert xcom(second, "square") == value  # the first job's value, same process id and all
    reused = xcom(second, "square", key="kinetic_cache")
    assert reused["reused"] is True
    assert reused["job_id"] == launched[0] and reused["run_id"] == first.run_id
    assert reused["task_id"] == "square" and reused["cache_key"] == recorded["cache_key"]
    assert f"reused the result of job {launched[0]} from run {first.run_id}" in second_log
    assert "chip-hours" in second_log and "No job was launched" in second_log
    usage = xcom(second, "square", key="kinetic_usage")
    assert usage["chip_hours"] == 0 and usage["attempts"][0]["outcome"] == "reused"

    # The Kinetic view: the second run's task instance says whose result it reused.
    row = _view_row(second)
    assert row["state"] == "succeeded" and row["ending"] == "reused"
    assert f"reused the result of job {launched[0]} from run {first.run_id}" in row["doing"]
    assert row["jobs"][-1]["reused"]["job_id"] == launched[0]
    assert row["chip_hours"] == 0
    assert _view_row(first)["ending"] == "succeeded"


@pytest.mark.parametrize("base_uri", ["file"], indirect=True)
def test_a_run_recreated_for_the_same_logical_date_reuses_the_result(base_uri, tmp_path, capsys):
    """A reprocess (``dag.test()`` with the logical date of a run deletes and recreates that run,
    as a recreated DAG run does): the new run's task instance has no job record, and reuses."""
    import kn_cache

    dag = kn_cache.cache_dag("kn_cache_twice", str(tmp_path), 11)
    first, _ = _run(capsys, dag)
    job_id = _jobs(base_uri)[0]
    again, log = _run(capsys, dag, logical_date=first.logical_date)
    assert again.logical_date == first.logical_date
    assert _jobs(base_uri) == [job_id]
    assert xcom(again, "square", key="kinetic_cache")["job_id"] == job_id
    assert xcom(again, "square")["square"] == 121
    assert f"reused the result of job {job_id} from run {first.run_id}" in log


@pytest.mark.parametrize("base_uri", ["file"], indirect=True)
def test_changing_an_argument_the_code_or_cache_version_launches_a_new_job(base_uri, tmp_path, capsys):
    import kn_cache

    tag = str(tmp_path)
    kn_cache.cache_dag("kn_cache_base", tag, 3).test()
    assert len(_jobs(base_uri)) == 1
    # the same inputs in another DAG reuse it (the key is the job, not the DAG's name)
    dr, _ = _run(capsys, kn_cache.cache_dag("kn_cache_other_dag", tag, 3))
    assert xcom(dr, "square", key="kinetic_cache")["reused"] is True
    assert len(_jobs(base_uri)) == 1

    variants = {
        "argument": kn_cache.cache_dag("kn_cache_arg", tag, 4),
        "code": kn_cache.cache_dag("kn_cache_code", tag, 3, changed=True),
        "cache_version": kn_cache.cache_dag("kn_cache_version", tag, 3, version="2"),
    }
    keys = set()
    for count, (what, dag) in enumerate(variants.items(), start=2):
        dr, _ = _run(capsys, dag)
        assert ti_states(dr) == {"square": "success"}, what
        assert len(_jobs(base_uri)) == count, f"changing the {what} launched no new job"
        cached = xcom(dr, "square", key="kinetic_cache")
        assert cached["reused"] is False, what
        keys.add(cached["cache_key"])
    assert len(keys) == 3
    assert xcom(dr, "square")["square"] == 9
    # and each of them is reused in its turn
    dr, _ = _run(capsys, kn_cache.cache_dag("kn_cache_version", tag, 3, version="2"))
    assert xcom(dr, "square", key="kinetic_cache")["reused"] is True
    assert len(_jobs(base_uri)) == 4


@pytest.mark.parametrize("base_uri", ["file"], indirect=True)
def test_a_run_that_asks_for_a_fresh_run_launches_a_job_and_replaces_the_entry(base_uri, tmp_path, capsys):
    import kn_cache

    dag = kn_cache.cache_dag("kn_cache_fresh", str(tmp_path), 5)
    first, _ = _run(capsys, dag)
    name = xcom(first, "square", key="kinetic_cache")["variable"]
    fresh, log = _run(capsys, dag, run_conf={"kinetic_fresh_run": True})
    assert len(_jobs(base_uri)) == 2
    assert 'not reusing a result (the DAG run\'s conf has "kinetic_fresh_run": true)' in log
    assert xcom(fresh, "square", key="kinetic_cache") == {
        "reused": False,
        "cache_key": name.removeprefix("kinetic_cache."),
        "variable": name,
    }
    assert _variable(name)["run_id"] == fresh.run_id  # the fresh result replaced the entry
    named, _ = _run(capsys, dag, run_conf={"kinetic_fresh_run": ["square"]})
    assert len(_jobs(base_uri)) == 3
    other, _ = _run(capsys, dag, run_conf={"kinetic_fresh_run": ["another_task"]})
    assert len(_jobs(base_uri)) == 3
    assert xcom(other, "square", key="kinetic_cache")["run_id"] == named.run_id


@pytest.mark.parametrize("base_uri", ["file", "gs"], indirect=True)
def test_a_result_replaced_in_job_storage_is_refused_and_a_new_job_runs(base_uri, tmp_path, capsys):
    """A bucket writer replaces the cached job's result envelope *and* its summary (all they can
    write): the entry in the metadata DB holds the digest of the result that was verified, so the
    replaced one is never unpickled; the task runs a new job and returns the real value."""
    import cloudpickle
    import kn_cache

    dag = kn_cache.cache_dag("kn_cache_planted", str(tmp_path), 6)
    first, _ = _run(capsys, dag)
    entry = _variable(xcom(first, "square", key="kinetic_cache")["variable"])
    storage = open_storage(base_uri)
    layout = JobLayout(entry["job_uri"])
    planted = json.loads(storage.read_text(layout.result_summary()))
    envelope = {**planted, "ok": True, "value": {"square": -1, "planted": True}}
    forged = cloudpickle.dumps(envelope)
    storage.write_bytes(layout.result(), forged)
    planted["integrity"] = {"sha256": hashlib.sha256(forged).hexdigest(), "hmac": "0" * 64}
    storage.write_text(layout.result_summary(), json.dumps(planted))

    second, log = _run(capsys, dag)
    assert ti_states(second) == {"square": "success"}
    assert f"refused the cached result of job {entry['job_id']}" in log
    assert "running a new job instead" in log
    assert len(_jobs(base_uri)) == 2
    assert xcom(second, "square")["square"] == 36 and "planted" not in xcom(second, "square")
    assert xcom(second, "square", key="kinetic_cache")["reused"] is False


@pytest.mark.parametrize("base_uri", ["file"], indirect=True)
def test_with_a_signing_key_an_entry_changed_in_the_variables_is_not_used(
    base_uri, tmp_path, capsys, monkeypatch
):
    """[kinetic] cache_signing_key: someone who may edit Variables (and write the bucket) points the
    entry at an envelope they planted, with its right digest; the entry's HMAC no longer matches."""
    import cloudpickle
    import kn_cache
    from airflow.models.variable import Variable

    monkeypatch.setenv("AIRFLOW__KINETIC__CACHE_SIGNING_KEY", "k" * 40)
    dag = kn_cache.cache_dag("kn_cache_planted", str(tmp_path), 9)
    first, _ = _run(capsys, dag)
    name = xcom(first, "square", key="kinetic_cache")["variable"]
    entry = _variable(name)
    assert len(entry["hmac"]) == 64
    reused, _ = _run(capsys, dag)
    assert xcom(reused, "square", key="kinetic_cache")["reused"] is True  # signed entries are used

    storage = open_storage(base_uri)
    planted = join_uri(base_uri, "planted", "result.pkl")
    storage.write_bytes(planted, cloudpickle.dumps({"ok": True, "value": {"square": -1}}))
    forged = {**entry, "job_uri": join_uri(base_uri, "planted")}
    forged["result_sha256"] = hashlib.sha256(storage.read_bytes(planted)).hexdigest()
    Variable.set(name, json.dumps(forged))
    third, log = _run(capsys, dag)
    assert f"the result cache entry {name} is not signed with [kinetic] cache_signing_key" in log
    assert xcom(third, "square")["square"] == 81
    assert len(_jobs(base_uri)) == 2
    assert len(_variable(name)["hmac"]) == 64  # the new job's result is entered, signed

    monkeypatch.setenv("AIRFLOW__KINETIC__CACHE_SIGNING_KEY", "short")
    fourth, log = _run(capsys, dag)
    assert ti_states(fourth) == {"square": "failed"}
    assert "[kinetic] cache_signing_key is 5 characters long" in log and "openssl rand -hex 32" in log
    assert len(_jobs(base_uri)) == 2  # failed before any job existed


@pytest.mark.parametrize("base_uri", ["file"], indirect=True)
def test_a_failed_try_enters_nothing_and_its_retry_runs_a_job(base_uri, tmp_path, capsys):
    import kn_cache

    dag = kn_cache.flaky_dag("kn_cache_flaky", str(tmp_path), str(tmp_path / "marker"))
    dr, log = _run(capsys, dag)
    assert ti_states(dr) == {"flaky": "success"}
    assert xcom(dr, "flaky") == "second try"
    assert len(_jobs(base_uri)) == 2  # the failed try's job, then the retry's own
    assert xcom(dr, "flaky", key="kinetic_cache")["reused"] is False
    assert log.count("[kinetic] cache: no earlier result with key") == 2
    again, _ = _run(capsys, dag)
    assert xcom(again, "flaky") == "second try"
    assert len(_jobs(base_uri)) == 2


@pytest.mark.parametrize("backend", ["gke", "pathways", "multislice"])
@pytest.mark.parametrize("base_uri", ["gs"], indirect=True)
def test_on_the_cluster_backends_a_second_run_reuses_the_first_job(
    backend, base_uri, gke_env, tmp_path, capsys
):
    """The emulator runs a GKE Job, a 4-host LeaderWorkerSet (pathways) and a 2-slice JobSet
    (multislice); host 0's result is the one entered and reused."""
    import kn_cache

    dag = kn_cache.cache_dag(f"kn_cache_{backend}", str(tmp_path), 8, **kn_cache.CLUSTER[backend])
    first, _ = _run(capsys, dag)
    assert ti_states(first) == {"square": "success"}
    launched = _jobs(base_uri, f"kn-cache-{backend}-")
    assert len(launched) == 1
    entry = _variable(xcom(first, "square", key="kinetic_cache")["variable"])
    assert entry["backend"] == backend and entry["job_id"] == launched[0]
    second, log = _run(capsys, dag)
    assert ti_states(second) == {"square": "success"}
    assert _jobs(base_uri, f"kn-cache-{backend}-") == launched
    assert xcom(second, "square") == xcom(first, "square")
    assert f"reused the result of job {launched[0]} from run {first.run_id}" in log


@pytest.mark.parametrize("base_uri", ["file"], indirect=True)
def test_with_a_capacity_ladder_a_result_of_a_later_rung_is_reused(base_uri, gke_env, tmp_path, capsys):
    import kn_cache

    dag = kn_cache.cache_dag("kn_cache_ladder", str(tmp_path), 12, **kn_cache.CLUSTER["ladder"])
    first, _ = _run(capsys, dag)
    assert ti_states(first) == {"square": "success"}
    launched = _jobs(base_uri)
    assert sorted(job[-4:] for job in launched) == ["t1a1", "t1a2"]  # rung 1 withdrawn, rung 2 ran
    entry = _variable(xcom(first, "square", key="kinetic_cache")["variable"])
    assert entry["job_id"].endswith("t1a2") and entry["accelerator"] == "gpu-l4"
    second, log = _run(capsys, dag)
    assert _jobs(base_uri) == launched  # not even rung 1 was submitted
    assert xcom(second, "square", key="kinetic_cache")["job_id"] == entry["job_id"]
    assert f"reused the result of job {entry['job_id']}" in log


# Parse time and the entry's own checks ---------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cache": "yes"}, "cache='yes' is a string, not a bool"),
        ({"cache": 1}, "write cache=True"),
        ({"cache_version": "2"}, "cache_version='2' given without cache=True does nothing"),
        ({"cache": True, "cache_version": ""}, "cache_version='' is empty"),
        ({"cache": True, "cache_version": 2}, "is an int, not a string"),
        ({"cache": True, "debug": True}, "cache=True with debug=True: a reused result would skip the job"),
    ],
)
def test_cache_options_are_checked_when_the_dag_is_parsed(options, message):
    from airflow.sdk import task

    from kinetic_airflow.options import KineticOptionError

    with pytest.raises(KineticOptionError, match=re.escape(message)):
        task.kinetic(backend="local", **options)(lambda: None)


def _ref(accelerator: str, backend: str = "gke"):
    from kinetic_airflow.accelerators import parse_accelerator
    from kinetic_airflow.job.layout import JobIdentity
    from kinetic_airflow.job.ref import JobRef

    identity = JobIdentity("d", "r", "t")
    return JobRef(job_id=identity.job_id, backend=backend, identity=identity, job_uri="file:///x",
                  spec=parse_accelerator(accelerator))  # fmt: skip


def test_the_key_changes_with_each_part_but_not_with_spot():
    from kinetic_airflow.result_cache import cache_key

    parts = {"payload_sha256": "a" * 64, "code_sha256": "b" * 64, "requirements": ["numpy==2.1"],
             "image": "img:1", "client": {"python": "3.11.7"}, "cache_version": None}  # fmt: skip
    key = cache_key(_ref("tpu-v6e-8"), **parts)
    assert key == cache_key(_ref("tpu-v6e-8:spot"), **parts)
    changed = {
        cache_key(_ref("tpu-v6e-16"), **parts),
        cache_key(_ref("tpu-v6e-8", backend="pathways"), **parts),
        *(
            cache_key(_ref("tpu-v6e-8"), **{**parts, name: value})
            for name, value in (
                ("payload_sha256", "c" * 64),
                ("code_sha256", None),
                ("requirements", ["numpy==2.2"]),
                ("image", "img:2"),
                ("client", {"python": "3.12.1"}),
                ("cache_version", "2"),
            )
        ),
    }
    assert key not in changed and len(changed) == 8


def test_an_entry_that_is_not_as_the_worker_writes_it_is_not_used():
    from kinetic_airflow.result_cache import CacheEntry

    good = {"key": "k", "job_id": "j", "job_uri": "file:///x/j", "backend": "local",
            "result_sha256": "f" * 64, "dag_id": "d", "run_id": "r", "task_id": "t", "map_index": -1,
            "try_number": 1, "accelerator": "cpu", "chip_hours": 0.0, "run_seconds": 1.5, "created": 1.0,
            "version": 1}  # fmt: skip
    entry = CacheEntry.from_dict(good, "k")
    assert entry.result_uri == "file:///x/j/result.pkl" and entry.to_dict() == good
    for change, words in (
        ({"key": "other"}, "not the key it is stored under"),
        ({"result_sha256": ""}, "result_sha256"),
        ({"map_index": "0"}, "map_index"),
        ({"chip_hours": True}, "chip_hours"),
        ({"version": 2}, "entry version 2"),
    ):
        with pytest.raises(ValueError, match=words):
            CacheEntry.from_dict({**good, **change}, "k")


def test_the_digest_looked_up_is_the_digest_shipped(tmp_path):
    """The look-up digests the payload without storing it; it must be what ``write_payload`` ships."""
    import threading

    import kn_cache

    from kinetic_airflow.job.payload import PayloadError, payload_digest, write_payload

    storage = open_storage(f"file://{tmp_path}")
    args, kwargs, env = ["tag", 3], {"extra": [1.5, {"a": None}]}, {"KN_COLOR": "blue"}
    uri = f"file://{tmp_path}/payload.pkl"
    shipped = write_payload(storage, uri, kn_cache._square, args, kwargs, env=env)
    assert payload_digest(kn_cache._square, args, kwargs, env=env) == shipped["sha256"]
    assert payload_digest(kn_cache._square, ["tag", 4], kwargs, env=env) != shipped["sha256"]
    with pytest.raises(PayloadError, match=r"for task 'square': positional argument 1 \(a _thread.lock\)"):
        payload_digest(kn_cache._square, ["tag", threading.Lock()], {}, task_label="task 'square'")


@pytest.mark.parametrize("base_uri", ["file"], indirect=True)
def test_a_miss_ships_the_payload_the_look_up_prepared(base_uri, tmp_path, capsys, monkeypatch):
    """The look-up's prepared parts (code bundle, staged arguments, captured environment) are
    what the job ships: a miss prepares the payload once, not once more to ship it."""
    import kn_cache

    from kinetic_airflow import result_cache, submission

    calls = []
    prepare = submission.prepare_payload

    def counting(*args, **kwargs):
        calls.append(args[1])
        return prepare(*args, **kwargs)

    monkeypatch.setattr(submission, "prepare_payload", counting)
    monkeypatch.setattr(result_cache, "prepare_payload", counting)
    dr, _ = _run(capsys, kn_cache.cache_dag("kn_cache_once", str(tmp_path), 5))
    assert ti_states(dr) == {"square": "success"} and xcom(dr, "square")["square"] == 25
    assert len(_jobs(base_uri)) == 1 and calls == [base_uri]
