"""Kubernetes API clients from Airflow connections, plus the few raw calls the backend makes.

Two ways to reach a cluster, both from connection *ids* (the JobRef carries only
ids and public endpoint data, never a token):

* ``kubernetes_conn_id``: any cluster through cncf-kubernetes' KubernetesHook
  (kubeconfig in the connection, a kubeconfig path, or in-cluster);
* GKE: the GCP connection + project/location/cluster. GKEHook resolves the
  endpoint and CA once at submit time; GKEKubernetesHook mints short-lived
  tokens from the GCP connection and refreshes them, so jobs that run for hours
  keep working without kubeconfig or gcloud.

Which GKE endpoint is used and as whom follow the google provider's GKE operators:
``use_internal_ip`` (the private endpoint), ``use_dns_endpoint`` (the DNS endpoint, whose
certificate is publicly trusted, so no cluster CA is passed) and ``impersonation_chain``
(service accounts; the last is impersonated, the others are delegates). They travel in
the cluster reference as plain, public values, so the triggerer mints its own tokens
through the same chain and reaches the same endpoint.

Calls go through ``_preload_content=False`` and plain JSON: the backend works on
dicts, which is cheaper than the client's model objects and what the watch
cache stores.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from typing import TYPE_CHECKING, Any

from kinetic_airflow.config import resolve_setting
from kinetic_airflow.gcp_auth import gcp_conn_for_cluster
from kinetic_airflow.optional import require_providers

if TYPE_CHECKING:
    from kinetic_airflow.backends.gke.transport import ApiServer

__all__ = [
    "ApiError",
    "KubeApi",
    "akube_api",
    "api_server",
    "cached_kube_api",
    "cluster_key",
    "endpoint_mode",
    "gke_access",
    "impersonation_chain_of",
    "kube_api",
    "resolve_gke_cluster",
    "resolve_gke_cluster_info",
]


def _rbac_fix(status: int, message: Any) -> str:
    """For RBAC's 403 (``... cannot VERB resource "R" in API group "G" ...``): the grant that fixes it."""
    found = _RBAC_DENIAL.search(str(message)) if status == 403 else None
    if found is None:
        return ""
    verb, resource, group = found.groups()
    return (
        f'. Grant {verb} on {resource} (API group "{group}") to the identity kinetic uses: '
        "kinetic-airflow doctor --print-rbac prints the Role with every rule kinetic needs"
    )


_RBAC_DENIAL = re.compile(r'cannot (\S+) resource "([^"]+)" in API group "([^"]*)"')


class ApiError(RuntimeError):
    def __init__(self, status: int, reason: str, body: str = "") -> None:
        self.status = status
        self.reason = reason
        self.body = body
        try:
            message = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            message = body
        super().__init__(f"Kubernetes API error {status} {reason}: {message}{_rbac_fix(status, message)}")
        # RBAC refused this identity (not a 403 some other layer returned, e.g. a kubelet's)
        self.rbac_denied = bool(_rbac_fix(status, message))


_RETRYABLE = frozenset({429, 500, 502, 503, 504})


_KEY_FIELDS = (
    "kubernetes_conn_id",
    "gcp_conn_id",
    "project",
    "location",
    "name",
    "endpoint",
    "ca",
    # another identity is another client (its own tokens and permissions)
    "impersonation_chain",
    "use_dns_endpoint",
)


def cluster_key(cluster: dict[str, Any]) -> str:
    """What tells clusters apart: a re-created cluster (new endpoint or CA) gets a new client."""
    return json.dumps({k: cluster.get(k) for k in _KEY_FIELDS}, sort_keys=True)


