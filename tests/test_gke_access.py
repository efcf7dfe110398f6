"""Issue 18: which GKE endpoint is used (public, private, DNS) and as whom (impersonation_chain).

Nothing can stand in for Google's control plane here, so, as in tests/test_everyday_surface.py,
only ``GKEHook.get_cluster`` is replaced: it answers a cluster with all three endpoints and
records the hook it was called on. The credentials are real: a service account key whose token
comes from a local OAuth2 endpoint, impersonated through a local IAM Credentials endpoint
(google-auth's own ``generateAccessToken`` call), so the bearer token the Kubernetes client
sends is the impersonated service account's.
"""

from __future__ import annotations

import base64
import http.server
import json
import threading
import types
from datetime import UTC, datetime, timedelta

import pytest

CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
PUBLIC, PRIVATE, DNS = "203.0.113.7", "10.0.0.2", "gke-abc123.us-central1.gke.goog"
CHAIN = ["delegate@p.iam.gserviceaccount.com", "kinetic-airflow@p.iam.gserviceaccount.com"]


def cluster_info(private: str = PRIVATE, dns: str = DNS) -> types.SimpleNamespace:
    """The fields of google.cloud.container_v1.Cluster the backend reads."""
    ns = types.SimpleNamespace
    return ns(
        endpoint=PUBLIC,
        master_auth=ns(cluster_ca_certificate=CA),
        private_cluster_config=ns(private_endpoint=private),
        control_plane_endpoints_config=ns(dns_endpoint_config=ns(endpoint=dns)),
    )


@pytest.fixture
def google_endpoints():
    """A local OAuth2 token endpoint (the key's token_uri) and IAM Credentials generateAccessToken."""
    seen: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            seen.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
            if self.path == "/token":
                reply = {"access_token": "source-token", "expires_in": 3600, "token_type": "Bearer"}
            else:
                expires = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
                reply = {"accessToken": "impersonated-token", "expireTime": expires}
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()


