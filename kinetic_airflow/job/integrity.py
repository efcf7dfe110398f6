"""Digests and HMACs that keep a writer of the job bucket from running code (README, "Security model").

Job storage is writable by many identities (every job pod, CI, pipelines, people), and a
cloudpickle object runs code when it is loaded. So nothing read from storage is unpickled
unless it is vouched for by something a bucket writer cannot change:

* a per-job random **key**, made by the worker, kept in the job record (Airflow's metadata
  DB) and handed to the job out of band: a local job reads it from an inherited pipe
  (``KINETIC_JOB_KEY_FD``), a cluster job from a Kubernetes Secret owned by the Job /
  LeaderWorkerSet (``KINETIC_JOB_KEY``), which the runner moves to a pipe by starting itself
  again, so that no process's environment (``/proc/PID/environ``) ever holds it;
* the **manifest** (payload digest, code archive digest, requirements) carries an HMAC made
  with that key; the runner checks it, then the payload against the digest it vouches for;
* every **result envelope** (host 0's result, any host's failure record) is described in
  its ``result.json`` by its SHA-256 and an HMAC of (host, digest) under the key; the worker
  checks both while downloading, before anything is unpickled;
* the digest of a verified result goes into its XCom reference, so whoever loads it later
  (``load_result``, a downstream job, the CLI) checks the bytes against that.

Standard library only: the runner imports this module inside the job.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import sys
from typing import Any, BinaryIO

__all__ = [
    "KEY_ENV",
    "KEY_FD_ENV",
    "HashingFile",
    "IntegrityError",
    "check_digest",
    "check_result",
    "file_sha256",
    "hide_key_from_environ",
    "key_pipe",
    "manifest_text",
    "new_key",
    "result_tag",
    "take_key",
    "verify_manifest",
]

KEY_ENV = "KINETIC_JOB_KEY"
# The number of an inherited file descriptor, the read end of a pipe holding the key.
KEY_FD_ENV = "KINETIC_JOB_KEY_FD"
_KEY_LIMIT = 4096  # a key is 64 hex characters; a pipe that holds more is not one of ours
MANIFEST_MAC = "hmac"  # the manifest's field holding its HMAC
_CHUNK = 1 << 22


class IntegrityError(RuntimeError):
    """An object in job storage is not the one Airflow or the job wrote: it is never unpickled."""


def new_key() -> str:
    """A fresh per-job key (256 random bits, hex)."""
    return secrets.token_hex(32)


def _mac(key: str, message: bytes) -> str:
    return hmac.new(bytes.fromhex(key), message, hashlib.sha256).hexdigest()


def _canonical(fields: dict[str, Any]) -> str:
    return json.dumps(fields, sort_keys=True, default=str)


def manifest_text(fields: dict[str, Any], key: str) -> str:
    """The manifest as stored: its canonical JSON with an HMAC of that JSON under the job key."""
    body = json.loads(_canonical({k: v for k, v in fields.items() if k != MANIFEST_MAC}))
    body[MANIFEST_MAC] = _mac(key, b"kinetic-manifest-v1\n" + _canonical(body).encode())
    return _canonical(body)


def verify_manifest(text: str, key: str | None, where: str, key_source: str) -> dict[str, Any]:
    """The manifest's fields, once its HMAC is checked; ``IntegrityError`` naming the object otherwise."""
    if not key:
        raise IntegrityError(
            f"this job was given no key ({KEY_ENV} is not set), so the manifest {where} cannot be checked "
            "and nothing from job storage is loaded. Jobs get their key from the Airflow worker that "
            f"creates them ({key_source}); a job started by hand needs {KEY_ENV} from its job record."
        )
    try:
        fields = json.loads(text)
    except ValueError:
        fields = None
    if not isinstance(fields, dict):
        raise IntegrityError(f"the manifest {where} is not a JSON object: it was not written by Airflow")
    claimed = str(fields.pop(MANIFEST_MAC, "") or "")
    expected = _mac(key, b"kinetic-manifest-v1\n" + _canonical(fields).encode())
    if not hmac.compare_digest(claimed, expected):
        raise IntegrityError(
            f"the manifest {where} does not carry this job's HMAC (checked with the key from "
            f"{key_source}): it was changed after the Airflow worker wrote it, by someone who can write "
            "job storage. Nothing from it (payload, code archive, requirements) is loaded; re-run the "
            "task to ship it again."
        )
    return fields


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_digest(actual: str, expected: str | None, what: str, source: str) -> None:
    """Refuse ``what`` unless its SHA-256 is the one ``source`` vouches for."""
    if not expected or not hmac.compare_digest(actual, str(expected)):
        wanted = expected or "a recorded digest (none given)"
        raise IntegrityError(
            f"{what} has SHA-256 {actual}, but {source} expects {wanted}: "
            "it was changed after it was written, by someone who can write job storage. It is not loaded."
        )


