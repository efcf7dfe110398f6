"""keras-kinetic 0.0.4's own tools see kinetic-airflow jobs: ``kinetic.jobs.list_jobs``,
``kinetic.attach`` and ``JobHandle.status / logs / result`` (and the ``kinetic jobs list`` /
``status`` commands) from the released wheel in ``.venv-kinetic``, against the cluster emulator
and fake GCS, after real dag.test() runs in a kinetic bucket (``{project}-kn-{cluster}-jobs``)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import ti_states, xcom
from ops_support import cli, cli_json, cluster, gke_env

from kinetic_airflow.job.storage import open_storage

__all__ = ["cluster", "gke_env"]  # fixtures

ROOT = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).resolve().parent / "kinetic_interop_probe.py"
ORACLE_PYTHON = Path(os.environ.get("KINETIC_ORACLE_PYTHON", ROOT / ".venv-kinetic" / "bin" / "python"))
PROJECT, CLUSTER = "test-project", "kinetic-cluster"
BUCKET = f"{PROJECT}-kn-{CLUSTER}-jobs"  # kinetic's bucket for that project and cluster


@pytest.fixture
def kinetic_bucket(gke_env, fake_gcs, monkeypatch):
    if not ORACLE_PYTHON.exists():
        raise AssertionError(
            f"keras-kinetic 0.0.4 venv missing: {ORACLE_PYTHON}. Run `bash scripts/setup-kinetic-oracle.sh`."
        )
    fake_gcs.create_bucket(BUCKET)
    monkeypatch.setenv("KINETIC_BASE_URI", f"gs://{BUCKET}")  # the cluster backends' default, spelled out
    return gke_env


def _kinetic(kubeconfig: Path, home: Path, *job_ids: str) -> dict:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),  # no ~/.kinetic profiles of whoever runs the tests
        "KUBECONFIG": str(kubeconfig),
        "STORAGE_EMULATOR_HOST": os.environ["STORAGE_EMULATOR_HOST"],
        "GOOGLE_CLOUD_PROJECT": PROJECT,
        "COLUMNS": "250",
    }
    proc = subprocess.run(
        [str(ORACLE_PYTHON), str(PROBE), PROJECT, CLUSTER, *job_ids],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_kinetic_lists_attaches_and_collects_kinetic_airflow_jobs(kinetic_bucket, tmp_path):
    import kn_ops

    dr = kn_ops.DAGS["kn_ops_gke"].test()
    assert ti_states(dr) == {"greet": "success", "diverges": "failed", "big": "success"}
    ids = {
        r["task_instance"].rsplit("/", 1)[-1]: r["job_id"]
        for r in cli_json("jobs", "list", "--run-id", dr.run_id)
    }
    greet, diverges = ids["greet"], ids["diverges"]
    assert xcom(dr, "greet")["job"] == greet

    # the handle, where kinetic reads it, with kinetic's keys
    storage = open_storage(f"gs://{BUCKET}")
    handle = json.loads(storage.read_text(f"gs://{BUCKET}/{greet}/handle.json"))
    assert handle["k8s_name"] == f"kinetic-{greet}" and handle["backend"] == "gke"
    assert handle["bucket_name"] == BUCKET and handle["project"] == PROJECT
    assert handle["kinetic_airflow"]["job_uri"] == f"gs://{BUCKET}/jobs/{greet}"

    # keras-kinetic's CLI is a person's tool: it runs with that person's kubeconfig (here the
    # cluster admin's), not with Airflow's Role (kinetic reads jobs/status, which kinetic-airflow
    # never calls).
    admin = kinetic_bucket[0].write_kubeconfig(tmp_path / "admin-kubeconfig")
    seen = _kinetic(admin, tmp_path, greet, diverges)
    assert seen["version"] == "0.0.4"
    listed = {h["job_id"]: h for h in seen["listed"]}
    assert {greet, diverges, ids["big"]} <= set(listed)
    assert listed[greet]["func_name"] == "greet" and listed[greet]["accelerator"] == "cpu"
    assert listed[greet]["display_name"] == "kn_ops_gke.greet"

    ok = seen["jobs"][greet]
    assert ok["status"] == "SUCCEEDED"
    assert "hello ops line 2" in ok["logs"]
    assert ok["result"] == repr({"greeting": "hello ops", "job": greet})

    failed = seen["jobs"][diverges]
    assert failed["status"] == "FAILED"
    assert failed["raised"]["type"] == "builtins.ValueError"
    assert failed["raised"]["message"] == "bad learning rate: -1.0"
    assert any("raise ValueError" in note for note in failed["raised"]["notes"])  # the remote traceback

    # kinetic's own command line
    assert greet in seen["cli_list"] and "greet" in seen["cli_list"]
    assert f"{greet}: SUCCEEDED" in seen["cli_status"]
    print(
        "\n" + cli("jobs", "list", "--run-id", dr.run_id)[1] + "\n" + seen["cli_list"]
    )  # for the closing note

    # kinetic's cleanup would delete only its interop files ({bucket}/{job_id}/), never ours
    assert storage.exists(f"gs://{BUCKET}/{greet}/result.pkl")
    assert storage.exists(f"gs://{BUCKET}/jobs/{greet}/result.pkl")
    # and kinetic-airflow gc takes the interop files with the job (big's XCom still needs its job)
    code, _, err = cli("gc", "--older-than", "0s")
    assert code == 0, err
    assert not storage.list(f"gs://{BUCKET}/{greet}") and not storage.list(f"gs://{BUCKET}/jobs/{greet}")
    assert storage.exists(f"gs://{BUCKET}/{ids['big']}/handle.json")


def test_no_handle_outside_a_kinetic_bucket(gke_env, base_uri):
    """kinetic can only look in {project}-kn-{cluster}-jobs: elsewhere nothing is written outside
    the base URI (the job record is written whatever the bucket)."""
    import kn_ops

    dr = kn_ops.DAGS["kn_ops_gke"].test()
    ids = [r["job_id"] for r in cli_json("jobs", "list", "--run-id", dr.run_id)]
    storage = open_storage(base_uri)
    root = base_uri.split("/kinetic")[0]
    assert not any(storage.exists(f"{root}/{job_id}/handle.json") for job_id in ids)
    for job_id in ids:
        assert storage.exists(f"{base_uri}/jobs/{job_id}/job.json")


def test_interop_switched_off(kinetic_bucket, monkeypatch):
    monkeypatch.setenv("AIRFLOW__KINETIC__KINETIC_INTEROP", "false")
    import kn_ops

    dr = kn_ops.DAGS["kn_ops_gke"].test()
    greet = xcom(dr, "greet")["job"]
    storage = open_storage(f"gs://{BUCKET}")
    assert storage.exists(f"gs://{BUCKET}/jobs/{greet}/result.pkl")
    assert not storage.exists(f"gs://{BUCKET}/{greet}/handle.json")
    assert not storage.exists(f"gs://{BUCKET}/{greet}/result.pkl")
