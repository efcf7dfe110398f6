"""Which Google credentials the worker and the triggerer use, and what to say when there are none.

Order: the task's / ``[kinetic] gcp_conn_id`` connection (must exist), else the
``google_cloud_default`` connection if it is defined, else *ambient* credentials
(Application Default Credentials: Workload Identity, a metadata server,
``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth application-default login``).

Airflow's Google hooks (GKEHook, GKEKubernetesHook, GCSHook) always read a connection;
a GCP connection without a key uses ADC. For the ambient case kinetic therefore names a
process-local connection with no fields, ``kinetic_ambient_google``, defined through the
environment-variable secrets backend (``AIRFLOW_CONN_KINETIC_AMBIENT_GOOGLE``): it holds
no secret, so it may appear in job references and trigger kwargs like any connection id.

Impersonation (``impersonation_chain``, ``backends.gke.client``) works on top of either: the
hooks are given the chain, and Airflow's Google hooks impersonate it from the connection's
credentials or, for ``kinetic_ambient_google``, from the ambient ones. The chain is a list of
account names, not a credential, so it travels in the job reference as the connection id does.
"""

from __future__ import annotations

import os

__all__ = [
    "AMBIENT_CONN_ID",
    "DEFAULT_GCP_CONN_ID",
    "KineticConfigError",
    "connection_exists",
    "gcp_conn_for_cluster",
    "no_credentials_error",
    "use_ambient_connection",
]

DEFAULT_GCP_CONN_ID = "google_cloud_default"
AMBIENT_CONN_ID = "kinetic_ambient_google"
_AMBIENT_ENV = "AIRFLOW_CONN_KINETIC_AMBIENT_GOOGLE"


class KineticConfigError(ValueError):
    """Configuration the user must fix (a missing connection, a bad base URI)."""


def connection_exists(conn_id: str) -> bool:
    # Airflow start-up cost: loaded when called, not when this module is imported.
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return False
    return True


def _connection_howto(conn_id: str) -> str:
    return (
        f"`airflow connections add {conn_id} --conn-type google_cloud_platform "
        '--conn-extra \'{"project": "my-project", "key_path": "/path/key.json"}\'` (without a key the '
        "connection uses the machine's ambient credentials)"
    )


def no_credentials_error(what: str, detail: str = "") -> KineticConfigError:
    return KineticConfigError(
        f"{what} needs Google credentials, and there are none: no Airflow connection "
        f"{DEFAULT_GCP_CONN_ID!r} and no ambient credentials on this machine"
        + (f" ({detail})" if detail else "")
        + ". Fix one of: create the connection, "
        + _connection_howto(DEFAULT_GCP_CONN_ID)
        + ", or set gcp_conn_id= / [kinetic] gcp_conn_id to an existing one; give the worker and "
        "triggerer ambient credentials (Workload Identity on GKE, GOOGLE_APPLICATION_CREDENTIALS="
        "/path/key.json, or `gcloud auth application-default login`); or, for local runs, keep job "
        "storage on disk (base_uri='file:///path', the local backend's default)."
    )


def _ambient_credentials_problem() -> str | None:
    """None when Application Default Credentials are available, else why not."""
    # Start-up cost: the Google clients load only when gs:// or GCP credentials are used.
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        google.auth.default()
    except DefaultCredentialsError as exc:
        return str(exc).split(". ")[0]
    return None


def use_ambient_connection() -> str:
    """Define the field-less ambient connection in this process; returns its id."""
    os.environ.setdefault(_AMBIENT_ENV, "google-cloud-platform://")
    return AMBIENT_CONN_ID


def missing_connection_error(conn_id: str) -> KineticConfigError:
    return KineticConfigError(
        f"the GCP connection {conn_id!r} is not defined (gcp_conn_id). Create it, "
        + _connection_howto(conn_id)
        + f", or drop gcp_conn_id to use {DEFAULT_GCP_CONN_ID!r} or the machine's ambient credentials."
    )


def gcp_conn_for_cluster(explicit: str | None, what: str = "the GKE backend") -> str:
    """The connection id GKE hooks should use; ambient credentials when no connection is set up."""
    if explicit == AMBIENT_CONN_ID:
        return use_ambient_connection()
    if explicit:
        if not connection_exists(explicit):
            raise missing_connection_error(explicit)
        return explicit
    if connection_exists(DEFAULT_GCP_CONN_ID):
        return DEFAULT_GCP_CONN_ID
    problem = _ambient_credentials_problem()
    if problem is not None:
        raise no_credentials_error(what, problem)
    return use_ambient_connection()
