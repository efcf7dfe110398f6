"""A parameter sweep: one kinetic job per combination with ``.partial().expand()``.

Airflow owns the fan-out: each combination is a mapped task instance with its
own job, retries and log; ``max_active_tis_per_dag`` bounds how many jobs run at
once (deferred tasks count), which keeps a sweep within the cluster's quota.
"""

from __future__ import annotations

import itertools

import pendulum
from airflow.sdk import dag, task


@task
def grid() -> list[dict]:
    return [{"width": w, "depth": d} for w, d in itertools.product([8, 32], [1, 2, 3])]


@task.kinetic(accelerator="gpu-l4", max_active_tis_per_dag=4)
def score(config: dict, noise: float) -> dict:
    import math

    # Stand-in for a training run: a smooth function of the hyper-parameters.
    value = math.log(config["width"]) * config["depth"] - noise * config["depth"] ** 2
    return {**config, "score": round(value, 4)}


@task
def leaderboard(results: list[dict]) -> list[dict]:
    ranked = sorted(results, key=lambda r: r["score"], reverse=True)
    for rank, row in enumerate(ranked, 1):
        print(f"{rank}. width={row['width']} depth={row['depth']} score={row['score']}")
    return ranked


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False, tags=["kinetic"])
def kinetic_parameter_sweep():
    leaderboard(score.partial(noise=0.3).expand(config=grid()))


sweep_dag = kinetic_parameter_sweep()

if __name__ == "__main__":
    run = sweep_dag.test()
    print(f"DAG run {run.run_id}: {run.state}")
    raise SystemExit(0 if run.state == "success" else 1)
