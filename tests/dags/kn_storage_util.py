"""A sibling module of the test DAG files: small read/write helpers for file paths and gs:// URIs.

Jobs call these, so they also check that sibling modules of DAG files travel by value.
"""

from __future__ import annotations

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
