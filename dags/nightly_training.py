"""A nightly training pipeline: prepare -> train on an accelerator -> evaluate -> pick best.

``train`` asks for a TPU slice; on the ``local`` backend it runs as a local
process (the accelerator only matters on GKE), so the DAG is testable on a
laptop. Training checkpoints to ``KINETIC_OUTPUT_DIR``, which is the same for
every try of a task instance: a retry resumes instead of starting over.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task


@task
def prepare(n: int = 256) -> dict:
    """Make a tiny regression dataset (a real pipeline would point at gs://.../dataset)."""
    import random

    rng = random.Random(0)
    xs = [rng.uniform(-1, 1) for _ in range(n)]
    ys = [3.0 * x + 0.5 + rng.gauss(0, 0.05) for x in xs]
    return {"x": xs, "y": ys}


# One 8-chip v6e host (tpu-v6e-8 is two 4-chip hosts, as in keras-kinetic).
@task.kinetic(accelerator="tpu-v6e-8t", retries=2, retry_delay=pendulum.duration(seconds=5))
def train(data: dict, lr: float, epochs: int = 200) -> dict:
    import json
    import os

    out = os.environ["KINETIC_OUTPUT_DIR"]
    ckpt = os.path.join(out, f"ckpt-lr{lr}.json") if not out.startswith("gs://") else None
    w, b, start = 0.0, 0.0, 0
    if ckpt and os.path.exists(ckpt):  # resume after a retry or preemption
        state = json.load(open(ckpt))
        w, b, start = state["w"], state["b"], state["epoch"]
        print(f"resuming from epoch {start}")
    xs, ys = data["x"], data["y"]
    n = len(xs)
    for epoch in range(start, epochs):
        gw = sum((w * x + b - y) * x for x, y in zip(xs, ys, strict=True)) * 2 / n
        gb = sum((w * x + b - y) for x, y in zip(xs, ys, strict=True)) * 2 / n
        w, b = w - lr * gw, b - lr * gb
        if ckpt and epoch % 50 == 0:
            json.dump({"w": w, "b": b, "epoch": epoch + 1}, open(ckpt, "w"))
    loss = sum((w * x + b - y) ** 2 for x, y in zip(xs, ys, strict=True)) / n
    print(f"lr={lr}: loss={loss:.5f} w={w:.3f} b={b:.3f}")
    return {"lr": lr, "loss": loss, "w": w, "b": b}


@task.kinetic(accelerator="cpu")
def evaluate(model: dict, data: dict) -> dict:
    xs, ys = data["x"], data["y"]
    mae = sum(abs(model["w"] * x + model["b"] - y) for x, y in zip(xs, ys, strict=True)) / len(xs)
    return {**model, "mae": mae}


@task
def pick_best(results: list[dict]) -> dict:
    best = min(results, key=lambda r: r["mae"])
    print(f"best learning rate {best['lr']} with MAE {best['mae']:.4f}")
    return best


@dag(schedule="@daily", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False, tags=["kinetic"])
def kinetic_nightly_training():
    data = prepare()
    models = train.partial(data=data).expand(lr=[0.3, 0.1, 0.03])
    scores = evaluate.partial(data=data).expand(model=models)
    pick_best(scores)


nightly_dag = kinetic_nightly_training()

if __name__ == "__main__":
    run = nightly_dag.test()
    print(f"DAG run {run.run_id}: {run.state}")
    raise SystemExit(0 if run.state == "success" else 1)
