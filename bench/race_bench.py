"""Airflow's executor-event race, measured: failed kinetic tasks with and without kinetic's guard.

Runs real Airflow (api-server, scheduler, dag-processor, triggerer, LocalExecutor) on a private
PostgreSQL, with the GKE backend pointed at the cluster emulator, twice over the same work:

* ``unguarded``: ``wait_before_defer=0`` and ``min_deferral_seconds=0`` — every task defers at
  once and resumes the moment its job ends, as kinetic-airflow did before it dealt with the race;
* ``guarded``: kinetic's defaults: a finished job's event is held until the scheduler has read
  the exit event of the process that deferred the task, seen through that process's
  LocalExecutor worker (``kinetic_airflow.resume_window``, ``local_executor_watch``).

For each backend and job length it triggers ``--runs`` DAG runs of ``--tasks`` mapped kinetic
tasks whose jobs sleep that long, and counts failed task instances and the scheduler's
"finished with state success, but the task instance's state attribute is ..." lines. It also
reports each cell's task-duration overhead: a task instance's duration (start to end, across its
deferral) minus the job's sleep, median and worst.

``patient`` is the default guard with ``wait_before_defer=20``: a job of up to 20 s is awaited
in the worker, never deferred. ``brisk`` is the default guard on a deployment with Airflow's
``[workers] min_heartbeat_interval = 1`` (default 5), which is also how long a task supervisor's
``select`` sleeps between looks at its process (Task SDK ``supervisor.py``): measured, it changes
the deferred jobs' overhead by 0.2-0.5 s at most (README, Benchmarks). A third mode,
``fixed``, is the guard as it was before it watched the deferring process
(``watch_deferring_process=false``: every finished job's event held ``min_deferral_seconds``).
``--exit-report-delay S`` makes the emulator report a container's exit S seconds late, as a real
kubelet and Job controller do (a second or two); kinetic delivers a result when the job's output
closes, so the overhead should not grow with it:

    .venv/bin/python bench/race_bench.py --runs 3 --tasks 20 --lengths 0 2 5
    .venv/bin/python bench/race_bench.py --modes fixed guarded --runs 1 --lengths 0 2 5 10 15 30

``--transports handwritten kubernetes`` runs each mode with both ways of building the GKE
backend's Kubernetes connection: ``handwritten`` (``backends/gke/transport.py`` reads the
kubeconfig) and ``kubernetes`` (the kubernetes python client loads it: ``kube_client_shim``), in
alternating rounds (``--rounds``) on the same machine, so load falls on both alike, and prints the
overhead of each against the first:

    .venv/bin/python bench/race_bench.py --backends gke --modes guarded --lengths 0 \
        --runs 2 --tasks 10 --transports handwritten kubernetes --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from components.airflow_services import AirflowServices, poll
from components.emulator_process import EmulatorProcess
from components.postgres import PostgresServer

RACE_MESSAGE = "but the task instance's state attribute is"

DAG_TEMPLATE = """
import time
import pendulum
from airflow.sdk import dag, task

START = pendulum.datetime(2026, 1, 1, tz="UTC")
"""

CELL_TEMPLATE = """

@task.kinetic(backend="{backend}", task_id="job")
def job_{name}(i: int) -> int:
    time.sleep({seconds})
    return i


@dag(dag_id="{name}", schedule=None, start_date=START, catchup=False, max_active_tasks={tasks})
def dag_{name}():
    job_{name}.expand(i=list(range({tasks})))


