"""The cluster emulator as the cluster of every kinetic job in a test module (dag.test() tier)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cluster_emulator import ClusterEmulator

__all__ = ["point_kinetic_at", "running_emulator"]


@contextmanager
def running_emulator(
    tmp_path_factory: Any, node_pools: Any = None, **options: Any
) -> Iterator[tuple[ClusterEmulator, Path]]:
    """An emulator (its default pools: every TPU and GPU type) and a kubeconfig for it;
    ``options``: more ClusterEmulator arguments (e.g. unserved_versions)."""
    from kinetic_airflow.backends.gke.watch_cache import reset_shared_state

    kwargs = {"node_pools": node_pools, **options} if node_pools is not None else dict(options)
    emulator = ClusterEmulator(work_dir=tmp_path_factory.mktemp("emulator"), **kwargs)
    emulator.start()
    try:
        yield emulator, emulator.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")
    finally:
        reset_shared_state()
        emulator.stop()


def point_kinetic_at(emulator: ClusterEmulator, kubeconfig: Path, monkeypatch: Any) -> None:
    """A Kubernetes connection to the emulator, this venv as the runner image, no faults left armed."""
    from kinetic_airflow.backends.gke.watch_cache import reset_shared_state

    emulator.clear_faults()
    reset_shared_state()
    conn = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig), "namespace": "default"}}
    monkeypatch.setenv("AIRFLOW_CONN_KINETIC_EMULATOR", json.dumps(conn))
    monkeypatch.setenv("KINETIC_KUBERNETES_CONN_ID", "kinetic_emulator")
    monkeypatch.setenv("KINETIC_RUNNER_PYTHON", sys.executable)
    monkeypatch.setenv("KINETIC_CONTAINER_IMAGE", "kinetic-runner:test")