def api_server(cluster: dict[str, Any]) -> ApiServer:
    """The cluster's API server as the reference's identity reaches it (``transport``: without
    the Kubernetes client library whenever the connection allows)."""
    require_providers("cncf.kubernetes") if cluster.get("kubernetes_conn_id") else require_providers()
    # Optional dependency: urllib3 and PyYAML come with Airflow and its providers, not with the bare
    # package that `kinetic-airflow image` runs from (its CLI imports this module).
    from kinetic_airflow.backends.gke.transport import (
        from_client_configuration,
        from_google_credentials,
        from_kubernetes_connection,
    )

    if cluster.get("kubernetes_conn_id"):
        conn_id = cluster["kubernetes_conn_id"]
        server = from_kubernetes_connection(_connection_extras(conn_id))
        if server is not None:
            return server
        # Start-up cost (the cncf hook module and the Kubernetes client, seconds): only for the forms
        # transport.py leaves to the provider (exec plugins, in-cluster, the default kubeconfig...).
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        client = KubernetesHook(conn_id=conn_id).get_conn()
        return from_client_configuration(client.configuration, built_by="KubernetesHook")
    # Airflow start-up cost: loaded when called, not when this module is imported.
    from airflow.providers.google.common.hooks.base_google import GoogleBaseHook

    if not cluster.get("endpoint"):
        raise ValueError("a GKE cluster reference needs its endpoint; resolve_gke_cluster() fills it in")
    credentials = GoogleBaseHook(
        gcp_conn_id=gcp_conn_for_cluster(cluster.get("gcp_conn_id")),
        impersonation_chain=impersonation_chain_of(cluster.get("impersonation_chain")),
    ).get_credentials()
    # The DNS endpoint's certificate is publicly trusted (as in the google provider): no cluster CA.
    ca = None if cluster.get("use_dns_endpoint") else cluster["ca"]
    return from_google_credentials(f"https://{cluster['endpoint']}", ca, credentials)


def _connection_extras(conn_id: str) -> dict[str, Any]:
    """A connection's extras; {} when it cannot be read (the provider's hook then says why)."""
    # Airflow start-up cost: loaded when called, not when this module is imported.
    from airflow.sdk import BaseHook

    try:
        extras = BaseHook.get_connection(conn_id).extra_dejson
    except Exception:  # not found, or a secrets backend's error: KubernetesHook reports it
        return {}
    return extras if isinstance(extras, dict) else {}


def impersonation_chain_of(value: Any) -> list[str] | None:
    """A chain as a list of service accounts: ``[kinetic] impersonation_chain`` is one string,
    comma separated; a task gives a string or a list. None (or empty) means no impersonation."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    chain = [str(item).strip() for item in items if str(item).strip()]
    return chain or None


def gke_access(
    use_internal_ip: bool | None = None,
    use_dns_endpoint: bool | None = None,
    impersonation_chain: str | list[str] | tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """The three access settings of a GKE cluster reference: task argument > ``[kinetic]`` > env."""
    return {
        "use_internal_ip": bool(resolve_setting("use_internal_ip", use_internal_ip)),
        "use_dns_endpoint": bool(resolve_setting("use_dns_endpoint", use_dns_endpoint)),
        "impersonation_chain": impersonation_chain_of(
            resolve_setting("impersonation_chain", impersonation_chain)
        ),
    }


def endpoint_mode(cluster: dict[str, Any]) -> str:
    """How the control plane is reached: kubernetes connection, or GKE's public, private or DNS endpoint."""
    if cluster.get("kubernetes_conn_id"):
        return "kubernetes_conn_id"
    if cluster.get("use_dns_endpoint"):
        return "dns"
    if cluster.get("use_internal_ip"):
        return "private"
    return "public"


class EndpointMissingError(ValueError):
    """The GKE cluster has no endpoint of the requested kind (``use_internal_ip`` / ``use_dns_endpoint``)."""


def _chosen_endpoint(info: Any, cluster: dict[str, Any]) -> str:
    """The endpoint of ``info`` (a GKE ``Cluster``) that ``cluster``'s options ask for, or why none."""
    name = cluster.get("name")
    if cluster.get("use_internal_ip") and cluster.get("use_dns_endpoint"):
        raise EndpointMissingError(
            f"use_internal_ip and use_dns_endpoint are both set for GKE cluster {name!r}: choose one "
            "(the DNS endpoint works from anywhere IAM allows; the private endpoint only from the "
            "cluster's VPC)."
        )
    if cluster.get("use_dns_endpoint"):
        config = getattr(info, "control_plane_endpoints_config", None)
        endpoint = getattr(getattr(config, "dns_endpoint_config", None), "endpoint", "")
        if not endpoint:
            raise EndpointMissingError(
                f"GKE cluster {name!r} has no DNS endpoint (control_plane_endpoints_config."
                "dns_endpoint_config.endpoint is empty), but use_dns_endpoint is set. Enable it with "
                f"`gcloud container clusters update {name} --location {cluster.get('location')} "
                "--enable-dns-access`, or drop use_dns_endpoint ([kinetic] use_dns_endpoint)."
            )
        return str(endpoint)
    if cluster.get("use_internal_ip"):
        endpoint = getattr(getattr(info, "private_cluster_config", None), "private_endpoint", "")
        if not endpoint:
            raise EndpointMissingError(
                f"GKE cluster {name!r} has no private endpoint (private_cluster_config.private_endpoint "
                "is empty), but use_internal_ip is set: it is not a private cluster. Drop use_internal_ip "
                "([kinetic] use_internal_ip) to use its public endpoint, or use_dns_endpoint."
            )
        return str(endpoint)
    return str(info.endpoint)


