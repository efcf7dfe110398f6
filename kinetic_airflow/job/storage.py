"""One small storage interface over ``gs://`` and ``file://`` URIs.

The worker, the trigger and the runner all move the same few objects (payload,
manifest, markers, result envelope, logs), so they share this one interface
instead of each speaking GCS or the filesystem directly. Only the standard
library and, for ``gs://``, google-cloud-storage are imported: the runner uses
this module inside the job, where Airflow is not installed.

Credentials are not decided here. The worker passes a client built from its
Airflow connection; the runner lets google-cloud-storage find ambient
credentials (Workload Identity on GKE, ``STORAGE_EMULATOR_HOST`` in tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urlparse

from kinetic_airflow.job.integrity import HashingFile, file_sha256
from kinetic_airflow.job.streamed import copy_hashed

__all__ = [
    "JSON_DEPTH_LIMIT",
    "SMALL_OBJECT_LIMIT",
    "FileStorage",
    "GCSStorage",
    "Storage",
    "StorageError",
    "StorageNotFound",
    "UnreadableObject",
    "is_storage_error",
    "join_uri",
    "open_storage",
    "parse_json",
    "uri_to_local_path",
]

# Big enough that large payloads stream in few requests, small enough to bound memory.
_CHUNK_SIZE = 48 * 1024 * 1024  # the resumable upload holds about two chunks: peak memory


class StorageError(RuntimeError):
    """A storage operation failed for a reason the user can act on."""


class StorageNotFound(StorageError, FileNotFoundError):
    """The object does not exist."""


# What a read of one of a job's small files may cost. The markers, progress record, job record,
# manifest and log cursor the worker, runner and watcher write are a few KiB; a result summary
# carries the exception's message and traceback, which a function controls, so the bound is
# generous. A larger object (or deeper JSON) was written by someone else with access to job
# storage: reading it whole would let them exhaust the reader (a triggerer, an api-server).
SMALL_OBJECT_LIMIT = 16 * 1024 * 1024
# Nothing kinetic-airflow writes nests deeper than a few levels; Python's parser recurses once
# per level and raises RecursionError near 1,000.
JSON_DEPTH_LIMIT = 64


class UnreadableObject(ValueError):
    """An object in job storage that no kinetic-airflow writer makes: too large, nested too
    deeply, not UTF-8 or not JSON. Not a storage failure (reading it again gives the same), so
    it is never retried; readers say which object and carry on without it where they can."""


def parse_json(text: str | bytes, where: str, *, max_depth: int = JSON_DEPTH_LIMIT) -> Any:
    """``text`` parsed, or ``UnreadableObject`` naming ``where`` and what is wrong with it.

    Bounded in depth: Python's parser raises ``RecursionError`` (not ``ValueError``) on deep
    nesting, which callers that expect bad JSON would not catch."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise UnreadableObject(
            f"{where} is JSON nested too deeply to read: kinetic-airflow never writes it so; someone "
            "with write access to job storage did. Delete or rewrite it (or re-run the task)"
        ) from None
    except ValueError as exc:
        raise UnreadableObject(
            f"{where} is not JSON ({exc}): kinetic-airflow did not write it. Delete or rewrite it "
            "(or re-run the task)"
        ) from None
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > max_depth:
            raise UnreadableObject(
                f"{where} nests JSON more than {max_depth} levels deep: kinetic-airflow never writes it "
                "so; someone with write access to job storage did. Delete or rewrite it (or re-run the task)"
            )
        stack.extend((child, depth + 1) for child in children)
    return value


def is_storage_error(exc: BaseException) -> bool:
    """Whether ``exc`` came from the storage itself (and may pass: a retry can help), not from
    the caller's code: filesystem and network errors, ``StorageError``, and the exceptions of
    the Google client libraries (HTTP 5xx/429, transport, auth transport)."""
    if isinstance(exc, StorageNotFound):
        return False  # an answer, not a failure
    if isinstance(exc, (OSError, StorageError)):
        return True
    return type(exc).__module__.split(".")[0] in ("google", "requests", "urllib3")


def join_uri(base: str, *parts: str) -> str:
    """Join URI path parts with single slashes (URIs are not OS paths)."""
    out = base.rstrip("/")
    for part in parts:
        part = str(part).strip("/")
        if part:
            out = f"{out}/{part}"
    return out


