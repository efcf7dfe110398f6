"""``kinetic-airflow reproduce JOB [--pdb]``: run a stored job again on this machine.

The failure at 3 a.m. replayed at 9 a.m. on a laptop: the job's manifest and payload are
copied into a local job directory (``file://``), and the same runner the pod ran
(``python -m kinetic_airflow.runner``) runs it there, in the foreground, printing the
command first. The original job's files are only read, never written: the local copy
gets its own result, markers and a scratch ``KINETIC_OUTPUT_DIR`` (``--output-dir`` to
use another, e.g. the task's real one to resume from its checkpoints). ``--pdb`` opens
pdb at the function's exception (post mortem).

What cannot come along is said, not silently dropped: environment variables the pod got
from Kubernetes Secrets (``pod_override``) and the accelerator itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from kinetic_airflow.cli.common import CliError, add_storage_options, guarded, resolve_job
from kinetic_airflow.cli.job_keys import NO_KEY_HELP, recorded_integrity
from kinetic_airflow.cli.text import described
from kinetic_airflow.job.integrity import (
    KEY_ENV,
    KEY_FD_ENV,
    IntegrityError,
    check_digest,
    key_pipe,
    manifest_text,
    verify_manifest,
)
from kinetic_airflow.job.layout import MANIFEST_NAME, PAYLOAD_NAME, SUMMARY_NAME, JobLayout
from kinetic_airflow.job.ref import JobRef, K8sFields
from kinetic_airflow.jobstore import load_job

__all__ = ["add_reproduce_command", "new_workdir", "reproduce_commands", "run_reproduce"]


def new_workdir(job_id: str) -> str:
    """A fresh private directory (mode 0700, an unpredictable name) for one reproduction."""
    return tempfile.mkdtemp(prefix=f"kinetic-reproduce-{job_id}-")


def _given_workdir(path: str) -> str:
    """``--workdir``: used only when it is empty or new, so that nothing of the user's is overwritten."""
    path = os.path.abspath(path)
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise CliError(
            f"--workdir {path} is not an empty directory: reproduce writes the job's files there and "
            "never overwrites anything; name a new or empty directory, or leave --workdir out for a "
            "private temporary one"
        )
    os.makedirs(path, exist_ok=True)
    return path


def _k8s(ref: JobRef | None) -> K8sFields:
    """The job's cluster fields; empty ones for a local job (or one without ``job.json``)."""
    return ref.k8s if ref is not None and ref.k8s is not None else K8sFields()


def _env(ref: JobRef | None) -> dict[str, str]:
    """The plain variables the job's container had (not those from Secrets)."""
    env = {"KERAS_BACKEND": "jax"}
    env.update({k: str(v) for k, v in (_k8s(ref).container_env or {}).items()})
    return env


def runner_command(local_job_uri: str, *, pdb: bool = False, python: str | None = None) -> list[str]:
    command = [python or sys.executable, "-m", "kinetic_airflow.runner", "--job-uri", local_job_uri]
    return [*command, "--pdb"] if pdb else command


def _shell(env: dict[str, str], command: list[str]) -> str:
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return f"{assigns} {shlex.join(command)}".strip()


def reproduce_commands(job_uri: str, job_id: str, ref: JobRef | None) -> list[str]:
    """What ``jobs show`` prints: the reproduce command, and the runner command it runs."""
    local = f"file://WORKDIR/jobs/{job_id}"
    return [
        f"kinetic-airflow reproduce {shlex.quote(job_uri)}   (add --pdb for a debugger)",
        "runs: " + _shell(_env(ref), runner_command(local)),
    ]


def _secret_env(ref: JobRef | None) -> list[str]:
    spec = ((_k8s(ref).pod_override or {}).get("spec")) or {}
    names = []
    for container in spec.get("containers") or []:
        for item in container.get("env") or []:
            if isinstance(item, dict) and "valueFrom" in item:
                names.append(str(item.get("name")))
    return names


def copy_job(storage: Any, job_uri: str, workdir: str, output_dir: str | None, key: str) -> str:
    """The job's manifest and payload (and DAG code archive) in ``workdir``; returns the local job URI.

    The manifest is checked with the job's ``key`` (from its record) and the payload against the
    digest it vouches for before either is copied: a stored payload runs here, on this machine.
    The local manifest is signed again with the same key, which only the local runner is given.
    """
    source = JobLayout(job_uri)
    job_id = job_uri.rstrip("/").rsplit("/", 1)[-1]
    local_dir = os.path.join(workdir, "jobs", job_id)
    os.makedirs(local_dir)
    local = JobLayout("file://" + local_dir)
    text = storage.read_text_or_none(source.manifest)
    if text is None:
        raise FileNotFoundError(
            f"{source.manifest} does not exist: the job never got its payload (its worker died while "
            "submitting it), so there is nothing to reproduce"
        )
    where = "the job record in Airflow's metadata DB"
    manifest = verify_manifest(text, key, source.manifest, where)
    local_payload = os.path.join(local_dir, PAYLOAD_NAME)
    check_digest(
        storage.download_hashed(source.payload, local_payload),
        manifest.get("sha256"),
        f"the payload {source.payload}",
        "its HMAC-checked manifest",
    )
    code = manifest.get("code")
    if isinstance(code, dict) and code.get("uri"):
        # the runner reads the archive with the local job's storage: bring it along
        target = os.path.join(workdir, "code", os.path.basename(str(code["uri"])))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        storage.download_file(str(code["uri"]), target)
        manifest["code"] = {**code, "uri": "file://" + target}
    manifest["original_output_dir"] = manifest.get("output_dir")
    manifest["output_dir"] = output_dir or "file://" + os.path.join(workdir, "output")
    manifest["reproduced_from"] = job_uri
    with open(os.path.join(local_dir, MANIFEST_NAME), "w") as fh:
        fh.write(manifest_text(manifest, key))
    return local.job_uri


