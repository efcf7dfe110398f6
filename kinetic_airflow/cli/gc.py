"""``kinetic-airflow gc``: the command around :mod:`kinetic_airflow.retention`, whose
docstring (what goes, what stays and why) is the command's help."""

from __future__ import annotations

import argparse
import time
from typing import Any

from kinetic_airflow import retention
from kinetic_airflow.backends.gke.client import gke_access, resolve_gke_cluster
from kinetic_airflow.cli.common import (
    CliError,
    add_output_options,
    add_storage_options,
    age,
    base_uri_of,
    guarded,
    print_rows,
    storage_of,
)
from kinetic_airflow.cli.text import described
from kinetic_airflow.config import resolve_setting
from kinetic_airflow.retention import AirflowFacts, airflow_facts, apply_plan, make_plan, parse_age


# The command --------------------------------------------------------------------------------
def _configured_cluster(args: argparse.Namespace) -> list[tuple[dict[str, Any], str]]:
    """The cluster of the [kinetic] configuration (as the operator resolves it), if one is set."""
    conn_id = resolve_setting("kubernetes_conn_id")
    project = args.project or resolve_setting("project")
    if not conn_id and not project:
        return []
    cluster = {
        "kubernetes_conn_id": conn_id,
        "gcp_conn_id": args.gcp_conn_id or resolve_setting("gcp_conn_id"),
        "project": project,
        "location": resolve_setting("zone"),
        "name": args.cluster or resolve_setting("cluster"),
        **gke_access(),
    }
    return [(resolve_gke_cluster(cluster), args.namespace or resolve_setting("namespace"))]


def _gc(args: argparse.Namespace) -> int:
    if args.older_than is None:
        days = resolve_setting("retention_days")
        if days in (None, ""):
            raise CliError(
                "how old must job files be to go? Pass --older-than (e.g. 30d) or set [kinetic] "
                "retention_days (AIRFLOW__KINETIC__RETENTION_DAYS=30)"
            )
        older_than = float(days) * 86400
    else:
        try:
            older_than = parse_age(args.older_than)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    base = base_uri_of(args)
    storage = storage_of(args, base)
    facts: AirflowFacts | None = None
    if not args.skip_airflow_checks:
        try:
            facts = airflow_facts(set())
        except Exception as exc:
            raise CliError(
                f"gc needs Airflow's metadata DB to know which results task instances still need ({exc}). "
                "Run it where `airflow db check` works, or pass --skip-airflow-checks (then every job "
                "that succeeded is kept, and orphans are not looked for)"
            ) from None
    plan = make_plan(
        storage,
        base,
        older_than,
        facts=facts,
        include_outputs=args.include_outputs,
        clusters=_configured_cluster(args),
        orphan_grace=parse_age(args.orphan_grace),
    )
    now = time.time()
    shown = [d for d in plan.jobs if d.delete or d.reason != "newer than the cutoff" or args.verbose]
    rows = [
        {
            "job_id": d.info.job_id,
            "task_instance": d.info.task_instance,
            "state": d.info.state.value,
            "age": age(now - d.info.last_activity if d.info.last_activity else None),
            "action": ("would delete" if args.dry_run else "delete") if d.delete else "keep",
            "reason": d.reason,
        }
        for d in shown
    ]
    rows += [
        {"job_id": "-", "task_instance": uri, "state": "-", "age": "-",
         "action": "would delete" if args.dry_run else "delete", "reason": why}
        for uri, why in plan.outputs
    ]  # fmt: skip
    rows += [
        {"job_id": "-", "task_instance": path, "state": "-", "age": "-", "action": "refuse", "reason": why}
        for path, why in plan.refused
    ]  # fmt: skip
    orphan_rows = [
        {
            "kind": o.obj.kind,
            "name": o.obj.name,
            "namespace": o.obj.namespace,
            "state": o.obj.status.state.value,
            "action": "delete" if args.delete_orphans and not args.dry_run else "report",
            "reason": o.reason,
        }
        for o in plan.orphans
    ]
    done = None if args.dry_run else apply_plan(storage, plan, delete_orphans=args.delete_orphans)
    if args.output in ("json", "yaml"):
        report = {
            "base_uri": base,
            "older_than_seconds": older_than,
            "dry_run": bool(args.dry_run),
            "files": rows,
            "orphans": orphan_rows,
            "deleted": done,
            "refused": [{"path": path, "reason": why} for path, why in plan.refused],
            "notes": plan.notes,
        }
        print_rows([report], args.output)
        return 0
    print(f"job storage {base}: jobs with no activity for {age(older_than)}")
    print_rows(rows, "table") if rows else print("nothing to delete")
    if orphan_rows:
        print("\norphaned cluster objects (their task instance no longer runs):")
        print_rows(orphan_rows, "table")
    for note in plan.notes:
        print(f"note: {note}")
    if plan.refused:
        print(
            f"refused {len(plan.refused)} path(s) outside the job store's own prefixes (listed above): "
            "job storage names them, and anyone who can write it could have; nothing there was deleted"
        )
    if done is None:
        print(
            f"dry run: would delete {len(plan.to_delete)} job(s) and {len(plan.outputs)} output dir(s)"
            + (f", {len(plan.orphans)} orphan(s)" if args.delete_orphans else "")
        )
        return 0
    print(
        f"deleted {done['jobs']} job(s), {done['outputs']} output dir(s), {done['orphans']} orphan(s); "
        f"kept {len(plan.jobs) - done['jobs']} job(s)"
    )
    return 0


def run_gc(args: argparse.Namespace) -> int:
    return guarded(_gc, args)


def add_gc_command(sub: Any) -> None:
    parser = sub.add_parser(
        "gc",
        help="delete old job files; find and delete orphaned cluster jobs",
        **described(retention.__doc__),
    )
    parser.add_argument("--older-than", help="age, e.g. 30d, 12h (default: [kinetic] retention_days)")
    parser.add_argument("--dry-run", action="store_true", help="show what would go; delete nothing")
    parser.add_argument(
        "--include-outputs",
        action="store_true",
        help="also delete KINETIC_OUTPUT_DIR of task instances done with",
    )
    parser.add_argument(
        "--delete-orphans",
        action="store_true",
        help="delete orphaned Jobs / LeaderWorkerSets (else reported)",
    )
    parser.add_argument(
        "--orphan-grace", default="10m", help="objects younger than this are never orphans (default 10m)"
    )
    parser.add_argument(
        "--skip-airflow-checks",
        action="store_true",
        help="without Airflow's DB: keep every succeeded job, do not look for orphans",
    )
    parser.add_argument("--namespace", help="namespace to look for orphans in ([kinetic] namespace)")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also list the jobs kept for being recent"
    )
    add_storage_options(parser)
    add_output_options(parser)
