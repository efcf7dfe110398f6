"""What the Kinetic view shows of the metrics jobs reported: a task's curves, a sweep's table.

The points come from the jobs' metrics chunks in job storage (``job.metrics``), checked as plain
numbers and cached (a chunk never changes once written); the task instances, their labels
(``lr=0.01``: the mapped arguments), states and chip-hours from ``data.task_rows``.
"""

from __future__ import annotations

from typing import Any

from kinetic_airflow.connections import storage_for
from kinetic_airflow.job.metrics import higher_is_better
from kinetic_airflow.reported_metrics import combine, read_attempts
from kinetic_airflow.ui.data import _READERS, job_details, task_rows

__all__ = ["parse_label", "sweep", "task_metrics"]


def _latest_try(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The attempts of the newest try: a preemption's new attempt continues the same curve."""
    if not jobs:
        return []
    newest = max((j.get("try_number") or 0) for j in jobs)
    return [j for j in jobs if (j.get("try_number") or 0) == newest]


def _curves(row: dict[str, Any]) -> list[dict[str, Any]]:
    conn = row.get("gcp_conn_id")
    return read_attempts(_latest_try(row.get("jobs") or []), lambda uri: storage_for(uri, conn))


def _shaped(attempts: list[dict[str, Any]]) -> dict[str, Any]:
    combined = combine(attempts)
    names = sorted({name for a in attempts for name in a["points"]} | set(combined["final"]))
    return {
        "metrics": names,
        "attempts": [
            {k: a[k] for k in ("job_id", "attempt", "try_number", "points", "summary")} for a in attempts
        ],
        **combined,
    }


def task_metrics(
    session: Any, dag_id: str, run_id: str, task_id: str, map_index: int
) -> dict[str, Any] | None:
    row = job_details(session, dag_id, run_id, task_id, map_index)
    return None if row is None else _shaped(_curves(row))


def parse_label(label: str) -> dict[str, Any]:
    """``lr=0.01, depth=4`` (kinetic's map label: the expanded arguments) as ``{"lr": 0.01, "depth": 4}``;
    a value that is not a number stays text."""
    params: dict[str, Any] = {}
    for part in (label or "").split(", "):
        name, sep, text = part.partition("=")
        if not sep or not name.strip():
            continue
        try:
            value: Any = float(text)
            value = (
                int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value
            )
        except ValueError:
            value = text
        params[name.strip()] = value
    return params


def sweep(
    session: Any, dag_ids: set[str], dag_id: str, task_id: str, run_id: str | None, limit: int = 2000
) -> dict[str, Any]:
    """Every map index of a mapped kinetic task, grouped by DAG run (newest first): label, its
    parameters, state, final and best of each metric, chip-hours, and the curves."""
    rows = [
        r
        for r in task_rows(
            session,
            all_jobs=True,
            dag_ids=dag_ids,
            dag_id=dag_id,
            task_id=task_id,
            run_id=run_id,
            limit=limit,
        )
        if r["map_index"] >= 0
    ]
    curves = [_READERS.submit(_curves, r) for r in rows]  # every member's chunks at once
    runs: dict[str, dict[str, Any]] = {}
    names: set[str] = set()
    params: list[str] = []
    for row, future in zip(rows, curves, strict=True):
        shaped = _shaped(future.result())
        names.update(shaped["metrics"])
        member_params = parse_label(row["label"])
        params.extend(p for p in member_params if p not in params)
        run = runs.setdefault(
            row["run_id"], {"run_id": row["run_id"], "run_after": row["run_after"], "members": []}
        )
        run["members"].append(
            {
                "map_index": row["map_index"],
                "label": row["label"],
                "params": member_params,
                "state": row["state"],
                "ti_state": row["ti_state"],
                "chip_hours": row["chip_hours"],
                "run_seconds": row["run_seconds"],
                "final": shaped["final"],
                "best": shaped["best"],
                "attempts": len(shaped["attempts"]),
                # one curve per member: its attempts' points in order (a preemption continues it)
                "curves": {
                    name: [p for a in shaped["attempts"] for p in a["points"].get(name, [])]
                    for name in shaped["metrics"]
                },
            }
        )
    for run in runs.values():
        run["members"].sort(key=lambda m: m["map_index"])
    return {
        "dag_id": dag_id,
        "task_id": task_id,
        "metrics": sorted(names),
        "higher_is_better": {name: higher_is_better(name) for name in sorted(names)},
        "params": params,
        "runs": list(runs.values()),
    }
