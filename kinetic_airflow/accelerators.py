"""Accelerator strings -> what a GKE pod needs: the public name of ``kinetic_airflow.job.accelerators``.

The registry itself lives in ``kinetic_airflow.job`` since the job reference (``JobRef``)
carries the parsed :class:`AcceleratorSpec` and ``job/`` imports nothing outside itself
(tests/test_import_graph.py). DAG authors, the docs and the rest of the package keep importing
it from here, so the move changed no import path; see that module for the grammar.
"""

from __future__ import annotations

from kinetic_airflow.job import accelerators as _registry
from kinetic_airflow.job.accelerators import *  # noqa: F403 (the public names, listed once there)

__all__ = list(_registry.__all__)
