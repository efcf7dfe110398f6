"""``Data``: a local file/directory or a ``gs://`` URI that a job needs on its disk.

Used two ways, as in kinetic: in ``volumes={"/mnt/data": Data("./ds")}`` the data
appears at that absolute path before the function runs; passed as an argument
(``train(Data("./ds"))``) the function receives the local path of the copy.

Local data is uploaded once to a content-addressed cache under the job storage
(``{base}/cache/{sha256}/``) and skipped when that digest is already there, so a
sweep of 50 tasks over one dataset uploads it once. Standard library only: the
runner materializes these objects inside the job.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kinetic_airflow.job.layout import fuse_local_path, fuse_mount_path, fuse_points_at_file
from kinetic_airflow.job.storage import Storage, StorageNotFound, join_uri, open_storage

__all__ = ["Data", "check_fuse_folder", "data_in", "fuse_folder", "validate_volumes"]

_COMPLETE_MARKER = ".kinetic-complete"


def fuse_folder(uri: str) -> str:
    """The bucket folder ``Data(uri, fuse=True)`` mounts (``only-dir``): the URI's folder, or the
    folder of the file it names; "" for the whole bucket."""
    prefix = uri.removeprefix("gs://").partition("/")[2].strip("/")
    return posixpath.dirname(prefix) if fuse_points_at_file(uri) else prefix


def check_fuse_folder(uri: str) -> None:
    """Refuse a folder the GCS FUSE CSI driver cannot mount: it splits a volume's mount options
    on every comma, with no escape (GoogleCloudPlatform/gcs-fuse-csi-driver
    ``pkg/csi_driver/utils.go``, ``parseVolumeAttributes``), so ``only-dir=a,b`` would mount
    folder ``a`` and pass ``b`` to gcsfuse as an option."""
    folder = fuse_folder(uri)
    if "," in folder:
        raise ValueError(
            f"Data({uri!r}, fuse=True): the bucket folder {folder!r} has a comma, and the GCS FUSE CSI "
            "driver splits its mount options on every comma (there is no escape), so it cannot mount "
            "that folder. Mount a parent folder without a comma (and name the path below it in your "
            "function), rename the folder, or drop fuse=True to copy the data instead"
        )


@dataclass
class Data:
    """A dataset to make available in the job: a local path or a ``gs://`` URI."""

    source: str
    # Filled in by ``stage`` on the worker: where the content lives in job storage.
    staged_uri: str | None = None
    is_dir: bool | None = None
    # gs:// data on a cluster: mounted lazily through the GCS FUSE CSI driver instead of copied
    # (what a multi-hundred-GB training set needs). Copied anyway on the local backend.
    fuse: bool = False

    def __post_init__(self) -> None:
        if self.fuse and not str(self.source).startswith("gs://"):
            raise ValueError(
                f"Data({self.source!r}, fuse=True): only gs:// data can be mounted through GCS FUSE; "
                "local data is uploaded once and copied into the job (drop fuse=True)"
            )
        if self.fuse:
            check_fuse_folder(str(self.source))
        if not isinstance(self.source, (str, os.PathLike)):
            raise TypeError(f"Data() takes a path or gs:// URI string, got {type(self.source).__name__}")
        self.source = os.fspath(self.source)
        if not self.source:
            raise ValueError("Data() needs a non-empty path or gs:// URI")

    @property
    def is_remote(self) -> bool:
        return self.source.startswith("gs://")

    # Worker side ---------------------------------------------------------------------------
    def stage(self, storage: Storage, base_uri: str) -> Data:
        """Upload local content to the cache (once per digest); remote URIs stay as they are."""
        if self.is_remote:
            return Data(self.source, staged_uri=self.source, is_dir=None, fuse=self.fuse)
        path = Path(self.source).expanduser().resolve()
        if not path.exists():
            raise FileNotFoundError(
                f"Data({self.source!r}): {path} does not exist on the Airflow worker. Use a path that "
                "exists where the task runs, or a gs:// URI."
            )
        digest = _content_digest(path)
        cache_uri = join_uri(base_uri, "cache", digest)
        if not storage.exists(join_uri(cache_uri, _COMPLETE_MARKER)):
            files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
            for file in files:
                rel = file.name if path.is_file() else file.relative_to(path).as_posix()
                storage.upload_file(str(file), join_uri(cache_uri, "content", rel))
            storage.write_text(join_uri(cache_uri, _COMPLETE_MARKER), digest)
        return Data(self.source, staged_uri=join_uri(cache_uri, "content"), is_dir=path.is_dir())

    # Runner side ---------------------------------------------------------------------------
    def materialize(self, local_root: str) -> str:
        """Copy the staged content to local disk; return the path the function should use."""
        uri = self.staged_uri or self.source
        if self.fuse and self.is_remote:
            if os.path.isdir(fuse_mount_path(uri)):  # the pod mounted it: nothing to copy
                return fuse_local_path(uri)
        storage = open_storage(uri)
        target = Path(local_root) / hashlib.sha256(uri.encode()).hexdigest()[:16]
        items = storage.list(uri)
        if not items:
            raise StorageNotFound(f"Data({self.source!r}): nothing found at {uri}")
        single_file = len(items) == 1 and items[0].rstrip("/") == uri.rstrip("/")
        if single_file:
            target.mkdir(parents=True, exist_ok=True)
            dest = target / uri.rstrip("/").rsplit("/", 1)[-1]
            storage.download_file(uri, str(dest))
            return str(dest)
        prefix = uri.rstrip("/") + "/"
        for item in items:
            dest = target / item[len(prefix) :]
            dest.parent.mkdir(parents=True, exist_ok=True)
            storage.download_file(item, str(dest))
        if self.is_dir is False and len(items) == 1:
            return str(target / items[0][len(prefix) :])
        return str(target)

    def __fspath__(self) -> str:  # lets users open(Data(...)) locally while developing
        return self.source


