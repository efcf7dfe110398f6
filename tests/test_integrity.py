"""Whoever can write the job bucket cannot run code in Airflow or in the job (issue 24).

Each test plays someone with write access to job storage and nothing else, at the moment that
hurts most, on the local, gke and pathways backends (emulator) under dag.test(): the malicious
pickle writes a marker file when it is loaded, and the marker must never appear. The attacker
writes with a storage client of its own; the hooks below only choose *when* (after the worker
or the runner wrote an object, before the other side reads it), so every check runs for real.
"""

from __future__ import annotations

import hashlib
import json
import pickle

import pytest
from emulated_cluster import point_kinetic_at, running_emulator
from helpers import ti_states, xcom

from kinetic_airflow import driver, operators, submission
from kinetic_airflow.job.layout import JobLayout
from kinetic_airflow.job.storage import open_storage

pytestmark = pytest.mark.timeout(300)


class _Evil:
    """Runs code when unpickled: what a bucket writer would plant."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('code ran')",))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_emulator(tmp_path_factory) as running:
        yield running


@pytest.fixture
def marker(tmp_path):
    return tmp_path / "code-ran"


@pytest.fixture
def evil(marker) -> bytes:
    return pickle.dumps(_Evil(str(marker)))


def _use(backend: str, request, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    if backend != "local":
        point_kinetic_at(*request.getfixturevalue("cluster"), monkeypatch)


@pytest.fixture(params=["local", "gke"])
def backend(request, monkeypatch, tmp_path):
    _use(request.param, request, monkeypatch, tmp_path)
    return request.param


@pytest.fixture
def pathways(request, monkeypatch, tmp_path):
    _use("pathways", request, monkeypatch, tmp_path)
    return "pathways"


def _dag(kind: str, backend: str):
    import kn_integrity

    return kn_integrity.DAGS[(kind, backend)]


def _log(capfd) -> str:
    out, err = capfd.readouterr()
    return out + err


def _replace_envelope(job_uri: str, host: int, evil: bytes) -> str:
    """As a thorough attacker would: the envelope, and the digest its result.json claims."""
    layout = JobLayout(job_uri)
    storage = open_storage(job_uri)
    storage.write_bytes(layout.result(host), evil)
    summary = json.loads(storage.read_text_or_none(layout.result_summary(host)))
    summary["integrity"]["sha256"] = hashlib.sha256(evil).hexdigest()
    storage.write_text(layout.result_summary(host), json.dumps(summary))
    return layout.result(host)


def _before_the_worker_loads(monkeypatch, evil: bytes) -> list[str]:
    """Tamper with the job's envelope once the job has ended, before the worker reads it."""
    tampered: list[str] = []
    real = operators.KineticRunOperator.execute_complete

    def execute_complete(self, context, event=None, **kwargs):
        if event and event.get("job") and event.get("status") in ("success", "failed"):
            tampered.append(_replace_envelope(event["job"]["job_uri"], int(event.get("host") or 0), evil))
        return real(self, context, event, **kwargs)

    monkeypatch.setattr(operators.KineticRunOperator, "execute_complete", execute_complete)
    return tampered


def test_untampered_jobs_succeed_and_their_reference_carries_the_verified_digest(backend, marker):
    dr = _dag("downstream", backend).test()
    assert ti_states(dr) == {"produce": "success", "load_plain": "success", "load_in_job": "success"}
    ref = xcom(dr, "produce")
    assert len(ref["sha256"]) == 64, ref
    assert xcom(dr, "load_plain") == xcom(dr, "load_in_job") == 70


def test_a_tampered_result_is_refused_before_the_worker_unpickles_it(
    backend, marker, evil, monkeypatch, capfd
):
    tampered = _before_the_worker_loads(monkeypatch, evil)
    dr = _dag("single", backend).test()
    log = _log(capfd)
    assert ti_states(dr) == {"compute": "failed"}
    assert len(tampered) == 1
    assert f"IntegrityError: the result envelope {tampered[0]} is not vouched for by its job" in log, log[
        -3000:
    ]
    assert not marker.exists(), "the tampered result ran code in the worker"


