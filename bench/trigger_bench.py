"""Watching many running jobs: kinetic-airflow's trigger vs cncf-kubernetes' KubernetesJobTrigger.

Everything a watched job costs is counted, on real stand-ins started here:

* Kubernetes API requests, from the request log of the cluster emulator (a separate process);
* storage requests, from the access log of fake-gcs-server: kinetic's job files live on
  ``gs://`` as in production (the peer has none);
* the triggerer's CPU seconds, its threads and its peak RSS (each side runs in a fresh
  process holding N triggers in one event loop, as Airflow's triggerer does).

The Jobs are real pods (processes) printing a line every 5 s; kinetic's triggers are built
as the operator builds them (heartbeat checks on, log streaming on) and the runner's
heartbeat object is refreshed every 30 s as a runner would (those writes are the job's,
reported apart). Runs: kinetic at its default poll interval (2 s), the peer at the same
interval, and the peer at its own default (10 s). The peer's effective poll rate is
printed, so a peer that cannot keep up with its interval on this machine is visible.

    .venv/bin/python bench/trigger_bench.py --jobs 20 200 500 --window 300

Memory over a long run (issue 18: a followed pod must not keep every line it printed):

    .venv/bin/python bench/trigger_bench.py --jobs 200 --sides kinetic --window 1800 \
        --line-every 1 --rss-every 60

prints the triggerer's RSS once a minute; flat means the log streams hold only the lines
not yet shown.

Silent pods (``--line-every 0``) print nothing: kinetic's triggers then read the runners'
heartbeats instead of log cursors.

N = 20 is there so the peer is measured where it keeps up with its interval on 2 cores.

Targets (README): <= 2 storage requests per job per minute for kinetic in steady state;
>= 10x fewer requests (API + storage) than KubernetesJobTrigger at equal intervals,
start-up included; CPU <= 1/5; threads independent of N.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

CONN_ID = "kinetic_bench"
BUCKET = "kn-bench"
LINE_EVERY_SECONDS = 5
HEARTBEAT_EVERY_SECONDS = 30.0


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _access_lines(path: str) -> int:
    with open(path, "rb") as fh:
        return sum(1 for line in fh if b'HTTP/1.1\\" ' in line)


# The triggerer side (a child process) --------------------------------------------------------------
def _rss_mib() -> float:
    """This process's resident memory now (ru_maxrss is only the peak)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def _run_triggers(
    triggers: list[Any], warmup: float, window: float, counters: Any, rss_every: float = 0.0
) -> dict:
    async def consume(trigger: Any) -> None:
        async for _ in trigger.run():
            return

    def mark() -> dict[str, float]:
        return {"time": time.monotonic(), "cpu": _cpu_seconds(), **counters()}

    start = mark()
    tasks = [asyncio.create_task(consume(t)) for t in triggers]
    await asyncio.sleep(warmup)
    steady = mark()
    rss_series: list[tuple[float, float]] = []
    if rss_every > 0:
        left = window
        while left > 0:
            rss_series.append((round(time.monotonic() - steady["time"]), round(_rss_mib(), 1)))
            await asyncio.sleep(min(rss_every, left))
            left -= rss_every
        rss_series.append((round(time.monotonic() - steady["time"]), round(_rss_mib(), 1)))
    else:
        await asyncio.sleep(window)
    end = mark()
    threads = threading.active_count()
    finished = sum(t.done() for t in tasks)
    for t in tasks:
        t.cancel()
    # Bounded: a trigger that runs on after its cancellation (a swallowed CancelledError) is
    # counted and cancelled again, not waited for for ever.
    _, pending = await asyncio.wait(tasks, timeout=30)
    ran_on = len(pending)
    for _ in range(10):
        if not pending:
            break
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=5)
    if pending:
        raise SystemExit(f"{len(pending)} of {len(tasks)} triggers ignore cancellation")
    return {
        "ran_on_after_cancel": ran_on,
        "start": start,
        "steady": steady,
        "end": end,
        "threads": threads,
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_series": rss_series,
        "finished_early": finished,
    }


