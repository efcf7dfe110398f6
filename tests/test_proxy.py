"""Every path to the cluster's API server goes through the environment's HTTP proxy (issue 38.5).

A real Squid from Debian (``scripts/setup.sh`` installs it) stands between kinetic and the
cluster emulator, and direct connections are refused for real: the address kinetic is given for
the cluster (``Gate``) is a relay in front of the emulator that serves only connections coming
from 127.0.0.3, the source address of Squid's own connections (``tcp_outgoing_address``). Any
other connection, such as kinetic connecting directly (its source is 127.0.0.1), is reset at
once. So each request that reaches the cluster went through Squid, and a test that passes only
does so because the client chose the proxy. Everything stays on 127.0.0.0/8: every address is an
IP literal, and Squid is kept off the machine's DNS (``dns_nameservers 127.0.0.1``). Squid opens a
new connection to the gate for each request (``server_persistent_connections off``), so the gate's
count of connections it served shows that a request went through.

The GKE tier's key scenario (submit, watch, log streamed, result) runs both ways a worker and a
triggerer reach a cluster: a kubeconfig connection over plain HTTP (``HTTP_PROXY``: Squid gets
absolute URLs) and GKE credentials over HTTPS (``HTTPS_PROXY``: a ``CONNECT`` tunnel, the
certificate still verified end to end). ``NO_PROXY`` is honoured, the cncf hook's client
configuration keeps its ``no_proxy`` and ``proxy_headers``, and proxy credentials never show.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import cloudpickle
import pytest
import yaml
from cluster_emulator import ClusterEmulator, NodePool
from emulated_cluster import (
    bind_google_worker,
    google_worker_tokens,
    grant_printed_role,
    point_kinetic_at,
    product_token,
)
from jobkit import gke_job
from test_gke_access import google_endpoints, service_account_key  # noqa: F401 (fixtures)

from kinetic_airflow.backends.gke import client
from kinetic_airflow.backends.gke.client import ApiError, KubeApi, api_server
from kinetic_airflow.backends.gke.watch_cache import reset_shared_state

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(300)

PROXY_SOURCE = "127.0.0.3"  # Squid's outgoing connections come from here; the gate serves only it
SERVICE_ACCOUNT = "/api/v1/namespaces/default/serviceaccounts/kinetic"
_PROXY_ENV = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gate:
    """The cluster's address: a TCP relay to the emulator that serves only ``PROXY_SOURCE``.

    A connection from any other address is reset (``SO_LINGER`` 0) as soon as it is accepted and
    counted in ``refused``; one from the proxy is relayed byte for byte (TLS passes through)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.served = 0
        self.refused = 0
        threading.Thread(target=self._accept, daemon=True, name="gate").start()

    def _accept(self) -> None:
        while True:
            try:
                conn, (address, _) = self.listener.accept()
            except OSError:
                return
            if address != PROXY_SOURCE:
                self.refused += 1
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
                continue
            self.served += 1
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        with conn, socket.create_connection(("127.0.0.1", self.target_port)) as upstream:
            back = threading.Thread(target=_pipe, args=(upstream, conn), daemon=True)
            back.start()
            _pipe(conn, upstream)
            back.join()

    def close(self) -> None:
        self.listener.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


SQUID_CONF = """
http_port 127.0.0.1:{port}
acl loopback src 127.0.0.0/8
http_access allow loopback
http_access deny all
tcp_outgoing_address {source}
cache deny all
server_persistent_connections off
dns_nameservers 127.0.0.1
pinger_enable off
visible_hostname kinetic-test-proxy
pid_filename {folder}/squid.pid
access_log stdio:{folder}/access.log
cache_log {folder}/cache.log
coredump_dir {folder}
buffered_logs off
shutdown_lifetime 0 seconds
"""