def test_a_tampered_payload_is_refused_by_the_runner(backend, marker, evil, monkeypatch, capfd):
    """The payload replaced after upload, its manifest untouched."""
    real = submission.write_payload

    def write_payload(storage, uri, *args, **kwargs):
        fields = real(storage, uri, *args, **kwargs)
        open_storage(uri).write_bytes(uri, evil)
        return fields

    monkeypatch.setattr(submission, "write_payload", write_payload)
    dr = _dag("single", backend).test()
    log = _log(capfd)
    assert ti_states(dr) == {"compute": "failed"}
    assert "payload digest mismatch: the payload file://" in log, log[-3000:]
    assert "but the manifest (HMAC-checked with the job key from" in log
    assert not marker.exists(), "the tampered payload ran code in the job"


def test_a_payload_and_manifest_digest_replaced_together_are_refused(
    backend, marker, evil, monkeypatch, capfd
):
    """The attacker rewrites the manifest's digest to match its payload: the HMAC no longer fits."""
    real_write, real_text = submission.write_payload, submission.manifest_text

    def write_payload(storage, uri, *args, **kwargs):
        fields = real_write(storage, uri, *args, **kwargs)
        open_storage(uri).write_bytes(uri, evil)
        return fields

    def manifest_text(fields, key):
        text = json.loads(real_text(fields, key))
        text["sha256"] = hashlib.sha256(evil).hexdigest()
        return json.dumps(text, sort_keys=True)

    monkeypatch.setattr(submission, "write_payload", write_payload)
    monkeypatch.setattr(submission, "manifest_text", manifest_text)
    dr = _dag("single", backend).test()
    log = _log(capfd)
    assert ti_states(dr) == {"compute": "failed"}
    assert "does not carry this job's HMAC (checked with the key from " in log, log[-3000:]
    source = (
        "a pipe from the Airflow worker that started the job"
        if backend == "local"
        else "the Kubernetes Secret"
    )
    assert source in log
    assert not marker.exists(), "the tampered payload ran code in the job"


def test_a_tampered_result_loaded_downstream_is_refused(backend, marker, evil, monkeypatch, capfd):
    """The reference went to XCom with the verified digest; the envelope is replaced afterwards."""
    real = driver.to_xcom
    tampered: list[str] = []

    def to_xcom(value, result_uri, **kwargs):
        out = real(value, result_uri, **kwargs)
        job_uri = result_uri.rsplit("/", 1)[0]
        tampered.append(_replace_envelope(job_uri, 0, evil))
        return out

    monkeypatch.setattr(driver, "to_xcom", to_xcom)
    dr = _dag("downstream", backend).test()
    log = _log(capfd)
    assert ti_states(dr) == {"produce": "success", "load_plain": "failed", "load_in_job": "failed"}
    digest = hashlib.sha256(evil).hexdigest()
    # the plain task (load_result) and the downstream job's runner both refuse it
    assert log.count(f"the result {tampered[0]} has SHA-256 {digest}, but its XCom reference") >= 2, log[
        -4000:
    ]
    assert not marker.exists(), "the tampered result ran code downstream"


def test_a_tampered_failure_record_of_a_multi_host_job_is_refused(pathways, marker, evil, monkeypatch, capfd):
    tampered = _before_the_worker_loads(monkeypatch, evil)
    dr = _dag("failure", pathways).test()
    log = _log(capfd)
    assert ti_states(dr) == {"fails": "failed"}
    assert len(tampered) == 1 and tampered[0].endswith("/result-host1.pkl"), tampered
    assert f"the result envelope {tampered[0]} is not vouched for by its job" in log, log[-3000:]
    assert not marker.exists(), "the tampered failure record ran code in the worker"


def test_an_untampered_multi_host_failure_is_the_functions_own_error(pathways, marker, capfd):
    dr = _dag("failure", pathways).test()
    log = _log(capfd)
    assert ti_states(dr) == {"fails": "failed"}
    assert "ValueError: host 1 fails on purpose" in log, log[-3000:]


