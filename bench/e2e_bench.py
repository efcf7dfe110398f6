"""A trivial function end to end: @task.kinetic vs @task.kubernetes vs KubernetesPodOperator.

All three run against the same cluster emulator (a separate process that runs each pod as a
local process), each sample in a fresh Python process running ``dag.test()`` with
kinetic-airflow's and Airflow's default settings. Reported per side: task duration (the task
instance's start to end, as Airflow records it), median and spread over the samples; for
kinetic also job end -> task end (the runner's ``finished`` marker to the task's end).

    .venv/bin/python bench/e2e_bench.py --samples 10

The peer tasks run with ``do_xcom_push=False``: pushing XCom from a pod needs ``exec`` into
its sidecar, which the emulator does not serve; kinetic's task returns its value as XCom.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

CONN_ID = "kinetic_e2e"

DAGS = f'''
import pendulum
from airflow.sdk import dag, task
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

START = pendulum.datetime(2026, 1, 1, tz="UTC")


@task.kinetic(backend="gke")
def trivial_kinetic():
    return 42


@task.kubernetes(image="python:3.11-slim", namespace="default", kubernetes_conn_id="{CONN_ID}",
                 do_xcom_push=False, get_logs=True, in_cluster=False)
def trivial_task_kubernetes():
    return 42


@dag(dag_id="e2e_kinetic", schedule=None, start_date=START, catchup=False)
def e2e_kinetic():
    trivial_kinetic()


@dag(dag_id="e2e_task_kubernetes", schedule=None, start_date=START, catchup=False)
def e2e_task_kubernetes():
    trivial_task_kubernetes()


@dag(dag_id="e2e_kpo", schedule=None, start_date=START, catchup=False)
def e2e_kpo():
    KubernetesPodOperator(task_id="trivial_kpo", name="trivial-kpo", namespace="default",
                          image="python:3.11-slim", cmds=["python", "-c", "print(42)"],
                          kubernetes_conn_id="{CONN_ID}", in_cluster=False, get_logs=True,
                          do_xcom_push=False)


e2e_kinetic()
e2e_task_kubernetes()
e2e_kpo()
'''

SAMPLE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import e2e_dags
from airflow.models.taskinstance import TaskInstance
from airflow.utils.session import create_session
from sqlalchemy import select

dag = getattr(e2e_dags, sys.argv[2])()
run = dag.test()
with create_session() as session:
    (ti,) = session.scalars(
        select(TaskInstance).where(TaskInstance.dag_id == run.dag_id, TaskInstance.run_id == run.run_id)
    ).all()
    print(json.dumps({"state": str(ti.state), "start": ti.start_date.timestamp(),
                      "end": ti.end_date.timestamp(), "run_id": run.run_id}))
"""


def _finished_marker(base: Path, run_id: str) -> float | None:
    for marker in base.glob("jobs/*/status/finished.json"):
        manifest = json.loads((marker.parent.parent / "manifest.json").read_text())
        if manifest.get("identity", {}).get("run_id") == run_id:
            return float(json.loads(marker.read_text())["time"])
    return None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--json", help="also write the samples here")
    parser.add_argument("--sides", nargs="+", default=["e2e_kinetic", "e2e_task_kubernetes", "e2e_kpo"])
    parser.add_argument("--logs", help="keep each sample's output in this folder")
    args = parser.parse_args()

    from components.emulator_process import EmulatorProcess

    work = Path(tempfile.mkdtemp(prefix="kinetic-e2e-bench-"))
    dags = work / "dags"
    dags.mkdir()
    (dags / "e2e_dags.py").write_text(DAGS)
    venv_bin = str(Path(sys.executable).parent)
    pod_env = {"PATH": os.pathsep.join([venv_bin, os.environ.get("PATH", "/usr/bin:/bin")])}
    results: dict[str, list[dict]] = {}
    with EmulatorProcess(work / "emulator", env=pod_env) as emulator:
        env = {
            **os.environ,
            **emulator.airflow_env(conn_id=CONN_ID),
            "AIRFLOW_HOME": str(work / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "KINETIC_BASE_URI": f"file://{work}/kinetic",
            "KINETIC_LOCAL_STATE_DIR": str(work / "local"),
        }
        subprocess.run([f"{venv_bin}/airflow", "db", "migrate"], env=env, check=True, capture_output=True)
        for side in args.sides:
            results[side] = []
            for number in range(args.samples):
                out = subprocess.run(
                    [sys.executable, "-c", SAMPLE, str(dags), side], env=env, capture_output=True, text=True
                )
                if args.logs:
                    Path(args.logs).mkdir(parents=True, exist_ok=True)
                    Path(args.logs, f"{side}-{number}.log").write_text(out.stdout + out.stderr)
                if out.returncode != 0:
                    raise SystemExit(f"{side} failed:\n{out.stderr[-3000:]}")
                sample = json.loads(out.stdout.strip().splitlines()[-1])
                if "success" not in sample["state"]:
                    raise SystemExit(f"{side} ended {sample['state']}:\n{out.stdout[-3000:]}")
                if side == "e2e_kinetic":
                    finished = _finished_marker(work / "kinetic", sample["run_id"])
                    sample["job_end_to_task_end"] = sample["end"] - finished if finished else None
                results[side].append(sample)
                print(side, json.dumps(sample), flush=True)

    print()
    print(f"task start -> task end of a trivial function, {args.samples} samples each (fresh process each)")
    medians = {}
    for side, samples in results.items():
        durations = [s["end"] - s["start"] for s in samples]
        medians[side] = statistics.median(durations)
        print(
            f"  {side:20s} median {medians[side]:6.2f}s   "
            f"min {min(durations):6.2f}s   max {max(durations):6.2f}s"
        )
    lags = [
        s["job_end_to_task_end"] for s in results["e2e_kinetic"] if s.get("job_end_to_task_end") is not None
    ]
    if lags:
        print(f"  kinetic job end -> task end: median {statistics.median(lags):.3f}s, max {max(lags):.3f}s")
    if {"e2e_kinetic", "e2e_task_kubernetes"} <= set(medians):
        ratio = medians["e2e_kinetic"] / medians["e2e_task_kubernetes"]
        print(f"  kinetic / @task.kubernetes: {ratio:.2f} (target <= 1.5)")
    if {"e2e_kinetic", "e2e_kpo"} <= set(medians):
        print(f"  kinetic / KubernetesPodOperator: {medians['e2e_kinetic'] / medians['e2e_kpo']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