dag_{name}()
"""


def cell_name(backend: str, seconds: float) -> str:
    return f"race_{backend}_{str(seconds).replace('.', '_')}s"


def write_dags(folder: Path, backends: list[str], lengths: list[float], tasks: int) -> list[tuple]:
    cells = [(b, s, cell_name(b, s)) for b in backends for s in lengths]
    text = DAG_TEMPLATE + "".join(
        CELL_TEMPLATE.format(backend=b, seconds=s, name=n, tasks=tasks) for b, s, n in cells
    )
    (folder / "race_bench_dags.py").write_text(text)
    return cells


SHIM = Path(__file__).resolve().parent / "kube_client_shim"


def run_mode(
    mode: str, args: argparse.Namespace, transport: str = "handwritten"
) -> dict[tuple[str, float], dict]:
    root = Path(tempfile.mkdtemp(prefix=f"race-bench-{mode}-{transport}-"))
    dags = root / "dags"
    dags.mkdir()
    cells = write_dags(dags, args.backends, args.lengths, args.tasks)
    env = {"KINETIC_BASE_URI": f"file://{root}/kinetic", "KINETIC_POLL_INTERVAL": str(args.poll)}
    if mode == "unguarded":
        env.update(
            {
                "KINETIC_WAIT_BEFORE_DEFER": "0",
                "KINETIC_MIN_DEFERRAL_SECONDS": "0",
                "KINETIC_RESUME_MARGIN_SECONDS": "0",
                "KINETIC_WATCH_DEFERRING_PROCESS": "false",
            }
        )
    elif mode == "fixed":  # the guard before it watched the deferring process
        env["KINETIC_WATCH_DEFERRING_PROCESS"] = "false"
    elif mode == "patient":  # no deferral for a job of up to 20 s: the worker waits for it
        env["KINETIC_WAIT_BEFORE_DEFER"] = "20"
    elif mode == "brisk":  # the default guard; task supervisors look at their process every second
        env["AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL"] = "1"
    results: dict[tuple[str, float], dict] = {}
    with PostgresServer() as pg, EmulatorProcess(root / "emulator") as emulator:
        if args.exit_report_delay:
            emulator.admin.delay_exit_reports(args.exit_report_delay)
        env = {**emulator.airflow_env(), **env, "KINETIC_BACKEND": "local"}
        if transport == "kubernetes":  # every Airflow process loads the shim at start-up (site)
            env["PYTHONPATH"] = str(SHIM)
        services = AirflowServices(
            root / "airflow",
            dags,
            extra_env=env,
            parallelism=args.parallelism,
            database_url=pg.create_database("airflow"),
        )
        try:
            services.start()
            for backend, seconds, name in cells:
                poll(
                    lambda n=name: services.api("GET", f"/api/v2/dags/{n}")["dag_id"] == n,
                    timeout=120,
                    what=f"DAG {name} parsed",
                )
                services.api("PATCH", f"/api/v2/dags/{name}", {"is_paused": False})
                started = time.monotonic()
                run_ids = [
                    services.api("POST", f"/api/v2/dags/{name}/dagRuns", {"logical_date": None})["dag_run_id"]
                    for _ in range(args.runs)
                ]
                failed = 0
                overheads: list[float] = []
                for run_id in run_ids:
                    path = f"/api/v2/dags/{name}/dagRuns/{quote(run_id, safe='')}"
                    poll(
                        lambda p=path: services.api("GET", p)["state"] in ("success", "failed"),
                        timeout=600,
                        what=f"{name} {run_id}",
                    )
                    tis = services.api("GET", f"{path}/taskInstances?limit=1000")["task_instances"]
                    failed += sum(ti["state"] != "success" for ti in tis)
                    overheads += [
                        ti["duration"] - seconds for ti in tis if ti["state"] == "success" and ti["duration"]
                    ]
                log = (services.logs / "scheduler.log").read_text(errors="replace")
                races = sum(1 for line in log.splitlines() if RACE_MESSAGE in line and name in line)
                results[(backend, seconds)] = {
                    "failed": failed,
                    "races": races,
                    "total": args.runs * args.tasks,
                    "overhead_median_s": round(statistics.median(overheads), 2) if overheads else None,
                    "overhead_max_s": round(max(overheads), 2) if overheads else None,
                    "wall_s": round(time.monotonic() - started, 1),
                }
                print(
                    f"{mode:9} {transport:11} {backend:5} {seconds:>4}s  {results[(backend, seconds)]}",
                    flush=True,
                )
        finally:
            services.stop()
            services.kill_leftovers()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--lengths", type=float, nargs="+", default=[0.0, 2.0, 5.0])
    parser.add_argument("--backends", nargs="+", default=["local", "gke"])
    parser.add_argument("--parallelism", type=int, default=8)
    parser.add_argument(
        "--poll", type=float, default=2.0, help="kinetic poll_interval (default: kinetic's 2 s)"
    )
    parser.add_argument("--modes", nargs="+", default=["unguarded", "guarded"])
    parser.add_argument(
        "--exit-report-delay",
        type=float,
        default=0.0,
        help="the emulator reports a container's exit this much later, as a real node and Job "
        "controller do (a second or two); default 0",
    )
    parser.add_argument(
        "--transports",
        nargs="+",
        default=["handwritten"],
        choices=["handwritten", "kubernetes"],
        help="how the GKE backend builds its Kubernetes connection (see above); several: compared",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="with several transports: alternate them this many times"
    )
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    if len(args.transports) > 1:
        compare_transports(args)
        return
    table = {mode: run_mode(mode, args, args.transports[0]) for mode in args.modes}
    print()
    print("failed task instances (executor-event race lines in the scheduler log), out of N")
    header = "backend  job length  " + "  ".join(f"{m:>18}" for m in args.modes) + "     N"
    print(header)
    for backend in args.backends:
        for seconds in args.lengths:
            cells = [table[m][(backend, seconds)] for m in args.modes]
            shown = "  ".join(f"{c['failed']:>10} ({c['races']:>3})    " for c in cells)
            print(f"{backend:7}  {seconds:>8}s  {shown}  {cells[0]['total']:>4}")
    print()
    print("task-duration overhead above the job's sleep, seconds: median / worst")
    print("backend  job length  " + "  ".join(f"{m:>18}" for m in args.modes))
    for backend in args.backends:
        for seconds in args.lengths:
            cells = [table[m][(backend, seconds)] for m in args.modes]
            shown = "  ".join(f"{c['overhead_median_s']!s:>8} / {c['overhead_max_s']!s:<7}" for c in cells)
            print(f"{backend:7}  {seconds:>8}s  {shown}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({m: {f"{b}/{s}": v for (b, s), v in r.items()} for m, r in table.items()}, indent=2)
        )


def compare_transports(args: argparse.Namespace) -> None:
    """Each mode with every transport, in alternating rounds; overhead medians and their ratios."""
    overheads: dict[tuple[str, str, str, float], list[float]] = {}
    failed: dict[tuple[str, str], int] = {}
    for round_no in range(args.rounds):
        for transport in args.transports:
            for mode in args.modes:
                print(f"round {round_no + 1}/{args.rounds}: {mode} with {transport}", flush=True)
                for (backend, seconds), cell in run_mode(mode, args, transport).items():
                    overheads.setdefault((mode, transport, backend, seconds), []).append(
                        cell["overhead_median_s"]
                    )
                    failed[(mode, transport)] = failed.get((mode, transport), 0) + cell["failed"]
    print()
    print("task-duration overhead above the job's sleep, seconds: median of the rounds' medians")
    first = args.transports[0]
    print("mode       backend  job length  " + "  ".join(f"{t:>24}" for t in args.transports))
    for mode in args.modes:
        for backend in args.backends:
            for seconds in args.lengths:
                base = statistics.median(overheads[(mode, first, backend, seconds)])
                shown = []
                for transport in args.transports:
                    value = statistics.median(overheads[(mode, transport, backend, seconds)])
                    shown.append(f"{value:8.2f} ({value - base:+.2f}, x{value / base:.2f})")
                print(f"{mode:9}  {backend:7}  {seconds:>8}s  " + "  ".join(f"{c:>24}" for c in shown))
    print("per round:", {f"{m}/{t}/{b}/{s}": v for (m, t, b, s), v in overheads.items()})
    print("failed task instances:", {f"{m}/{t}": n for (m, t), n in failed.items()})
    if args.json:
        Path(args.json).write_text(
            json.dumps({f"{m}/{t}/{b}/{s}": v for (m, t, b, s), v in overheads.items()}, indent=2)
        )


if __name__ == "__main__":
    main()
