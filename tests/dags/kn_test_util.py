"""A sibling module of the test DAG files: helpers for jobs (read/write on paths and gs:// URIs,
which also checks that sibling modules of DAG files travel by value) and for the tests
(a failure recorder and a duplicate-execute hook)."""

from __future__ import annotations

import os
from pathlib import Path


def _blob(uri: str):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    bucket, name = uri[len("gs://") :].split("/", 1)
    return (
        storage.Client(project="test-project", credentials=AnonymousCredentials()).bucket(bucket).blob(name)
    )


def read_text(path: str) -> str | None:
    if path.startswith("gs://"):
        blob = _blob(path)
        return blob.download_as_text() if blob.exists() else None
    p = Path(path)
    return p.read_text() if p.exists() else None


def write_text(path: str, text: str) -> None:
    if path.startswith("gs://"):
        _blob(path).upload_from_string(text)
    else:
        Path(path).write_text(text)


def record_failure(context):
    """on_failure_callback: write what the task failed with where the test can read it."""
    out = os.environ.get("KN_TEST_FAILURES")
    if out:
        exc = context.get("exception")
        kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
        Path(out, f"{context['ti'].task_id}.txt").write_text(f"{kind}\n{exc}")


def execute_twice(context):
    """pre_execute hook: run the operator's execute once more, as a duplicate worker would."""
    from airflow.sdk.exceptions import TaskDeferred

    store = context["task_state_store"]
    if store.get("test_duplicate_done"):
        return  # the resume after deferral also passes through here
    store.set("test_duplicate_done", True)
    try:
        context["task"].execute(context)
    except TaskDeferred:
        pass
