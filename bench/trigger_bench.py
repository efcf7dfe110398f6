"""Watching many deferred jobs: kinetic-airflow's trigger vs cncf-kubernetes' KubernetesJobTrigger.

In one run, against one local cluster emulator (a separate process, so its CPU
is not counted):

1. N running Jobs (default 200) are created.
2. A "triggerer" subprocess runs N KineticJobTrigger instances in one event loop
   for a fixed window; another runs N KubernetesJobTrigger instances for the same
   Jobs and window, with the same poll interval. For each we count the API
   requests the emulator received and the CPU seconds the triggerer process used.
3. Submit latency (operator execute start -> Job created) of KineticRunOperator vs
   KubernetesJobOperator against the same emulator.

    python bench/trigger_bench.py [--jobs 200] [--window 60] [--poll 5]

Targets: >= 10x fewer requests, <= 1/5 the CPU, submit latency <= 0.5x.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CONN_ID = "kinetic_bench"


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _request_count(url: str) -> int:
    with urllib.request.urlopen(f"{url}/_emulator/requests?since=999999999", timeout=10) as resp:
        return int(json.load(resp)["count"])


def _job_ref(name: str, base_uri: str) -> dict[str, Any]:
    job_id = name[len("kinetic-") :]
    return {
        "backend": "gke",
        "job_id": job_id,
        "job_uri": f"{base_uri}/jobs/{job_id}",
        "base_uri": base_uri,
        "identity": {"dag_id": "bench", "run_id": "r", "task_id": job_id, "map_index": -1},
        "cluster": {"kubernetes_conn_id": CONN_ID},
        "namespace": "default",
        "accelerator": "cpu",
        "node_selectors": {},
        "startup_timeout": 3600.0,
        "heartbeat_timeout": None,
    }


async def _run_triggers(triggers: list[Any], warmup: float, window: float, url: str) -> dict:
    """Counters at start, after the warm-up (clients built, watches/streams open) and at the end."""

    async def consume(trigger: Any) -> None:
        async for _ in trigger.run():
            return

    marks = [(time.monotonic(), _cpu_seconds(), _request_count(url))]
    tasks = [asyncio.create_task(consume(t)) for t in triggers]
    await asyncio.sleep(warmup)
    marks.append((time.monotonic(), _cpu_seconds(), _request_count(url)))
    await asyncio.sleep(window)
    marks.append((time.monotonic(), _cpu_seconds(), _request_count(url)))
    finished = sum(t.done() for t in tasks)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    (t0, c0, r0), (t1, c1, r1), (t2, c2, r2) = marks
    return {
        "steady": {"elapsed": t2 - t1, "cpu_seconds": c2 - c1, "requests": r2 - r1},
        "total": {"elapsed": t2 - t0, "cpu_seconds": c2 - c0, "requests": r2 - r0},
        "finished_early": finished,
    }


def triggerer(mode: str, names: list[str], url: str, window: float, poll: float, base_uri: str) -> dict:
    """One triggerer process: N triggers of one kind in one event loop for ``window`` seconds."""
    import logging

    logging.disable(logging.CRITICAL)  # both sides equally: measure watching, not log formatting
    if mode == "kinetic":
        from kinetic_airflow.triggers import KineticJobTrigger

        triggers = [KineticJobTrigger(job=_job_ref(n, base_uri), poll_interval=poll) for n in names]
    else:
        from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger

        triggers = [
            KubernetesJobTrigger(
                job_name=n,
                job_namespace="default",
                pod_names=[],
                pod_namespace="default",
                base_container_name="base",
                kubernetes_conn_id=CONN_ID,
                poll_interval=poll,
                get_logs=False,
            )
            for n in names
        ]
    return asyncio.run(_run_triggers(triggers, max(10.0, 3 * poll), window, url))


def _context(task_id: str) -> dict[str, Any]:
    class _Store(dict):
        def set(self, key: str, value: Any, **_: Any) -> None:
            self[key] = value

    class _TI:
        dag_id, run_id, map_index, try_number = "bench", f"run-{time.time_ns()}", -1, 1

        def __init__(self) -> None:
            self.task_id = task_id

        def xcom_push(self, *args: Any, **kwargs: Any) -> None:
            pass

    return {"ti": _TI(), "task_state_store": _Store(), "dag": None, "run_id": _TI.run_id}


def _post_times(url: str, since: int) -> list[float]:
    with urllib.request.urlopen(f"{url}/_emulator/requests?since={since}", timeout=10) as resp:
        records = json.load(resp)["requests"]
    return [r["time"] for r in records if r["method"] == "POST" and r["path"].endswith("/jobs")]


def submit_latency(kind: str, samples: int, url: str) -> list[float]:
    """Seconds from execute() start until the Job-creating POST reaches the API server.

    The arrival time comes from the emulator's request log, so the emulator's own work
    (schema validation, storing) is left out for both operators alike.
    """
    from airflow.sdk.exceptions import TaskDeferred

    times = []
    for i in range(samples):
        context = _context(f"submit-{kind}-{i}")
        if kind == "kinetic":
            from kinetic_airflow.operators import KineticRunOperator

            op = KineticRunOperator(
                task_id=f"submit-{i}", python_callable=time.sleep, op_args=[1], backend="gke"
            )
        else:
            from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator

            op = KubernetesJobOperator(
                task_id=f"submit-{i}",
                name=f"kjo-submit-{i}-{time.time_ns() % 10**8}",
                namespace="default",
                image="python:3.11-slim",
                cmds=["sleep", "1"],
                kubernetes_conn_id=CONN_ID,
                wait_until_job_complete=False,
                deferrable=False,
                random_name_suffix=False,
                get_logs=False,
                do_xcom_push=False,
            )
        since = _request_count(url)
        start = time.time()
        try:
            op.execute(context)
        except TaskDeferred:
            pass  # ours defers right after creating the Job
        (posted,) = _post_times(url, since)
        times.append(posted - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--poll", type=float, default=5.0)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--child", default=None)
    parser.add_argument("--url", default="")
    parser.add_argument("--base-uri", default="")
    args = parser.parse_args()
    if args.child:
        names = json.loads(os.environ["BENCH_JOB_NAMES"])
        print(json.dumps(triggerer(args.child, names, args.url, args.window, args.poll, args.base_uri)))
        return
    if args.child is None and os.environ.get("BENCH_SUBMIT"):
        print(json.dumps(submit_latency(os.environ["BENCH_SUBMIT"], args.samples, args.url)))
        return

    work = Path(tempfile.mkdtemp(prefix="kinetic-bench-"))
    kubeconfig = work / "kubeconfig"
    emulator = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kinetic_airflow.testing.cluster",
            "--port",
            "0",
            "--kubeconfig",
            str(kubeconfig),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        line = emulator.stdout.readline()
        assert line.startswith("READY"), line
        url = line.split()[1]
        conn = {
            "conn_type": "kubernetes",
            "extra": {"kube_config_path": str(kubeconfig), "namespace": "default"},
        }
        env = {
            **os.environ,
            f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(conn),
            "AIRFLOW_HOME": str(work / "airflow"),
            "PYTHONPATH": str(REPO),
            "KINETIC_BASE_URI": f"file://{work}/kinetic",
            "KINETIC_KUBERNETES_CONN_ID": CONN_ID,
            "KINETIC_RUNNER_PYTHON": sys.executable,
        }
        names = _create_jobs(kubeconfig, args.jobs)
        env["BENCH_JOB_NAMES"] = json.dumps(names)
        results = {}
        for mode in ("kinetic", "cncf"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", mode, "--url", url, "--window", str(args.window),
                 "--poll", str(args.poll), "--base-uri", f"file://{work}/kinetic"],
                env=env, capture_output=True, text=True,
            )  # fmt: skip
            if out.returncode != 0:
                raise SystemExit(f"{mode} triggerer failed:\n{out.stderr[-3000:]}")
            results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        latency = {}
        for kind in ("kinetic", "cncf"):
            out = subprocess.run(
                [sys.executable, __file__, "--samples", str(args.samples), "--url", url],
                env={**env, "BENCH_SUBMIT": kind},
                capture_output=True,
                text=True,
            )
            if out.returncode != 0:
                raise SystemExit(f"{kind} submit failed:\n{out.stderr[-3000:]}")
            latency[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        emulator.terminate()
        emulator.wait(30)

    print(
        f"{args.jobs} running Jobs watched for {args.window:.0f}s, poll interval {args.poll}s (same for both)"
    )
    for phase, title in (("steady", "steady state (after warm-up)"), ("total", "including start-up")):
        per_min = {}
        print(title + ":")
        for mode, r in results.items():
            m = r[phase]
            minutes = m["elapsed"] / 60
            per_min[mode] = (m["requests"] / minutes, m["cpu_seconds"] / minutes)
            print(
                f"  {mode:8s} API requests/min {per_min[mode][0]:9.1f}   triggerer CPU s/min "
                f"{per_min[mode][1]:7.2f}   (finished early: {r['finished_early']})"
            )
        cpu_ratio = per_min["kinetic"][1] / max(per_min["cncf"][1], 1e-9)
        if per_min["kinetic"][0] == 0:
            print(
                "  requests: kinetic made none (its watches stay open); cncf polls every job (target >= 10x)"
            )
        else:
            req_ratio = per_min["cncf"][0] / per_min["kinetic"][0]
            print(f"  requests: kinetic uses {req_ratio:.1f}x fewer (target >= 10x)")
        print(f"  CPU: kinetic uses {cpu_ratio:.2f} of cncf's (target <= 0.2)")
    ours, theirs = statistics.median(latency["kinetic"]), statistics.median(latency["cncf"])
    print(
        f"submit latency (execute start -> Job POST at the API server), median of {args.samples}: "
        f"kinetic {ours * 1000:.0f} ms, "
        f"KubernetesJobOperator {theirs * 1000:.0f} ms, ratio {ours / theirs:.2f} (target <= 0.5)"
    )


def _create_jobs(kubeconfig: Path, count: int) -> list[str]:
    import kubernetes

    client = kubernetes.config.new_client_from_config(str(kubeconfig))
    batch = kubernetes.client.BatchV1Api(client)
    names = []
    for i in range(count):
        name = f"kinetic-bench-{i:04d}"
        labels = {"app": "kinetic", "job-id": name[len("kinetic-") :]}
        batch.create_namespaced_job(
            "default",
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "backoffLimit": 0,
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {"name": "kinetic-worker", "image": "busybox", "command": ["sleep", "900"]}
                            ],
                        },
                    },
                },
            },
        )
        names.append(name)
    core = kubernetes.client.CoreV1Api(client)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod("default", label_selector="app=kinetic").items
        if sum(p.status.phase == "Running" for p in pods) >= count:
            break
        time.sleep(1)
    return names


if __name__ == "__main__":
    main()