def _content_digest(path: Path) -> str:
    """sha256 over relative names and bytes, so identical content hits the same cache entry."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        rel = file.name if path.is_file() else file.relative_to(path).as_posix()
        digest.update(rel.encode() + b"\0")
        with open(file, "rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
        digest.update(b"\0")
    digest.update(b"dir" if path.is_dir() else b"file")
    return digest.hexdigest()


def data_in(*values: Any) -> list[Data]:
    """Every Data in ``values``, at any depth of lists, tuples, sets and dict values (a task's
    arguments and its volumes)."""
    found: list[Data] = []

    def walk(value: Any) -> None:
        if isinstance(value, Data):
            found.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple, set)):
            for item in value:
                walk(item)

    for value in values:
        walk(value)
    return found


def validate_volumes(volumes: Any) -> dict[str, Data]:
    """Parse-time check: ``{absolute mount path: Data}``."""
    if volumes is None:
        return {}
    if not isinstance(volumes, dict):
        raise TypeError(
            f"volumes must be a dict of absolute mount path -> Data(...), got {type(volumes).__name__}. "
            'Example: volumes={"/data": Data("./dataset")}'
        )
    for mount, data in volumes.items():
        if not isinstance(mount, str) or not mount.startswith("/"):
            raise ValueError(
                f"volumes: mount path {mount!r} must be an absolute path such as '/data'. "
                'Example: volumes={"/data": Data("./dataset")}'
            )
        if not isinstance(data, Data):
            raise TypeError(
                f"volumes[{mount!r}] must be a kinetic_airflow.Data object, got {type(data).__name__}. "
                f'Wrap the path: volumes={{"{mount}": Data({data!r})}}'
            )
    return dict(volumes)


def mount(path: str, mount_path: str) -> None:
    """Make ``path`` visible at ``mount_path`` (a symlink; an existing empty dir is filled)."""
    target = Path(mount_path)
    if target.is_symlink():
        target.unlink()
    if target.is_dir() and not any(target.iterdir()):
        target.rmdir()
    if target.exists():
        if Path(path).is_dir() and target.is_dir():
            shutil.copytree(path, target, dirs_exist_ok=True)
            return
        raise FileExistsError(
            f"volume mount path {mount_path} already exists in the job; pick a path that is free"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(path)
