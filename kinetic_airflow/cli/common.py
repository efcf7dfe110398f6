"""What every ``kinetic-airflow`` command shares: storage and output options, the job lookup,
tables, and one way to report a user error (one line, exit 2)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from kinetic_airflow.backends.gke.pod_override import PodOverrideError
from kinetic_airflow.config import default_base_uri, resolve_setting
from kinetic_airflow.connections import KineticConfigError, storage_for
from kinetic_airflow.job.storage import Storage, StorageError, join_uri


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
        # Optional dependency: PyYAML only for -o yaml.
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

    import airflow.sdk  # noqa: F401  (configures logging: patch it after, not before)

    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
                handler.setStream(_Stderr())  # type: ignore[arg-type]
    try:
        # Airflow start-up cost: Airflow's logging is set up when a command runs, not for --help.
        import structlog

        factory = structlog.get_config().get("logger_factory")
        if getattr(factory, "io", None) in (None, sys.stdout):
            factory.io = _Stderr()
    except Exception:  # another logging setup: nothing of ours to fix
        pass


def guarded(handler: Any, args: argparse.Namespace) -> int:
    """User errors as one line (exit 2), never a raw library traceback."""
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