def result_tag(key: str, host: int, sha256: str) -> str:
    """The HMAC the runner writes for host ``host``'s envelope with digest ``sha256``."""
    return _mac(key, f"kinetic-result-v1\n{int(host)}\n{sha256}".encode())


def check_result(
    summary: dict[str, Any] | None, actual_sha256: str, key: str | None, host: int, what: str
) -> str:
    """Check a downloaded envelope against its ``result.json`` and the job key; returns its digest.

    The digest in ``result.json`` is only a claim (anyone who can write the envelope can write
    it too); the HMAC over (host, digest) under the key is what a bucket writer cannot make.
    """
    if not key:
        raise IntegrityError(
            f"{what} cannot be checked: the job record holds no key for this job (a job submitted "
            "before kinetic-airflow verified results, or a record that was lost). It is not unpickled."
        )
    integrity = (summary or {}).get("integrity") or {}
    claimed, tag = str(integrity.get("sha256") or ""), str(integrity.get("hmac") or "")
    if not tag or not hmac.compare_digest(tag, result_tag(key, host, claimed)):
        raise IntegrityError(
            f"{what} is not vouched for by its job: the HMAC in its result.json does not match the job's "
            "key (kept in the job record in Airflow's metadata DB). The result or its summary was written "
            "by someone other than the job's runner. It is not unpickled."
        )
    check_digest(actual_sha256, claimed, what, "the job's HMAC-signed result.json")
    return actual_sha256


class HashingFile:
    """A binary file wrapper that digests what passes through ``write`` (bounded slices, no copy)."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.digest = hashlib.sha256()

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        for start in range(0, view.nbytes, _CHUNK):
            self.fh.write(view[start : start + _CHUNK])
        return view.nbytes

    def flush(self) -> None:
        self.fh.flush()

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


def key_pipe(key: str) -> int:
    """The read end of a pipe that holds ``key`` (its write end closed), to hand to a child process.

    Why a pipe and not an environment variable: a process's initial environment stays readable
    in ``/proc/PID/environ`` for its whole life, by any process of the same user (every local
    job runs as the same user); a pipe is read once by the runner and is empty afterwards.
    """
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, key.encode("ascii"))
    finally:
        os.close(write_end)
    return read_end


def hide_key_from_environ(orig_argv: list[str]) -> None:
    """If the key came in this process's environment, start the process again with it on a pipe.

    A Kubernetes ``secretKeyRef`` (and a job started by hand) puts the key into the runner's
    initial environment, which removing it from ``os.environ`` does not change in
    ``/proc/PID/environ``. ``exec`` with a new environment does: same PID, same arguments, the
    key on an inherited pipe. Call it first thing, before any thread starts.
    """
    key = os.environ.get(KEY_ENV)
    if not key:
        return
    env = {name: value for name, value in os.environ.items() if name != KEY_ENV}
    env[KEY_FD_ENV] = str(key_pipe(key))
    os.set_inheritable(int(env[KEY_FD_ENV]), True)
    os.execve(sys.executable, orig_argv, env)


def take_key() -> str | None:
    """The job key, from its pipe (read once, then closed) or its environment variable.

    Both variables are removed from the environment, so the user's function and its children
    inherit neither the key nor the descriptor.
    """
    fd_text = os.environ.pop(KEY_FD_ENV, None)
    from_env = os.environ.pop(KEY_ENV, None)
    if fd_text:
        try:
            fd = int(fd_text)
            data = b""
            while len(data) <= _KEY_LIMIT and (chunk := os.read(fd, _KEY_LIMIT + 1 - len(data))):
                data += chunk
            os.close(fd)
            key = data.decode("ascii").strip()
        except (ValueError, OSError, UnicodeDecodeError):
            key = ""
        if key and len(key) <= _KEY_LIMIT:
            return key
    return from_env or None