# What the GKE API said about a cluster, per (connection, project, location, cluster, access options):
# the endpoint and CA are public and change only when the cluster is re-created, so a process asks
# once. Guarded like _CLIENTS: the lock covers the dict only, never the GKE call.
_ENDPOINTS: dict[str, dict[str, Any]] = {}
_ENDPOINTS_LOCK = threading.Lock()
_RESOLVED_FIELDS = (
    "gcp_conn_id",
    "impersonation_chain",
    "use_internal_ip",
    "use_dns_endpoint",
    "endpoint",
    "ca",
    "autopilot",  # the requirements cache's choice (volumes.requirements_cache_for)
)


def _endpoint_key(cluster: dict[str, Any]) -> str:
    chain = impersonation_chain_of(cluster.get("impersonation_chain"))
    fields = ("gcp_conn_id", "project", "location", "name")
    return json.dumps(
        [
            *(cluster.get(k) for k in fields),
            bool(cluster.get("use_internal_ip")),
            bool(cluster.get("use_dns_endpoint")),
            chain,
        ]
    )


def resolve_gke_cluster(cluster: dict[str, Any]) -> dict[str, Any]:
    """Fill in a GKE cluster's endpoint and CA certificate (public data) from the GKE API.

    The endpoint is the public one, the private one (``use_internal_ip``) or the DNS one
    (``use_dns_endpoint``); ``impersonation_chain`` is used for this call and kept in the
    result, so every later client (worker, triggerer, CLI) acts as the same identity.
    The GKE API is asked once per process for each connection, project, location, cluster and
    access options; later calls in the process reuse its answer (a re-created cluster is seen by
    the next process).
    """
    if cluster.get("kubernetes_conn_id") or cluster.get("endpoint"):
        return cluster
    key = _endpoint_key(cluster)
    with _ENDPOINTS_LOCK:
        known = _ENDPOINTS.get(key)
    if known is not None:
        return {**cluster, **known}
    resolved = resolve_gke_cluster_info(cluster)[0]  # outside the lock: a network call
    with _ENDPOINTS_LOCK:
        _ENDPOINTS[key] = {k: resolved[k] for k in _RESOLVED_FIELDS}
    return resolved


