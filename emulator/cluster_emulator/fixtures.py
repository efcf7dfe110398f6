"""pytest fixtures for the cluster emulator.

Use them with ``pytest_plugins = ["cluster_emulator.fixtures"]``
in the top-level ``conftest.py`` (or import the fixture names into a conftest).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .emulator import ClusterEmulator

if TYPE_CHECKING:
    import kubernetes.client


@pytest.fixture
def k8s_cluster(tmp_path: Path) -> Iterator[ClusterEmulator]:
    """A started emulator for one test (pods and faults cannot leak between tests)."""
    emulator = ClusterEmulator(work_dir=tmp_path / "k8s-emulator")
    emulator.start()
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture(scope="session")
def k8s_cluster_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterEmulator]:
    """One emulator shared by the session (cheaper; tests must use unique object names and clear faults)."""
    emulator = ClusterEmulator(work_dir=tmp_path_factory.mktemp("k8s-emulator"))
    emulator.start()
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def k8s_kubeconfig(k8s_cluster: ClusterEmulator, tmp_path: Path) -> Path:
    """Path of a kubeconfig (context ``emulator``) for the function-scoped emulator."""
    return k8s_cluster.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def k8s_api_client(k8s_cluster: ClusterEmulator) -> Iterator[kubernetes.client.ApiClient]:
    """An official ``kubernetes`` ApiClient bound to the function-scoped emulator."""
    client = k8s_cluster.api_client()
    try:
        yield client
    finally:
        client.close()
