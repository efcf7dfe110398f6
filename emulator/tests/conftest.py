"""Fixtures for the cluster emulator's own tests.

``pytest_plugins`` is only honoured in the top-level conftest, so the fixtures
are imported by name here instead.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import cluster_emulator  # noqa: F401
except ImportError:  # running from outside the repo root without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cluster_emulator.fixtures import (  # noqa: F401
    k8s_api_client,
    k8s_cluster,
    k8s_cluster_session,
    k8s_kubeconfig,
)
