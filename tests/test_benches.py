"""The benchmarks start from what the product builds today.

A benchmark that fails at its start is a README figure nobody can refresh: ``trigger_bench``
item-assigned into its job references until one session found it broken (``JobRef`` had become
frozen). Running a benchmark costs minutes of CPU, so this checks what it builds from the
product, not its run: the job references it hands its triggers, as the trigger kwargs carry them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from kinetic_airflow.job.ref import JobRef

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trigger_bench_watches_references_as_the_operator_makes_them(tmp_path: Path) -> None:
    bench = _bench("trigger_bench")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    conn = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}
    env = {
        f"AIRFLOW_CONN_{bench.CONN_ID.upper()}": json.dumps(conn),
        "KINETIC_KUBERNETES_CONN_ID": bench.CONN_ID,
        "KINETIC_RUNNER_PYTHON": sys.executable,
        "KINETIC_BASE_URI": f"gs://{bench.BUCKET}/kinetic",
        "KINETIC_LOCAL_STATE_DIR": str(tmp_path / "local"),
    }
    refs = bench._job_refs(2, env)
    decoded = [JobRef.from_dict(json.loads(json.dumps(ref))) for ref in refs]  # as refs.json carries them
    assert len({ref.job_id for ref in decoded}) == 2
    assert all(ref.backend == "gke" and ref.submitted_at and ref.k8s is not None for ref in decoded), decoded
