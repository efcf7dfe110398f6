"""``kinetic-airflow jobs ...``: find a job, read its log, see its result, stop it.

kinetic-airflow jobs list [--dag-id D] [--run-id R] [--task-id T] [--state S] [--backend B]
                         (--backend also picks that backend's default base URI)
kinetic-airflow jobs logs JOB [--follow]
kinetic-airflow jobs result JOB [--load]
kinetic-airflow jobs cancel JOB [--reason TEXT]
kinetic-airflow jobs show JOB

JOB is a job id (looked up under the base URI) or a job URI. Everything is read from job
storage (each job's ``job.json``, manifest, markers and result summary) and, for jobs
without an outcome yet, from their backend, with the connections the operator used (the
ids recorded in the job; credentials come from Airflow's connections, as for the task).
Output is a table, or ``-o json`` / ``--json`` / ``-o yaml`` as Airflow's own CLI offers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from kinetic_airflow.jobstore import JobInfo, backend_states, list_job_ids, load_job
from kinetic_airflow.storage import Storage, join_uri

__all__ = ["add_job_commands", "add_storage_options", "print_rows", "resolve_job", "run_jobs_command"]


class CliError(Exception):
    """A problem the user fixes (printed without a traceback, exit code 2)."""


# Options shared by jobs, gc and reproduce -----------------------------------------------------
def add_storage_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("where jobs live (default: the [kinetic] configuration)")
    group.add_argument(
        "--base-uri", help="job storage, gs://bucket/prefix or file:///path ([kinetic] base_uri)"
    )
    group.add_argument("--backend", help="for the default base URI: local, gke, pathways ([kinetic] backend)")
    group.add_argument("--project", help="for the default base URI gs://{project}-kn-{cluster}-jobs")
    group.add_argument("--cluster", help="for the default base URI ([kinetic] cluster)")
    group.add_argument("--gcp-conn-id", help="Airflow GCP connection for gs:// ([kinetic] gcp_conn_id)")


def add_output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o", "--output", choices=("table", "json", "yaml", "plain"), default="table", help="output format"
    )
    parser.add_argument("--json", dest="output", action="store_const", const="json", help="same as -o json")


def base_uri_of(args: argparse.Namespace) -> str:
    from kinetic_airflow.config import default_base_uri, resolve_setting

    base = args.base_uri or resolve_setting("base_uri")
    if base:
        return str(base).rstrip("/")
    backend = args.backend or resolve_setting("backend")
    if backend == "auto":
        backend = "gke"
    try:
        return default_base_uri(
            backend, args.project or resolve_setting("project"), args.cluster or resolve_setting("cluster")
        )
    except ValueError as exc:
        raise CliError(f"{exc}. Or pass --base-uri.") from None


def storage_of(args: argparse.Namespace, uri: str) -> Storage:
    from kinetic_airflow.config import resolve_setting
    from kinetic_airflow.connections import storage_for

    return storage_for(uri, args.gcp_conn_id or resolve_setting("gcp_conn_id"))


def resolve_job(args: argparse.Namespace, job: str) -> tuple[Storage, str]:
    """(storage, job URI) for a job id or URI; refuses one that has no files."""
    if "://" in job:
        job_uri = job.rstrip("/")
    else:
        job_uri = join_uri(base_uri_of(args), "jobs", job)
    storage = storage_of(args, job_uri)
    if not storage.list(job_uri):
        where = job_uri.rsplit("/", 1)[0]
        raise CliError(
            f"no job {job_uri.rsplit('/', 1)[-1]} in {where}: check the id (`kinetic-airflow jobs list`), "
            "or pass --base-uri (or the job's full URI) if it ran with another base URI"
        )
    return storage, job_uri


# Output ---------------------------------------------------------------------------------------
def age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def print_rows(rows: Sequence[dict[str, Any]], output: str, columns: Sequence[str] | None = None) -> None:
    """A kubectl-style table (nothing truncated), or JSON / YAML / plain as Airflow's CLI does."""
    if output == "json":
        print(json.dumps(list(rows), indent=2, default=str))
        return
    if output == "yaml":
        import yaml

        print(yaml.safe_dump(json.loads(json.dumps(list(rows), default=str)), sort_keys=False), end="")
        return
    columns = list(columns or (rows[0].keys() if rows else []))
    if output == "plain":
        for row in rows:
            print("\t".join(str(row.get(c, "")) for c in columns))
        return
    if not rows:
        print("No jobs found.")
        return
    text = [[str(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in text)) for i, c in enumerate(columns)]
    heads = [c.upper().replace("_", " ") for c in columns]
    print("  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip())
    for row in text:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def job_row(info: JobInfo, now: float) -> dict[str, Any]:
    identity = info.identity
    return {
        "job_id": info.job_id,
        "task_instance": info.task_instance,
        "try": identity.try_number if identity else "?",
        "attempt": identity.attempt if identity else "?",
        "backend": info.backend,
        "accelerator": info.accelerator,
        "state": info.state,
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
        infos = [i for i in infos if i.state in states]
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
def describe(info: JobInfo) -> dict[str, Any]:
    ref = info.ref or {}
    identity = info.identity
    manifest = info.manifest or {}
    summary = info.summary or {}
    details: dict[str, Any] = {
        "job_id": info.job_id,
        "job_uri": info.job_uri,
        "state": info.state,
        "task_instance": info.task_instance,
        "try_number": identity.try_number if identity else None,
        "attempt": identity.attempt if identity else None,
        "backend": info.backend,
        "accelerator": info.accelerator,
        "callable": (info.record or {}).get("callable") or manifest.get("callable"),
        "created": _iso(info.created),
        "output_dir": manifest.get("output_dir"),
    }
    if ref.get("backend") in ("gke", "pathways"):
        from kinetic_airflow.backends import get_backend

        cluster = ref.get("cluster") or {}
        details.update(
            cluster=cluster.get("name") or cluster.get("kubernetes_conn_id"),
            namespace=ref.get("namespace"),
            kubernetes_object=get_backend(ref["backend"]).object_name(ref),
            image=ref.get("image"),
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
    details["markers"] = {name: _iso(m.get("time")) for name, m in sorted(info.markers.items())}
    from kinetic_airflow.reproduce import reproduce_commands

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
    details = describe(info)
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
    from kinetic_airflow.layout import JobLayout

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
    from kinetic_airflow.integrity import IntegrityError
    from kinetic_airflow.job_keys import NO_KEY_HELP, recorded_integrity
    from kinetic_airflow.results import load_verified_envelope

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
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # no login name and no passwd entry (some containers)
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname() or 'unknown host'}"


def cmd_cancel(args: argparse.Namespace) -> int:
    from kinetic_airflow import lifecycle
    from kinetic_airflow.backends import get_backend

    storage, job_uri = resolve_job(args, args.job)
    info = load_job(storage, job_uri)
    if info.ref is None:
        raise CliError(
            f"job {info.job_id} has no job.json (an older kinetic-airflow submitted it), so its backend is "
            "unknown: stop it with kubectl (kubectl delete job kinetic-<job id>) or by its process"
        )
    if info.summary is not None or info.cancelled is not None:
        print(f"job {info.job_id} has already ended ({info.state}); nothing to cancel")
        return 0
    lifecycle.cancel_job(
        info.ref,
        storage,
        get_backend(info.ref["backend"]),
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
    from kinetic_airflow.logs_cli import print_logs

    storage, job_uri = resolve_job(args, args.job)
    info = load_job(storage, job_uri)
    return print_logs(info, storage, follow=args.follow)


# Wiring ---------------------------------------------------------------------------------------
def add_job_commands(sub: Any) -> None:
    from kinetic_airflow.cli_text import described

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
        help="pending, running, succeeded, failed, cancelled, lost, unknown (repeat or comma-separate)",
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
    actions.choices["result"].add_argument(
        "--load", action="store_true", help="download result.pkl and unpickle it here (needs its modules)"
    )
    actions.choices["cancel"].add_argument(
        "--reason", default="cancelled from the command line", help="recorded in status/cancelled.json"
    )


def run_jobs_command(args: argparse.Namespace) -> int:
    handler = {
        "list": cmd_list,
        "show": cmd_show,
        "result": cmd_result,
        "cancel": cmd_cancel,
        "logs": cmd_logs,
    }[args.jobs_command]
    return guarded(handler, args)


class _Stderr:
    """Whatever ``sys.stderr`` is when a line is written, not when logging was set up: the
    commands also run inside other programs (tests) that swap the stream and swap it back."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def logs_to_stderr() -> None:
    """Airflow's logging writes to stdout; a command's output (tables, JSON) must be all there is."""
    import logging

    import airflow.sdk  # noqa: F401  (configures logging: patch it after, not before)

    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
                handler.setStream(_Stderr())  # type: ignore[arg-type]
    try:
        import structlog

        factory = structlog.get_config().get("logger_factory")
        if getattr(factory, "io", None) in (None, sys.stdout):
            factory.io = _Stderr()
    except Exception:  # another logging setup: nothing of ours to fix
        pass


def guarded(handler: Any, args: argparse.Namespace) -> int:
    """User errors as one line (exit 2), never a raw library traceback."""
    from kinetic_airflow.connections import KineticConfigError
    from kinetic_airflow.pod_override import PodOverrideError
    from kinetic_airflow.storage import StorageError

    logs_to_stderr()
    try:
        return handler(args)
    except (CliError, KineticConfigError, StorageError, PodOverrideError, ValueError) as exc:
        print(f"kinetic-airflow: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except Exception as exc:  # storage or cluster unreachable, a permission, ...: say what, briefly
        print(
            f"kinetic-airflow {args.command}: {type(exc).__name__}: {exc}\n(check the connection ids, "
            "the base URI and that the bucket / cluster is reachable from here)",
            file=sys.stderr,
        )
        return 1
