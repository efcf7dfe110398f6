"""A multi-host TPU step: four hosts of a v6e slice compute one statistic together.

Runs as it is on the embedded local backend (one process plays the whole slice), on the
cluster emulator (four processes, a real JAX collective; see the README's emulator
walkthrough) and on GKE (a LeaderWorkerSet of four TPU VMs).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

HOSTS_TPU = "tpu-v6e-16"  # 16 chips, 4x4: four hosts of four chips


@task.kinetic(accelerator="cpu")
def make_dataset(n: int) -> list[float]:
    return [float(i % 7) for i in range(n)]


@task.kinetic(
    accelerator=HOSTS_TPU,
    # On the emulator there are no TPUs: `export AIRFLOW_VAR_KINETIC_JAX_PLATFORMS=cpu`.
    container_env={"JAX_PLATFORMS": "{{ var.value.get('kinetic_jax_platforms', 'tpu') }}"},
)
def global_mean(values: list[float]) -> dict:
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    from kinetic_airflow.job.multihost import initialize_jax

    initialize_jax()
    me, hosts = jax.process_index(), jax.process_count()
    shard = jnp.array(values[me::hosts])  # every host reads its own part of the data
    partial = jnp.array([shard.sum(), shard.size])
    totals = multihost_utils.process_allgather(partial).reshape(hosts, 2).sum(axis=0)
    print(f"host {me} of {hosts}: partial sum {float(partial[0])}, global {totals.tolist()}", flush=True)
    return {"hosts": hosts, "mean": float(totals[0] / totals[1])}


@task
def report(result: dict) -> None:
    print(f"mean over {result['hosts']} hosts: {result['mean']:.4f}")


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False, tags=["kinetic"])
def multihost():
    report(global_mean(make_dataset(10_000)))


multihost_dag = multihost()

if __name__ == "__main__":
    run = multihost_dag.test()
    print(f"DAG run {run.run_id}: {run.state}")
    raise SystemExit(0 if run.state == "success" else 1)
