"""Storage with the worker's credentials: the Airflow GCP connection, not ambient ones."""

from __future__ import annotations

import logging
from typing import Any

from kinetic_airflow.storage import GCSStorage, Storage, open_storage

__all__ = ["KineticConfigError", "storage_for"]

log = logging.getLogger(__name__)

DEFAULT_GCP_CONN_ID = "google_cloud_default"


class KineticConfigError(ValueError):
    """Configuration the user must fix (a missing connection, a bad base URI)."""


def _gcs_client(gcp_conn_id: str | None) -> Any:
    from airflow.providers.google.cloud.hooks.gcs import GCSHook
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    conn_id = gcp_conn_id or DEFAULT_GCP_CONN_ID
    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        if conn_id == DEFAULT_GCP_CONN_ID and not gcp_conn_id:
            log.info("no %s connection; using ambient Google credentials for storage", conn_id)
            return None
        raise KineticConfigError(
            f"the GCP connection {conn_id!r} is not defined. Create it, e.g. "
            f"`airflow connections add {conn_id} --conn-type google_cloud_platform "
            '--conn-extra \'{"project": "my-project"}\'` (keys come from ADC / Workload Identity when '
            "no key is given), or set gcp_conn_id to an existing connection."
        ) from None
    return GCSHook(gcp_conn_id=conn_id).get_conn()


def storage_for(uri: str, gcp_conn_id: str | None = None) -> Storage:
    storage = open_storage(uri)
    if isinstance(storage, GCSStorage):
        return GCSStorage(_gcs_client(gcp_conn_id))
    return storage
