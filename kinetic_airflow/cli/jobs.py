"""``kinetic-airflow jobs ...``: find a job, read its log, see its result, stop it.

kinetic-airflow jobs list [--dag-id D] [--run-id R] [--task-id T] [--state S] [--backend B]
                         (--backend also picks that backend's default base URI)
kinetic-airflow jobs logs JOB [--follow]
kinetic-airflow jobs result JOB [--load]
kinetic-airflow jobs cancel JOB [--reason TEXT]
kinetic-airflow jobs show JOB
kinetic-airflow jobs debug JOB [--local-port P] [--local-root DIR]
                         (a debug=True job: forward its debugger here, print the VS Code config)

JOB is a job id (looked up under the base URI) or a job URI. Everything is read from job
storage (each job's ``job.json``, manifest, markers and result summary) and, for jobs
without an outcome yet, from their backend, with the connections the operator used (the
ids recorded in the job; credentials come from Airflow's connections, as for the task).
Output is a table, or ``-o json`` / ``--json`` / ``-o yaml`` as Airflow's own CLI offers.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import time
from typing import Any

from kinetic_airflow import lifecycle
from kinetic_airflow.backends.registry import backend_states, get_backend
from kinetic_airflow.cli.common import (
    CliError,
    add_output_options,
    add_storage_options,
    age,
    base_uri_of,
    guarded,
    print_rows,
    resolve_job,
    storage_of,
)
from kinetic_airflow.cli.debug import add_debug_command, cmd_debug
from kinetic_airflow.cli.job_keys import NO_KEY_HELP, recorded_integrity
from kinetic_airflow.cli.logs import print_logs
from kinetic_airflow.cli.reproduce import reproduce_commands
from kinetic_airflow.cli.text import described
from kinetic_airflow.job.integrity import IntegrityError
from kinetic_airflow.job.layout import JobLayout
from kinetic_airflow.job.ref import K8sFields
from kinetic_airflow.job.states import JobStatus
from kinetic_airflow.job.storage import join_uri
from kinetic_airflow.jobstore import JobInfo, list_job_ids, load_job, read_json_object
from kinetic_airflow.results import load_verified_envelope

__all__ = ["add_job_commands", "add_storage_options", "print_rows", "resolve_job", "run_jobs_command"]


def job_row(info: JobInfo, now: float) -> dict[str, Any]:
    identity = info.identity
    return {
        "job_id": info.job_id,
        "task_instance": info.task_instance,
        "try": identity.try_number if identity else "?",
        "attempt": identity.attempt if identity else "?",
        "backend": info.backend,
        "accelerator": info.accelerator,
        "state": info.state.value,
        "age": age(now - info.created if info.created else None),
    }


# jobs list ------------------------------------------------------------------------------------
def _matches(info: JobInfo, args: argparse.Namespace) -> bool:
    identity = info.identity
    for attr in ("dag_id", "run_id", "task_id"):
        wanted = getattr(args, attr)
        if wanted and (identity is None or getattr(identity, attr) != wanted):
            return False
    if args.backend and args.backend != "auto" and info.backend != args.backend:
        return False
    return True


def cmd_list(args: argparse.Namespace) -> int:
    base = base_uri_of(args)
    storage = storage_of(args, base)
    infos = [load_job(storage, join_uri(base, "jobs", job_id)) for job_id in list_job_ids(storage, base)]
    infos = [i for i in infos if _matches(i, args)]
    backend_states(infos)
    states = {s for value in args.state or [] for s in value.split(",") if s}
    if states:
        infos = [i for i in infos if i.state.value in states]
    infos.sort(key=lambda i: i.created or 0, reverse=True)
    if args.limit:
        infos = infos[: args.limit]
    now = time.time()
    rows = [job_row(info, now) for info in infos]
    if args.output in ("json", "yaml"):
        for row, info in zip(rows, infos, strict=True):
            row.update(job_uri=info.job_uri, created=info.created, message=info.backend_message)
    print_rows(rows, args.output)
    return 0


# jobs show ------------------------------------------------------------------------------------
_USAGE_FIELDS = (
    "device",
    "chips",
    "spot",
    "rung",  # a capacity ladder's: this job's rung of how many, and what it asked for
    "rungs",
    "capacity",
    "queue_seconds",
    "run_seconds",
    "chip_hours",
    "outcome",
)


def describe(info: JobInfo, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """What ``jobs show`` prints; ``usage`` is the job's ``usage.json`` (written when its outcome
    reached Airflow), None before that."""
    ref = info.ref
    identity = info.identity
    manifest = info.manifest or {}
    summary = info.summary or {}
    details: dict[str, Any] = {
        "job_id": info.job_id,
        "job_uri": info.job_uri,
        "state": info.state.value,
        "task_instance": info.task_instance,
        "try_number": identity.try_number if identity else None,
        "attempt": identity.attempt if identity else None,
        "backend": info.backend,
        "accelerator": info.accelerator,
        "callable": (info.record or {}).get("callable") or manifest.get("callable"),
        "created": _iso(info.created),
        "output_dir": manifest.get("output_dir"),
    }
    if ref is not None and ref.backend in ("gke", "pathways", "multislice"):
        k8s = ref.k8s or K8sFields()
        cluster = k8s.cluster or {}
        details.update(
            cluster=cluster.get("name") or cluster.get("kubernetes_conn_id"),
            namespace=k8s.namespace,
            kubernetes_object=get_backend(ref.backend).object_name(ref),
            image=k8s.image,
        )
    if info.backend_message:
        details["backend_says"] = info.backend_message
    if info.cancelled:
        details["cancelled"] = f"by {info.cancelled.get('by')}: {info.cancelled.get('reason')}"
    if summary:
        details["result"] = {
            k: summary.get(k)
            for k in ("ok", "phase", "error_type", "error_message", "value_type", "value_repr", "timings")
            if summary.get(k) is not None
        }
    if usage:
        details["usage"] = {k: usage.get(k) for k in _USAGE_FIELDS if usage.get(k) is not None}
    details["markers"] = {name: _iso(m.get("time")) for name, m in sorted(info.markers.items())}
    details["reproduce"] = reproduce_commands(info.job_uri, info.job_id, ref)
    return details


def _iso(when: Any) -> str | None:
    if not isinstance(when, (int, float)):
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


def cmd_show(args: argparse.Namespace) -> int:
    storage, job_uri = resolve_job(args, args.job)
    info = load_job(storage, job_uri)
    backend_states([info])
    details = describe(info, read_json_object(storage, JobLayout(job_uri).usage))
    if args.output in ("json", "yaml"):
        print_rows([details], args.output)
        return 0
    for key, value in details.items():
        if key == "reproduce":
            continue
        if isinstance(value, dict):
            print(f"{key}:")
            for sub, item in value.items():
                print(f"  {sub}: {item}")
        elif value is not None:
            print(f"{key}: {value}")
    print("reproduce locally (downloads the payload, runs it with the same runner):")
    for line in details["reproduce"]:
        print(f"  {line}")
    return 0


# jobs result ----------------------------------------------------------------------------------
def cmd_result(args: argparse.Namespace) -> int:
    storage, job_uri = resolve_job(args, args.job)
    info = load_job(storage, job_uri)
    if info.summary is None:
        backend_states([info])
        raise CliError(
            f"job {info.job_id} has no result yet (state {info.state}"
            + (f": {info.backend_message}" if info.backend_message else "")
            + f"). `kinetic-airflow jobs logs {info.job_id}` shows what it is doing."
        )
    summary = info.summary
    if not args.load:
        if args.output in ("json", "yaml"):
            print_rows([summary], args.output)
        else:
            for key in ("ok", "value_type", "value_repr", "phase", "error_type", "error_message", "timings"):
                if summary.get(key) is not None:
                    print(f"{key}: {summary[key]}")
            if summary.get("traceback"):
                print("remote traceback:\n" + summary["traceback"].rstrip())
        return 0 if summary.get("ok") else 1
    # Verified before anything is unpickled: with the job's key, from its record in the metadata DB.
    integrity, why = recorded_integrity(info.identity, info.job_id)
    if not integrity:
        raise CliError(
            f"cannot check the result of {info.job_id} before unpickling it: {why}. {NO_KEY_HELP}. "
            "`jobs result` without --load shows its summary (nothing is unpickled)."
        )
    try:
        envelope, _ = load_verified_envelope(
            storage, JobLayout(job_uri).result(), summary, integrity["key"], 0
        )
    except IntegrityError as exc:
        raise CliError(str(exc)) from None
    except ModuleNotFoundError as exc:
        raise CliError(
            f"the result of {info.job_id} needs module {exc.name!r} to be loaded here: install it, or use "
            "`jobs result` without --load for its summary"
        ) from None
    if envelope.get("ok"):
        value = envelope.get("value")
        if args.output == "json":
            print(json.dumps(value, indent=2, default=repr))
        else:
            print(repr(value))
        return 0
    exc = envelope.get("exception")
    print(
        f"the job failed in phase {envelope.get('phase')}: {exc!r}" if exc else summary.get("error_message")
    )
    if summary.get("traceback"):
        print("remote traceback:\n" + summary["traceback"].rstrip())
    return 1


# jobs cancel ----------------------------------------------------------------------------------
def who_runs_this() -> str:
    """``user@host`` of this process, for the cancelled marker: whoever reads why a job stopped
    (its task's error, the Kinetic view) can tell which person, on which machine, stopped it."""

    try:
        user = getpass.getuser()
    except Exception:  # no login name and no passwd entry (some containers)
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname() or 'unknown host'}"