def test_the_key_stays_in_the_job_record_and_its_secret(request, monkeypatch, tmp_path, capfd):
    """gke: the key is in the metadata DB's job record and a Secret owned by the Job, and nowhere
    a bucket writer, a log reader or a viewer of the UI, XCom or the Job's spec could read it."""
    import base64
    import os

    import kubernetes
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from kinetic_airflow.job.layout import STATE_KEY
    from kinetic_airflow.lifecycle import decode_record
    from kinetic_airflow.ui.data import job_details

    _use("gke", request, monkeypatch, tmp_path)
    emulator = request.getfixturevalue("cluster")[0]
    dr = _dag("single", "gke").test()
    log = _log(capfd)
    assert ti_states(dr) == {"compute": "success"}
    with create_session() as session:
        stored = session.scalar(
            select(TaskStateStoreModel.value).where(
                TaskStateStoreModel.run_id == dr.run_id, TaskStateStoreModel.key == STATE_KEY
            )
        )
        record = decode_record(stored)
        key = record.integrity["key"]
        assert len(key) == 64 and record.integrity["payload_sha256"]
        assert key not in json.dumps(record.job.to_dict())  # the reference trigger kwargs carry
        xcoms = session.scalars(select(XComModel.value).where(XComModel.run_id == dr.run_id)).all()
        assert xcoms and not any(key in str(v) for v in xcoms)
        view = job_details(session, dr.dag_id, dr.run_id, "compute", -1)
        assert view is not None and key not in json.dumps(view, default=str)
    assert key not in log
    for root, _, files in os.walk(tmp_path / "kinetic"):
        for name in files:
            assert key.encode() not in open(os.path.join(root, name), "rb").read(), name
    client = emulator.api_client()
    job_name = f"kinetic-{record.job.job_id}"
    job = client.sanitize_for_serialization(
        kubernetes.client.BatchV1Api(client).read_namespaced_job(job_name, "default")
    )
    assert key not in json.dumps(job)
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KINETIC_JOB_KEY"]["valueFrom"]["secretKeyRef"] == {"name": f"{job_name}-key", "key": "key"}
    core = kubernetes.client.CoreV1Api(client)
    secret = core.read_namespaced_secret(f"{job_name}-key", "default")
    assert base64.b64decode(secret.data["key"]).decode() == key
    assert [(o.kind, o.name, o.uid) for o in secret.metadata.owner_references] == [
        ("Job", job_name, job["metadata"]["uid"])
    ]
    # deleted with its Job (the garbage collector follows the ownerReference)
    kubernetes.client.BatchV1Api(client).delete_namespaced_job(
        job_name, "default", propagation_policy="Background"
    )
    assert f"{job_name}-key" not in [s.metadata.name for s in core.list_namespaced_secret("default").items]


def test_a_runner_without_its_key_loads_nothing(tmp_path, marker, evil):
    """A job started by hand (or by a bucket writer's own pod) gets no key: the runner refuses
    the manifest before reading the payload, naming the variable."""
    import os
    import subprocess
    import sys

    from jobkit import make_job

    layout = make_job(f"file://{tmp_path}/kinetic", len, ("abc",), job_id="no-key")
    storage = open_storage(layout.job_uri)
    storage.write_bytes(layout.payload, evil)
    manifest = json.loads(storage.read_text_or_none(layout.manifest))
    manifest.update(sha256=hashlib.sha256(evil).hexdigest())
    storage.write_text(layout.manifest, json.dumps(manifest))
    env = {k: v for k, v in os.environ.items() if k != "KINETIC_JOB_KEY"}
    proc = subprocess.run(
        [sys.executable, "-m", "kinetic_airflow.runner", "--job-uri", layout.job_uri],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 1
    summary = json.loads(storage.read_text_or_none(layout.result_summary()))
    assert (
        summary["phase"] == "verify"
        and "this job was given no key (KINETIC_JOB_KEY is not set)" in (summary["error_message"])
    )
    assert not marker.exists(), "the payload was unpickled without a key"
