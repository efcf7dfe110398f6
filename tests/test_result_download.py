"""Downloads digested as they arrive: one request read in large pieces, SHA-256 in the same pass.

The piece copier is checked with in-memory streams (every byte in order, short reads, a failing
sink); GCSStorage.download_hashed against fake-gcs-server with its access log (one request for
any size, a cut connection, the library fallback); the envelope loader end to end.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import cloudpickle
import pytest

from kinetic_airflow.job.envelope import ResultRef, load_checked_envelope
from kinetic_airflow.job.integrity import IntegrityError, check_digest
from kinetic_airflow.job.storage import FileStorage, GCSStorage, StorageError, StorageNotFound
from kinetic_airflow.job.streamed import PIECE_BYTES, copy_hashed
from kinetic_airflow.testing.gcs import FakeGCS


def _object(size: int) -> bytes:
    return os.urandom(size)


class _Trickle:
    """A stream that hands out at most ``step`` bytes per read, like a socket."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data, self.step, self.pos = data, step, 0

    def readinto(self, view: memoryview) -> int:
        n = min(len(view), self.step, len(self.data) - self.pos)
        view[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n


@pytest.mark.parametrize(("size", "step"), [(0, 5), (10, 3), (64, 64), (100, 7), (1000, 333), (4097, 4096)])
def test_every_byte_is_written_and_digested_in_order(size: int, step: int) -> None:
    data = _object(size)
    sink = io.BytesIO()
    digest, length = copy_hashed(_Trickle(data, step).readinto, sink, piece_bytes=64)
    assert (sink.getvalue(), digest, length) == (data, hashlib.sha256(data).hexdigest(), size)


def test_a_failing_sink_fails_the_copy() -> None:
    class Full(io.BytesIO):
        def write(self, data) -> int:  # type: ignore[override]
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        copy_hashed(_Trickle(_object(1000), 100).readinto, Full(), piece_bytes=64)


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


@pytest.mark.parametrize(("name", "size"), [("small.bin", 5000), ("large.bin", 3 * PIECE_BYTES + 5)])
def test_any_object_is_one_request(
    logged_gcs: FakeGCS, bucket: str, tmp_path: Path, name: str, size: int
) -> None:
    data = _object(size)
    storage = GCSStorage(logged_gcs.client())
    storage.write_bytes(f"{bucket}/{name}", data)
    digest = storage.download_hashed(f"{bucket}/{name}", str(tmp_path / "out"))
    assert (tmp_path / "out").read_bytes() == data
    assert digest == hashlib.sha256(data).hexdigest()
    assert len(_gets(logged_gcs, name)) == 1


def test_an_empty_object_downloads(logged_gcs: FakeGCS, bucket: str, tmp_path: Path) -> None:
    storage = GCSStorage(logged_gcs.client())
    storage.write_bytes(f"{bucket}/empty.bin", b"")
    digest = storage.download_hashed(f"{bucket}/empty.bin", str(tmp_path / "out"))
    assert digest == hashlib.sha256().hexdigest()
    assert (tmp_path / "out").read_bytes() == b""


def test_a_missing_object_is_storage_not_found(logged_gcs: FakeGCS, bucket: str, tmp_path: Path) -> None:
    with pytest.raises(StorageNotFound, match=r"missing\.bin does not exist"):
        GCSStorage(logged_gcs.client()).download_hashed(f"{bucket}/missing.bin", str(tmp_path / "out"))


@pytest.mark.parametrize(("cuts", "succeeds"), [(1, True), (3, False)])
def test_a_cut_connection_is_tried_again_and_then_fails_the_download(
    logged_gcs: FakeGCS,
    bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cuts: int,
    succeeds: bool,
) -> None:
    data = _object(50_000)
    storage = GCSStorage(logged_gcs.client())
    storage.write_bytes(f"{bucket}/cut-{cuts}.bin", data)
    session = storage.client._http
    real_get = session.get
    tries = [0]

    def cut_short(*args, **kwargs):
        response = real_get(*args, **kwargs)
        tries[0] += 1
        if tries[0] > cuts:
            return response
        real_readinto = response.raw.readinto
        sent = [0]

        def readinto(view: memoryview) -> int:
            if sent[0] >= 20_000:
                return 0  # the peer closed the connection
            n = real_readinto(view[: 20_000 - sent[0]])
            sent[0] += n
            return n

        monkeypatch.setattr(response.raw, "readinto", readinto)
        return response

    monkeypatch.setattr(session, "get", cut_short)
    out = tmp_path / "out"
    if succeeds:
        assert (
            storage.download_hashed(f"{bucket}/cut-{cuts}.bin", str(out)) == hashlib.sha256(data).hexdigest()
        )
        assert out.read_bytes() == data and tries[0] == 2
    else:
        with pytest.raises(StorageError, match=r"ended after 20000 of 50000 bytes.*\(3 tries\)"):
            storage.download_hashed(f"{bucket}/cut-{cuts}.bin", str(out))
        assert tries[0] == 3


def test_a_client_without_the_session_uses_the_library_download(
    logged_gcs: FakeGCS, bucket: str, tmp_path: Path
) -> None:
    class WithoutSession:
        def __init__(self, client) -> None:
            self._client = client

        def __getattr__(self, name: str):
            if name == "_http":
                raise AttributeError(name)
            return getattr(self._client, name)

    data = _object(70_000)
    storage = GCSStorage(WithoutSession(logged_gcs.client()))
    storage.write_bytes(f"{bucket}/lib.bin", data)
    assert (
        storage.download_hashed(f"{bucket}/lib.bin", str(tmp_path / "out"))
        == hashlib.sha256(data).hexdigest()
    )
    assert (tmp_path / "out").read_bytes() == data
    with pytest.raises(StorageNotFound):
        storage.download_hashed(f"{bucket}/none.bin", str(tmp_path / "out2"))


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