def cmd_cancel(args: argparse.Namespace) -> int:
    storage, job_uri = resolve_job(args, args.job)
    info = load_job(storage, job_uri)
    ref = info.ref
    if ref is None:
        raise CliError(
            f"job {info.job_id} has no job.json (an older kinetic-airflow submitted it), so its backend is "
            "unknown: stop it with kubectl (kubectl delete job kinetic-<job id>) or by its process"
        )
    if info.summary is not None or info.cancelled is not None:
        print(f"job {info.job_id} has already ended ({info.state}); nothing to cancel")
        return 0
    lifecycle.cancel_job(
        ref,
        storage,
        get_backend(ref.backend),
        by=f"kinetic-airflow jobs cancel ({who_runs_this()})",
        reason=args.reason,
    )
    print(
        f"cancelled job {info.job_id} ({info.task_instance}): marked cancelled and stopped. Its task fails "
        "with the reason (and retries if it has retries left: mark the task failed in Airflow to stop it "
        "for good). Payload, logs and markers stay in " + job_uri
    )
    return 0


# jobs logs ------------------------------------------------------------------------------------
def cmd_logs(args: argparse.Namespace) -> int:
    storage, job_uri = resolve_job(args, args.job)
    info = load_job(storage, job_uri)
    return print_logs(info, storage, follow=args.follow, raw=args.raw)