def uri_to_local_path(uri: str) -> str:
    """``file:///a/b`` -> ``/a/b``; plain absolute paths pass through."""
    if uri.startswith("file://"):
        parsed = urlparse(uri)
        if parsed.netloc not in ("", "localhost"):
            raise StorageError(f"file:// URIs must be absolute and local, got {uri!r}")
        return unquote(parsed.path)
    if uri.startswith("/"):
        return uri
    raise StorageError(f"not a file:// URI: {uri!r}")


def _split_gs(uri: str) -> tuple[str, str]:
    parsed = urlparse(uri)
    if parsed.scheme != "gs" or not parsed.netloc:
        raise StorageError(f"not a gs:// URI: {uri!r}")
    return parsed.netloc, parsed.path.lstrip("/")


class Storage:
    """Operations every scheme supports. URIs passed in are absolute (scheme included)."""

    scheme: str = ""

    def write_bytes(self, uri: str, data: bytes, *, if_absent: bool = False) -> bool:
        """Write ``data``; with ``if_absent`` only when nothing is there yet. Returns False if skipped."""
        raise NotImplementedError

    def read_bytes(self, uri: str) -> bytes:
        raise NotImplementedError

    def exists(self, uri: str) -> bool:
        raise NotImplementedError

    def upload_file(self, local_path: str, uri: str) -> None:
        raise NotImplementedError

    def open_write(self, uri: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        """A file to stream an object into; it appears whole on success and not at all on error."""
        raise NotImplementedError

    def download_file(self, uri: str, local_path: str) -> None:
        raise NotImplementedError

    def download_hashed(self, uri: str, local_path: str) -> str:
        """Download to ``local_path`` and return the SHA-256 of what was written.

        The caller checks the digest before it trusts the file; storages that can digest while
        they download override this, so the bytes are read once.
        """
        self.download_file(uri, local_path)
        return file_sha256(local_path)

    def list(self, prefix_uri: str) -> list[str]:
        """All object URIs under ``prefix_uri`` (recursive)."""
        raise NotImplementedError

    # Text helpers -------------------------------------------------------------------------
    def write_text(self, uri: str, text: str, *, if_absent: bool = False) -> bool:
        return self.write_bytes(uri, text.encode("utf-8"), if_absent=if_absent)

    def read_text(self, uri: str) -> str:
        return self.read_bytes(uri).decode("utf-8")

    def read_at_most(self, uri: str, limit: int) -> bytes | None:
        """The object's bytes, or None when it is larger than ``limit``, reading at most
        ``limit + 1`` of them: a file no writer of ours makes that large (a forged one) costs
        no more memory than the limit. Storages that can read a prefix override this."""
        data = self.read_bytes(uri)
        return None if len(data) > limit else data

    def read_text_or_none(self, uri: str, *, limit: int | None = SMALL_OBJECT_LIMIT) -> str | None:
        """The object's text; None when it does not exist. At most ``limit`` bytes are read (None:
        no bound, for a log a person asked for): a larger object, or one that is not UTF-8,
        raises ``UnreadableObject`` naming it."""
        try:
            data = self.read_bytes(uri) if limit is None else self.read_at_most(uri, limit)
        except StorageNotFound:
            return None
        if data is None:
            raise UnreadableObject(
                f"{uri} is larger than {limit:,} bytes, which no kinetic-airflow writer makes: someone "
                "with write access to job storage wrote it. It is not read; delete or rewrite it (or "
                "re-run the task)"
            )
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UnreadableObject(f"{uri} is not UTF-8 ({exc}): kinetic-airflow did not write it") from None

    def read_json_or_none(self, uri: str, *, limit: int = SMALL_OBJECT_LIMIT) -> Any:
        """The JSON value stored at ``uri`` (None when absent or empty), bounded in bytes and depth;
        ``UnreadableObject`` for one no kinetic-airflow writer makes."""
        text = self.read_text_or_none(uri, limit=limit)
        return parse_json(text, uri) if text else None

    # Async wrappers for the trigger: the triggerer's event loop must never block on I/O,
    # and both backends here are blocking clients, so each call runs in a worker thread.
    async def aread_text_or_none(self, uri: str, *, limit: int | None = SMALL_OBJECT_LIMIT) -> str | None:
        return await asyncio.to_thread(self.read_text_or_none, uri, limit=limit)

    async def awrite_text(self, uri: str, text: str) -> bool:
        return await asyncio.to_thread(self.write_text, uri, text)


class FileStorage(Storage):
    """``file://`` storage: a directory tree. Writes are atomic (temp file + rename)."""

    scheme = "file"

    def _path(self, uri: str) -> Path:
        return Path(uri_to_local_path(uri))

    def write_bytes(self, uri: str, data: bytes, *, if_absent: bool = False) -> bool:
        path = self._path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        if if_absent:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            return True
        with self._atomic_writer(path) as fh:
            fh.write(data)
        return True

    def _atomic_writer(self, path: Path) -> _AtomicFile:
        return _AtomicFile(path)

    def read_bytes(self, uri: str) -> bytes:
        try:
            return self._path(uri).read_bytes()
        except FileNotFoundError:
            raise StorageNotFound(f"{uri} does not exist") from None

    def read_at_most(self, uri: str, limit: int) -> bytes | None:
        try:
            with self._path(uri).open("rb") as fh:
                data = fh.read(limit + 1)
        except FileNotFoundError:
            raise StorageNotFound(f"{uri} does not exist") from None
        return None if len(data) > limit else data

    def exists(self, uri: str) -> bool:
        return self._path(uri).exists()

    def upload_file(self, local_path: str, uri: str) -> None:
        path = self._path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(local_path, "rb") as src, self._atomic_writer(path) as dst:
            shutil.copyfileobj(src, dst, _CHUNK_SIZE)

    def open_write(self, uri: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        path = self._path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        return self._atomic_writer(path)

    def download_file(self, uri: str, local_path: str) -> None:
        try:
            shutil.copyfile(self._path(uri), local_path)
        except FileNotFoundError:
            raise StorageNotFound(f"{uri} does not exist") from None

    def download_hashed(self, uri: str, local_path: str) -> str:
        try:
            with open(self._path(uri), "rb") as src, open(local_path, "wb") as dst:
                sink = HashingFile(dst)
                shutil.copyfileobj(src, sink, _CHUNK_SIZE)
        except FileNotFoundError:
            raise StorageNotFound(f"{uri} does not exist") from None
        return sink.hexdigest()

    def list(self, prefix_uri: str) -> list[str]:
        root = self._path(prefix_uri)
        if root.is_file():
            return [prefix_uri]
        if not root.is_dir():
            return []
        base = prefix_uri.rstrip("/")
        return sorted(
            f"{base}/{p.relative_to(root).as_posix()}"
            for p in root.rglob("*")
            if p.is_file() and not p.name.startswith(".tmp-")
        )


class _AtomicFile:
    """Write to a temp file beside the target and rename on success, so readers never see halves."""

    def __init__(self, path: Path) -> None:
        self.path = path
        fd, self.tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        self.fh = os.fdopen(fd, "wb")

    def __enter__(self) -> IO[bytes]:
        return self.fh

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.fh.close()
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            os.unlink(self.tmp)


class GCSStorage(Storage):
    """``gs://`` storage through google-cloud-storage."""

    scheme = "gs"

    def __init__(self, client: Any = None) -> None:
        self._client = _without_bucket_metadata_cache(client) if client is not None else None

    @property
    def client(self) -> Any:
        if self._client is None:
            # Start-up cost: the Google clients load only when gs:// or GCP credentials are used.
            from google.cloud import storage

            self._client = _without_bucket_metadata_cache(_ambient_client(storage))
        return self._client

    def _blob(self, uri: str, *, upload: bool = False) -> Any:
        """Uploads go in chunks (bounded memory, resumable); downloads stream in one request."""
        bucket, name = _split_gs(uri)
        return self.client.bucket(bucket).blob(name, chunk_size=_CHUNK_SIZE if upload else None)

    def _translate(self, uri: str, exc: Exception) -> Exception:
        # Start-up cost: the Google clients load only when gs:// or GCP credentials are used.
        from google.api_core import exceptions as gexc

        if isinstance(exc, gexc.NotFound):
            bucket, _ = _split_gs(uri)
            message = str(exc)
            if "bucket" in message.lower() and "does not exist" in message.lower():
                return StorageError(
                    f"the bucket gs://{bucket} does not exist (while accessing {uri}). Create it "
                    f"(`gcloud storage buckets create gs://{bucket}`) or point [kinetic] base_uri / "
                    "the operator's base_uri at a bucket you can write to."
                )
            return StorageNotFound(f"{uri} does not exist")
        if isinstance(exc, gexc.Forbidden):
            return StorageError(
                f"permission denied on {uri}: the credentials in use cannot access this bucket "
                f"({exc}). Grant roles/storage.objectAdmin on the bucket to the account of the "
                "Airflow GCP connection (worker) and of the job's Kubernetes service account."
            )
        return exc

    def _bucket_exists_or_raise(self, uri: str, exc: Exception) -> Exception:
        """A 404 on upload means the bucket is missing; say so instead of 'object not found'."""
        # Start-up cost: the Google clients load only when gs:// or GCP credentials are used.
        from google.api_core import exceptions as gexc

        if isinstance(exc, gexc.NotFound):
            bucket, _ = _split_gs(uri)
            return StorageError(
                f"the bucket gs://{bucket} does not exist (while writing {uri}). Create it "
                f"(`gcloud storage buckets create gs://{bucket}`) or set [kinetic] base_uri "
                "to a bucket you can write to."
            )
        return self._translate(uri, exc)

    def write_bytes(self, uri: str, data: bytes, *, if_absent: bool = False) -> bool:
        # Start-up cost: the Google clients load only when gs:// or GCP credentials are used.
        from google.api_core import exceptions as gexc

        blob = self._blob(uri)
        try:
            # Small writes go multipart, where the emulator and GCS both enforce the precondition.
            blob.upload_from_string(data, if_generation_match=0 if if_absent else None)
        except gexc.PreconditionFailed:
            return False
        except Exception as exc:
            raise self._bucket_exists_or_raise(uri, exc) from exc
        return True

    def read_bytes(self, uri: str, *, end: int | None = None) -> bytes:
        """The object's bytes; with ``end``, bytes 0 to ``end`` (inclusive) in one ranged request.
        Every read of an object goes through here (bounded or not)."""
        try:
            if end is None:
                return self._blob(uri).download_as_bytes()
            return self._blob(uri).download_as_bytes(start=0, end=end)
        except Exception as exc:
            raise self._translate(uri, exc) from exc

    def read_at_most(self, uri: str, limit: int) -> bytes | None:
        # Start-up cost: the Google clients load only when gs:// or GCP credentials are used.
        from google.api_core import exceptions as gexc

        try:  # one ranged request (the end is inclusive): a larger object shows one byte over
            data = self.read_bytes(uri, end=limit)
        except gexc.RequestRangeNotSatisfiable:
            return b""  # 416: no byte 0 to start from, an empty object (a missing one is a 404)
        return None if len(data) > limit else data

    def exists(self, uri: str) -> bool:
        try:
            return bool(self._blob(uri).exists())
        except Exception as exc:
            raise self._translate(uri, exc) from exc

    def upload_file(self, local_path: str, uri: str) -> None:
        try:
            self._blob(uri, upload=True).upload_from_filename(local_path)
        except Exception as exc:
            raise self._bucket_exists_or_raise(uri, exc) from exc

    @contextlib.contextmanager
    def open_write(self, uri: str) -> Iterator[IO[bytes]]:
        """A resumable upload fed as it is written: memory stays at one chunk, no temp file.

        Only a clean exit finalizes the upload; after an error the unfinished session is
        abandoned, so no partial object appears.
        """
        try:
            writer = self._blob(uri, upload=True).open("wb", ignore_flush=True)
        except Exception as exc:
            raise self._bucket_exists_or_raise(uri, exc) from exc
        yield writer
        try:
            writer.close()
        except Exception as exc:
            raise self._bucket_exists_or_raise(uri, exc) from exc

    def download_file(self, uri: str, local_path: str) -> None:
        try:
            self._blob(uri).download_to_filename(local_path)
        except Exception as exc:
            if os.path.exists(local_path) and os.path.getsize(local_path) == 0:
                os.unlink(local_path)
            raise self._translate(uri, exc) from exc

    def download_hashed(self, uri: str, local_path: str) -> str:
        """One request, read in large pieces and digested while it is written (job/streamed.py).

        The response is read straight from the client's authorized session: the library's own
        download loop moves 8 KiB at a time in Python and is what made downloads slower than
        raw calls. Its checksum is not needed: the caller checks the SHA-256 returned. A
        google-cloud-storage without the two internals this uses gets the library's download.
        """
        blob = self._blob(uri)
        try:
            session, url = self.client._http, blob._get_download_url(self.client)
        except AttributeError:
            try:
                with open(local_path, "wb") as fh:
                    sink = HashingFile(fh)
                    blob.download_to_file(sink, raw_download=True)
                return sink.hexdigest()
            except Exception as exc:
                raise self._translate(uri, exc) from exc
        for attempt in range(1, _DOWNLOAD_ATTEMPTS):
            try:
                return self._stream_hashed(session, url, uri, local_path)
            except _TransientDownloadError:
                time.sleep(0.5 * attempt)  # the library's downloads retried these too
        try:
            return self._stream_hashed(session, url, uri, local_path)
        except _TransientDownloadError as exc:
            raise StorageError(f"{exc} ({_DOWNLOAD_ATTEMPTS} tries). Nothing from it is used.") from exc

    def _stream_hashed(self, session: Any, url: str, uri: str, local_path: str) -> str:
        """One try: a cut or a 429/5xx is transient (start again), anything else is final."""
        try:
            response = session.get(url, headers={"Accept-Encoding": "identity"}, stream=True)
        except OSError as exc:  # requests' ConnectionError and timeouts are OSErrors
            raise _TransientDownloadError(f"cannot download {uri}: {exc}") from exc
        with contextlib.closing(response):
            if response.status_code in _TRANSIENT_STATUS:
                raise _TransientDownloadError(f"downloading {uri} got HTTP {response.status_code}")
            if response.status_code != 200:
                raise self._translate(uri, _http_error(response))
            try:
                with open(local_path, "wb") as fh:
                    digest, length = copy_hashed(response.raw.readinto, fh)
            except Exception as exc:
                if isinstance(exc, OSError) and not _is_connection_error(exc):
                    raise  # the local disk (full, permissions): not the connection
                raise _TransientDownloadError(f"the download of {uri} broke off: {exc}") from exc
            expected = response.headers.get("Content-Length")
            if expected is not None and int(expected) != length:
                raise _TransientDownloadError(
                    f"the download of {uri} ended after {length} of {expected} bytes: the connection was cut"
                )
        return digest

    def list(self, prefix_uri: str) -> list[str]:
        bucket, name = _split_gs(prefix_uri)
        prefix = name.rstrip("/") + "/" if name else ""
        try:
            blobs = self.client.list_blobs(bucket, prefix=prefix)
            out = [f"gs://{bucket}/{b.name}" for b in blobs]
        except Exception as exc:
            raise self._translate(prefix_uri, exc) from exc
        if not out and name and self.exists(prefix_uri):
            return [prefix_uri]
        return sorted(out)


_DOWNLOAD_ATTEMPTS = 3
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class _TransientDownloadError(Exception):
    """A try of a download that may work when made again."""


def _is_connection_error(exc: BaseException) -> bool:
    """urllib3's and http.client's errors for a broken stream, told apart from a local disk's."""
    module = type(exc).__module__
    return module.startswith(("urllib3", "requests", "http.client")) or isinstance(
        exc, (ConnectionError, TimeoutError)
    )


def _http_error(response: Any) -> Exception:
    """The API exception the library would have raised for this response (NotFound, Forbidden…)."""
    # Start-up cost: the Google clients load only when gs:// or GCP credentials are used.
    from google.api_core import exceptions as gexc

    return gexc.from_http_status(
        response.status_code, f"{response.request.method} {response.url}: {response.text[:500]}"
    )


def _without_bucket_metadata_cache(client: Any) -> Any:
    """Switch off google-cloud-storage's (3.x) bucket metadata cache on our clients.

    It only decorates tracing spans, but it costs requests: a background ``GET`` of the bucket
    (in a new thread) the first time a client touches it, and another after every 404 — and a
    watcher reading a not-yet-written file is a 404. Every call site checks the attribute
    with ``hasattr(...) and client._bucket_metadata_cache``, so None turns it off cleanly.
    """
    if getattr(client, "_bucket_metadata_cache", None) is not None:
        client._bucket_metadata_cache = None
    return client


def _ambient_client(storage_module: Any) -> Any:
    """A client from ambient credentials; anonymous against an emulator (tests, local runs)."""
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        # Start-up cost: the Google clients load only when gs:// or GCP credentials are used.
        from google.auth.credentials import AnonymousCredentials

        return storage_module.Client(
            project=os.environ.get("GOOGLE_CLOUD_PROJECT", "test-project"),
            credentials=AnonymousCredentials(),
        )
    return storage_module.Client()


def open_storage(uri: str) -> Storage:
    """The storage that serves ``uri``'s scheme."""
    if uri.startswith("gs://"):
        return GCSStorage()
    if uri.startswith("file://") or uri.startswith("/"):
        return FileStorage()
    raise StorageError(
        f"unsupported storage URI {uri!r}: use gs://bucket/prefix or file:///absolute/path "
        "(set [kinetic] base_uri or the operator's base_uri)"
    )
