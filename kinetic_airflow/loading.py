"""``load_result``: fetch a result that was too big (or not serializable) for XCom."""

from __future__ import annotations

from typing import Any

from kinetic_airflow.connections import storage_for
from kinetic_airflow.job.envelope import ResultRef, is_result_ref

__all__ = ["load_result"]


def load_result(value: Any, *, gcp_conn_id: str | None = None) -> Any:
    """Return the real object behind a kinetic result reference (other values pass through).

    Use it in a plain ``@task`` downstream of a kinetic task whose result stayed in storage::

        @task
        def evaluate(weights):
            weights = load_result(weights)
    """
    if not (is_result_ref(value) or isinstance(value, ResultRef)):
        return value
    ref = ResultRef.from_xcom(value) if is_result_ref(value) else value
    return ref.load(storage_for(ref.uri, gcp_conn_id))
