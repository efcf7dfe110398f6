"""``kinetic-airflow gc``: dry run and real run against job storage (file:// and fake GCS) on the
local backend and the cluster emulator, keeping a live job's files, results an XCom references
and KINETIC_OUTPUT_DIR; orphaned cluster objects found and deleted; [kinetic] retention_days; the
maintenance DAG in dags/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
from helpers import backend_and_storage, dag_runs_in_metastore, on_storage, ti_states
from jobkit import gke_job, make_job, run_runner
from ops_support import (
    cli,
    cli_json,
    cli_polled_json,
    cli_run,
    cli_run_json,
    cluster,
    gke_env,
    in_background,
    k8s,
    local_env,
    wait_for,
)

from kinetic_airflow.job.storage import open_storage, uri_to_local_path

__all__ = ["cluster", "gke_env", "local_env"]  # fixtures

cloudpickle.register_pickle_by_value(sys.modules[__name__])
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["local", "gke"])
def backend(request):
    request.getfixturevalue("gke_env" if request.param == "gke" else "local_env")
    return request.param


def _rows(report: dict) -> dict[str, dict]:
    return {r["task_instance"].rsplit("/", 1)[-1]: r for r in report["files"] if r["job_id"] != "-"}


@backend_and_storage  # lists and deletes on both storages
def test_gc_keeps_live_and_needed(backend, base_uri, tmp_path, monkeypatch):
    """Dry run, then the real run, while a job runs: only finished, unreferenced jobs go.

    (A short name: fake-GCS buckets are named after the first 40 characters of the test id.)"""
    import kn_ops

    dr = kn_ops.DAGS[f"kn_ops_{backend}"].test()
    assert ti_states(dr) == {"greet": "success", "diverges": "failed", "big": "success"}
    done = {r["task_instance"].rsplit("/", 1)[-1]: r for r in cli_json("jobs", "list", "--run-id", dr.run_id)}
    storage = open_storage(base_uri)
    greet_output = json.loads(storage.read_text(f"{done['greet']['job_uri']}/manifest.json"))["output_dir"]
    storage.write_text(f"{greet_output}/checkpoint.txt", "step 100")  # what a training job leaves

    flag = tmp_path / "flag"
    monkeypatch.setenv("KN_OPS_FLAG", str(flag))
    dag_id = f"kn_ops_wait_{backend}"

    def gc_while_a_job_runs():
        try:
            running = ("jobs", "list", "--dag-id", dag_id, "--state", "running")
            live = wait_for(lambda: next(iter(cli_polled_json(*running)), None), "a running job")
            code, out, err = cli_run("gc", "--older-than", "0s", "--dry-run", "--json")
            assert code == 0, err
            dry = json.loads(out)[0]
            assert dry["dry_run"] is True and dry["deleted"] is None
            code, out, err = cli_run("gc", "--older-than", "0s")
            assert code == 0, err
            kept_live = storage.exists(f"{live['job_uri']}/manifest.json")
            return live, dry, out, kept_live
        finally:
            flag.write_text("go")

    thread, result = in_background(gc_while_a_job_runs)
    waited = kn_ops.DAGS[dag_id].test()
    thread.join(240)
    live, dry, real_out, kept_live = result[0]
    assert ti_states(waited) == {"waits": "success"}  # gc did not disturb it

    rows = _rows(dry)
    assert rows["greet"]["action"] == "would delete" and rows["diverges"]["action"] == "would delete"
    assert rows["big"]["action"] == "keep", rows["big"]
    assert "referenced by XCom 'return_value'" in rows["big"]["reason"]
    assert rows["waits"]["action"] == "keep" and "live (running)" in rows["waits"]["reason"], rows["waits"]
    for name in ("greet", "diverges", "big"):  # a dry run deletes nothing
        assert rows[name]["job_id"] == done[name]["job_id"]
    assert "deleted 2 job(s), 0 output dir(s), 0 orphan(s)" in real_out
    assert kept_live  # the live job's files survived the real run while it ran

    assert not storage.list(done["greet"]["job_uri"]) and not storage.list(done["diverges"]["job_uri"])
    assert storage.exists(f"{done['big']['job_uri']}/result.pkl")
    assert storage.exists(f"{live['job_uri']}/result.json")
    assert storage.read_text(f"{greet_output}/checkpoint.txt") == "step 100"  # outputs only when asked

    # the output directory goes only with --include-outputs (and only once none of its jobs stays)
    code, out, err = cli("gc", "--older-than", "0s", "--include-outputs", "--dry-run")
    assert code == 0, err
    assert greet_output not in out  # its job is gone already: nothing names it any more
    code, out, _ = cli("gc", "--older-than", "30d", "--dry-run")
    assert code == 0 and "would delete 0 job(s)" in out


def test_a_metastore_with_hundreds_of_runs_keeps_every_referenced_result(local_env, tmp_path, monkeypatch):
    """300 real DAG runs in the metadata DB: gc, as its own process, keeps every job whose result
    an XCom references (as a task's return value, inside a multiple_outputs dict, passed on in a
    list by another task) and every job of a task instance still due to retry; it deletes the rest.
    """
    import shutil

    import kn_ops
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import update

    from kinetic_airflow.job.layout import JobIdentity

    base = f"file://{tmp_path}/kinetic"
    monkeypatch.setenv("KINETIC_BASE_URI", base)
    template = make_job(base, lambda: b"x" * 1000, job_id="template")  # a real job's files
    proc, summary = run_runner(template)
    assert summary and summary["ok"], proc.stderr
    template_dir = tmp_path / "kinetic" / "jobs" / "template"
    failed_summary = json.dumps({**summary, "ok": False, "error_type": "ValueError", "error_message": "x"})

    dag = kn_ops.DAGS["kn_ops_local"]
    runs = [f"gc_many__{i:03d}" for i in range(300)]
    retrying = set(runs[::10])  # their ``diverges`` is up for retry: its job stays
    dag_runs_in_metastore(dag, runs, {"greet": "success", "big": "success", "diverges": "failed"})

    def job(run_id: str, task_id: str, ok: bool = True) -> str:
        identity = JobIdentity(dag.dag_id, run_id, task_id)
        job_uri = f"{base}/jobs/{identity.job_id}"
        target = tmp_path / "kinetic" / "jobs" / identity.job_id
        shutil.copytree(template_dir, target)
        ref = {"backend": "local", "job_id": identity.job_id, "job_uri": job_uri}
        record = {"version": 1, "job": {**ref, "identity": identity.to_dict()}, "created": time.time() - 3600}
        (target / "job.json").write_text(json.dumps(record))
        if not ok:
            (target / "result.json").write_text(failed_summary)
        return job_uri

    jobs: dict[str, dict[str, str]] = {}
    with create_session() as session:
        for i, run_id in enumerate(runs):
            jobs[run_id] = {t: job(run_id, t, ok=t != "diverges") for t in ("greet", "big", "diverges")}
            ref = {"__kinetic_result_ref__": f"{jobs[run_id]['big']}/result.pkl", "key": None,
                   "type": "builtins.bytes", "summary": ""}  # fmt: skip
            # as the execution API stores a worker's XCom (JSON), and every 4th run as
            # XComModel.set() does (the JSON text, encoded again)
            ti = {"dag_id": dag.dag_id, "run_id": run_id, "session": session, "serialize": i % 4 == 0}
            XComModel.set("return_value", {"greeting": f"hello {i}"}, task_id="greet", **ti)
            if i % 3 == 0:  # what the operator pushes for a result XCom cannot carry
                XComModel.set("return_value", ref, task_id="big", **ti)
            elif i % 3 == 1:  # multiple_outputs: one key's value stayed in storage
                keyed = {**ref, "key": "model"}
                XComModel.set("return_value", {"model": keyed, "loss": 0.1}, task_id="big", **ti)
                XComModel.set("model", keyed, task_id="big", **ti)
            else:  # a plain task handed the reference on
                XComModel.set("forwarded", {"refs": [ref]}, task_id="greet", **ti)
        session.execute(
            update(TaskInstance)
            .where(TaskInstance.dag_id == dag.dag_id, TaskInstance.run_id.in_(sorted(retrying)))
            .where(TaskInstance.task_id == "diverges")
            .values(state="up_for_retry")
        )

    code, out, err = cli_run("gc", "--older-than", "0s", "--json", timeout=600)
    assert code == 0, err
    report = json.loads(out)[0]
    decisions = {row["job_id"]: row for row in report["files"]}
    storage = open_storage(base)
    for run_id in runs:
        big = jobs[run_id]["big"].rsplit("/", 1)[1]
        assert decisions[big]["action"] == "keep", decisions[big]
        assert "referenced by XCom" in decisions[big]["reason"], decisions[big]
        assert storage.exists(f"{jobs[run_id]['big']}/result.pkl")
        assert not storage.list(jobs[run_id]["greet"])
        diverges = jobs[run_id]["diverges"]
        if run_id in retrying:
            assert "its task instance is up_for_retry" in decisions[diverges.rsplit("/", 1)[1]]["reason"]
            assert storage.exists(f"{diverges}/result.json")
        else:
            assert not storage.list(diverges)
    assert report["deleted"]["jobs"] == 1 + 300 + 300 - len(retrying)  # with the template job


def test_an_xcom_backend_that_stores_values_elsewhere_keeps_every_succeeded_job(
    local_env, tmp_path, monkeypatch
):
    """With common.io's object-storage XCom backend, a reference may sit in object storage, not
    in the metadata DB: gc cannot see it, so it keeps every succeeded job (and says why)."""
    base = f"file://{tmp_path}/kinetic"
    monkeypatch.setenv("KINETIC_BASE_URI", base)
    layout = make_job(base, lambda: b"x" * 1000, job_id="done")
    proc, summary = run_runner(layout)
    assert summary and summary["ok"], proc.stderr
    (plain,) = cli_run_json("gc", "--older-than", "0s", "--dry-run")
    assert [r["action"] for r in plain["files"]] == ["would delete"]  # the control: DB-only XCom

    backend = "airflow.providers.common.io.xcom.backend.XComObjectStorageBackend"
    monkeypatch.setenv("AIRFLOW__CORE__XCOM_BACKEND", backend)
    monkeypatch.setenv("AIRFLOW__COMMON_IO__XCOM_OBJECTSTORAGE_PATH", f"file://{tmp_path}/xcom")
    monkeypatch.setenv("AIRFLOW__COMMON_IO__XCOM_OBJECTSTORAGE_THRESHOLD", "0")
    (report,) = cli_run_json("gc", "--older-than", "0s")
    (row,) = report["files"]
    assert row["action"] == "keep" and f"XCom values are stored by {backend}" in row["reason"], row
    assert any("every succeeded job is kept" in note for note in report["notes"]), report
    assert open_storage(base).exists(f"{layout.job_uri}/result.pkl")


def test_references_are_found_in_every_stored_form():
    from kinetic_airflow.retention import _refs_in

    uri = "gs://b/kinetic/jobs/j-1/result.pkl"
    ref = {"__kinetic_result_ref__": uri, "key": None, "type": "builtins.bytes", "summary": ""}
    forms = [
        ref,  # the JSON the execution API stores
        json.dumps(ref),  # XComModel.set(): the JSON text, encoded again
        json.dumps(json.dumps({"out": [ref]})),  # nested, and encoded once more
        {"model": {**ref, "key": "model"}, "loss": 0.1},  # multiple_outputs
        repr(ref),  # a plain task returned str(ref): not JSON
    ]
    for form in forms:
        assert _refs_in(form) == [uri], form
    assert _refs_in({"greeting": "hello"}) == [] and _refs_in("__kinetic_result_ref__ only") == []


def test_include_outputs_deletes_the_output_dir_with_the_last_job(local_env, base_uri):
    import kn_ops

    dr = kn_ops.DAGS["kn_ops_local"].test()
    greet = next(
        r for r in cli_json("jobs", "list", "--run-id", dr.run_id) if r["task_instance"].endswith("/greet")
    )
    storage = open_storage(base_uri)
    output = json.loads(storage.read_text(f"{greet['job_uri']}/manifest.json"))["output_dir"]
    storage.write_text(f"{output}/ckpt", "x")
    code, out, _ = cli("gc", "--older-than", "0s", "--include-outputs", "--dry-run")
    assert code == 0 and output in out and "KINETIC_OUTPUT_DIR of kn_ops_local/" in out
    assert storage.exists(f"{output}/ckpt")
    code, out, _ = cli("gc", "--older-than", "0s", "--include-outputs")
    assert code == 0 and not storage.exists(f"{output}/ckpt") and not storage.list(greet["job_uri"])


def sleeps_long() -> str:
    time.sleep(300)
    return "never"


@on_storage("gs")  # the orphans are the cluster's
def test_orphaned_cluster_jobs_are_found_and_deleted(gke_env, base_uri):
    emulator, _, _ = gke_env
    _, ref, storage = gke_job("orphan", sleeps_long, [])  # a Job no task instance owns
    batch, core = k8s(emulator)
    name = f"kinetic-{ref.job_id}"
    wait_for(lambda: any(p.status.phase == "Running" for p in core.list_namespaced_pod(
        "default", label_selector=f"job-name={name}").items), "the orphan's pod")  # fmt: skip

    code, out, err = cli("gc", "--older-than", "30d", "--orphan-grace", "0s", "--json")
    assert code == 0, err
    report = json.loads(out)[0]
    (orphan,) = [o for o in report["orphans"] if o["name"] == name]
    assert orphan["kind"] == "Job" and orphan["action"] == "report"
    assert "no task instance d/" in orphan["reason"]
    assert batch.read_namespaced_job(name, "default")  # found, not deleted

    code, out, _ = cli("gc", "--older-than", "30d", "--orphan-grace", "1h")
    assert name not in out  # a young object may be a try just starting

    code, out, err = cli("gc", "--older-than", "30d", "--orphan-grace", "0s", "--delete-orphans")
    assert code == 0, err
    assert "1 orphan(s)" in out
    wait_for(lambda: not batch.list_namespaced_job("default", field_selector=f"metadata.name={name}").items,
             "the orphan to be deleted")  # fmt: skip
    marker = json.loads(storage.read_text(f"{ref.job_uri}/status/cancelled.json"))
    assert marker["by"] == "kinetic-airflow gc --delete-orphans" and "no task instance" in marker["reason"]


@on_storage("file")  # a setting and its parse
def test_retention_days_setting_and_bad_ages(local_env, base_uri, monkeypatch):
    code, _, err = cli("gc", "--dry-run")
    assert code == 2 and "Pass --older-than (e.g. 30d) or set [kinetic] retention_days" in err
    code, _, err = cli("gc", "--older-than", "thirty days")
    assert code == 2 and "--older-than 'thirty days' is not an age" in err
    monkeypatch.setenv("AIRFLOW__KINETIC__RETENTION_DAYS", "7")
    code, out, _ = cli("gc", "--dry-run")
    assert code == 0 and "jobs with no activity for 7d" in out


def test_the_maintenance_dag_runs_gc(tmp_path):
    """dags/kinetic_maintenance.py as it is, in its own Airflow home: an old finished job goes."""
    home = tmp_path / "home"
    base = f"file://{tmp_path}/kinetic"
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "KINETIC_BASE_URI": base,
        "AIRFLOW__KINETIC__RETENTION_DAYS": "0",
    }
    layout = make_job(base, lambda: 42, job_id="old-job")  # an old job, finished, nobody needs it
    proc, summary = run_runner(layout)
    assert summary and summary["ok"], proc.stderr
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True)
    run = subprocess.run(
        [sys.executable, str(REPO / "dags" / "kinetic_maintenance.py")],
        env=env,
        capture_output=True,
        text=True,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0 and "kinetic_maintenance: success" in run.stdout, output[-3000:]
    assert "deleted 1 job(s)" in output
    assert not open_storage(base).list(layout.job_uri)


def _plant_ended_job(storage, base_uri: str, identity, output_dir: str, job_id: str | None = None) -> str:
    """What a writer of job storage can make without any key: a failed, long-ended job."""
    job_uri = f"{base_uri}/jobs/{job_id or identity.job_id}"
    manifest = {"identity": identity.to_dict(), "output_dir": output_dir, "created": 1000.0, "hmac": "0" * 64}
    storage.write_text(f"{job_uri}/manifest.json", json.dumps(manifest))
    storage.write_text(f"{job_uri}/result.json", json.dumps({"ok": False, "error_type": "ValueError"}))
    return job_uri


@on_storage("file", "gs")  # rmtree on disk, a prefix listing in GCS
def test_gc_deletes_no_path_a_forged_job_names_outside_the_store(local_env, base_uri, tmp_path):
    """A bucket writer plants ended jobs whose files point gc elsewhere: at a directory outside
    the store (``..``), at the store's own job files through a crafted identity, at another
    job's directory name, through a symlink. gc refuses each, reports it, and deletes only the
    output directory an identity really gives (the planted legitimate job's)."""
    from kinetic_airflow.job.layout import JobIdentity, output_dir_uri

    storage = open_storage(base_uri)
    gs = base_uri.startswith("gs://")
    root = base_uri.rsplit("/", 1)[0]  # the bucket (gs) or the test's directory (file)
    victim = f"{root}/victim"
    storage.write_text(f"{victim}/precious.txt", "not kinetic's")

    traversal = JobIdentity("forged", "r1", "t")
    _plant_ended_job(storage, base_uri, traversal, f"{base_uri}/outputs/../../victim")
    # an identity whose own output directory climbs out of outputs/ (dag_id "..")
    climbing = JobIdentity("..", "jobs", "t")
    climbed = output_dir_uri(base_uri, climbing)
    storage.write_text(f"{base_uri}/jobs/t/-1/keep.txt", "inside the store, outside outputs/")
    _plant_ended_job(storage, base_uri, climbing, climbed)
    # a manifest whose identity is another job's (its hash does not give this directory's name)
    honest = JobIdentity("honest", "r1", "t")
    honest_output = output_dir_uri(base_uri, honest)
    storage.write_text(f"{honest_output}/ckpt", "another task instance's checkpoint")
    _plant_ended_job(storage, base_uri, honest, honest_output, job_id="someone-else-0123456789-t1a1")
    # a legitimate ended job: its output directory is the one its identity gives, and it goes
    legit = JobIdentity("legit", "r1", "t")
    legit_output = output_dir_uri(base_uri, legit)
    storage.write_text(f"{legit_output}/ckpt", "x")
    _plant_ended_job(storage, base_uri, legit, legit_output)
    linked = None
    if not gs:  # a symlink in the store's own outputs/ to a directory outside it
        outside = tmp_path / "linked-victim"
        (outside / "r1" / "t" / "-1").mkdir(parents=True)
        (outside / "r1" / "t" / "-1" / "precious.txt").write_text("not kinetic's either")
        linked = JobIdentity("linked", "r1", "t")
        os.symlink(outside, Path(uri_to_local_path(f"{base_uri}/outputs/linked")))
        _plant_ended_job(storage, base_uri, linked, output_dir_uri(base_uri, linked))

    code, dry_out, err = cli("gc", "--older-than", "1d", "--include-outputs", "--dry-run")
    assert code == 0, err
    code, out, err = cli("gc", "--older-than", "1d", "--include-outputs", "--json")
    assert code == 0, err
    assert storage.read_text(f"{victim}/precious.txt") == "not kinetic's"
    report = json.loads(out)[0]
    refused = {r["path"]: r["reason"] for r in report.get("refused", [])}
    assert f"{base_uri}/outputs/../../victim" in refused
    assert "not deleted" in refused[f"{base_uri}/outputs/../../victim"]
    assert climbed in refused and ("outside the job store" in refused[climbed] or "'..'" in refused[climbed])
    assert "is not this job's" in refused[honest_output]
    if linked is not None:
        assert "outside the job store" in refused[output_dir_uri(base_uri, linked)]

    assert storage.read_text(f"{victim}/precious.txt") == "not kinetic's"
    assert storage.read_text(f"{base_uri}/jobs/t/-1/keep.txt") == "inside the store, outside outputs/"
    assert storage.read_text(f"{honest_output}/ckpt") == "another task instance's checkpoint"
    if linked is not None:
        assert (tmp_path / "linked-victim" / "r1" / "t" / "-1" / "precious.txt").exists()
    assert not storage.exists(f"{legit_output}/ckpt")  # the one directory gc may delete, it did
    assert report["deleted"]["outputs"] == 1
    assert "outputs/../../victim" in dry_out and "nothing there was deleted" in dry_out