def triggerer(
    mode: str,
    refs: list[dict],
    poll: float,
    warmup: float,
    window: float,
    access_log: str,
    rss_every: float = 0.0,
) -> dict:
    import logging

    from cluster_emulator import EmulatorAdminClient

    logging.disable(logging.CRITICAL)  # both sides equally: measure watching, not log formatting
    admin = EmulatorAdminClient(os.environ["BENCH_EMULATOR_URL"])

    def counters() -> dict[str, int]:
        return {"api": int(admin.requests(since=2**62)["count"]), "storage": _access_lines(access_log)}

    if mode == "kinetic":
        from kinetic_airflow.triggers import KineticJobTrigger

        triggers = [KineticJobTrigger(job=ref, poll_interval=poll) for ref in refs]
    else:
        from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger

        triggers = [
            KubernetesJobTrigger(
                job_name=f"kinetic-{ref['job_id']}",
                job_namespace="default",
                pod_names=[],
                pod_namespace="default",
                base_container_name="kinetic-worker",
                kubernetes_conn_id=CONN_ID,
                poll_interval=poll,
                get_logs=True,  # the trigger itself never streams logs; the operator reads them after
            )
            for ref in refs
        ]
    return asyncio.run(_run_triggers(triggers, warmup, window, counters, rss_every))


# The parent: stand-ins, jobs, runs, table ------------------------------------------------------------
def _job_refs(count: int, env: dict[str, str]) -> list[dict]:
    """Job references exactly as KineticRunOperator makes them (defaults for heartbeat etc.)."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        from kinetic_airflow.job.layout import JobIdentity
        from kinetic_airflow.operators import KineticRunOperator

        op = KineticRunOperator(task_id="watched", python_callable=time.sleep, op_args=[1], backend="gke")
        refs = []
        for i in range(count):
            identity = JobIdentity("bench", f"run-{time.time_ns()}", f"watched-{i}")
            ref = op._job_ref(identity, "gke", env["KINETIC_BASE_URI"])
            refs.append(ref.replace(submitted_at=time.time()).to_dict())  # JobRef is frozen; kwargs' form
        return refs
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _create_jobs(emulator: Any, refs: list[dict], line_every: float = LINE_EVERY_SECONDS) -> None:
    import kubernetes

    batch = kubernetes.client.BatchV1Api(emulator.api_client())
    core = kubernetes.client.CoreV1Api(emulator.api_client())
    script = f"while true; do echo tick $(date +%s); sleep {line_every:g}; done"
    if line_every <= 0:  # a silent job: it prints nothing for the whole run
        script = "while true; do sleep 3600; done"
    for ref in refs:
        from kinetic_airflow.job.layout import JobIdentity

        labels = JobIdentity.from_dict(ref["identity"]).labels()
        batch.create_namespaced_job(
            "default",
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": f"kinetic-{ref['job_id']}", "labels": labels},
                "spec": {
                    "backoffLimit": 0,
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "kinetic-worker",
                                    "image": "busybox",
                                    "command": ["sh", "-c", script],
                                }
                            ],
                        },
                    },
                },
            },
        )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod("default", label_selector="app=kinetic").items
        if sum(p.status.phase == "Running" for p in pods) >= len(refs):
            return
        time.sleep(1)
    raise SystemExit("the bench Jobs did not all start")


def _delete_jobs(emulator: Any) -> None:
    import kubernetes

    batch = kubernetes.client.BatchV1Api(emulator.api_client())
    batch.delete_collection_namespaced_job(
        "default", label_selector="app=kinetic", propagation_policy="Background"
    )


class _Heartbeats(threading.Thread):
    """What each job's runner does meanwhile: rewrite its heartbeat object every 30 s."""

    def __init__(self, refs: list[dict]) -> None:
        super().__init__(daemon=True)
        from kinetic_airflow.job.storage import open_storage

        self.refs, self.stop = refs, threading.Event()
        self.storage = open_storage(refs[0]["job_uri"])  # one client, as one runner would have
        self.times: list[float] = []  # time.monotonic() of each write (one clock for all processes)

    def writes_between(self, start: float, end: float) -> int:
        return sum(start <= t <= end for t in self.times)

    def beat(self) -> None:
        from kinetic_airflow.job.layout import JobLayout

        for ref in self.refs:
            uri = JobLayout(ref["job_uri"]).status("heartbeat")
            self.storage.write_text(uri, json.dumps({"time": time.time()}))
            self.times.append(time.monotonic())

    def run(self) -> None:
        while not self.stop.wait(HEARTBEAT_EVERY_SECONDS):
            self.beat()


