"""Downloads digested as they arrive: parallel ranges on gs://, one request for small objects.

The ranged reader is checked with an in-memory object (order, memory bound, short or failing
ranges); GCSStorage.download_hashed against fake-gcs-server with its access log (how many
requests, what a rewrite during the download does); the envelope loader end to end.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
from pathlib import Path

import cloudpickle
import pytest

from kinetic_airflow.job import storage as storage_module
from kinetic_airflow.job.envelope import ResultRef, load_checked_envelope
from kinetic_airflow.job.integrity import IntegrityError, check_digest
from kinetic_airflow.job.ranged import ObjectChangedError, download_in_ranges
from kinetic_airflow.job.storage import FileStorage, GCSStorage, StorageError, StorageNotFound
from kinetic_airflow.testing.gcs import FakeGCS


def _object(size: int) -> bytes:
    return os.urandom(size)


class _Recorder(io.BytesIO):
    """A file that counts the ranges fetched but not yet written (what the reader holds)."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.held = 0
        self.most_held = 0

    def fetched(self) -> None:
        with self.lock:
            self.held += 1
            self.most_held = max(self.most_held, self.held)

    def write(self, data) -> int:  # type: ignore[override]
        with self.lock:
            self.held = max(0, self.held - 1)
        return super().write(data)


@pytest.mark.parametrize("size", [10, 100, 101, 1000, 4097])
def test_ranges_are_written_and_digested_in_order(size: int) -> None:
    data = _object(size)
    sink = _Recorder()

    def fetch(start: int, end: int) -> bytes:
        sink.fetched()
        return data[start:end]

    digest = download_in_ranges(fetch, sink, first=data[:10], size=size, range_bytes=7, workers=3)
    assert sink.getvalue() == data
    assert digest == hashlib.sha256(data).hexdigest()
    # The head plus at most workers + 1 ranges queued and the one in hand: memory is bounded.
    assert sink.most_held <= 3 + 2


def test_a_short_range_fails_the_download() -> None:
    data = _object(100)

    def fetch(start: int, end: int) -> bytes:
        return data[start : end - 1] if start == 40 else data[start:end]

    with pytest.raises(ObjectChangedError, match="bytes 40-49 came back as 9 bytes"):
        download_in_ranges(fetch, io.BytesIO(), first=data[:10], size=100, range_bytes=10, workers=2)


def test_a_failing_range_fails_the_download_without_hanging() -> None:
    data = _object(1000)

    def fetch(start: int, end: int) -> bytes:
        if start == 30:
            raise ConnectionError("reset by peer")
        return data[start:end]

    with pytest.raises(ConnectionError, match="reset by peer"):
        download_in_ranges(fetch, io.BytesIO(), first=data[:10], size=1000, range_bytes=10, workers=2)


@pytest.fixture(scope="module")
def logged_gcs(tmp_path_factory: pytest.TempPathFactory):
    server = FakeGCS(access_log=tmp_path_factory.mktemp("gcs") / "access.log").start()
    # The clients must reach this server, not a session-wide one an earlier module started.
    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = server.url
    try:
        yield server
    finally:
        if saved is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = saved
        server.stop()


@pytest.fixture
def bucket(logged_gcs: FakeGCS, request: pytest.FixtureRequest) -> str:
    name = "dl-" + "".join(c for c in request.node.name.lower() if c.isalnum())[:40]
    return logged_gcs.create_bucket(name)


def _gets(server: FakeGCS, name: str) -> list[str]:
    return [r.path for r in server.requests() if r.method == "GET" and name in r.path]


def test_a_small_object_is_one_request(logged_gcs: FakeGCS, bucket: str, tmp_path: Path) -> None:
    data = _object(5000)
    storage = GCSStorage(logged_gcs.client())
    storage.range_bytes = 8192
    storage.write_bytes(f"{bucket}/small.bin", data)
    digest = storage.download_hashed(f"{bucket}/small.bin", str(tmp_path / "out"))
    assert (tmp_path / "out").read_bytes() == data
    assert digest == hashlib.sha256(data).hexdigest()
    assert len(_gets(logged_gcs, "small.bin")) == 1


