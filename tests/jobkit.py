"""Build a job in storage without Airflow, the way the operator does, for runner-level tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from kinetic_airflow.layout import JobLayout
from kinetic_airflow.payload import build_payload, manifest_json
from kinetic_airflow.storage import open_storage


def make_job(
    base_uri: str,
    fn: Any,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    job_id: str = "job-1",
    manifest_overrides: dict | None = None,
) -> JobLayout:
    layout = JobLayout.for_job(base_uri, job_id)
    storage = open_storage(base_uri)
    path, fields = build_payload(fn, list(args), kwargs or {})
    try:
        storage.upload_file(path, layout.payload)
    finally:
        os.unlink(path)
    manifest = {**fields, "job_id": job_id, "attempt": 1, "heartbeat_seconds": 1}
    manifest.update(manifest_overrides or {})
    storage.write_text(layout.manifest, manifest_json(manifest))
    return layout


def run_runner(layout: JobLayout, python: str = sys.executable, timeout: float = 120, env=None):
    proc = subprocess.run(
        [python, "-m", "kinetic_airflow.runner", "--job-uri", layout.job_uri],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    summary = open_storage(layout.job_uri).read_text_or_none(layout.result_summary())
    return proc, (json.loads(summary) if summary else None)