def _per_job_minute(result: dict, phase: str, jobs: int, job_side_writes: float) -> dict[str, float]:
    a, b = result["start" if phase == "total" else "steady"], result["end"]
    minutes = (b["time"] - a["time"]) / 60
    storage = b["storage"] - a["storage"] - job_side_writes
    return {
        "api": (b["api"] - a["api"]) / jobs / minutes,
        "storage": storage / jobs / minutes,
        "all": (b["api"] - a["api"] + storage) / jobs / minutes,
        "cpu_s_per_min": (b["cpu"] - a["cpu"]) / minutes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, nargs="+", default=[20, 200, 500])
    parser.add_argument("--window", type=float, default=300.0, help="seconds measured after the warm-up")
    parser.add_argument("--warmup", type=float, default=30.0)
    parser.add_argument("--kinetic-poll", type=float, default=2.0)
    parser.add_argument("--peer-polls", type=float, nargs="+", default=[2.0, 10.0])
    parser.add_argument("--child", default=None)
    parser.add_argument("--poll", type=float, default=2.0)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--sides", nargs="+", default=["kinetic", "cncf"], choices=["kinetic", "cncf"])
    parser.add_argument(
        "--line-every", type=float, default=LINE_EVERY_SECONDS, help="seconds a line (0: silent pods)"
    )
    parser.add_argument("--rss-every", type=float, default=0.0, help="sample the triggerer's RSS this often")
    args = parser.parse_args()
    if args.child:
        refs = json.loads(Path(os.environ["BENCH_REFS"]).read_text())
        result = triggerer(
            args.child,
            refs,
            args.poll,
            args.warmup,
            args.window,
            os.environ["BENCH_ACCESS_LOG"],
            args.rss_every,
        )
        print(json.dumps(result))
        return

    from components.emulator_process import EmulatorProcess

    from kinetic_airflow.testing.gcs import FakeGCS

    work = Path(tempfile.mkdtemp(prefix="kinetic-trigger-bench-"))
    access_log = work / "gcs-access.log"
    table: list[dict] = []
    with (
        FakeGCS(access_log=access_log) as gcs,
        EmulatorProcess(work / "emulator", env=gcs.environ()) as emulator,
    ):
        env = {
            **os.environ,
            **gcs.environ(),
            **emulator.airflow_env(conn_id=CONN_ID),
            "AIRFLOW_HOME": str(work / "airflow"),
            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
            "KINETIC_BASE_URI": f"gs://{BUCKET}/kinetic",
            "KINETIC_LOCAL_STATE_DIR": str(work / "local"),
            "BENCH_EMULATOR_URL": emulator.url,
            "BENCH_ACCESS_LOG": str(access_log),
        }
        os.environ.update(gcs.environ())
        gcs.create_bucket(BUCKET)
        runs = [("kinetic", args.kinetic_poll)] if "kinetic" in args.sides else []
        runs += [("cncf", p) for p in args.peer_polls] if "cncf" in args.sides else []
        for count in args.jobs:
            refs = _job_refs(count, env)
            (work / "refs.json").write_text(json.dumps(refs))
            _create_jobs(emulator, refs, args.line_every)
            beats = _Heartbeats(refs)
            beats.beat()
            beats.start()
            try:
                for mode, poll in runs:
                    out = subprocess.run(
                        [sys.executable, __file__, "--child", mode, "--poll", str(poll),
                         "--warmup", str(args.warmup), "--window", str(args.window),
                         "--rss-every", str(args.rss_every)],
                        env={**env, "BENCH_REFS": str(work / "refs.json")}, capture_output=True, text=True,
                    )  # fmt: skip
                    if out.returncode != 0:
                        raise SystemExit(f"{mode} triggerer failed:\n{out.stderr[-3000:]}")
                    result = json.loads(out.stdout.strip().splitlines()[-1])
                    start, steady, end = (result[k]["time"] for k in ("start", "steady", "end"))
                    # The runner's writes, not the trigger's: left out of the trigger's figures.
                    job_writes = beats.writes_between(start, end)
                    steady_writes = beats.writes_between(steady, end)
                    row = {
                        "jobs": count,
                        "side": mode,
                        "poll": poll,
                        "steady": _per_job_minute(result, "steady", count, steady_writes),
                        "total": _per_job_minute(result, "total", count, job_writes),
                        "threads": result["threads"],
                        "rss_mib": round(result["rss_mib"]),
                        "rss_series": result["rss_series"],
                        "finished_early": result["finished_early"],
                        "ran_on_after_cancel": result["ran_on_after_cancel"],
                        "job_side_storage_per_job_min": job_writes / count / ((end - start) / 60),
                    }
                    table.append(row)
                    print(json.dumps(row), flush=True)
            finally:
                beats.stop.set()
                _delete_jobs(emulator)
    _print_table(table, args)
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=2))


