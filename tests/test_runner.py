"""The runner on its own: markers, envelope, verification, and not hanging on stray threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import cloudpickle
from jobkit import make_job, run_runner

from kinetic_airflow.job.storage import open_storage

# The job process cannot import this test module: ship its functions by value, as the operator
# does for DAG files.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _hello(name):
    return f"hello {name}"


def _leaves_a_thread():
    import threading
    import time

    threading.Thread(target=time.sleep, args=(3600,), daemon=False).start()
    return "done"


def test_success_writes_markers_and_envelope(tmp_path):
    layout = make_job(f"file://{tmp_path}", _hello, ("world",))
    proc, summary = run_runner(layout)
    assert proc.returncode == 0, proc.stderr
    assert summary["ok"] is True and summary["value_repr"] == "'hello world'"
    assert set(summary["timings"]) >= {"download", "verify", "unpickle", "execute", "upload", "total"}
    storage = open_storage(layout.job_uri)
    for marker in ("started", "heartbeat", "finished"):
        assert storage.exists(layout.status(marker)), marker
    with open(tmp_path / "jobs/job-1/result.pkl", "rb") as fh:
        assert cloudpickle.load(fh)["value"] == "hello world"


def _big_result():
    return b"x" * (200 * 1024 * 1024)  # its upload takes a measurable share of the job


def test_the_finished_line_counts_the_whole_job_and_says_how_it_splits(tmp_path):
    """The job log's "finished in" and the usage line's run time (started to finished marker)
    count the same span: a large result's upload is part of it, and the line names each step."""
    layout = make_job(f"file://{tmp_path}", _big_result)
    proc, summary = run_runner(layout, timeout=300)
    assert proc.returncode == 0, proc.stderr
    timings = summary["timings"]
    steps = {k: v for k, v in timings.items() if k != "total" and not k.startswith("install_")}
    assert timings["total"] + 0.005 * len(steps) >= sum(steps.values()), timings  # upload included
    (line,) = [text for text in proc.stderr.splitlines() if "finished in" in text]
    assert f"finished in {timings['total']:.1f}s (runner start to result stored: " in line, line
    assert f"execute {steps['execute']:.1f}s" in line and f"upload {steps['upload']:.1f}s" in line, line
    storage = open_storage(layout.job_uri)
    marks = {m: json.loads(storage.read_text(layout.status(m)))["time"] for m in ("started", "finished")}
    assert marks["finished"] - marks["started"] >= timings["total"] - 0.005  # the usage line's span


