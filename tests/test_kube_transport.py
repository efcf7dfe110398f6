"""The Kubernetes API without the Kubernetes client library (``backends/gke/transport.py``).

Against the emulator serving HTTPS: each kubeconfig form kinetic reads itself reaches it and
verifies its certificate, with the header the form says; a form it leaves to the cncf provider
(an exec plugin) still works, through the provider's client configuration; transient errors
are retried; and a process that talks to a cluster through a connection kinetic reads never loads
``kubernetes`` (the per-task cost this module exists to save: bench/kube_client_bench.py).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from cluster_emulator import ClusterEmulator, NodePool

from kinetic_airflow.backends.gke import client
from kinetic_airflow.backends.gke.client import ApiError, KubeApi, api_server

SERVICE_ACCOUNT = "/api/v1/namespaces/default/serviceaccounts/kinetic"


@pytest.fixture(scope="module")
def tls_emulator(tmp_path_factory):
    k8s = ClusterEmulator(
        tls=True, node_pools=[NodePool("default-pool")], work_dir=tmp_path_factory.mktemp("emulator")
    )
    k8s.start()
    yield k8s
    k8s.stop()


def _kubeconfig(k8s: ClusterEmulator, *, cluster: dict | None = None, user: dict | None = None) -> dict:
    config = k8s.kubeconfig()
    config["clusters"][0]["cluster"] = cluster if cluster is not None else config["clusters"][0]["cluster"]
    config["users"][0]["user"] = user if user is not None else config["users"][0]["user"]
    return config


def _connection(monkeypatch, conn_id: str, extras: dict) -> dict:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "kubernetes", "extra": extras})
    )
    monkeypatch.setattr(client, "_CLIENTS", {})
    return {"kubernetes_conn_id": conn_id}


def _forms(k8s: ClusterEmulator, folder: Path) -> dict[str, tuple[dict, str]]:
    """Connection extras of every form kinetic reads itself, and the Authorization header each sends."""
    config = k8s.kubeconfig()
    path = folder / "config"
    path.write_text(yaml.safe_dump(config))
    # relative paths are read from the kubeconfig's folder, as kubectl and the Python client do
    (folder / "ca.crt").write_bytes(base64.b64decode(k8s.ca_certificate_b64))
    (folder / "token").write_text("from-a-file\n")
    relative = _kubeconfig(
        k8s,
        cluster={"server": config["clusters"][0]["cluster"]["server"], "certificate-authority": "ca.crt"},
        user={"tokenFile": "token"},
    )
    (folder / "relative").write_text(yaml.safe_dump(relative))
    token = f"Bearer {config['users'][0]['user']['token']}"
    return {
        "kube_config_path": ({"kube_config_path": str(path)}, token),
        "kube_config as a dict": ({"kube_config": config}, token),
        "kube_config as YAML text": ({"kube_config": yaml.safe_dump(config)}, token),
        "prefixed extra": ({"extra__kubernetes__kube_config_path": str(path)}, token),
        "relative CA file and tokenFile": (
            {"kube_config_path": str(folder / "relative")},
            "Bearer from-a-file",
        ),
    }


@pytest.mark.parametrize(
    "form",
    [
        "kube_config_path",
        "kube_config as a dict",
        "kube_config as YAML text",
        "prefixed extra",
        "relative CA file and tokenFile",
    ],
)
def test_kubeconfig_forms_kinetic_reads_reach_the_server_and_verify_it(
    tls_emulator, tmp_path, monkeypatch, form
):
    extras, header = _forms(tls_emulator, tmp_path)[form]
    server = api_server(_connection(monkeypatch, "kube_form", extras))
    assert server.built_by == "kinetic"
    assert server.host.startswith("https://") and server.verify
    assert server.headers()["Authorization"] == header
    assert KubeApi(server).request("GET", SERVICE_ACCOUNT)["metadata"]["name"] == "kinetic"


def test_an_unverifiable_certificate_is_refused_unless_verification_is_disabled(tls_emulator, monkeypatch):
    """No CA in the kubeconfig: the emulator's self-made certificate must not be trusted, unless
    the connection says ``disable_verify_ssl`` (or the kubeconfig ``insecure-skip-tls-verify``)."""
    bare = _kubeconfig(tls_emulator, cluster={"server": tls_emulator.url})
    server = api_server(_connection(monkeypatch, "kube_bare", {"kube_config": bare}))
    with pytest.raises(ApiError) as refused:
        KubeApi(server, retries=0).request("GET", SERVICE_ACCOUNT)
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
    for extras in (
        {"kube_config": bare, "disable_verify_ssl": True},
        {
            "kube_config": _kubeconfig(
                tls_emulator, cluster={"server": tls_emulator.url, "insecure-skip-tls-verify": True}
            )
        },
    ):
        server = api_server(_connection(monkeypatch, "kube_insecure", extras))
        assert not server.verify
        assert KubeApi(server).request("GET", SERVICE_ACCOUNT)["metadata"]["name"] == "kinetic"


def test_transient_errors_are_retried_and_the_last_answer_is_the_error(tls_emulator, tmp_path, monkeypatch):
    """429 and 5xx answers are retried (urllib3's ``Retry``, ``Retry-After`` honoured) up to the
    client's ``retries``; past them, or with ``retry=False``, the error is the API's own answer."""
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(tls_emulator.kubeconfig()))
    server = api_server(_connection(monkeypatch, "kube_retry", {"kube_config_path": str(path)}))
    log = tls_emulator.request_log

    def served() -> list[int | None]:
        return [r.status for r in log.since(mark) if r.path == SERVICE_ACCOUNT]

    try:
        mark = log.count
        tls_emulator.inject_api_fault("GET", "serviceaccounts/kinetic$", status=503, count=2)
        tls_emulator.inject_api_fault("GET", "serviceaccounts/kinetic$", status=429, count=1, retry_after=0.2)
        assert KubeApi(server).request("GET", SERVICE_ACCOUNT)["metadata"]["name"] == "kinetic"
        assert served() == [503, 503, 429, 200]

        mark = log.count
        tls_emulator.inject_api_fault("GET", "serviceaccounts/kinetic$", status=502, count=None)
        with pytest.raises(ApiError) as exhausted:
            KubeApi(server, retries=2).request("GET", SERVICE_ACCOUNT)
        assert exhausted.value.status == 502 and served() == [502, 502, 502]

        mark = log.count
        with pytest.raises(ApiError) as once:
            KubeApi(server).request("GET", SERVICE_ACCOUNT, retry=False)
        assert once.value.status == 502 and served() == [502]
    finally:
        tls_emulator.clear_faults()


def test_an_exec_plugin_kubeconfig_goes_through_the_providers_client_configuration(
    tls_emulator, tmp_path, monkeypatch
):
    """``gke-gcloud-auth-plugin`` and its kind: the cncf provider's KubernetesHook runs the plugin;
    kinetic sends the token it got, to the server it configured, with its CA."""
    plugin = tmp_path / "auth-plugin"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "kind": "ExecCredential",
        "status": {"token": "from-the-plugin"},
    }
    plugin.write_text(f"#!{sys.executable}\nprint({json.dumps(json.dumps(credential))})\n")
    plugin.chmod(0o755)
    config = _kubeconfig(
        tls_emulator,
        user={"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": str(plugin)}},
    )
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(config))
    server = api_server(_connection(monkeypatch, "kube_exec", {"kube_config_path": str(path)}))
    assert server.built_by == "KubernetesHook"
    assert server.headers()["Authorization"] == "Bearer from-the-plugin"
    assert server.verify and server.ca_file
    assert KubeApi(server).request("GET", SERVICE_ACCOUNT)["metadata"]["name"] == "kinetic"


def test_a_process_that_uses_a_cluster_never_loads_the_kubernetes_client(tls_emulator, tmp_path):
    """What a task process does with a cluster: the backend, the operator, a client, a request,
    a watch of the namespace. None of it may import ``kubernetes`` or ``kubernetes_asyncio``."""
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(tls_emulator.kubeconfig()))
    conn = json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": str(path)}})
    script = textwrap.dedent(
        """
        import sys
        import kinetic_airflow.operators
        import kinetic_airflow.triggers
        from kinetic_airflow.backends.gke.client import kube_api
        from kinetic_airflow.backends.gke import backend

        api = kube_api({"kubernetes_conn_id": "kube_probe"})
        api.request("GET", "/api/v1/namespaces/default/serviceaccounts/kinetic")
        stream = api.request("GET", "/api/v1/namespaces/default/pods", query={"watch": "false"}, stream=True)
        stream.release_conn()
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("kubernetes", "kubernetes_asyncio")))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "AIRFLOW_CONN_KUBE_PROBE": conn},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