def resolve_gke_cluster_info(cluster: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """``resolve_gke_cluster`` plus the GKE API's ``Cluster`` it read (node pools, autoscaling),
    for ``kinetic-airflow doctor``; always asks the GKE API."""
    require_providers("google", needed_for="finding a GKE cluster (the gke and pathways backends)")
    # Airflow start-up cost: loaded when called, not when this module is imported.
    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook

    # No connection at all means ambient credentials (README): the same id then reaches the
    # triggerer in the job reference, so it mints its tokens the same way.
    conn_id = gcp_conn_for_cluster(cluster.get("gcp_conn_id"))
    chain = impersonation_chain_of(cluster.get("impersonation_chain"))
    hook = GKEHook(gcp_conn_id=conn_id, location=cluster["location"], impersonation_chain=chain)
    info = hook.get_cluster(name=cluster["name"], project_id=cluster["project"])
    resolved = {
        **cluster,
        "gcp_conn_id": conn_id,
        "impersonation_chain": chain,
        "use_internal_ip": bool(cluster.get("use_internal_ip")),
        "use_dns_endpoint": bool(cluster.get("use_dns_endpoint")),
        "endpoint": _chosen_endpoint(info, cluster),
        "ca": info.master_auth.cluster_ca_certificate,
        # GKE's Cluster.autopilot.enabled: Autopilot refuses writable hostPath volumes, so the
        # requirements cache is an emptyDir there (volumes.requirements_cache_for)
        "autopilot": bool(getattr(getattr(info, "autopilot", None), "enabled", False)),
    }
    return resolved, info


class KubeApi:
    """The backend's Kubernetes calls, with retries for transient errors (429/5xx, resets)."""

    def __init__(self, server: ApiServer, retries: int = 5) -> None:
        self.server = server
        self.retries = retries

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        stream: bool = False,
        timeout: float | tuple[float, float | None] | None = 30,
        retry: bool = True,
    ) -> Any:
        """JSON of the response (or the unread streaming response); 429/5xx/resets are retried
        (``retry``) by urllib3's ``Retry``, honouring ``Retry-After``; what is still failing after
        the last retry is an ``ApiError`` (status 0: no answer, with the connection error)."""
        # Optional dependency: urllib3 comes with Airflow, not with the bare package (api_server).
        from urllib3.exceptions import HTTPError, MaxRetryError

        try:
            response = self.server.request(
                method,
                path,
                query=query,
                body=body,
                timeout=timeout,
                retries=self._retry_policy() if retry else False,
                preload_content=not stream,  # a body cut short is retried too, as the headers are
            )
        except HTTPError as exc:
            cause = exc.reason if isinstance(exc, MaxRetryError) and exc.reason is not None else exc
            raise ApiError(0, type(cause).__name__, str(cause)) from exc
        if response.status < 400:
            if stream:
                return response
            try:
                return json.loads(response.data or b"{}")
            finally:
                response.release_conn()
        body_text = response.data.decode("utf-8", "replace")
        response.release_conn()
        raise ApiError(response.status, response.reason or "", body_text)

    def _retry_policy(self) -> Any:
        """urllib3's ``Retry`` for one request: up to ``retries`` more attempts on throttling
        (429), a transient server or proxy error (500, 502, 503, 504), a refused or reset
        connection and a read timeout, for every method (a repeated create meets the object
        the first made: 409, which the callers handle); pauses 0.2 s doubling to 5 s, or what
        ``Retry-After`` asks. Redirects are not followed: the API server sends none."""
        # Optional dependency: urllib3 comes with Airflow, not with the bare package (api_server).
        from urllib3.util.retry import Retry

        return Retry(
            total=self.retries,
            status_forcelist=_RETRYABLE,
            allowed_methods=None,
            backoff_factor=0.2,
            backoff_max=5.0,
            respect_retry_after_header=True,
            raise_on_status=False,
            redirect=False,
        )

    # Paths -----------------------------------------------------------------------------------
    @staticmethod
    def jobs_path(namespace: str, name: str | None = None) -> str:
        base = f"/apis/batch/v1/namespaces/{namespace}/jobs"
        return f"{base}/{name}" if name else base

    @staticmethod
    def pods_path(namespace: str, name: str | None = None) -> str:
        base = f"/api/v1/namespaces/{namespace}/pods"
        return f"{base}/{name}" if name else base

    def delete_foreground(self, path: str) -> None:
        """Delete an object and (Foreground) what it owns; one already gone is fine."""
        try:
            self.request(
                "DELETE",
                path,
                body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"},
            )
        except ApiError as exc:
            if exc.status != 404:
                raise

    def get_or_none(self, path: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise


_CLIENTS: dict[str, KubeApi] = {}
# Guards the dict only. Nothing that can block or yield runs while it is held: building a client
# looks up a connection, which under the triggerer is a supervisor call that greenback may
# suspend, letting another trigger on the same thread try to take this lock (a deadlock).
_CLIENTS_LOCK = threading.Lock()


def cached_kube_api(cluster: dict[str, Any]) -> KubeApi | None:
    """The process's client of ``cluster`` if one was built already; never does I/O."""
    with _CLIENTS_LOCK:
        return _CLIENTS.get(cluster_key(cluster))


def kube_api(cluster: dict[str, Any]) -> KubeApi:
    """One client per cluster per process: triggers of one triggerer share its connection pool.

    The first call for a cluster builds the client (connection look-up, maybe a token): call it
    from a worker thread in async code (``akube_api``), never on the event loop's thread.
    """
    found = cached_kube_api(cluster)
    if found is not None:
        return found
    built = KubeApi(api_server(cluster))  # outside the lock: may block, or yield under greenback
    with _CLIENTS_LOCK:
        return _CLIENTS.setdefault(cluster_key(cluster), built)


async def akube_api(cluster: dict[str, Any]) -> KubeApi:
    """``kube_api`` for the event loop: a cached client at once, a new one built in a thread."""
    found = cached_kube_api(cluster)
    if found is not None:
        return found
    return await asyncio.to_thread(kube_api, cluster)
