"""The triggerer loads the cluster clients before it forks its trigger runner, and freezes them out
of the cyclic garbage collector (kinetic_airflow.warmup).

Each case runs Airflow's own listener call in a fresh interpreter (a module loaded once stays
loaded, so only a new process can show what the hook imports), the way ``Job.__init__`` calls it:
through the plugin's listener manager, with the process's command line as Airflow's CLI sees it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import gc, json, sys
sys.argv = json.loads(sys.argv[1])
from airflow.listeners.listener import get_listener_manager
get_listener_manager().hook.on_starting(component=None)
names = ["airflow.providers.cncf.kubernetes.hooks.kubernetes", "kinetic_airflow.backends.gke.pathways"]
loaded = {n: n in sys.modules for n in names}
print(json.dumps({**loaded, "frozen out of the cyclic GC": gc.get_freeze_count() > 100000}))
"""


def _loaded_after_on_starting(argv: list[str], backend: str, tmp_path) -> dict[str, bool]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__KINETIC__", "KINETIC_"))}
    env["KINETIC_BACKEND"] = backend
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_triggerer_loads_the_cluster_clients_before_any_trigger(tmp_path) -> None:
    loaded = _loaded_after_on_starting(["airflow", "triggerer", "--skip-serve-logs"], "gke", tmp_path)
    assert loaded == {
        "airflow.providers.cncf.kubernetes.hooks.kubernetes": True,
        "kinetic_airflow.backends.gke.pathways": True,
        "frozen out of the cyclic GC": True,
    }


@pytest.mark.parametrize(
    ("argv", "backend"),
    [
        (["airflow", "scheduler"], "gke"),
        (["airflow", "dag-processor"], "gke"),
        (["airflow", "triggerer"], "local"),
    ],
)
def test_no_other_process_and_no_local_only_deployment_pays_for_them(argv, backend, tmp_path) -> None:
    assert set(_loaded_after_on_starting(argv, backend, tmp_path).values()) == {False}
