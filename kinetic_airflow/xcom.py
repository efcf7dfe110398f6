"""An XCom backend that hands every task a kinetic result's value, not its reference.

A kinetic task whose result is too large for XCom (``[kinetic] xcom_max_bytes``) or not
serializable by Airflow keeps the result in job storage and pushes a small reference. Kinetic
tasks downstream resolve references themselves; a plain ``@task`` gets the reference dict, and
``weights.mean()`` then fails with ``'dict' object has no attribute 'mean'``. With this backend
enabled, every task that pulls the XCom gets the value::

    [core]
    xcom_backend = kinetic_airflow.xcom.KineticXComBackend

What changes: the value is downloaded, checked against the digest its reference carries and
unpickled in the worker of each task that pulls it (a downstream kinetic task then ships the
value in its payload instead of the reference). What does not: what is stored in Airflow's
database (still the reference), and the UI and REST API, which show the stored reference
(Airflow uses a custom backend's ``deserialize_value`` only on workers).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk.bases.xcom import BaseXCom

from kinetic_airflow.job.envelope import replace_refs
from kinetic_airflow.loading import load_result

__all__ = ["KineticXComBackend"]


class KineticXComBackend(BaseXCom):
    """Airflow's own XCom, with kinetic result references resolved to their values on read."""

    @staticmethod
    def deserialize_value(result: Any) -> Any:
        value = BaseXCom.deserialize_value(result)
        return replace_refs(value, load_result)
