"""Storage with the worker's credentials: the Airflow GCP connection, else ambient ones."""

from __future__ import annotations

import logging
from typing import Any

from kinetic_airflow.gcp_auth import (
    AMBIENT_CONN_ID,
    DEFAULT_GCP_CONN_ID,
    KineticConfigError,
    connection_exists,
    missing_connection_error,
    no_credentials_error,
)
from kinetic_airflow.job.storage import GCSStorage, Storage, _ambient_client, open_storage
from kinetic_airflow.optional import require_providers

__all__ = ["KineticConfigError", "storage_for"]

log = logging.getLogger(__name__)


def _ambient_storage_client(uri: str) -> Any:
    # Start-up cost: the Google clients load only when gs:// or GCP credentials are used.
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import storage

    try:
        return _ambient_client(storage)
    except DefaultCredentialsError as exc:
        raise no_credentials_error(f"job storage {uri}", str(exc).split(". ")[0]) from None


def _gcs_client(gcp_conn_id: str | None, uri: str = "gs://") -> Any:
    # Start-up cost: the Google clients load only when gs:// or GCP credentials are used.
    from google.auth.exceptions import DefaultCredentialsError

    if gcp_conn_id == AMBIENT_CONN_ID:
        return _ambient_storage_client(uri)
    conn_id = gcp_conn_id or DEFAULT_GCP_CONN_ID
    if not connection_exists(conn_id):
        if not gcp_conn_id:
            log.info("no %s connection; using ambient Google credentials for storage", conn_id)
            return _ambient_storage_client(uri)
        raise missing_connection_error(conn_id)
    require_providers("google", needed_for=f"job storage {uri} through the Airflow connection {conn_id!r}")
    # Airflow start-up cost, and an optional provider (the gke extra): loaded when used.
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    try:
        return GCSHook(gcp_conn_id=conn_id).get_conn()
    except DefaultCredentialsError as exc:  # a connection without a key falls back to ADC
        raise no_credentials_error(
            f"job storage {uri} (connection {conn_id!r} has no key)", str(exc).split(". ")[0]
        ) from None


def storage_for(uri: str, gcp_conn_id: str | None = None) -> Storage:
    storage = open_storage(uri)
    if isinstance(storage, GCSStorage):
        return GCSStorage(_gcs_client(gcp_conn_id, uri))
    return storage