def run_reproduce(args: argparse.Namespace) -> int:
    return guarded(_reproduce, args)


def _reproduce(args: argparse.Namespace) -> int:
    storage, job_uri = resolve_job(args, args.job)
    info = load_job(storage, job_uri)
    integrity, why = recorded_integrity(info.identity, info.job_id)
    if not integrity:
        raise CliError(
            f"cannot check the payload of {info.job_id} before running it here: {why}. {NO_KEY_HELP}."
        )
    workdir = _given_workdir(args.workdir) if args.workdir else new_workdir(info.job_id)
    try:
        local_uri = copy_job(storage, job_uri, workdir, args.output_dir, integrity["key"])
    except (FileNotFoundError, IntegrityError) as exc:
        shutil.rmtree(workdir, ignore_errors=True)  # made empty (or new) above: only our copy goes
        raise CliError(str(exc)) from None
    ref = info.ref
    env = _env(ref)
    command = runner_command(local_uri, pdb=args.pdb, python=args.python)
    original = info.summary or {}
    print(f"reproducing job {info.job_id} ({info.task_instance}) from {job_uri}")
    if original:
        outcome = "succeeded" if original.get("ok") else f"failed: {original.get('error_type')}"
        detail = "" if original.get("ok") else f" ({original.get('error_message')})"
        print(f"the job {outcome}{detail}")
    accelerator = ref.accelerator if ref is not None else None
    if accelerator and accelerator != "cpu":
        print(f"note: the job ran on {accelerator}; here it runs on this machine's hardware")
    secret = _secret_env(ref)
    if secret:
        print(f"note: set these yourself, the pod got them from Kubernetes: {', '.join(secret)}")
    local_dir = local_uri[len("file://") :]
    with open(os.path.join(local_dir, MANIFEST_NAME)) as fh:
        print(f"KINETIC_OUTPUT_DIR: {json.load(fh)['output_dir']}")
    print("running: " + _shell(env, command), flush=True)
    # the key on a pipe only the runner reads: never printed, never in an environment
    key_fd = key_pipe(integrity["key"])
    key_env = {
        KEY_FD_ENV: str(key_fd),
        "KINETIC_JOB_KEY_SOURCE": "the job record (kinetic-airflow reproduce)",
    }
    base_env = {k: v for k, v in os.environ.items() if k not in (KEY_ENV, KEY_FD_ENV)}
    try:
        proc = subprocess.run(command, env={**base_env, **env, **key_env}, pass_fds=(key_fd,))
    finally:
        os.close(key_fd)
    summary_path = os.path.join(local_dir, SUMMARY_NAME)
    summary_text = open(summary_path).read() if os.path.exists(summary_path) else None
    if summary_text is None:
        print(f"the runner exited with {proc.returncode} without a result (see its output above)")
        return proc.returncode or 1
    summary = json.loads(summary_text)
    if summary.get("ok"):
        print(f"reproduced: the function returned {summary.get('value_repr')}")
        print(f"local job files: {workdir}")
        return 0
    same = original and original.get("error_type") == summary.get("error_type")
    print(
        f"reproduced: {summary.get('error_type')}: {summary.get('error_message')} "
        f"(phase {summary.get('phase')})" + ("; the same exception as the job" if same else "")
    )
    print(f"local job files: {workdir}")
    return 1


def add_reproduce_command(sub: Any) -> None:
    parser = sub.add_parser(
        "reproduce",
        help="download a job's payload and run it here with the same runner",
        **described(__doc__),
    )
    parser.add_argument("job", help="job id, or the job's URI")
    parser.add_argument("--pdb", action="store_true", help="open pdb at the function's exception")
    parser.add_argument(
        "--workdir",
        help="an empty or new directory for the local copy (default: a new private temporary one)",
    )
    parser.add_argument(
        "--output-dir",
        help="KINETIC_OUTPUT_DIR for the run (default: a scratch directory in the workdir; pass the "
        "task's own to resume from its checkpoints)",
    )
    parser.add_argument("--python", help="interpreter to run it with (default: this one)")
    add_storage_options(parser)
