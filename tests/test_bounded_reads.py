"""Reading a job's small files is bounded in bytes and depth, whoever wrote them: job storage is
writable by every job, CI and people, and its readers are the triggerer and the api-server.

A file no kinetic-airflow writer makes (too large, JSON nested too deeply, not UTF-8) is an
``UnreadableObject`` naming it, never a ``RecursionError`` or a read of the whole object; the
trigger carries on (a progress record it cannot read) or ends the wait with a failure that names
the file (a result summary it cannot read)."""

from __future__ import annotations

import asyncio
import sys
import time

import cloudpickle
import pytest
from jobkit import key_of, make_job

from kinetic_airflow.job.storage import (
    JSON_DEPTH_LIMIT,
    StorageNotFound,
    UnreadableObject,
    open_storage,
    parse_json,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

DEEP = "[" * 100_000 + "]" * 100_000  # Python's parser recurses once per level


def test_deep_json_is_an_unreadable_object_not_a_recursion_error():
    with pytest.raises(UnreadableObject, match="nested too deeply"):
        parse_json(DEEP, "file:///x/status/progress.json")
    shallow_enough = "[" * JSON_DEPTH_LIMIT + "]" * JSON_DEPTH_LIMIT
    assert parse_json(shallow_enough, "here") is not None
    one_more = "[" * (JSON_DEPTH_LIMIT + 1) + "]" * (JSON_DEPTH_LIMIT + 1)
    with pytest.raises(UnreadableObject, match=f"more than {JSON_DEPTH_LIMIT} levels"):
        parse_json(one_more, "here")
    with pytest.raises(UnreadableObject, match="is not JSON"):
        parse_json("{not json", "here")


@pytest.mark.parametrize("scheme", ["file", "gs"])
def test_small_reads_stop_at_their_limit(scheme, tmp_path, request):
    base = f"file://{tmp_path}" if scheme == "file" else request.getfixturevalue("gcs_bucket") + "/bounded"
    storage = open_storage(base)
    storage.write_bytes(f"{base}/status/progress.json", b'{"state": "' + b"x" * 5000 + b'"}')
    with pytest.raises(UnreadableObject, match="larger than 1,000 bytes"):
        storage.read_text_or_none(f"{base}/status/progress.json", limit=1000)
    assert storage.read_json_or_none(f"{base}/status/progress.json")["state"] == "x" * 5000
    assert storage.read_text_or_none(f"{base}/missing.json") is None
    storage.write_bytes(f"{base}/latin1.json", b'{"a": "\xe9"}')
    with pytest.raises(UnreadableObject, match="not UTF-8"):
        storage.read_json_or_none(f"{base}/latin1.json")
    storage.write_bytes(f"{base}/deep.json", DEEP.encode())
    with pytest.raises(UnreadableObject, match="nested too deeply"):
        storage.read_json_or_none(f"{base}/deep.json")
    with pytest.raises(StorageNotFound):
        storage.read_at_most(f"{base}/missing.json", 10)


def _returns_ok() -> str:
    return "ok"


def _ended_local_job(tmp_path, job_id: str):
    from kinetic_airflow.backends.local import LocalBackend
    from kinetic_airflow.job.ref import JobRef

    layout = make_job(f"file://{tmp_path}", _returns_ok, job_id=job_id)
    ref = JobRef(
        backend="local",
        job_id=job_id,
        job_uri=layout.job_uri,
        local_dir=str(tmp_path / "jobs" / job_id),
        python=sys.executable,
    )
    backend = LocalBackend()
    backend.submit(ref, job_key=key_of(ref.job_uri))
    deadline = time.monotonic() + 120
    while not backend.status(ref).state.terminal:
        assert time.monotonic() < deadline, "the local job did not end"
        time.sleep(0.1)
    return ref, layout


def _event(ref) -> dict:
    from kinetic_airflow.triggers import KineticJobTrigger

    trigger = KineticJobTrigger(job=ref.to_dict(), poll_interval=0.1)

    async def first():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(first())


def test_the_trigger_reads_past_a_deeply_nested_progress_record(tmp_path):
    """The watcher resumes an earlier watcher's progress record first thing: one nested 100,000
    deep made the trigger die with RecursionError; now it is ignored and the job's result counts."""
    ref, layout = _ended_local_job(tmp_path, "deep-progress")
    storage = open_storage(layout.job_uri)
    storage.write_text(layout.status("progress"), DEEP)
    event = _event(ref)
    assert event["status"] == "success", event


def test_a_deeply_nested_result_summary_fails_the_wait_naming_the_file(tmp_path):
    ref, layout = _ended_local_job(tmp_path, "deep-summary")
    storage = open_storage(layout.job_uri)
    storage.write_text(layout.result_summary(), DEEP)
    event = _event(ref)
    assert event["status"] == "failed", event
    assert layout.result_summary() in event["message"] and "nested too deeply" in event["message"], event