# Wiring ---------------------------------------------------------------------------------------
def add_job_commands(sub: Any) -> None:
    jobs = sub.add_parser(
        "jobs", help="list jobs, read their logs and results, cancel them", **described(__doc__)
    )
    actions = jobs.add_subparsers(dest="jobs_command", required=True)

    listing = actions.add_parser("list", help="jobs in job storage, newest first")
    listing.add_argument("--dag-id")
    listing.add_argument("--run-id")
    listing.add_argument("--task-id")
    listing.add_argument(
        "--state",
        action="append",
        help=", ".join(s.value for s in JobStatus) + " (repeat or comma-separate)",
    )
    listing.add_argument("--limit", type=int, default=0, help="at most this many (newest first)")
    for parser, helptext in (
        (listing, None),
        (actions.add_parser("logs", help="a job's log (all hosts of a multi-host job)"), "logs"),
        (actions.add_parser("result", help="a job's result summary; --load unpickles the value"), "result"),
        (actions.add_parser("cancel", help="stop a job (marked cancelled, as on_kill does)"), "cancel"),
        (actions.add_parser("show", help="everything about a job, and how to re-run it locally"), "show"),
    ):
        if helptext:
            parser.add_argument("job", help="job id, or the job's URI")
        add_storage_options(parser)
        add_output_options(parser)
    actions.choices["logs"].add_argument("-f", "--follow", action="store_true", help="until the job ends")
    actions.choices["logs"].add_argument(
        "--raw",
        action="store_true",
        help="print the log's bytes as written; by default terminal control sequences are shown escaped",
    )
    actions.choices["result"].add_argument(
        "--load", action="store_true", help="download result.pkl and unpickle it here (needs its modules)"
    )
    actions.choices["cancel"].add_argument(
        "--reason", default="cancelled from the command line", help="recorded in status/cancelled.json"
    )
    add_debug_command(actions)  # jobs debug JOB (kinetic_airflow.cli.debug)


def run_jobs_command(args: argparse.Namespace) -> int:
    handler = {
        "list": cmd_list,
        "show": cmd_show,
        "result": cmd_result,
        "cancel": cmd_cancel,
        "logs": cmd_logs,
        "debug": cmd_debug,
    }[args.jobs_command]
    return guarded(handler, args)
