"""What kinetic_airflow.report() costs a job: 10,000 points a second vs the same job silent.

Both jobs run the real runner (``python -m kinetic_airflow.runner``, as a job's process runs
it) on file:// job storage, at the same time (two processes, side by side), so whatever else
loads the machine hits both alike; ``--rounds`` repeats the pair. The function does fixed
units of CPU work for ``--seconds`` and counts them (its own speed); the reporting job also
calls ``report(step=..., loss=..., lr=...)`` paced at ``--rate`` points a second (the silent
one does the same pacing arithmetic, without the call). Printed: units per second of each,
their ratio (reporting / silent), the points reported and the storage writes the metrics made
(chunk objects; at most one per ``--interval`` plus the final flush).

    .venv/bin/python bench/metrics_bench.py --seconds 60 --rounds 2
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import cloudpickle  # noqa: E402
from jobkit import make_job, run_runner  # noqa: E402

from kinetic_airflow.job.storage import open_storage  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def workload(seconds: float, rate: float, reporting: bool) -> dict:
    import time

    import kinetic_airflow

    report = kinetic_airflow.report
    start, cpu = time.perf_counter(), time.process_time()
    units = points = 0
    acc = 0.0
    while True:
        now = time.perf_counter()
        elapsed = now - start
        if elapsed >= seconds:
            break
        for i in range(200):  # one unit of the function's own work (~10-20 us)
            acc += (i * 0.5) ** 0.5
        units += 1
        due = int(elapsed * rate)
        while points < due:
            points += 1
            if reporting:
                report(step=points, loss=1.0 / points, lr=0.001)
    return {
        "units": units,
        "seconds": time.perf_counter() - start,
        "cpu": time.process_time() - cpu,  # every thread of the job: the metrics writer's too
        "points": points if reporting else 0,
    }


def run_one(root: Path, name: str, seconds: float, rate: float, reporting: bool, interval: float) -> dict:
    base = f"file://{root}"
    layout = make_job(
        base,
        workload,
        (seconds, rate, reporting),
        job_id=name,
        manifest_overrides={"metrics_interval": interval, "heartbeat_seconds": 30},
    )
    proc, summary = run_runner(layout, timeout=seconds * 3 + 120)
    if proc.returncode != 0 or not summary or not summary.get("ok"):
        raise SystemExit(f"job {name} failed:\n{proc.stderr}")
    storage = open_storage(base)
    value = storage.read_text(layout.result_summary())
    repr_text = json.loads(value)["value_repr"]
    result = ast.literal_eval(repr_text)  # the dict of numbers the function returned
    result["writes"] = len(storage.list(layout.metrics_prefix))
    result["speed"] = result["units"] / result["seconds"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each job's function")
    parser.add_argument("--rate", type=float, default=10_000.0, help="points a second")
    parser.add_argument("--interval", type=float, default=5.0, help="[kinetic] metrics_interval")
    parser.add_argument("--rounds", type=int, default=1, help="silent+reporting pairs")
    args = parser.parse_args()
    silent, loud = [], []
    with tempfile.TemporaryDirectory(prefix="kinetic-metrics-bench-") as tmp:
        for r in range(args.rounds):
            with ThreadPoolExecutor(2) as pool:  # each thread waits on its job's process
                quiet = pool.submit(
                    run_one, Path(tmp), f"silent-{r}", args.seconds, args.rate, False, args.interval
                )
                busy = pool.submit(
                    run_one, Path(tmp), f"reporting-{r}", args.seconds, args.rate, True, args.interval
                )
                silent.append(quiet.result())
                loud.append(busy.result())
    s = statistics.median(x["speed"] for x in silent)
    v = statistics.median(x["speed"] for x in loud)
    bound = math.ceil(args.seconds / args.interval) + 1
    print(f"function: {args.seconds:g} s of work units; reporting at {args.rate:g} points/s; "
          f"metrics_interval {args.interval:g} s; {args.rounds} round(s)")  # fmt: skip
    # cpu share: the job's CPU seconds per second; well under 1.0 means a loaded machine starved it
    print(f"{'job':<12} {'units/s':>10} {'cpu share':>10} {'units/cpu-s':>12} {'points':>8} {'writes':>7}")
    for name, runs in (("silent", silent), ("reporting", loud)):
        for x in runs:
            share, per_cpu = x["cpu"] / x["seconds"], x["units"] / x["cpu"]
            row = f"{name:<12} {x['speed']:>10.0f} {share:>10.2f} {per_cpu:>12.0f}"
            print(f"{row} {x['points']:>8} {x['writes']:>7}")
    print(f"speed ratio reporting/silent (medians): {v / s:.4f}  ({(v / s - 1) * 100:+.2f}%)")
    c = statistics.median(x["units"] / x["cpu"] for x in loud) / statistics.median(
        x["units"] / x["cpu"] for x in silent
    )
    print(f"per CPU second (the writer thread's CPU counted): {c:.4f}  ({(c - 1) * 100:+.2f}%)")
    print(f"metrics writes per reporting job: {[x['writes'] for x in loud]} "
          f"(bound: one per interval + the final flush = {bound})")  # fmt: skip


if __name__ == "__main__":
    main()