def _print_table(table: list[dict], args: argparse.Namespace) -> None:
    for row in table:
        if row["rss_series"]:
            series = ", ".join(f"{t}s {mib:.0f}" for t, mib in row["rss_series"])
            print(f"N={row['jobs']} {row['side']}: triggerer RSS MiB over the window: {series}")
    print()
    print(
        f"per job per minute, window {args.window:.0f}s after a {args.warmup:.0f}s warm-up; "
        "'all' = API + storage requests; CPU in triggerer-seconds per minute"
    )
    print(
        f"{'N':>4} {'side':8} {'poll':>5} | {'steady: API':>11} {'storage':>8} {'all':>7} | "
        f"{'with start-up: all':>18} | {'CPU s/min':>9} {'threads':>7} {'RSS MiB':>7} | {'nominal polls':>13}"
    )
    for row in table:
        s, t = row["steady"], row["total"]
        nominal = 60 / row["poll"]
        print(
            f"{row['jobs']:>4} {row['side']:8} {row['poll']:>5.0f} | {s['api']:>11.2f} {s['storage']:>8.2f} "
            f"{s['all']:>7.2f} | {t['all']:>18.2f} | {s['cpu_s_per_min']:>9.2f} {row['threads']:>7} "
            f"{row['rss_mib']:>7} | {nominal:>13.0f}"
        )
    print()
    for count in sorted({r["jobs"] for r in table}):
        rows = {(r["side"], r["poll"]): r for r in table if r["jobs"] == count}
        ours = rows.get(("kinetic", args.kinetic_poll))
        if not ours:
            continue
        for (side, poll), peer in sorted(rows.items()):
            if side != "cncf":
                continue
            ratio = peer["total"]["all"] / max(ours["total"]["all"], 1e-9)
            cpu = ours["steady"]["cpu_s_per_min"] / max(peer["steady"]["cpu_s_per_min"], 1e-9)
            kept_up = peer["steady"]["api"] / (60 / poll)
            print(
                f"N={count}: vs the peer at {poll:.0f}s ("
                + ("equal intervals" if poll == args.kinetic_poll else "its default")
                + f"; it made {kept_up:.0%} of its nominal polls): kinetic makes {ratio:.1f}x fewer "
                f"requests (API + storage, start-up included; target >= 10x at equal intervals) and "
                f"uses {cpu:.2f} of its CPU (target <= 0.2)"
            )
        print(
            f"N={count}: kinetic storage requests per job per minute in steady state "
            f"{ours['steady']['storage']:.2f} (target <= 2); threads {ours['threads']}; the runner's "
            f"own heartbeat writes add {ours['job_side_storage_per_job_min']:.2f}; triggers that ran on "
            f"after being cancelled: {ours.get('ran_on_after_cancel', 0)} (target 0)"
        )


if __name__ == "__main__":
    main()