@pytest.fixture
def service_account_key(google_endpoints, tmp_path, monkeypatch):
    """Ambient credentials (GOOGLE_APPLICATION_CREDENTIALS) whose tokens and impersonation are local."""
    import google.auth.iam
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    base, seen = google_endpoints
    pem = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        .decode()
    )
    key_file = tmp_path / "sa.json"
    key_file.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "p",
                "private_key_id": "1",
                "private_key": pem,
                "client_email": "worker@p.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": f"{base}/token",
            }
        )
    )
    for name in ("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", "AIRFLOW_CONN_KINETIC_AMBIENT_GOOGLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    # google-auth's IAM Credentials URL (iamcredentials.googleapis.com), pointed at the local one
    monkeypatch.setattr(google.auth.iam, "_IAM_ENDPOINT", base + "/iam/{}:generateAccessToken")
    return key_file, seen


@pytest.fixture
def gke_api(monkeypatch):
    """GKEHook.get_cluster answers ``cluster_info()``; records each call's hook settings. The
    process's cache of GKE answers starts empty: each test asks the GKE API itself."""
    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook

    from kinetic_airflow.backends.gke import client

    monkeypatch.setattr(client, "_ENDPOINTS", {})
    calls: list[dict] = []
    answer = {"info": cluster_info()}

    def get_cluster(self, name, project_id):
        calls.append(
            {
                "conn": self.gcp_conn_id,
                "chain": self.impersonation_chain,
                "identity": getattr(self.get_credentials(), "service_account_email", None),
                "name": name,
            }
        )
        return answer["info"]

    monkeypatch.setattr(GKEHook, "get_cluster", get_cluster)
    return calls, answer


def _cluster(**access):
    return {"gcp_conn_id": None, "project": "p", "location": "us-central1-a", "name": "c", **access}


@pytest.mark.parametrize(
    ("access", "endpoint", "mode"),
    [
        ({}, PUBLIC, "public"),
        ({"use_internal_ip": True}, PRIVATE, "private"),
        ({"use_dns_endpoint": True}, DNS, "dns"),
    ],
)
def test_the_endpoint_the_options_ask_for_is_used_by_the_client(
    service_account_key, gke_api, access, endpoint, mode
):
    from kinetic_airflow.backends.gke.client import api_server, endpoint_mode, resolve_gke_cluster

    cluster = resolve_gke_cluster(_cluster(**access))
    assert cluster["endpoint"] == endpoint and endpoint_mode(cluster) == mode
    server = api_server(json.loads(json.dumps(cluster)))  # what a job reference carries, as JSON
    assert server.host == f"https://{endpoint}"
    # The DNS endpoint's certificate is publicly trusted (as in the google provider): no cluster CA
    assert (server.ca_data is None) == (mode == "dns")
    assert server.ca_file is None


def test_a_missing_private_or_dns_endpoint_says_how_to_fix_it(service_account_key, gke_api):
    from kinetic_airflow.backends.gke.client import EndpointMissingError, resolve_gke_cluster

    _, answer = gke_api
    answer["info"] = cluster_info(private="", dns="")
    with pytest.raises(EndpointMissingError) as private:
        resolve_gke_cluster(_cluster(use_internal_ip=True))
    assert "has no private endpoint" in str(private.value) and "Drop use_internal_ip" in str(private.value)
    with pytest.raises(EndpointMissingError) as dns:
        resolve_gke_cluster(_cluster(use_dns_endpoint=True))
    assert "--enable-dns-access" in str(dns.value)
    with pytest.raises(EndpointMissingError, match="choose one"):
        resolve_gke_cluster(_cluster(use_internal_ip=True, use_dns_endpoint=True))


def test_impersonation_chain_reaches_the_gke_hook_and_the_kubernetes_token(service_account_key, gke_api):
    """Ambient credentials (no Airflow connection) impersonating a chain: the GKE API call and the
    Kubernetes client's bearer token both come from the impersonated service account."""
    from kinetic_airflow.backends.gke.client import api_server, resolve_gke_cluster

    _, seen = service_account_key
    calls, _ = gke_api
    cluster = resolve_gke_cluster(_cluster(use_internal_ip=True, impersonation_chain=",".join(CHAIN)))
    assert calls[0]["conn"] == "kinetic_ambient_google" and calls[0]["chain"] == CHAIN
    assert calls[0]["identity"] == CHAIN[-1]  # the hook's credentials are the impersonated account
    assert cluster["impersonation_chain"] == CHAIN
    seen.clear()
    server = api_server(json.loads(json.dumps(cluster)))  # the triggerer rebuilds it from the reference
    assert server.headers()["Authorization"] == "Bearer impersonated-token"
    iam = [r for r in seen if r["path"].startswith("/iam/")]
    assert [r["path"] for r in iam] == [f"/iam/{CHAIN[-1]}:generateAccessToken"]
    assert json.loads(iam[0]["body"])["delegates"] == [CHAIN[0]]
    assert iam[0]["auth"] == "Bearer source-token"  # the worker's own identity asked for it
    # only ids and public endpoint data travel: no token in the reference
    assert "token" not in json.dumps(cluster)


def test_without_a_chain_the_token_is_the_connections_own(service_account_key, gke_api):
    from kinetic_airflow.backends.gke.client import api_server, resolve_gke_cluster

    _, seen = service_account_key
    calls, _ = gke_api
    cluster = resolve_gke_cluster(_cluster())
    assert calls[0]["chain"] is None and calls[0]["identity"] == "worker@p.iam.gserviceaccount.com"
    assert api_server(cluster).headers()["Authorization"] == "Bearer source-token"
    assert not [r for r in seen if r["path"].startswith("/iam/")]


def test_the_gke_api_is_asked_once_per_process_for_each_cluster_and_access(service_account_key, gke_api):
    """Every GKE ``execute`` resolves its cluster; a process asks the GKE API once per connection,
    project, location, cluster and access options, and answers again from what it was told."""
    from kinetic_airflow.backends.gke.client import resolve_gke_cluster

    calls, answer = gke_api
    first = resolve_gke_cluster(_cluster())
    answer["info"] = cluster_info(private="10.9.9.9")  # not asked again: the first answer stands
    assert resolve_gke_cluster(_cluster()) == first and len(calls) == 1
    assert resolve_gke_cluster(_cluster(use_internal_ip=True))["endpoint"] == "10.9.9.9"
    resolve_gke_cluster(_cluster(impersonation_chain=CHAIN))
    resolve_gke_cluster({**_cluster(), "name": "another"})
    resolve_gke_cluster({**_cluster(), "project": "another"})
    assert [c["name"] for c in calls] == ["c", "c", "c", "another", "c"]
    assert len(calls) == 5
    assert resolve_gke_cluster(_cluster(use_internal_ip=True))["endpoint"] == "10.9.9.9"
    assert len(calls) == 5


def test_a_chain_is_another_client(service_account_key):
    from kinetic_airflow.backends.gke.client import cluster_key

    base = {**_cluster(), "endpoint": PUBLIC, "ca": CA}
    assert cluster_key(base) != cluster_key({**base, "impersonation_chain": CHAIN})
    assert cluster_key(base) != cluster_key({**base, "use_dns_endpoint": True})


def test_kinetic_config_sets_them_and_a_task_argument_wins(service_account_key, gke_api, monkeypatch):
    """[kinetic] use_internal_ip / impersonation_chain reach the operator's job reference."""
    from kinetic_airflow import KineticRunOperator
    from kinetic_airflow.job.ref import JobRef

    monkeypatch.setenv("AIRFLOW__KINETIC__USE_INTERNAL_IP", "true")
    monkeypatch.setenv("AIRFLOW__KINETIC__IMPERSONATION_CHAIN", ", ".join(CHAIN))
    monkeypatch.setenv("KINETIC_PROJECT", "p")
    monkeypatch.setenv("KINETIC_CONTAINER_IMAGE", "kinetic-runner:test")
    monkeypatch.delenv("KINETIC_KUBERNETES_CONN_ID", raising=False)
    calls, _ = gke_api
    configured = KineticRunOperator(task_id="t", python_callable=print, backend="gke")
    fields = configured._on_cluster(JobRef("j", "gke", "gs://b/jobs/j")).on_cluster()
    assert fields.cluster["endpoint"] == PRIVATE and fields.cluster["impersonation_chain"] == CHAIN
    assert calls[-1]["chain"] == CHAIN
    own = KineticRunOperator(
        task_id="t2",
        python_callable=print,
        backend="gke",
        use_internal_ip=False,
        use_dns_endpoint=True,
        impersonation_chain=CHAIN[-1],
    )
    fields = own._on_cluster(JobRef("j", "gke", "gs://b/jobs/j")).on_cluster()
    assert fields.cluster["endpoint"] == DNS and fields.cluster["impersonation_chain"] == [CHAIN[-1]]
    assert calls[-1]["chain"] == [CHAIN[-1]]


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"use_internal_ip": "false"}, TypeError, "use_internal_ip='false' is a string, not a bool"),
        ({"use_dns_endpoint": 1}, TypeError, "use_dns_endpoint=1 is an int, not a bool"),
        ({"use_internal_ip": True, "use_dns_endpoint": True}, ValueError, "choose one endpoint"),
        ({"impersonation_chain": ["kinetic"]}, ValueError, "each entry is a service account email"),
        ({"impersonation_chain": 7}, TypeError, "give a service account email or a list"),
    ],
)
@pytest.mark.parametrize("form", ["decorator", "operator"])
def test_wrong_access_options_fail_at_parse_time(options, error, says, form):
    from kinetic_airflow import KineticRunOperator, kinetic_task

    with pytest.raises(error, match=says):
        if form == "decorator":
            kinetic_task(backend="gke", **options)(lambda: 1)
        else:
            KineticRunOperator(task_id="t", python_callable=print, backend="gke", **options)