def test_lingering_non_daemon_thread_does_not_hang_the_job(tmp_path):
    layout = make_job(f"file://{tmp_path}", _leaves_a_thread)
    # subprocess.run's timeout only guards against a hang; without os._exit the job never ends
    proc, summary = run_runner(layout, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert summary["ok"] is True


def test_tampered_payload_is_refused_before_unpickling(tmp_path):
    layout = make_job(f"file://{tmp_path}", _hello, ("x",))
    payload = tmp_path / "jobs/job-1/payload.pkl"
    payload.write_bytes(payload.read_bytes() + b"evil")
    proc, summary = run_runner(layout)
    assert proc.returncode == 1
    assert summary["ok"] is False and summary["phase"] == "verify"
    assert "payload digest mismatch" in summary["error_message"]


def test_python_version_mismatch_is_explained(tmp_path):
    layout = make_job(
        f"file://{tmp_path}",
        _hello,
        ("x",),
        manifest_overrides={"fingerprint": {"python": "3.9.1", "cloudpickle": cloudpickle.__version__}},
    )
    # the digest still matches; only the fingerprint is off
    _, summary = run_runner(layout)
    assert summary["phase"] == "verify"
    assert "pickled on Python 3.9.1" in summary["error_message"]
    assert "use a runner image with Python 3.9" in summary["error_message"]


def test_runner_help_documents_arguments():
    out = subprocess.run(
        [sys.executable, "-m", "kinetic_airflow.runner", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for flag in ("--job-uri", "--host-index", "--heartbeat-seconds"):
        assert flag in out


def test_runner_on_gcs(gcs_bucket):
    layout = make_job(gcs_bucket + "/k", _hello, ("gcs",))
    proc, summary = run_runner(layout)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(json.dumps(summary))["value_repr"] == "'hello gcs'"


def _writes_marker(path):
    with open(path, "w") as fh:
        fh.write("ran")
    return "ran"


def _fingerprint(**changes):
    from kinetic_airflow.job.payload import fingerprint

    return {**fingerprint(), **changes}


def test_job_format_mismatch_fails_before_unpickling_and_names_both_releases(tmp_path):
    from kinetic_airflow import __version__
    from kinetic_airflow.job.envelope import FORMAT_VERSION

    ran = tmp_path / "ran"
    layout = make_job(
        f"file://{tmp_path}",
        _writes_marker,
        (str(ran),),
        manifest_overrides={
            "fingerprint": _fingerprint(kinetic_airflow="9.0.0", format=FORMAT_VERSION + 1),
            "image": "reg/kinetic-airflow-runner-tpu:old",
        },
    )
    proc, summary = run_runner(layout)
    assert proc.returncode == 1
    assert summary["ok"] is False and summary["phase"] == "verify"
    message = summary["error_message"]
    assert f"the Airflow worker (kinetic-airflow 9.0.0) wrote job format {FORMAT_VERSION + 1}" in message
    assert f"the runner in reg/kinetic-airflow-runner-tpu:old (kinetic-airflow {__version__})" in message
    assert "rebuild the runner image with the workers' kinetic-airflow (kinetic-airflow image" in message
    assert not ran.exists()  # nothing of the payload was unpickled or run


def test_release_mismatch_with_the_same_format_warns_in_the_job_log_and_runs(tmp_path):
    from kinetic_airflow import __version__

    layout = make_job(
        f"file://{tmp_path}",
        _hello,
        ("x",),
        manifest_overrides={"fingerprint": _fingerprint(kinetic_airflow="0.0.9")},
    )
    proc, summary = run_runner(layout)
    assert proc.returncode == 0, proc.stderr
    assert summary["ok"] is True
    assert (
        f"[kinetic] warning: version mismatch: the Airflow worker runs kinetic-airflow 0.0.9, the runner "
        f"in this job's image is kinetic-airflow {__version__}"
    ) in proc.stderr
    assert summary["fingerprint"]["kinetic_airflow"] == __version__


def test_matching_release_says_nothing(tmp_path):
    layout = make_job(f"file://{tmp_path}", _hello, ("x",))  # write_payload's own fingerprint
    proc, summary = run_runner(layout)
    assert summary["ok"] is True
    assert "mismatch" not in proc.stderr


def test_worker_refuses_an_envelope_of_another_format(tmp_path):
    """Checked after its HMAC (the job's own runner wrote it), before any field is read."""
    import hashlib

    import pytest

    from kinetic_airflow import __version__
    from kinetic_airflow.job.envelope import FORMAT_VERSION
    from kinetic_airflow.job.integrity import new_key, result_tag
    from kinetic_airflow.results import KineticJobError, load_verified_envelope

    storage = open_storage(f"file://{tmp_path}")
    uri = f"file://{tmp_path}/result.pkl"
    key = new_key()

    def stored(envelope: dict) -> dict:
        data = cloudpickle.dumps(envelope)
        storage.write_bytes(uri, data)
        digest = hashlib.sha256(data).hexdigest()
        return {"integrity": {"sha256": digest, "hmac": result_tag(key, 0, digest)}}

    envelope = {
        "ok": True,
        "value": 1,
        "fingerprint": {"kinetic_airflow": "9.0.0", "format": FORMAT_VERSION + 1},
    }
    summary = stored(envelope)
    with pytest.raises(KineticJobError) as caught:
        load_verified_envelope(storage, uri, summary, key, 0)
    assert f"is in job format {FORMAT_VERSION + 1}, written by the runner of kinetic-airflow 9.0.0" in str(
        caught.value
    )
    assert f"this worker (kinetic-airflow {__version__}) reads format {FORMAT_VERSION}" in str(caught.value)
    summary = stored({**envelope, "fingerprint": {"format": FORMAT_VERSION}})
    assert load_verified_envelope(storage, uri, summary, key, 0)[0]["value"] == 1


def test_a_replacement_pod_of_a_multihost_attempt_refuses_to_run_it_again(tmp_path):
    """Host 1's first pod ran the function; the pod that replaced it (another pod uid) ends at
    once with RERUN_REFUSED_EXIT, which its pod's status keeps, instead of waiting silently
    until a stale heartbeat gives the host up (group_status turns the code into a lost host)."""
    from kinetic_airflow.job.envelope import RERUN_REFUSED_EXIT

    layout = make_job(f"file://{tmp_path}", _hello, ("x",))
    storage = open_storage(layout.job_uri)
    storage.write_text(layout.status("started", 1), json.dumps({"time": 1.0, "pod_uid": "first-pod"}))
    env = {
        **os.environ,
        "KINETIC_NUM_HOSTS": "4",
        "KINETIC_HOST_INDEX": "1",
        "KINETIC_POD_UID": "replacement-pod",
    }
    proc, summary = run_runner(layout, env=env, timeout=60)
    assert proc.returncode == RERUN_REFUSED_EXIT, proc.stderr
    assert "already ran this attempt's function in an earlier pod" in proc.stderr, proc.stderr
    assert "kinetic starts the next attempt" in proc.stderr, proc.stderr
    assert summary is None  # the function did not run


def _reads_a_variable() -> str:
    from airflow.sdk import Variable

    return Variable.get("learning_rate")


def test_a_variable_read_in_the_job_says_why_it_cannot_work(tmp_path):
    layout = make_job(f"file://{tmp_path}", _reads_a_variable)
    proc, summary = run_runner(layout)
    assert proc.returncode == 1 and summary["ok"] is False and summary["phase"] == "execute"
    message = summary["error_message"]
    assert "Airflow Variables and Connections cannot be read inside a kinetic job" in message
    assert 'train(lr="{{ var.value.learning_rate }}")' in message and "pod_override" in message
