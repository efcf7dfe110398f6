"""``JobRef``: one typed job reference whose JSON form is the dict earlier versions wrote.

Running deployments hold that dict in trigger rows, job records, ``job.json`` and events, so
decoding an old form and encoding it again must give it back, key for key."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

from kinetic_airflow.job.layout import JobIdentity
from kinetic_airflow.job.ref import JobRef, JobRefError, K8sFields

IDENTITY = JobIdentity("d", "manual__2025-01-01", "train", 2, 3, attempt=1, try_id="0190-ti")

# A GKE job's reference as kinetic-airflow cacd4b9's operator wrote it (``_job_ref`` with
# ``_cluster_fields``, then ``submitted_at`` / ``gcp_conn_id`` in ``_submit``): the form the
# trigger rows and job records of running deployments hold.
OLD_GKE = {
    "backend": "gke",
    "job_id": IDENTITY.job_id,
    "job_uri": f"gs://b/kinetic/jobs/{IDENTITY.job_id}",
    "base_uri": "gs://b/kinetic",
    "identity": IDENTITY.to_dict(),
    "local_dir": f"/tmp/kinetic-airflow/{IDENTITY.job_id}",
    "python": "/usr/bin/python3",
    "accelerator": "tpu-v5e-8",
    "cluster": {
        "kubernetes_conn_id": None,
        "gcp_conn_id": "google_cloud_default",
        "project": "p",
        "location": "us-central1-a",
        "name": "kinetic-cluster",
        "endpoint": "https://10.0.0.2",
    },
    "namespace": "default",
    "node_selectors": {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice"},
    "image": "us-docker.pkg.dev/p/r/kinetic-runner:1",
    "runner_python": None,
    "service_account": None,
    "active_deadline_seconds": 3600,
    "container_env": {"A": "1"},
    "pod_override": None,
    "hosts": 2,
    "chips_per_host": 4,
    "startup_timeout": 1800.0,
    "heartbeat_timeout": 300.0,
    "requirements": ["numpy==2.0"],
    "requirements_source": "requirements.txt beside the DAG",
    "fuse_data": ["gs://b/data/"],
    "submitted_at": 1735689600.25,
    "gcp_conn_id": "google_cloud_default",
}

# A trigger row of a version before most fields existed (tests/test_resume_window.py).
OLD_MINIMAL = {"job_id": "j", "job_uri": "file:///tmp/j", "backend": "local"}


def test_an_old_cluster_reference_decodes_and_encodes_back_to_the_same_dict() -> None:
    ref = JobRef.from_dict(OLD_GKE)
    assert ref.identity == IDENTITY and ref.hosts == 2 and ref.submitted_at == 1735689600.25
    k8s = ref.on_cluster()
    assert k8s.namespace == "default" and k8s.chips_per_host == 4 and k8s.service_account is None
    assert ref.to_dict() == OLD_GKE
    # through JSON as well, as trigger kwargs and records travel
    again = JobRef.from_dict(json.loads(json.dumps(ref.to_dict())))
    assert again == ref and json.loads(json.dumps(again.to_dict())) == OLD_GKE


def test_an_old_minimal_reference_keeps_its_few_keys() -> None:
    ref = JobRef.from_dict(OLD_MINIMAL)
    assert (ref.job_id, ref.backend, ref.job_uri) == ("j", "local", "file:///tmp/j")
    assert ref.identity is None and ref.k8s is None and ref.hosts is None
    assert ref.to_dict() == OLD_MINIMAL  # absent stays absent: nothing is written as null


def test_an_older_trigger_row_still_resumes() -> None:
    from kinetic_airflow.triggers import KineticJobTrigger

    trigger = KineticJobTrigger(job=dict(OLD_GKE), poll_interval=1.0)
    assert trigger.job == JobRef.from_dict(OLD_GKE)
    _, kwargs = trigger.serialize()
    assert kwargs["job"] == OLD_GKE
    assert KineticJobTrigger(**kwargs).job == trigger.job


def test_the_operator_writes_the_same_keys_as_before(tmp_path, monkeypatch) -> None:
    from kinetic_airflow import KineticRunOperator

    monkeypatch.delenv("KINETIC_LOCAL_PYTHON", raising=False)
    op = KineticRunOperator(task_id="train", python_callable=print, backend="local")
    ref = op._job_ref(IDENTITY, "local", f"file://{tmp_path}")
    encoded = ref.to_dict()
    assert set(encoded) == {
        "backend", "job_id", "job_uri", "base_uri", "identity", "local_dir", "python", "accelerator",
        "stop_grace_seconds",  # added with the graceful stop; older readers keep it in ``extra``
    }  # fmt: skip
    assert encoded["stop_grace_seconds"] == 30.0
    assert encoded["identity"] == IDENTITY.to_dict() and encoded["python"] == sys.executable
    assert JobRef.from_dict(encoded) == ref


def test_the_cluster_fields_are_written_together_null_included() -> None:
    """An older cluster reference without a field re-encodes with it as null (or its default),
    which every reader takes as absent; nothing else about it changes."""
    older = {k: v for k, v in OLD_GKE.items() if k not in ("chips_per_host", "namespace")}
    encoded = JobRef.from_dict(older).to_dict()
    assert encoded == {**older, "chips_per_host": None, "namespace": "default"}


def test_unknown_keys_are_kept_and_written_back() -> None:
    newer = {**OLD_MINIMAL, "placement_hint": "high", "labels": {"team": "ml"}}
    ref = JobRef.from_dict(newer)
    assert ref.extra == {"placement_hint": "high", "labels": {"team": "ml"}}
    assert ref.to_dict() == newer


def test_an_event_brief_reference_decodes() -> None:
    from kinetic_airflow.watch import event_job

    brief = event_job(JobRef.from_dict(OLD_GKE))
    assert set(brief) == {"job_id", "backend", "job_uri", "base_uri", "identity", "accelerator", "hosts",
                          "submitted_at"}  # fmt: skip
    ref = JobRef.from_dict(brief)
    assert ref.k8s is None and ref.hosts == 2 and ref.to_dict() == brief


def test_the_reference_is_frozen_and_its_encoding_a_copy() -> None:
    ref = JobRef.from_dict(OLD_GKE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.job_id = "other"  # type: ignore[misc]
    encoded = ref.to_dict()
    encoded["container_env"]["B"] = "2"
    encoded["identity"]["attempt"] = 9
    assert ref.on_cluster().container_env == {"A": "1"} and ref.identity == IDENTITY
    assert ref.replace(submitted_at=1.0).submitted_at == 1.0 and ref.submitted_at == 1735689600.25


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({**OLD_GKE, "hosts": "two"}, "field 'hosts' must be a whole number or null, not 'two' (str)"),
        ({**OLD_GKE, "hosts": True}, "field 'hosts' must be a whole number"),
        ({**OLD_GKE, "namespace": 7}, "field 'namespace' must be a string, not 7 (int)"),
        ({**OLD_GKE, "node_selectors": ["a"]}, "field 'node_selectors' must be a JSON object"),
        ({**OLD_GKE, "requirements": "numpy"}, "field 'requirements' must be a list of strings"),
        ({**OLD_GKE, "submitted_at": "yesterday"}, "field 'submitted_at' must be a number or null"),
        ({**OLD_GKE, "identity": "d/r/t"}, "field 'identity' must be a JSON object"),
        ({**OLD_GKE, "identity": {"dag_id": "d"}}, "field 'identity' needs dag_id, run_id and task_id"),
        ({**OLD_GKE, "identity": {**IDENTITY.to_dict(), "try_number": "3"}}, "field 'identity.try_number'"),
        ({"job_id": "j", "backend": "local"}, "kinetic job reference 'j': field 'job_uri' is missing"),
        ({**OLD_MINIMAL, "job_id": None}, "field 'job_id' must be a string, not None"),
        (["j"], "a kinetic job reference must be a JSON object, not list"),
    ],
)
def test_a_bad_value_is_refused_naming_the_field_and_the_fix(value, says) -> None:
    with pytest.raises(JobRefError) as caught:
        JobRef.from_dict(value)
    assert says in str(caught.value)
    assert "clear the task so that it runs a new job" in str(caught.value)


def test_a_local_reference_used_as_a_cluster_one_says_so() -> None:
    with pytest.raises(JobRefError, match=r"'j' \(local\) has no cluster fields"):
        JobRef.from_dict(OLD_MINIMAL).on_cluster()
    with pytest.raises(JobRefError, match="field 'identity' is missing"):
        _ = JobRef.from_dict(OLD_MINIMAL).job_identity
    assert K8sFields().namespace == "default"


def test_a_damaged_job_json_is_listed_from_the_manifest(tmp_path, caplog) -> None:
    """The jobs CLI and retention read every job's job.json: one damaged reference must not stop
    the listing; that job is shown as a job without job.json (from its manifest)."""
    from kinetic_airflow.job.storage import FileStorage
    from kinetic_airflow.jobstore import load_job, record_uri

    job_uri = f"file://{tmp_path}/jobs/{IDENTITY.job_id}"
    storage = FileStorage()
    storage.write_text(record_uri(job_uri), json.dumps({"version": 1, "job": {**OLD_GKE, "hosts": "two"}}))
    storage.write_text(
        f"{job_uri}/manifest.json", json.dumps({"identity": IDENTITY.to_dict(), "backend": "gke"})
    )
    info = load_job(storage, job_uri)
    assert info.ref is None and "field 'hosts' must be a whole number" in caplog.text
    assert info.identity == IDENTITY and info.backend == "gke" and info.accelerator == "?"
    storage.write_text(record_uri(job_uri), json.dumps({"version": 1, "job": OLD_GKE}))
    info = load_job(storage, job_uri)
    assert info.ref == JobRef.from_dict(OLD_GKE) and info.accelerator == "tpu-v5e-8"


def test_capacity_and_queue_fields_round_trip_and_are_left_out_when_unset() -> None:
    ref = JobRef.from_dict(OLD_GKE)
    assert not {"capacity", "local_queue", "queue_timeout"} & ref.to_dict().keys()
    queued = ref.replace(
        k8s=dataclasses.replace(
            ref.on_cluster(),
            capacity="queued",
            max_run_seconds=3600,
            local_queue="team-a",
            queue_timeout=60.0,
        )
    )
    again = JobRef.from_dict(queued.to_dict())
    assert again == queued and again.on_cluster().local_queue == "team-a"


def test_the_reference_carries_its_parsed_accelerator_and_writes_only_the_string() -> None:
    """Decoding parses the stored string once into ``spec``; ``to_dict`` is what it always was."""
    from kinetic_airflow.accelerators import AcceleratorSpec, parse_accelerator

    ref = JobRef.from_dict(OLD_GKE)
    assert isinstance(ref.spec, AcceleratorSpec) and ref.spec == parse_accelerator("tpu-v5e-8")
    assert ref.accelerator_spec is ref.spec and hash(ref.spec) == hash(parse_accelerator("tpu-v5e-8"))
    assert ref.accelerator == "tpu-v5e-8"  # the stored string, not its normalized text
    assert ref.to_dict() == OLD_GKE and "spec" not in json.dumps(ref.to_dict())
    assert JobRef.from_dict(OLD_MINIMAL).spec is None
    # built from a spec (as the operator does): the string is its text, and the two stay in step
    spot = parse_accelerator("tpu-v6e-16:spot")
    built = JobRef(job_id="j", backend="pathways", job_uri="file:///tmp/j", spec=spot)
    assert built.accelerator == spot.text and built.to_dict()["accelerator"] == spot.text
    assert built.replace(accelerator="gpu-l4").spec == parse_accelerator("gpu-l4")
    assert built.replace(spec=parse_accelerator("cpu")).accelerator == "cpu"
    assert built.replace(hosts=4).spec is spot
    assert JobRef.from_dict(built.to_dict()) == built and JobRef.from_dict(built.to_dict()).spec == spot


def test_an_accelerator_this_version_cannot_read_leaves_the_reference_readable() -> None:
    """An older record stays listable; only what needs the hardware fails, naming the field."""
    odd = {**OLD_MINIMAL, "accelerator": "tpu-v99-8"}
    ref = JobRef.from_dict(odd)
    assert ref.spec is None and ref.to_dict() == odd
    with pytest.raises(JobRefError, match=r"field 'accelerator' \('tpu-v99-8'\) names no accelerator"):
        _ = ref.accelerator_spec


def test_a_spec_key_of_a_newer_version_is_kept_as_an_unknown_key() -> None:
    newer = {**OLD_MINIMAL, "spec": {"kind": "tpu"}}
    ref = JobRef.from_dict(newer)
    assert ref.spec is None and ref.extra == {"spec": {"kind": "tpu"}} and ref.to_dict() == newer
