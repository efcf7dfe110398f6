"""kinetic-airflow: run Python functions on TPUs and GPUs from Airflow.

Public names resolve lazily: the runner imports this package inside jobs where
Airflow is not installed, so importing ``kinetic_airflow`` must not import it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "kinetic_task": "kinetic_airflow.decorators",
    "KineticRunOperator": "kinetic_airflow.operators",
    "KineticJobTrigger": "kinetic_airflow.triggers",
    "Data": "kinetic_airflow.job.inputs",
    "ResultRef": "kinetic_airflow.job.envelope",
    "load_result": "kinetic_airflow.loading",
    "parse_accelerator": "kinetic_airflow.accelerators",
    "InvalidAcceleratorError": "kinetic_airflow.accelerators",
    "KineticJobError": "kinetic_airflow.results",
    "KineticOptionError": "kinetic_airflow.options",
    "KineticRemoteError": "kinetic_airflow.results",
    "PayloadError": "kinetic_airflow.job.payload",
    "report": "kinetic_airflow.job.metrics",
    "stop_requested": "kinetic_airflow.job.stop",
    "on_stop": "kinetic_airflow.job.stop",
}

__all__ = [
    "Data",
    "InvalidAcceleratorError",
    "KineticJobError",
    "KineticJobTrigger",
    "KineticOptionError",
    "KineticRemoteError",
    "KineticRunOperator",
    "PayloadError",
    "ResultRef",
    "kinetic_task",
    "load_result",
    "on_stop",
    "parse_accelerator",
    "report",
    "stop_requested",
]

if TYPE_CHECKING:
    from kinetic_airflow.accelerators import InvalidAcceleratorError, parse_accelerator
    from kinetic_airflow.decorators import kinetic_task
    from kinetic_airflow.job.envelope import ResultRef
    from kinetic_airflow.job.inputs import Data
    from kinetic_airflow.job.metrics import report
    from kinetic_airflow.job.payload import PayloadError
    from kinetic_airflow.job.stop import on_stop, stop_requested
    from kinetic_airflow.loading import load_result
    from kinetic_airflow.operators import KineticRunOperator
    from kinetic_airflow.options import KineticOptionError
    from kinetic_airflow.results import KineticJobError, KineticRemoteError
    from kinetic_airflow.triggers import KineticJobTrigger


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kinetic_airflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
