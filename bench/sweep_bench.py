"""A big sweep under the real scheduler: N mapped kinetic tasks whose jobs sleep, all deferred.

Real Airflow (api-server, scheduler, dag-processor, triggerer, LocalExecutor) on a private
PostgreSQL, the GKE backend against the cluster emulator (every job a Job whose pod is a real
process running kinetic's runner; job files on ``file://`` so a pod imports no cloud client,
the lightest pod the emulator allows), Airflow's and kinetic's default settings except
``--parallelism``. One DAG run of ``.expand()`` over N items; reported:

* wall time from the run's creation to its end, and whether every task succeeded;
* CPU seconds of the scheduler (its own process, and the LocalExecutor workers and task
  processes below it) and of the triggerer (with its trigger-runner subprocess), the triggerer's
  peak RSS and threads as sampled every 5 s;
* the time from the last job's end (the newest result file) to the DAG run's end.

    .venv/bin/python bench/sweep_bench.py --tasks 1000 --sleep 60
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from components.airflow_services import AirflowServices, poll
from components.emulator_process import EmulatorProcess
from components.postgres import PostgresServer

DAG = """
import time
import pendulum
from airflow.sdk import dag, task


@task.kinetic(backend="gke", task_id="member")
def member(i: int) -> int:
    time.sleep({sleep})
    return i


@dag(dag_id="sweep", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
     catchup=False, max_active_tasks={tasks})
def sweep():
    member.expand(i=list(range({tasks})))


sweep()
"""


def tree_cpu(proc: psutil.Process) -> tuple[float, float]:
    """(own, descendants') CPU seconds: live descendants read now, reaped ones through the
    children_* times of whoever reaped them."""
    try:
        own = proc.cpu_times()
    except psutil.Error:
        return 0.0, 0.0
    below = own.children_user + own.children_system
    for child in proc.children(recursive=True):
        try:
            times = child.cpu_times()  # with the processes it reaped (a worker's task processes)
            below += times.user + times.system + times.children_user + times.children_system
        except psutil.Error:
            pass
    return own.user + own.system, below


class Sampler(threading.Thread):
    """Samples a process tree's CPU, RSS and threads every few seconds (the last CPU reading
    before it ends is the one that counts: reaped children's time is added at their exit)."""

    def __init__(self, proc: psutil.Process, every: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.proc, self.every = proc, every
        self.peak_rss = 0
        self.peak_threads = 0
        self.cpu = (0.0, 0.0)
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            self.sample()
            self.stopping.wait(self.every)

    def sample(self) -> None:
        try:
            rss = self.proc.memory_info().rss + sum(
                c.memory_info().rss for c in self.proc.children(recursive=True)
            )
            threads = self.proc.num_threads() + sum(
                c.num_threads() for c in self.proc.children(recursive=True)
            )
        except psutil.Error:
            return
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_threads = max(self.peak_threads, threads)
        self.cpu = tree_cpu(self.proc)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--sleep", type=float, default=60.0)
    parser.add_argument("--parallelism", type=int, default=32, help="[core] parallelism (Airflow's default)")
    parser.add_argument("--timeout", type=float, default=5400.0)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="sweep-bench-"))
    (root / "dags").mkdir()
    (root / "dags" / "sweep.py").write_text(DAG.format(sleep=args.sleep, tasks=args.tasks))
    jobs_root = root / "kinetic"
    with PostgresServer() as pg, EmulatorProcess(root / "emulator") as emulator:
        env = {**emulator.airflow_env(), "KINETIC_BASE_URI": f"file://{jobs_root}"}
        services = AirflowServices(
            root / "airflow",
            root / "dags",
            extra_env={**env, "AIRFLOW__CORE__MAX_MAP_LENGTH": str(max(1024, args.tasks))},
            parallelism=args.parallelism,
            database_url=pg.create_database("airflow"),
        )
        try:
            services.start()
            poll(
                lambda: services.api("GET", "/api/v2/dags/sweep")["dag_id"] == "sweep",
                timeout=300,
                what="parsed",
            )
            samplers = {
                name: Sampler(psutil.Process(services.procs[name].pid)) for name in ("scheduler", "triggerer")
            }
            for sampler in samplers.values():
                sampler.sample()
            start_cpu = {name: s.cpu for name, s in samplers.items()}
            for sampler in samplers.values():
                sampler.start()
            services.api("PATCH", "/api/v2/dags/sweep", {"is_paused": False})
            started = time.time()
            run_id = services.api("POST", "/api/v2/dags/sweep/dagRuns", {"logical_date": None})["dag_run_id"]
            path = f"/api/v2/dags/sweep/dagRuns/{quote(run_id, safe='')}"
            last_report = 0.0

            def finished() -> bool:
                nonlocal last_report
                run = services.api("GET", path)
                if time.time() - last_report > 60:
                    last_report = time.time()
                    tis = services.api("GET", f"{path}/taskInstances?limit=1&state=success")
                    print(f"  {time.time() - started:7.0f}s  succeeded {tis['total_entries']}", flush=True)
                return run["state"] in ("success", "failed")

            poll(finished, timeout=args.timeout, interval=5.0, what="the sweep's run")
            run = services.api("GET", path)
            wall = time.time() - started
            for sampler in samplers.values():
                sampler.stopping.set()
                sampler.join()
                sampler.sample()
            states: dict[str, int] = {}
            offset = 0
            while True:
                page = services.api("GET", f"{path}/taskInstances?limit=100&offset={offset}")[
                    "task_instances"
                ]
                for ti in page:
                    states[ti["state"]] = states.get(ti["state"], 0) + 1
                if len(page) < 100:
                    break
                offset += 100
            results = list(jobs_root.rglob("result.json"))
            last_job_end = max((p.stat().st_mtime for p in results), default=None)
            run_end = datetime.fromisoformat(run["end_date"].replace("Z", "+00:00")).timestamp()
            cpu = {
                name: {
                    "own_s": round(s.cpu[0] - start_cpu[name][0], 1),
                    "below_s": round(s.cpu[1] - start_cpu[name][1], 1),
                }
                for name, s in samplers.items()
            }
            report = {
                "tasks": args.tasks,
                "sleep_s": args.sleep,
                "parallelism": args.parallelism,
                "run_state": run["state"],
                "task_states": states,
                "wall_s": round(wall, 1),
                "cpu": cpu,
                "triggerer_peak_rss_mib": round(samplers["triggerer"].peak_rss / 2**20),
                "triggerer_peak_threads": samplers["triggerer"].peak_threads,
                "result_files": len(results),
                "last_job_end_to_run_end_s": round(run_end - last_job_end, 2) if last_job_end else None,
            }
            print(json.dumps(report, indent=2))
            if args.json:
                Path(args.json).write_text(json.dumps(report, indent=2))
        finally:
            services.stop()
            services.kill_leftovers()


if __name__ == "__main__":
    main()