@pytest.mark.parametrize("size", [8192, 8192 * 5 + 3])
def test_a_large_object_arrives_whole_in_parallel_ranges(
    logged_gcs: FakeGCS, bucket: str, tmp_path: Path, size: int
) -> None:
    data = _object(size)
    storage = GCSStorage(logged_gcs.client())
    storage.range_bytes = 8192
    name = f"large-{size}.bin"
    storage.write_bytes(f"{bucket}/{name}", data)
    digest = storage.download_hashed(f"{bucket}/{name}", str(tmp_path / "out"))
    assert (tmp_path / "out").read_bytes() == data
    assert digest == hashlib.sha256(data).hexdigest()
    ranges = -(-size // 8192)
    # The head, one metadata read for the size, then the remaining ranges.
    assert len(_gets(logged_gcs, name)) == ranges + 1


def test_an_empty_object_downloads(logged_gcs: FakeGCS, bucket: str, tmp_path: Path) -> None:
    storage = GCSStorage(logged_gcs.client())
    storage.write_bytes(f"{bucket}/empty.bin", b"")
    digest = storage.download_hashed(f"{bucket}/empty.bin", str(tmp_path / "out"))
    assert digest == hashlib.sha256().hexdigest()
    assert (tmp_path / "out").read_bytes() == b""


def test_a_missing_object_is_storage_not_found(logged_gcs: FakeGCS, bucket: str, tmp_path: Path) -> None:
    with pytest.raises(StorageNotFound, match=r"missing\.bin does not exist"):
        GCSStorage(logged_gcs.client()).download_hashed(f"{bucket}/missing.bin", str(tmp_path / "out"))


def test_an_object_rewritten_during_the_download_fails_it(
    logged_gcs: FakeGCS, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"{bucket}/moving.bin"
    storage = GCSStorage(logged_gcs.client())
    storage.range_bytes = 8192
    storage.write_bytes(uri, _object(8192 * 3))
    real = storage_module.download_in_ranges

    def rewrite_then_read(*args, **kwargs):
        storage.write_bytes(uri, _object(8192 * 3))  # a new generation after the head was read
        return real(*args, **kwargs)

    monkeypatch.setattr(storage_module, "download_in_ranges", rewrite_then_read)
    with pytest.raises(StorageError, match=r"moving\.bin was rewritten or deleted while it was downloaded"):
        storage.download_hashed(uri, str(tmp_path / "out"))


def test_file_storage_digests_while_it_copies(tmp_path: Path) -> None:
    data = _object(70_000)
    (tmp_path / "src.bin").write_bytes(data)
    digest = FileStorage().download_hashed((tmp_path / "src.bin").as_uri(), str(tmp_path / "out"))
    assert digest == hashlib.sha256(data).hexdigest()
    assert (tmp_path / "out").read_bytes() == data
    with pytest.raises(StorageNotFound):
        FileStorage().download_hashed((tmp_path / "nope").as_uri(), str(tmp_path / "out2"))


def test_a_ranged_envelope_is_checked_before_it_is_unpickled(
    logged_gcs: FakeGCS, bucket: str, tmp_path: Path
) -> None:
    value = list(range(20_000))
    blob = cloudpickle.dumps({"ok": True, "value": value})
    storage = GCSStorage(logged_gcs.client())
    storage.range_bytes = 16384
    uri = f"{bucket}/result.pkl"
    storage.write_bytes(uri, blob)
    good = hashlib.sha256(blob).hexdigest()
    assert ResultRef(uri, sha256=good).load(storage) == value
    envelope, digest = load_checked_envelope(
        storage, uri, lambda actual: check_digest(actual, good, "the result", "its reference")
    )
    assert (envelope["value"], digest) == (value, good)
    with pytest.raises(IntegrityError, match="changed after it was written"):
        ResultRef(uri, sha256="0" * 64).load(storage)
