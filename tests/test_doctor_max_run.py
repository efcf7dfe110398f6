"""Issue 38 item 9c: ``cloud.google.com/gke-max-run-duration-seconds`` is a node label only node
pools the cluster autoscaler creates (node auto-provisioning, Autopilot) carry; a flex-start job
with ``max_run_duration`` selects it, so ``doctor`` checks that a pool's nodes carry the value."""

from __future__ import annotations

import json
import sys

import pytest
from cluster_emulator import ClusterEmulator, NodePool

from kinetic_airflow.backends.gke.doctor import FAIL, OK, run_doctor

HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"
L4 = {"cloud.google.com/gke-accelerator": "nvidia-l4"}
FLEX = "cloud.google.com/gke-flex-start"
MAX_RUN = "cloud.google.com/gke-max-run-duration-seconds"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    pools = [
        NodePool("default-pool"),
        NodePool("l4-flex-1h", labels={**L4, FLEX: "true", MAX_RUN: "3600"}),
    ]
    k8s = ClusterEmulator(node_pools=pools, work_dir=tmp_path_factory.mktemp("emulator"))
    k8s.start()
    yield k8s, k8s.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")
    k8s.stop()


@pytest.fixture
def cluster(emulator, monkeypatch, tmp_path):
    _, kubeconfig = emulator
    conn = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}
    monkeypatch.setenv("AIRFLOW_CONN_KINETIC_DOCTOR", json.dumps(conn))
    monkeypatch.setenv("KINETIC_KUBERNETES_CONN_ID", "kinetic_doctor")
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    monkeypatch.setenv("KINETIC_CONTAINER_IMAGE", f"us-docker.pkg.dev/p/kn/kinetic:py{HERE}")


def test_a_pool_carrying_the_run_duration_label_passes(cluster):
    report = run_doctor("gpu-l4", capacity="flex-start", max_run_duration=3600)
    check = report.check("max run duration")
    assert check.status == OK, report.render()
    assert "cloud.google.com/gke-max-run-duration-seconds=3600" in check.detail
    assert "flex-start nodes here carry it" in check.detail


def test_another_duration_than_the_pools_fails_saying_why(cluster):
    check = run_doctor("gpu-l4", capacity="flex-start", max_run_duration=7200).check("max run duration")
    assert check.status == FAIL
    assert "only node pools the cluster autoscaler creates" in check.detail
    assert "the flex-start nodes here carry 3600" in check.detail
    assert "--node-labels cloud.google.com/gke-max-run-duration-seconds=7200" in check.fix
    assert "enable node auto-provisioning" in check.fix


def test_no_check_without_a_run_duration(cluster):
    names = [c.name for c in run_doctor("gpu-l4", capacity="flex-start").checks]
    assert "max run duration" not in names