@pytest.fixture(scope="module")
def squid():
    """A private Squid on a free loopback port; yields its URL. Stopped with SIGTERM."""
    binary = shutil.which("squid") or "/usr/sbin/squid"
    if not os.access(binary, os.X_OK):
        pytest.fail("squid is not installed: run scripts/setup.sh (it installs Debian's squid)")
    folder = Path(tempfile.mkdtemp(prefix="kinetic-squid-"))
    folder.chmod(0o777)  # Squid started as root runs as the 'proxy' user and writes its logs here
    port = _free_port()
    (folder / "squid.conf").write_text(SQUID_CONF.format(port=port, source=PROXY_SOURCE, folder=folder))
    process = subprocess.Popen(
        [binary, "-N", "-f", str(folder / "squid.conf")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            break
        if process.poll() is not None or time.monotonic() > deadline:
            log = (
                (folder / "cache.log").read_text(errors="replace") if (folder / "cache.log").exists() else ""
            )
            process.kill()
            pytest.fail(f"squid did not start: {process.stderr.read().decode()[-2000:]}{log[-2000:]}")
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def http_cluster(tmp_path_factory):
    """A plain-HTTP emulator behind a gate; yields (emulator, gate)."""
    k8s = ClusterEmulator(node_pools=[NodePool("default-pool")], work_dir=tmp_path_factory.mktemp("emu"))
    k8s.start()
    grant_printed_role(k8s.url)
    gate = Gate(k8s.port)
    yield k8s, gate
    gate.close()
    k8s.stop()


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    """An HTTPS emulator (a GKE control plane) behind a gate; yields (emulator, gate)."""
    k8s = ClusterEmulator(
        tls=True,
        node_pools=[NodePool("default-pool")],
        work_dir=tmp_path_factory.mktemp("emu-tls"),
        static_tokens=google_worker_tokens(),
    )
    k8s.start()
    bind_google_worker(k8s)  # kinetic acts as the Google identity, holding the printed Role
    gate = Gate(k8s.port)
    yield k8s, gate
    gate.close()
    k8s.stop()


@pytest.fixture
def clean_env(monkeypatch):
    """No proxy setting of the machine's, and no client or watch of an earlier test."""
    for name in _PROXY_ENV:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setattr(client, "_CLIENTS", {})
    monkeypatch.setattr(client, "_ENDPOINTS", {})
    reset_shared_state()
    yield monkeypatch
    reset_shared_state()


def _gated_kubeconfig(k8s: ClusterEmulator, gate: Gate, folder: Path, **cluster: object) -> Path:
    """A kubeconfig naming the gate as the cluster's server."""
    config = k8s.kubeconfig()
    scheme = "https" if k8s.url.startswith("https") else "http"
    config["clusters"][0]["cluster"]["server"] = f"{scheme}://127.0.0.1:{gate.port}"
    config["clusters"][0]["cluster"].update(cluster)
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def _talk(line: str, value: int) -> int:
    print(line, flush=True)
    return value * 2


def _run_to_event(ref) -> dict:
    """The trigger's code, as the triggerer runs it after a restart: built from its kwargs."""
    from kinetic_airflow.triggers import KineticJobTrigger

    trigger = KineticJobTrigger(job=ref.to_dict(), poll_interval=0.3)
    kwargs = json.dumps(trigger.serialize()[1])
    rebuilt = KineticJobTrigger(**json.loads(kwargs))

    async def first_event():
        async for event in rebuilt.run():
            return event.payload

    return asyncio.run(first_event())


def _task_log(capfd) -> str:
    """What the trigger logged: both streams, since where its logger writes depends on how the
    process's logging was configured before."""
    captured = capfd.readouterr()
    return captured.out + captured.err


def _result_summary(storage, ref) -> dict:
    from kinetic_airflow.job.layout import JobLayout

    return json.loads(storage.read_text_or_none(JobLayout(ref.job_uri).result_summary()))


def test_a_job_runs_through_the_proxy_on_a_kubeconfig_connection(
    squid, http_cluster, clean_env, tmp_path, capfd
):
    """HTTP_PROXY: the submit, the watch, the followed log (aiohttp) and the result all reach the
    cluster through Squid, and the same connection without the proxy is refused."""
    k8s, gate = http_cluster
    monkeypatch = clean_env
    point_kinetic_at(k8s, _gated_kubeconfig(k8s, gate, tmp_path), monkeypatch)
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    conn = {"kubernetes_conn_id": "kinetic_emulator"}

    refused = gate.refused
    with pytest.raises(ApiError) as direct:
        KubeApi(api_server(conn), retries=0).request("GET", SERVICE_ACCOUNT)
    assert direct.value.status == 0 and gate.refused == refused + 1

    monkeypatch.setenv("HTTP_PROXY", squid)
    monkeypatch.setattr(client, "_CLIENTS", {})
    assert api_server(conn).proxy == squid
    served, refused = gate.served, gate.refused
    _, ref, storage = gke_job("proxied", _talk, ["through-the-proxy-kubeconfig", 21])
    event = _run_to_event(ref)
    assert event["status"] == "success", event
    # the job's log line, as the trigger writes it to the task log: streamed by aiohttp via Squid.
    # To stdout or stderr, as the process's logging is configured (an earlier test module's
    # dag.test() leaves Airflow's structlog writing to stderr).
    assert "through-the-proxy-kubeconfig" in _task_log(capfd)
    summary = _result_summary(storage, ref)
    assert summary["ok"] is True and summary["value_repr"] == "42"
    assert gate.refused == refused and gate.served > served


def test_a_gke_job_runs_through_the_proxy_tunnel(squid, tls_cluster, clean_env, request, tmp_path, capfd):
    """HTTPS_PROXY with GKE credentials: the endpoint from the GKE API is reached through a
    CONNECT tunnel, its certificate verified against the cluster CA; without the proxy it is
    refused."""
    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook

    request.getfixturevalue("service_account_key")  # ambient credentials, tokens from 127.0.0.1
    k8s, gate = tls_cluster
    ca = k8s.ca_certificate_b64
    monkeypatch = clean_env
    point_kinetic_at(k8s, tmp_path / "unused", monkeypatch)
    monkeypatch.delenv("KINETIC_KUBERNETES_CONN_ID")
    monkeypatch.setenv("KINETIC_PROJECT", "p")
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    ns = types.SimpleNamespace
    info = ns(
        endpoint=f"127.0.0.1:{gate.port}", master_auth=ns(cluster_ca_certificate=k8s.ca_certificate_b64)
    )
    monkeypatch.setattr(GKEHook, "get_cluster", lambda self, name, project_id: info)
    cluster = {
        "gcp_conn_id": None,
        "project": "p",
        "location": "us-central1-a",
        "name": "c",
        "endpoint": info.endpoint,
        "ca": ca,
    }

    refused = gate.refused
    with pytest.raises(ApiError) as direct:
        KubeApi(api_server(cluster), retries=0).request("GET", SERVICE_ACCOUNT)
    assert direct.value.status == 0 and gate.refused == refused + 1

    monkeypatch.setenv("HTTPS_PROXY", squid)
    assert api_server(cluster).proxy == squid
    served, refused = gate.served, gate.refused
    _, ref, storage = gke_job("proxied-gke", _talk, ["through-the-proxy-tunnel", 4])
    assert ref.on_cluster().cluster["endpoint"] == info.endpoint
    monkeypatch.setattr(client, "_CLIENTS", {})  # the triggerer: another process, its own client
    reset_shared_state()
    event = _run_to_event(ref)
    assert event["status"] == "success", event
    assert "through-the-proxy-tunnel" in _task_log(capfd)
    summary = _result_summary(storage, ref)
    assert summary["ok"] is True and summary["value_repr"] == "8"
    assert gate.refused == refused and gate.served > served


def test_no_proxy_names_the_hosts_reached_directly(squid, http_cluster, clean_env, tmp_path):
    """NO_PROXY (addresses, domains, CIDR ranges, ``*``) sends a request straight to the server:
    the emulator's own address, with a dead proxy in HTTP_PROXY, is reached only because NO_PROXY
    names it."""
    k8s, _ = http_cluster
    monkeypatch = clean_env
    config = tmp_path / "direct"
    config.write_text(yaml.safe_dump(k8s.kubeconfig()))
    point_kinetic_at(k8s, config, monkeypatch)
    conn = {"kubernetes_conn_id": "kinetic_emulator"}
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{_free_port()}")  # nothing listens there
    with pytest.raises(ApiError) as dead:
        KubeApi(api_server(conn), retries=0).request("GET", SERVICE_ACCOUNT)
    assert dead.value.status == 0
    for no_proxy in ("127.0.0.1", ".example.com, 127.0.0.1", "127.0.0.0/8", "*"):
        monkeypatch.setenv("NO_PROXY", no_proxy)
        monkeypatch.setattr(client, "_CLIENTS", {})
        server = api_server(conn)
        assert server.proxy is None, no_proxy
        assert KubeApi(server, retries=0).request("GET", SERVICE_ACCOUNT)["metadata"]["name"] == "kinetic"
    monkeypatch.setenv("NO_PROXY", "127.0.0.2,example.com")  # names other hosts: the proxy is used
    assert api_server(conn).proxy is not None


def test_the_hook_fallback_keeps_its_proxy_no_proxy_and_headers(squid, http_cluster, clean_env, tmp_path):
    """A kubeconfig the cncf hook builds (an exec plugin): the proxy its client configuration
    read from the environment is used, with its proxy_headers, unless its no_proxy names the
    server."""
    k8s, gate = http_cluster
    monkeypatch = clean_env
    plugin = tmp_path / "auth-plugin"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "kind": "ExecCredential",
        "status": {"token": product_token(k8s.url)},  # the service account holding the printed Role
    }
    plugin.write_text(f"#!{sys.executable}\nprint({json.dumps(json.dumps(credential))})\n")
    plugin.chmod(0o755)
    path = _gated_kubeconfig(k8s, gate, tmp_path)
    config = yaml.safe_load(path.read_text())
    config["users"][0]["user"] = {
        "exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": str(plugin)}
    }
    path.write_text(yaml.safe_dump(config))
    point_kinetic_at(k8s, path, monkeypatch)
    conn = {"kubernetes_conn_id": "kinetic_emulator"}
    monkeypatch.setenv("HTTP_PROXY", squid)
    server = api_server(conn)
    assert server.built_by == "KubernetesHook" and server.proxy == squid
    served = gate.served
    assert KubeApi(server, retries=0).request("GET", SERVICE_ACCOUNT)["metadata"]["name"] == "kinetic"
    assert gate.served > served

    from kinetic_airflow.backends.gke.transport import from_client_configuration

    configuration = types.SimpleNamespace(
        host=f"http://127.0.0.1:{gate.port}",
        auth_settings=dict,
        ssl_ca_cert=None,
        cert_file=None,
        key_file=None,
        verify_ssl=True,
        tls_server_name=None,
        proxy=squid,
        no_proxy=None,
        proxy_headers={"X-Proxy-Team": "ml"},
    )
    assert from_client_configuration(configuration, "KubernetesHook").proxy_headers == {"X-Proxy-Team": "ml"}
    configuration.no_proxy = "127.0.0.0/8"
    bypassed = from_client_configuration(configuration, "KubernetesHook")
    assert bypassed.proxy is None and bypassed.proxy_headers is None


