"""Small pure pieces: settings precedence, identity, XCom conversion, storage and Data."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic_airflow.config import default_base_uri, resolve_setting
from kinetic_airflow.job.envelope import ResultRef, is_result_ref
from kinetic_airflow.job.inputs import Data
from kinetic_airflow.job.layout import JobIdentity
from kinetic_airflow.job.storage import FileStorage, open_storage
from kinetic_airflow.results import to_xcom


def test_settings_precedence(monkeypatch):
    monkeypatch.delenv("AIRFLOW__KINETIC__ZONE", raising=False)
    monkeypatch.delenv("KINETIC_ZONE", raising=False)
    assert resolve_setting("zone") == "us-central1-a"
    monkeypatch.setenv("KINETIC_ZONE", "europe-west4-a")
    assert resolve_setting("zone") == "europe-west4-a"
    monkeypatch.setenv("AIRFLOW__KINETIC__ZONE", "us-east5-b")
    assert resolve_setting("zone") == "us-east5-b"
    assert resolve_setting("zone", "asia-east1-c") == "asia-east1-c"
    monkeypatch.setenv("KINETIC_POLL_INTERVAL", "7")
    assert resolve_setting("poll_interval") == 7.0


def test_default_base_uris():
    assert default_base_uri("local", None, "c").startswith("file:///")
    assert default_base_uri("gke", "proj", "kinetic-cluster") == "gs://proj-kn-kinetic-cluster-jobs"
    with pytest.raises(ValueError, match="needs a job bucket"):
        default_base_uri("gke", None, "c")


def test_job_identity_is_deterministic_and_dns_safe():
    a = JobIdentity("My_DAG.v2", "manual__2026-01-01T00:00:00+00:00", "train.step", 3, 2)
    b = JobIdentity("My_DAG.v2", "manual__2026-01-01T00:00:00+00:00", "train.step", 3, 2)
    assert a.job_id == b.job_id
    assert a.job_id != JobIdentity("My_DAG.v2", a.run_id, "train.step", 4, 2).job_id
    assert a.job_id.endswith("-t2a1") and a.next_attempt().job_id.endswith("-t2a2")
    import re

    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", a.job_id) and len(a.job_id) <= 42
    long = JobIdentity("d" * 200, "r", "t" * 200)
    assert len(long.job_id) <= 42 and len("keras-pathways-" + long.job_id + "-0-999") <= 63
    assert all(len(v) <= 63 for v in a.labels().values())


def test_to_xcom_keeps_small_values_and_refs_the_rest():
    uri = "gs://b/jobs/j/result.pkl"
    sha = "ab" * 32
    assert to_xcom({"a": 1}, uri, multiple_outputs=False, max_bytes=1000, sha256=sha) == {"a": 1}
    for value in (np.zeros(3), b"raw bytes", "x" * 5000):
        ref = to_xcom(value, uri, multiple_outputs=False, max_bytes=1000, sha256=sha)
        assert is_result_ref(ref) and ref["__kinetic_result_ref__"] == uri and ref["key"] is None
        assert ref["sha256"] == sha  # the verified digest travels with the reference
    mixed = to_xcom(
        {"loss": 0.1, "weights": np.ones(2)}, uri, multiple_outputs=True, max_bytes=1000, sha256=sha
    )
    assert mixed["loss"] == 0.1
    assert mixed["weights"]["key"] == "weights" and mixed["weights"]["type"] == "numpy.ndarray"


def test_result_ref_loads_keyed_values(tmp_path):
    import hashlib

    import cloudpickle

    from kinetic_airflow.job.integrity import IntegrityError

    data = cloudpickle.dumps({"value": {"w": np.arange(3)}})
    (tmp_path / "result.pkl").write_bytes(data)
    ref = ResultRef(f"file://{tmp_path}/result.pkl", key="w", sha256=hashlib.sha256(data).hexdigest())
    assert ref.load().tolist() == [0, 1, 2]
    unverified = ResultRef(f"file://{tmp_path}/result.pkl", key="w")  # a reference without a digest
    with pytest.raises(IntegrityError, match=r"but its XCom reference .* expects a recorded digest"):
        unverified.load()


def test_file_storage_atomic_and_exclusive(tmp_path):
    storage = open_storage(f"file://{tmp_path}")
    assert isinstance(storage, FileStorage)
    uri = f"file://{tmp_path}/a/b.txt"
    assert storage.write_text(uri, "1", if_absent=True) is True
    assert storage.write_text(uri, "2", if_absent=True) is False
    assert storage.read_text(uri) == "1"
    assert storage.list(f"file://{tmp_path}/a") == [uri]


def test_data_stages_once_and_materializes(tmp_path, gcs_bucket):
    src = tmp_path / "ds"
    (src / "x").mkdir(parents=True)
    (src / "x" / "a.txt").write_text("A")
    storage = open_storage(gcs_bucket)
    staged = Data(str(src)).stage(storage, gcs_bucket + "/k")
    before = storage.list(gcs_bucket + "/k/cache")
    again = Data(str(src)).stage(storage, gcs_bucket + "/k")
    assert again.staged_uri == staged.staged_uri and storage.list(gcs_bucket + "/k/cache") == before
    local = staged.materialize(str(tmp_path / "out"))
    assert (tmp_path / "out").exists() and open(f"{local}/x/a.txt").read() == "A"
    # a gs:// Data object is used in place, file or prefix
    storage.write_text(gcs_bucket + "/raw/one.csv", "1,2")
    path = Data(gcs_bucket + "/raw/one.csv").stage(storage, "unused").materialize(str(tmp_path / "g"))
    assert open(path).read() == "1,2"
    with pytest.raises(FileNotFoundError, match="does not exist on the Airflow worker"):
        Data(str(tmp_path / "missing")).stage(storage, gcs_bucket)


def test_provider_is_registered_with_airflow():
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "providers", "list", "-o", "plain"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "kinetic-airflow" in out
    from airflow.sdk import task

    assert callable(task.kinetic)


def test_cli_check_and_accelerators():
    from kinetic_airflow.cli.main import main

    assert main(["check", "gpu-a100x4"]) == 0
    assert main(["check", "tpu-v9-8"]) == 2
    assert main(["accelerators"]) == 0


def test_log_lines_are_not_repeated_by_a_rebuilt_watcher(tmp_path):
    """A triggerer restart rebuilds the trigger; the log cursor in job storage prevents repeats."""
    import asyncio
    import sys

    from jobkit import key_of, make_job

    from kinetic_airflow.backends.local import LocalBackend
    from kinetic_airflow.job.ref import JobRef
    from kinetic_airflow.job.storage import open_storage
    from kinetic_airflow.watch import JobWatcher

    def chatty():
        for i in range(5):
            print(f"line {i}", flush=True)
        return "ok"

    layout = make_job(f"file://{tmp_path}", chatty)
    ref = JobRef(
        backend="local",
        job_id="job-1",
        job_uri=layout.job_uri,
        local_dir=str(tmp_path / "jobs/job-1"),
        python=sys.executable,
    )
    LocalBackend().submit(ref, job_key=key_of(ref.job_uri))

    def watch() -> list[str]:
        lines: list[str] = []
        watcher = JobWatcher(
            ref, open_storage(layout.job_uri), LocalBackend(), poll_interval=0.1, emit_log=lines.append
        )
        event = asyncio.run(watcher.wait())
        assert event["status"] == "success"
        return lines

    first = watch()
    assert [line for line in first if line.startswith("line ")] == [f"line {i}" for i in range(5)]
    assert watch() == []  # the rebuilt watcher resumes after what was already shown


def test_names_read_as_the_user_wrote_them():
    """Airflow imports a DAG file as ``unusual_prefix_<sha1>_<file>``: shown as ``<file>``."""
    from kinetic_airflow.job.tracebacks import type_name, user_names, user_summary

    generated = "unusual_prefix_" + "f8d32b84" * 5 + "_nt_fail"
    assert type_name(f"{generated}.TrainingDiverged") == "nt_fail.TrainingDiverged"
    assert type_name("builtins.ValueError") == "ValueError" and type_name(None) is None
    text = f'Traceback ...\n  File "/dags/nt_fail.py", line 3, in f\n{generated}.TrainingDiverged: nan\n'
    assert user_names(text) == text.replace(f"{generated}.", "nt_fail.")
    assert user_names("unusual_prefix_not_a_hash_x.Y") == "unusual_prefix_not_a_hash_x.Y"  # only Airflow's
    summary = user_summary({"ok": False, "error_type": f"{generated}.E", "traceback": generated, "host": 0})
    assert summary == {"ok": False, "error_type": "nt_fail.E", "traceback": "nt_fail", "host": 0}
