"""Accelerator strings -> what a GKE pod needs: the public name of ``kinetic_airflow.job.accelerators``.

The registry itself lives in ``kinetic_airflow.job`` since the job reference (``JobRef``)
carries the parsed :class:`AcceleratorSpec` and ``job/`` imports nothing outside itself
(tests/test_import_graph.py). DAG authors, the docs and the rest of the package keep importing
it from here, so the move changed no import path; see that module for the grammar.
"""

from __future__ import annotations

from kinetic_airflow.job.accelerators import (
    CHIPS_NOTE,
    DEFAULT_GPU,
    DEFAULT_TPU,
    GPU_TYPES,
    LABEL_ACCELERATOR_COUNT,
    LABEL_GPU_ACCELERATOR,
    LABEL_SPOT,
    LABEL_TPU_ACCELERATOR,
    LABEL_TPU_TOPOLOGY,
    RESOURCE_GPU,
    RESOURCE_TPU,
    TPU_GENERATIONS,
    AcceleratorSpec,
    GpuType,
    InvalidAcceleratorError,
    Toleration,
    TpuGeneration,
    TpuShape,
    accelerator_notes,
    parse_accelerator,
    valid_choices,
)

__all__ = [
    "CHIPS_NOTE",
    "DEFAULT_GPU",
    "DEFAULT_TPU",
    "GPU_TYPES",
    "LABEL_ACCELERATOR_COUNT",
    "LABEL_GPU_ACCELERATOR",
    "LABEL_SPOT",
    "LABEL_TPU_ACCELERATOR",
    "LABEL_TPU_TOPOLOGY",
    "RESOURCE_GPU",
    "RESOURCE_TPU",
    "TPU_GENERATIONS",
    "AcceleratorSpec",
    "GpuType",
    "InvalidAcceleratorError",
    "Toleration",
    "TpuGeneration",
    "TpuShape",
    "accelerator_notes",
    "parse_accelerator",
    "valid_choices",
]
