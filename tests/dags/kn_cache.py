"""DAGs for the result-cache tests (tests/test_result_cache.py): ``cache=True`` tasks whose
inputs a test varies one at a time (an argument, the function's code, ``cache_version``).

``tag`` is an argument every test makes unique (its temporary folder), so that one test's
cache entries (Airflow Variables, kept in the session's metadata DB) never meet another's.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import dag, task

START = pendulum.datetime(2026, 1, 1, tz="UTC")


def _square(tag: str, x: int) -> dict:
    return {"square": x * x, "pid": os.getpid()}


def _square_changed(tag: str, x: int) -> dict:
    return {"square": x * x, "pid": os.getpid(), "changed": True}


def cache_dag(dag_id: str, tag: str, x: int, *, version: str | None = None, changed: bool = False,
              **options):  # fmt: skip
    """``square(tag, x)`` with cache=True; ``changed`` ships another function body under the
    same name (what editing the DAG file does to the shipped code)."""
    fn = _square_changed if changed else _square
    fn.__name__ = fn.__qualname__ = "square"

    @dag(dag_id=dag_id, schedule=None, start_date=START, catchup=False)
    def kn_cache():
        kinetic = {"backend": "local", **options}  # the cluster tests name their backend
        task.kinetic(fn, task_id="square", cache=True, cache_version=version, **kinetic)(tag, x)

    return kn_cache()


def flaky_dag(dag_id: str, tag: str, marker: str):
    """Fails on its first try (it leaves ``marker``), succeeds on the retry: same inputs both times."""

    @task.kinetic(backend="local", cache=True, retries=1, retry_delay=0)
    def flaky(tag: str, marker: str) -> str:
        if not os.path.exists(marker):
            with open(marker, "w") as fh:
                fh.write("first try")
            raise RuntimeError("the first try fails")
        return "second try"

    @dag(dag_id=dag_id, schedule=None, start_date=START, catchup=False)
    def kn_cache_flaky():
        flaky(tag, marker)

    return kn_cache_flaky()


# The cluster backends' tests (the emulator): a GKE Job, a 4-host LeaderWorkerSet, a 2-slice JobSet.
CLUSTER = {
    "gke": {"backend": "gke"},
    "pathways": {"backend": "auto", "accelerator": "tpu-v6e-16"},
    "multislice": {"backend": "auto", "accelerator": "tpu-v6e-16", "slices": 2},
    # a capacity ladder whose first rung never starts (no A100 pool): rung 2 (L4) runs the job
    "ladder": {"backend": "gke", "accelerator": [("gpu-a100", 2), "gpu-l4"]},
}

# dag.test() finds a DAG in the DAG folder by its id before it runs the copy a test built (with
# the test's own ``tag``): every id the tests use is defined here.
DAGS = {
    d.dag_id: d
    for d in (
        *(
            cache_dag(f"kn_cache_{name}", "parsed", 0)
            for name in ("twice", "base", "other_dag", "arg", "code", "version", "fresh", "planted", "once")
        ),
        *(cache_dag(f"kn_cache_{name}", "parsed", 0, **CLUSTER[name]) for name in CLUSTER),
        flaky_dag("kn_cache_flaky", "parsed", "/nonexistent/marker"),
    )
}
