"""The DAG bundle's own code, shipped to the job as one content-addressed archive.

cloudpickle carries what it pickles by value (the DAG file, modules it saw at module level),
but a function that imports a helper package of the DAG folder *inside its body* needs that
package importable in the job. So the worker zips the bundle's source roots (the DAG folder,
and the package root a DAG file lives in), names the archive by the sha256 of its content,
uploads it once to ``{base}/cache/code/{sha256}.zip`` (every job of the same bundle version
reuses it), and the runner unpacks it onto ``sys.path`` before it unpickles anything.

Excluded as kinetic excludes them: ``.git`` and ``__pycache__`` always; virtualenvs, tool
caches, ``node_modules`` and ``.DS_Store`` by default; whatever a ``.kineticignore`` at a root
lists (fnmatch patterns, ``dir/`` for directories only). Files that look like credentials
(``.env*``, ``*.pem``, ``id_rsa*``, service-account keys) are left out and named in a warning:
a job that needs a secret should get it from a Kubernetes Secret, not from the DAG folder.
Standard library only: the runner imports this module.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import logging
import os
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kinetic_airflow.job.storage import join_uri

__all__ = [
    "CodeBundle",
    "build_code_bundle",
    "code_roots",
    "install_code_bundle",
    "ship_code_bundle",
    "unpacked_sources",
]

log = logging.getLogger(__name__)

ALWAYS_EXCLUDED_DIRS = frozenset({".git", "__pycache__"})
DEFAULT_EXCLUDED_DIRS = frozenset(
    {".venv", "venv", "env", "node_modules", ".tox", ".nox", ".mypy_cache", ".ruff_cache",
     ".pytest_cache", ".ipynb_checkpoints", ".idea", ".vscode", "build", "dist", "logs"}
)  # fmt: skip
DEFAULT_EXCLUDED_FILES = frozenset(
    # airflow.db-wal and -shm too: reading them from a process that holds the DB open drops its
    # SQLite locks (POSIX locks go with any closed descriptor of the file).
    {".DS_Store", "airflow.cfg", "airflow.db", "airflow.db-wal", "airflow.db-shm", "webserver_config.py"}
)
SECRET_PATTERNS = (".env", ".env.*", "*.pem", "*.key", "id_rsa*", "id_ed25519*", "*credentials*.json",
                   "*service-account*.json", "*.p12", ".netrc", ".pgpass")  # fmt: skip
IGNORE_FILE = ".kineticignore"
SIZE_WARNING_BYTES = 100 * 1024 * 1024
_FIXED_TIME = (2020, 1, 1, 0, 0, 0)  # zip entries carry no mtime: same content, same digest


@dataclass
class CodeBundle:
    data: bytes
    sha256: str
    roots: list[str]  # archive folder names, one per archived folder
    files: int
    left_out_secrets: list[str] = field(default_factory=list)


def code_roots(dags_folder: str | None, dag_file: str | None) -> tuple[list[Path], list[Path]]:
    """(folders to archive, folders the job puts on ``sys.path``) for a DAG.

    ``sys.path`` gets what the worker has: the bundle's DAG folder (Airflow puts it there) and
    the package root the DAG file lives in — the first folder above the file that is not a
    package (no ``__init__.py``): ``dags/pipelines/train.py`` in package ``pipelines`` gives
    ``dags/``. A folder inside another is archived as part of it.
    """
    path_dirs: list[Path] = []
    if dags_folder and os.path.isdir(dags_folder):
        path_dirs.append(Path(dags_folder).resolve())
    if dag_file:
        if not os.path.isabs(dag_file) and dags_folder:  # a bundle-relative fileloc
            dag_file = os.path.join(dags_folder, dag_file)
        folder = Path(dag_file).resolve().parent
        while (folder / "__init__.py").exists() and folder.parent != folder:
            folder = folder.parent
        if folder not in path_dirs:
            path_dirs.append(folder)
    roots: list[Path] = []
    for folder in path_dirs:
        if not any(folder == r or r in folder.parents for r in roots):
            roots = [r for r in roots if folder not in r.parents] + [folder]
    return roots, path_dirs


def _ignore_patterns(root: Path) -> list[tuple[str, bool]]:
    path = root / IGNORE_FILE
    if not path.is_file():
        return []
    patterns = []
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            patterns.append((line.strip("/"), line.endswith("/")))
    return patterns


def _ignored(rel: str, patterns: list[tuple[str, bool]], is_dir: bool) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return any(
        (is_dir or not dir_only) and (fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(name, pat))
        for pat, dir_only in patterns
    )


def _is_venv(folder: Path) -> bool:
    return (folder / "pyvenv.cfg").exists()


def _files(root: Path) -> Iterable[tuple[Path, str]]:
    patterns = _ignore_patterns(root)
    for current, dirs, files in os.walk(root):
        here = Path(current)
        rel_dir = here.relative_to(root).as_posix()
        keep = []
        for d in sorted(dirs):
            rel = d if rel_dir == "." else f"{rel_dir}/{d}"
            if d in ALWAYS_EXCLUDED_DIRS or d in DEFAULT_EXCLUDED_DIRS or _is_venv(here / d):
                continue
            if _ignored(rel, patterns, is_dir=True) or (here / d).is_symlink():
                continue
            keep.append(d)
        dirs[:] = keep
        for name in sorted(files):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            path = here / name
            if name in DEFAULT_EXCLUDED_FILES or name == IGNORE_FILE or _ignored(rel, patterns, False):
                continue
            if path.is_symlink() or not path.is_file():
                continue
            yield path, rel


def build_code_bundle(roots: list[Path]) -> CodeBundle:
    """Zip the roots (deterministically: same files, same bytes, same digest)."""
    buffer = io.BytesIO()
    names, count, secrets = [], 0, []
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for index, root in enumerate(roots):
            folder = f"root{index}"
            names.append(folder)
            for path, rel in _files(root):
                if any(fnmatch.fnmatch(path.name, pat) for pat in SECRET_PATTERNS):
                    secrets.append(str(path))
                    continue
                info = zipfile.ZipInfo(f"{folder}/{rel}", date_time=_FIXED_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                archive.writestr(info, path.read_bytes())
                count += 1
    data = buffer.getvalue()
    return CodeBundle(data, hashlib.sha256(data).hexdigest(), names, count, secrets)


def _archive_path(folder: Path, roots: list[Path]) -> str:
    for index, root in enumerate(roots):
        if folder == root or root in folder.parents:
            rel = folder.relative_to(root).as_posix()
            return f"root{index}" if rel == "." else f"root{index}/{rel}"
    raise ValueError(f"{folder} is in none of the archived folders")


def ship_code_bundle(
    storage: object, base_uri: str, roots: list[Path], path_dirs: list[Path] | None = None
) -> dict[str, object] | None:
    """Upload the bundle unless that content is already there; the manifest's ``code`` entry."""
    if not roots:
        return None
    bundle = build_code_bundle(roots)
    if bundle.left_out_secrets:
        log.warning(
            "kinetic: left out of the code shipped to the job, because they look like credentials: %s. "
            "Give a job secrets through a Kubernetes Secret (pod_override env secretKeyRef), not files "
            "in the DAG folder; add a .kineticignore entry to silence this.",
            ", ".join(bundle.left_out_secrets),
        )
    if len(bundle.data) > SIZE_WARNING_BYTES:
        log.warning(
            "kinetic: the DAG bundle's code archive is %.0f MiB (%d files from %s): every new bundle "
            "version uploads it again. Keep data out of the DAG folder (use Data(...)) or list large "
            "paths in a .kineticignore.",
            len(bundle.data) / 2**20,
            bundle.files,
            ", ".join(map(str, roots)),
        )
    uri = join_uri(base_uri, "cache", "code", f"{bundle.sha256}.zip")
    # A look first: a conditional upload of an archive that is there would still send its bytes.
    uploaded = not storage.exists(uri) and storage.write_bytes(uri, bundle.data, if_absent=True)  # type: ignore[attr-defined]
    log.info(
        "kinetic: DAG code %s (%d files, %d bytes) %s",
        bundle.sha256[:12],
        bundle.files,
        len(bundle.data),
        "uploaded" if uploaded else "already in job storage",
    )
    paths = [_archive_path(folder, roots) for folder in (path_dirs or roots)]
    # Where each archived folder is on the worker: the runner names those paths in tracebacks,
    # not the temporary folder it unpacked the archive into.
    sources = {name: str(root) for name, root in zip(bundle.roots, roots, strict=True)}
    return {"uri": uri, "sha256": bundle.sha256, "paths": paths, "files": bundle.files, "sources": sources}


def unpacked_sources(entry: dict[str, object], workdir: str) -> dict[str, str]:
    """Each folder the archive is unpacked into (by ``install_code_bundle``) -> where it is on the worker."""
    sources = entry.get("sources")
    if not isinstance(sources, dict):
        return {}
    target = os.path.join(workdir, "code")
    return {os.path.join(target, str(name)): str(original) for name, original in sources.items()}


def install_code_bundle(storage: object, entry: dict[str, object], workdir: str) -> list[str]:
    """Runner side: fetch, verify and unpack the archive; the folders to put on ``sys.path``."""
    data = storage.read_bytes(str(entry["uri"]))  # type: ignore[attr-defined]
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise ValueError(
            f"the DAG code archive {entry['uri']} has digest {digest}, expected {entry['sha256']}: it was "
            "changed after upload; re-run the task to upload it again"
        )
    target = os.path.join(workdir, "code")
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for member in archive.namelist():
            resolved = os.path.realpath(os.path.join(target, member))
            if not resolved.startswith(os.path.realpath(target) + os.sep):
                raise ValueError(f"the DAG code archive holds a path outside its folder: {member!r}")
        archive.extractall(target)
    return [os.path.join(target, str(path)) for path in entry["paths"]]  # type: ignore[union-attr]