def test_proxy_credentials_become_a_header_and_are_never_shown(squid, http_cluster, clean_env, tmp_path):
    """A proxy URL with a user and password: sent as Proxy-Authorization, absent from the
    server's repr, from the URL urllib3 and aiohttp are given, and from connection errors."""
    k8s, gate = http_cluster
    monkeypatch = clean_env
    point_kinetic_at(k8s, _gated_kubeconfig(k8s, gate, tmp_path), monkeypatch)
    monkeypatch.setenv("HTTP_PROXY", squid.replace("http://", "http://ml-team:s3cr%40t@"))
    server = api_server({"kubernetes_conn_id": "kinetic_emulator"})
    assert server.proxy == squid
    expected = "Basic " + base64.b64encode(b"ml-team:s3cr@t").decode()
    assert server.proxy_headers == {"proxy-authorization": expected}
    assert "s3cr" not in repr(server) and "ml-team" not in repr(server)
    assert KubeApi(server, retries=0).request("GET", SERVICE_ACCOUNT)["metadata"]["name"] == "kinetic"
    # a proxy that cannot be reached: the error (which lands in the task log) names it, not its secret
    monkeypatch.setenv("HTTP_PROXY", f"http://ml-team:s3cr%40t@127.0.0.1:{_free_port()}")
    with pytest.raises(ApiError) as unreachable:
        KubeApi(api_server({"kubernetes_conn_id": "kinetic_emulator"}), retries=0).request(
            "GET", SERVICE_ACCOUNT
        )
    assert "127.0.0.1" in str(unreachable.value)
    assert "s3cr" not in str(unreachable.value) and "ml-team" not in str(unreachable.value)
