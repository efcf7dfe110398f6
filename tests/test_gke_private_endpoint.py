"""Issue 18: a job and ``doctor`` through GKE's private endpoint, as an impersonated account.

The emulator serves HTTPS (``ClusterEmulator(tls=True)``), so it stands where a GKE control
plane stands: the GKE API (only ``GKEHook.get_cluster``, replaced as in tests/test_gke_access.py)
answers a cluster whose public endpoint is a closed port and whose private endpoint is the
emulator, with the emulator's certificate as the cluster CA. Tokens are minted for real: a
service account key through a local token endpoint, impersonated through a local IAM
Credentials endpoint. A job submitted by the worker's code and watched by the trigger's code
runs there, which it can only if both chose the private endpoint and verified its CA.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import types

import cloudpickle
import kubernetes
import pytest
from cluster_emulator import ClusterEmulator, NodePool
from emulated_cluster import point_kinetic_at
from jobkit import gke_job
from test_gke_access import CHAIN, google_endpoints, service_account_key  # noqa: F401 (fixtures)

from kinetic_airflow.backends.gke.doctor import FAIL, OK, run_doctor

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tls_emulator(tmp_path_factory):
    pools = [NodePool("default-pool")]
    k8s = ClusterEmulator(tls=True, node_pools=pools, work_dir=tmp_path_factory.mktemp("emulator"))
    k8s.start()
    kubeconfig = k8s.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")
    core = kubernetes.client.CoreV1Api(k8s.api_client())  # over HTTPS, verifying its CA
    # The emulator starts with default/kinetic, as `kinetic up` leaves a cluster.
    assert core.read_namespaced_service_account("kinetic", "default").metadata.name == "kinetic"
    yield k8s, kubeconfig
    k8s.stop()


def _ns(**kw):
    return types.SimpleNamespace(**kw)


@pytest.fixture
def gke(tls_emulator, request, monkeypatch, tmp_path):
    """GKE settings (no Kubernetes connection) for a cluster whose private endpoint is the emulator.

    Returns (emulator, the GKE API's answer, the chains GKEHook was built with, the requests
    the token and IAM endpoints saw)."""
    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook

    from kinetic_airflow.backends.gke import client

    _, seen = request.getfixturevalue("service_account_key")
    k8s, kubeconfig = tls_emulator
    point_kinetic_at(k8s, kubeconfig, monkeypatch)  # runner Python, image, no faults
    monkeypatch.delenv("KINETIC_KUBERNETES_CONN_ID")
    monkeypatch.setenv("KINETIC_PROJECT", "p")
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    monkeypatch.setattr(client, "_CLIENTS", {})  # no client of an earlier test's cluster
    monkeypatch.setattr(client, "_ENDPOINTS", {})  # nor its GKE API answer
    info = _ns(
        endpoint=f"127.0.0.1:{_closed_port()}",  # the public endpoint refuses this machine
        master_auth=_ns(cluster_ca_certificate=k8s.ca_certificate_b64),
        private_cluster_config=_ns(private_endpoint=f"127.0.0.1:{k8s.port}"),
        control_plane_endpoints_config=_ns(dns_endpoint_config=_ns(endpoint="")),
        node_pools=[],
        autopilot=_ns(enabled=False),
        autoscaling=_ns(enable_node_autoprovisioning=False, resource_limits=[]),
    )
    chains: list = []

    def get_cluster(self, name, project_id):
        chains.append(self.impersonation_chain)
        return answer["info"]

    answer = {"info": info}
    monkeypatch.setattr(GKEHook, "get_cluster", get_cluster)
    return k8s, answer, chains, seen


def test_a_job_runs_through_the_private_endpoint_as_the_impersonated_account(gke, monkeypatch):
    from kinetic_airflow.backends.gke import client
    from kinetic_airflow.triggers import KineticJobTrigger

    seen = gke[3]
    monkeypatch.setenv("KINETIC_USE_INTERNAL_IP", "true")
    monkeypatch.setenv("KINETIC_IMPERSONATION_CHAIN", ",".join(CHAIN))
    _, ref, _ = gke_job("private", sum, [[1, 2, 3]])  # the worker's resolve and submit
    cluster = ref.on_cluster().cluster
    assert cluster["endpoint"] == f"127.0.0.1:{gke[0].port}" and cluster["use_internal_ip"]
    trigger = KineticJobTrigger(job=ref.to_dict(), poll_interval=0.3)
    kwargs = json.dumps(trigger.serialize()[1])
    assert "impersonated-token" not in kwargs and "source-token" not in kwargs
    # the triggerer is another process: no client yet, it mints its own token through the chain
    monkeypatch.setattr(client, "_CLIENTS", {})
    seen.clear()
    rebuilt = KineticJobTrigger(**json.loads(kwargs))

    async def first_event():
        async for event in rebuilt.run():
            return event.payload

    event = asyncio.run(first_event())
    assert event["status"] == "success", event
    assert [r["path"] for r in seen if r["path"].startswith("/iam/")] == [
        f"/iam/{CHAIN[-1]}:generateAccessToken"
    ]
    assert gke[2] and all(chain == CHAIN for chain in gke[2])


def test_doctor_names_the_private_endpoint_and_the_identity(gke):
    report = run_doctor(use_internal_ip=True, impersonation_chain=CHAIN)
    assert report.ok, report.render()
    detail = report.check("cluster").detail
    assert f"on its private endpoint 127.0.0.1:{gke[0].port}" in detail
    assert f"as {CHAIN[-1]} (impersonated)" in detail


def test_doctor_on_the_public_endpoint_that_refuses_this_machine(gke):
    report = run_doctor()
    check = report.check("cluster")
    assert check.status == FAIL and "on its public endpoint" in check.detail
    assert "authorized networks" in check.fix and "use_internal_ip=True" in check.fix


def test_doctor_on_an_unreachable_private_endpoint_says_where_it_can_be_reached(gke):
    answer = gke[1]
    answer["info"].private_cluster_config.private_endpoint = f"127.0.0.1:{_closed_port()}"
    check = run_doctor(use_internal_ip=True).check("cluster")
    assert check.status == FAIL
    assert "reachable only from the cluster's VPC" in check.fix and "use_dns_endpoint=True" in check.fix


def test_doctor_without_container_clusters_get(gke, monkeypatch):
    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook
    from google.api_core.exceptions import PermissionDenied

    def denied(self, name, project_id):
        raise PermissionDenied(
            f"Required 'container.clusters.get' permission for 'projects/p/zones/z/clusters/{name}'"
        )

    monkeypatch.setattr(GKEHook, "get_cluster", denied)
    check = run_doctor(use_internal_ip=True).check("cluster")
    assert check.status == FAIL and "roles/container.clusterViewer" in check.fix


def test_doctor_counts_gke_node_pools_and_autopilot_when_no_node_is_up(gke):
    """No node carries nvidia-l4 (pools scale from zero): the GKE API's node pools decide."""
    answer = gke[1]
    info = answer["info"]
    check = run_doctor("gpu-l4", use_internal_ip=True).check("accelerator nodes")
    assert check.status == FAIL and "no node pool, auto-provisioning or Autopilot provides it" in check.detail
    info.node_pools = [
        _ns(
            name="l4-pool",
            config=_ns(
                machine_type="g2-standard-4", accelerators=[_ns(accelerator_type="nvidia-l4")], spot=False
            ),
            autoscaling=_ns(enabled=True, max_node_count=4),
            placement_policy=None,
            initial_node_count=0,
        )
    ]
    check = run_doctor("gpu-l4", use_internal_ip=True).check("accelerator nodes")
    assert (
        check.status == OK and "node pool 'l4-pool' provides it (autoscaling up to 4 node(s))" in check.detail
    )
    assert (
        run_doctor("gpu-l4:spot", use_internal_ip=True).check("accelerator nodes").status == FAIL
    )  # not Spot
    info.node_pools = []
    info.autoscaling = _ns(
        enable_node_autoprovisioning=True, resource_limits=[_ns(resource_type="nvidia-l4")]
    )
    assert "auto-provisioning" in run_doctor("gpu-l4", use_internal_ip=True).check("accelerator nodes").detail
    info.autoscaling = _ns(enable_node_autoprovisioning=False, resource_limits=[])
    info.autopilot = _ns(enabled=True)
    check = run_doctor("tpu-v6e-8t", use_internal_ip=True).check("accelerator nodes")
    assert check.status == OK and "Autopilot" in check.detail
