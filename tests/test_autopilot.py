"""Issue 38 item 6: a job with ``requirements=`` runs on GKE Autopilot.

The emulator in its Autopilot mode (``ClusterEmulator(autopilot=True)``) refuses writable
hostPath volumes with GKE Warden's message, as Autopilot does. It serves HTTPS, so it stands
where a GKE control plane stands; the GKE API (only ``GKEHook.get_cluster``, replaced as in
tests/test_gke_private_endpoint.py) answers ``autopilot.enabled``. With the default
``[kinetic] requirements_cache = auto`` the product reads that field and caches the job's
environment in an emptyDir; an explicit ``hostpath`` is refused before anything is created,
naming the setting; ``doctor`` says which cache the cluster gets.
"""

from __future__ import annotations

import asyncio
import sys
import types

import cloudpickle
import pytest
from cluster_emulator import ClusterEmulator, NodePool
from emulated_cluster import bind_google_worker, google_worker_tokens, point_kinetic_at
from jobkit import gke_job
from test_gke_access import google_endpoints, service_account_key  # noqa: F401 (fixtures)
from test_shipping import _wheel

from kinetic_airflow.backends.gke.backend import k8s_job_name
from kinetic_airflow.backends.gke.doctor import FAIL, OK, run_doctor
from kinetic_airflow.backends.gke.volumes import RequirementsCacheError

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(600)


def _ns(**kw):
    return types.SimpleNamespace(**kw)


@pytest.fixture(scope="module")
def autopilot_emulator(tmp_path_factory):
    k8s = ClusterEmulator(
        tls=True,
        autopilot=True,
        node_pools=[NodePool("default-pool")],
        work_dir=tmp_path_factory.mktemp("emu"),
        static_tokens=google_worker_tokens(),
    )
    k8s.start()
    bind_google_worker(k8s)  # kinetic acts as the Google identity, holding the printed Role
    yield k8s, k8s.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")
    k8s.stop()


@pytest.fixture
def gke_autopilot(autopilot_emulator, request, monkeypatch, tmp_path):
    """GKE settings for an Autopilot cluster whose endpoint is the emulator; a local wheelhouse."""
    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook

    from kinetic_airflow.backends.gke import client

    request.getfixturevalue("service_account_key")  # ambient credentials with local tokens
    k8s, kubeconfig = autopilot_emulator
    point_kinetic_at(k8s, kubeconfig, monkeypatch)
    monkeypatch.delenv("KINETIC_KUBERNETES_CONN_ID")
    monkeypatch.setenv("KINETIC_PROJECT", "p")
    monkeypatch.setenv("KINETIC_CLUSTER", "autopilot-1")
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    monkeypatch.setattr(client, "_CLIENTS", {})
    house = tmp_path / "wheelhouse"
    _wheel(house)
    for name, value in {
        "PIP_FIND_LINKS": house,
        "PIP_NO_INDEX": "1",
        "UV_FIND_LINKS": house,
        "UV_NO_INDEX": "1",
    }.items():
        monkeypatch.setenv(name, str(value))
    info = _ns(
        endpoint=f"127.0.0.1:{k8s.port}",
        master_auth=_ns(cluster_ca_certificate=k8s.ca_certificate_b64),
        private_cluster_config=_ns(private_endpoint=""),
        control_plane_endpoints_config=_ns(dns_endpoint_config=_ns(endpoint="")),
        node_pools=[],
        autopilot=_ns(enabled=True),
        autoscaling=_ns(enable_node_autoprovisioning=False, resource_limits=[]),
    )
    monkeypatch.setattr(GKEHook, "get_cluster", lambda self, name, project_id: info)
    return k8s, info


def uses_tiny() -> str:
    import kn_tiny

    return kn_tiny.VALUE


def _first_event(ref) -> dict:
    from kinetic_airflow.triggers import KineticJobTrigger

    trigger = KineticJobTrigger(job=ref.to_dict(), poll_interval=0.3)

    async def first():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(first())


def test_a_requirements_job_runs_on_autopilot_with_an_empty_dir_cache(gke_autopilot):
    k8s, _ = gke_autopilot
    tiny = ["kn-tiny==0.1"]  # the runner reads them from the job's manifest, as the operator writes it
    _, ref, _ = gke_job(
        "needs-tiny", uses_tiny, [], operator_kwargs={"requirements": tiny}, manifest={"requirements": tiny}
    )
    assert ref.on_cluster().cluster["autopilot"] is True  # read from the GKE API's Cluster
    (job,) = [j for j in k8s.list_objects("jobs", "default") if j["metadata"]["name"] == k8s_job_name(ref)]
    volumes = job["spec"]["template"]["spec"]["volumes"]
    assert {"name": "kinetic-envs", "emptyDir": {}} in volumes
    assert not any("hostPath" in v for v in volumes)
    event = _first_event(ref)
    assert event["status"] == "success", event
    pods = [
        p
        for p in k8s.list_objects("pods", "default")
        if p["metadata"]["name"].startswith(job["metadata"]["name"])
    ]
    assert pods and all(p["status"]["phase"] == "Succeeded" for p in pods)


def test_an_explicit_host_path_cache_is_refused_naming_the_setting(gke_autopilot, monkeypatch):
    k8s, _ = gke_autopilot
    monkeypatch.setenv("AIRFLOW__KINETIC__REQUIREMENTS_CACHE", "hostpath")
    before = len(k8s.list_objects("jobs", "default"))
    with pytest.raises(RequirementsCacheError) as caught:
        gke_job("hostpath-cache", uses_tiny, [], operator_kwargs={"requirements": ["kn-tiny==0.1"]})
    message = str(caught.value)
    assert "requirements_cache = hostpath" in message and "'autopilot-1' is Autopilot" in message
    assert "set [kinetic] requirements_cache = auto or emptydir" in message
    assert len(k8s.list_objects("jobs", "default")) == before  # nothing was created


def test_doctor_says_which_cache_autopilot_gets(gke_autopilot, monkeypatch):
    check = run_doctor().check("requirements cache")
    assert check.status == OK, check
    assert "GKE Autopilot, which refuses writable hostPath volumes" in check.detail
    assert "an emptyDir per pod" in check.detail
    monkeypatch.setenv("AIRFLOW__KINETIC__REQUIREMENTS_CACHE", "hostpath")
    check = run_doctor().check("requirements cache")
    assert check.status == FAIL and "requirements_cache = auto" in check.fix
    _, info = gke_autopilot
    info.autopilot.enabled = False  # a Standard cluster: the node's hostPath
    check = run_doctor().check("requirements cache")
    assert check.status == OK and "GKE Standard" in check.detail and "/var/cache/kinetic/envs" in check.detail
