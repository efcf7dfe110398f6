"""Issue 18: ``kinetic-airflow doctor`` on the cluster emulator: a correctly set-up cluster passes,
and each broken set-up fails the one check it breaks, naming the fix.

The emulator is reached through a Kubernetes connection, as in tests/emulated_cluster.py; its
RBAC is the deny_verb set that its SelfSubjectAccessReviews answer from. Job storage is a
local directory, or fake GCS for the Workload Identity and bucket checks.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import kubernetes
import pytest
from cluster_emulator import ClusterEmulator, NodePool

from kinetic_airflow.backends.gke.doctor import FAIL, OK, SKIP, WARN, rbac_yaml, run_doctor

ROOT = Path(__file__).resolve().parent.parent
NS, SA = "ml", "kinetic"
GSA = "kinetic-pods@p.iam.gserviceaccount.com"
TPU = {
    "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
    "cloud.google.com/gke-tpu-topology": "2x4",
    "cloud.google.com/gke-accelerator-count": "4",
}
HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    """A cluster with CPU nodes and a two-host v6e 2x4 pool (no GPUs), namespace ml."""
    pools = [NodePool("default-pool"), NodePool("v6e-2x4", labels=TPU, node_count=2)]
    k8s = ClusterEmulator(
        node_pools=pools, namespaces=["default", NS], work_dir=tmp_path_factory.mktemp("emulator")
    )
    k8s.start()
    kubeconfig = k8s.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")
    yield k8s, kubeconfig
    k8s.stop()


@pytest.fixture
def cluster(emulator, monkeypatch, tmp_path):
    """The correct set-up, restored for every test: service account kinetic with Workload
    Identity in ml, no faults; a Kubernetes connection to it; job storage on disk."""
    k8s, kubeconfig = emulator
    k8s.clear_faults()
    core = kubernetes.client.CoreV1Api(k8s.api_client())
    if k8s.get_object("serviceaccounts", NS, SA) is not None:
        core.delete_namespaced_service_account(SA, NS)
    annotations = {"iam.gke.io/gcp-service-account": GSA}
    core.create_namespaced_service_account(NS, {"metadata": {"name": SA, "annotations": annotations}})
    conn = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}
    monkeypatch.setenv("AIRFLOW_CONN_KINETIC_DOCTOR", json.dumps(conn))
    for name, value in {
        "KINETIC_KUBERNETES_CONN_ID": "kinetic_doctor",
        "KINETIC_NAMESPACE": NS,
        "KINETIC_BASE_URI": f"file://{tmp_path}/kinetic",
        "KINETIC_CONTAINER_IMAGE": f"us-docker.pkg.dev/p/kn/kinetic:cpu-py{HERE}",
    }.items():
        monkeypatch.setenv(name, value)
    return k8s, core


def _only_failure(report, name):
    """The report failed exactly the check ``name``; returns it."""
    assert [c.name for c in report.failures()] == [name], report.render()
    assert not report.ok
    return report.check(name)


@pytest.mark.parametrize("accelerator", ["cpu", "tpu-v6e-8"])
def test_a_correctly_set_up_cluster_passes(cluster, accelerator):
    report = run_doctor(accelerator)
    assert report.ok, report.render()
    statuses = {c.name: c.status for c in report.checks}
    multi_host = accelerator == "tpu-v6e-8"
    assert statuses == {
        "settings": OK,
        "cluster": OK,
        "job storage": OK,
        "runner image": OK,
        "permissions": OK,
        "namespace": OK,
        "service account": OK,
        "workload identity": OK,
        "leaderworkerset api": OK if multi_host else SKIP,
        "accelerator nodes": OK,
        "requirements cache": OK,
    }
    assert "kubernetes connection 'kinetic_doctor'" in report.check("cluster").detail
    cache = report.check("requirements cache").detail  # no GKE API to ask whether it is Autopilot
    assert "hostPath /var/cache/kinetic/envs" in cache and "requirements_cache = emptydir" in cache
    if multi_host:
        assert "LeaderWorkerSet of 2 host(s) on pathways" in report.check("settings").detail
        assert "leaderworkersets" in report.check("permissions").detail
        assert "2 node(s) for tpu-v6e-2x4" in report.check("accelerator nodes").detail


def test_missing_namespace(cluster):
    report = run_doctor(namespace="nowhere")
    assert report.check("namespace").status == FAIL
    assert "kubectl create namespace nowhere" in report.check("namespace").fix
    # its service account cannot exist either; that check says so too
    assert "kubectl create serviceaccount kinetic -n nowhere" in report.check("service account").fix


def test_missing_service_account(cluster):
    _, core = cluster
    core.delete_namespaced_service_account(SA, NS)
    check = _only_failure(run_doctor(), "service account")
    assert "'kinetic' does not exist in namespace 'ml'" in check.detail
    assert "kubectl create serviceaccount kinetic -n ml" in check.fix
    assert "iam.gke.io/gcp-service-account=" in check.fix


def test_another_service_account_from_kinetic_config(cluster, monkeypatch):
    monkeypatch.setenv("AIRFLOW__KINETIC__SERVICE_ACCOUNT", "trainer")
    check = _only_failure(run_doctor(), "service account")
    assert "kubectl create serviceaccount trainer -n ml" in check.fix


def test_denied_create_jobs(cluster):
    k8s, _ = cluster
    k8s.deny_verb("create", "jobs")
    check = _only_failure(run_doctor(), "permissions")
    assert check.detail == "in namespace ml the identity may not: create jobs"
    assert "kinetic-airflow doctor --print-rbac --namespace ml" in check.fix


def test_denied_pod_logs(cluster):
    k8s, _ = cluster
    k8s.deny_verb("get", "pods/log")
    check = _only_failure(run_doctor(), "permissions")
    assert check.detail.endswith("may not: get pods/log")


def test_denied_watch(cluster):
    k8s, _ = cluster
    k8s.deny_verb("watch")  # list allowed, watch denied: the silent partial Role of the issue
    check = _only_failure(run_doctor(), "permissions")
    assert check.detail.startswith(
        "in namespace ml the identity may not: watch jobs, watch pods, watch events. Jobs still run, "
        "but the triggerer cannot follow the controllers' FailedCreate events"
    ), check.detail
    assert check.fix.startswith("grant them: kinetic-airflow doctor --print-rbac --namespace ml")


def _missing_account_job(monkeypatch):
    """A Job whose pods name a service account that does not exist: none is ever created."""
    from jobkit import gke_job

    monkeypatch.setenv("AIRFLOW__KINETIC__SERVICE_ACCOUNT", "nobody")
    _, ref, _ = gke_job("refused", lambda: 1, [])
    return ref


def test_a_role_without_events_warns_and_says_what_is_lost(cluster, monkeypatch):
    """Jobs run without events, so doctor warns (exit 0), but it says what the user loses: the
    controller's FailedCreate reason for a pod that cannot be created. The loss is shown too."""
    from kinetic_airflow.backends.base import JobState
    from kinetic_airflow.backends.gke.backend import k8s_job_name
    from kinetic_airflow.backends.registry import get_backend
    from kinetic_airflow.cli.main import main

    k8s, _ = cluster
    k8s.deny_verb("list", "events")
    k8s.deny_verb("watch", "events")
    report = run_doctor()
    assert report.ok, report.render()
    check = report.check("permissions")
    assert check.status == WARN
    assert check.detail == (
        "in namespace ml the identity may not: list events, watch events. Jobs still run, but kinetic "
        "cannot read the Job and StatefulSet controllers' FailedCreate events: a pod the cluster "
        "refuses to create (a ResourceQuota, a PodSecurity or webhook admission, a missing service "
        "account) then shows only as a job that did not start within startup_timeout, not with the "
        "controller's reason"
    )
    assert "kinetic-airflow doctor --print-rbac --namespace ml --rbac-user IDENTITY" in check.fix
    assert "kubectl create role kinetic-airflow-events -n ml --verb=list,watch --resource=events" in check.fix
    assert "--role=kinetic-airflow-events --user=IDENTITY" in check.fix
    assert "[warn] permissions: in namespace ml the identity may not: list events" in report.render()
    assert main(["doctor", "cpu"]) == 0  # a warning, not a failure

    # What doctor says is lost, on the cluster: the Job controller reports why it cannot create
    # the pod, but with this Role the status read (the worker's look) cannot see it.
    backend = get_backend("gke")
    ref = _missing_account_job(monkeypatch)
    name = k8s_job_name(ref)
    try:
        deadline = time.monotonic() + 30
        while not any(e.get("reason") == "FailedCreate" for e in k8s.events_for(NS, name)):
            assert time.monotonic() < deadline, k8s.events_for(NS, name)
            time.sleep(0.2)
        blind = backend.status(ref)
        assert (blind.state, blind.reason, blind.message) == (
            JobState.PENDING,
            "NoPod",
            "waiting for the Job's pod to be created",
        ), blind
        k8s.clear_faults()  # the Role with events: the same look names the cause
        told = backend.status(ref)
        assert told.reason == "FailedCreate", told
        assert 'serviceaccount "nobody" not found' in told.message, told
    finally:
        backend.cancel(ref)


def test_denied_leaderworkersets_for_a_multi_host_accelerator(cluster):
    k8s, _ = cluster
    k8s.deny_verb("delete", "leaderworkersets")
    check = _only_failure(run_doctor("tpu-v6e-8"), "permissions")
    assert check.detail.endswith("may not: delete leaderworkersets")
    assert run_doctor("cpu").ok  # the single-host backend does not need them


def test_missing_leaderworkerset_api_for_a_multi_host_accelerator(cluster):
    k8s, _ = cluster
    # what a cluster without the LWS CRD answers for its group
    k8s.inject_api_fault("GET", r"^/apis/leaderworkerset\.x-k8s\.io$", 404, count=None)
    check = _only_failure(run_doctor("tpu-v6e-8"), "leaderworkerset api")
    assert "serves no leaderworkerset.x-k8s.io API" in check.detail and "spans 2 hosts" in check.detail
    assert "kubectl apply --server-side -f https://github.com/kubernetes-sigs/lws/releases" in check.fix
    assert run_doctor("tpu-v6e-8t").check("leaderworkerset api").status == SKIP  # one host: not needed


def test_no_node_can_provide_the_accelerator(cluster):
    check = _only_failure(run_doctor("gpu-l4"), "accelerator nodes")
    assert "no node carries cloud.google.com/gke-accelerator=nvidia-l4" in check.detail
    assert "gcloud container node-pools create" in check.fix
    assert "--accelerator type=nvidia-l4,count=1" in check.fix
    check = _only_failure(run_doctor("tpu-v5p-8"), "accelerator nodes")  # a TPU of another type
    assert "--machine-type ct5p-hightpu-4t --tpu-topology 2x2x2 --num-nodes 2" in check.fix  # 2 hosts


def test_image_for_another_python(cluster):
    check = _only_failure(
        run_doctor(container_image="us-docker.pkg.dev/p/kn/kinetic:cpu-py3.9"), "runner image"
    )
    assert f"Python 3.9 but this Airflow worker runs Python {HERE}" in check.detail
    assert f"kinetic-airflow image --python {HERE}, then set [kinetic] container_image" in check.fix


def test_unreachable_endpoint(cluster, monkeypatch, tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "x"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    conn = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}
    monkeypatch.setenv("AIRFLOW_CONN_GONE", json.dumps(conn))
    report = run_doctor(kubernetes_conn_id="gone")
    check = _only_failure(report, "cluster")
    assert "did not answer" in check.detail and "check the server URL" in check.fix
    assert {c.name for c in report.checks if c.status == SKIP} == {
        "permissions",
        "namespace",
        "service account",
        "leaderworkerset api",
        "accelerator nodes",
        "requirements cache",
    }


def test_missing_workload_identity_annotation_with_gcs_storage(cluster, gcs_bucket, monkeypatch):
    _, core = cluster
    monkeypatch.setenv("KINETIC_BASE_URI", gcs_bucket + "/kinetic")
    assert run_doctor().ok  # annotated: the pods act as GSA
    core.patch_namespaced_service_account(
        SA, NS, {"metadata": {"annotations": {"iam.gke.io/gcp-service-account": None}}}
    )
    check = _only_failure(run_doctor(), "workload identity")
    assert "has no iam.gke.io/gcp-service-account annotation" in check.detail
    assert "kubectl annotate serviceaccount kinetic -n ml iam.gke.io/gcp-service-account=" in check.fix
    assert "roles/iam.workloadIdentityUser" in check.fix and "roles/storage.objectUser" in check.fix


def test_job_storage_this_machine_cannot_use(cluster, fake_gcs, monkeypatch):
    monkeypatch.setenv("KINETIC_BASE_URI", "gs://no-such-bucket-kinetic/kinetic")
    check = _only_failure(run_doctor(), "job storage")
    assert "gcloud storage buckets create gs://no-such-bucket-kinetic" in check.fix


def test_a_namespaced_role_that_may_not_list_nodes_warns(cluster):
    """Listing nodes needs a ClusterRole; without one (and without GKE's node pools) doctor cannot tell."""
    k8s, _ = cluster
    k8s.inject_api_fault("GET", r"^/api/v1/nodes$", 403, count=None)
    report = run_doctor("gpu-l4")
    assert report.ok and report.check("accelerator nodes").status == WARN


def test_cli_exit_code_and_json(cluster):
    k8s, _ = cluster
    k8s.deny_verb("get", "pods/log")
    from kinetic_airflow.cli.main import main

    assert main(["doctor", "cpu"]) == 1
    k8s.clear_faults()
    assert main(["doctor", "cpu"]) == 0


def test_cli_json_in_a_process(cluster):
    """The installed command, a separate process with the same environment."""
    import os

    result = subprocess.run(
        [sys.executable, "-m", "kinetic_airflow.cli", "doctor", "gpu-l4", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ},
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is False
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert [c["name"] for c in failed] == ["accelerator nodes"] and "node-pools create" in failed[0]["fix"]


def test_print_rbac_is_the_documented_role_and_kubectl_can_read_it(capsys):
    from kinetic_airflow.cli.main import main

    assert (
        main(
            [
                "doctor",
                "--print-rbac",
                "--namespace",
                "ml",
                "--rbac-user",
                "airflow@p.iam.gserviceaccount.com",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert printed == rbac_yaml("ml", "airflow@p.iam.gserviceaccount.com")
    guide = (ROOT / "docs/how-to/doctor.md").read_text()
    start = guide.index("<!-- rbac -->")
    block = guide[start:].split("```yaml\n", 1)[1].split("```", 1)[0]
    assert block == rbac_yaml(), "the docs' Role must be `kinetic-airflow doctor --print-rbac`'s"
    import yaml

    role, binding = list(yaml.safe_load_all(printed))
    assert role["kind"] == "Role" and binding["roleRef"]["name"] == role["metadata"]["name"]
    granted = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    from kinetic_airflow.backends.gke.doctor import REQUIRED_RULES

    assert granted == {(g, r, v) for g, r, verbs, _ in REQUIRED_RULES for v in verbs}
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "airflow@p.iam.gserviceaccount.com"}
    ]


def test_an_api_error_fails_that_check_and_the_others_still_run(cluster):
    k8s, _ = cluster
    k8s.inject_api_fault("GET", r"^/api/v1/namespaces/ml$", 500, count=None)
    report = run_doctor()
    check = _only_failure(report, "namespace")
    assert check.detail.startswith("could not check: Kubernetes API error 500")
    assert report.check("accelerator nodes").status == OK


def test_gke_options_with_a_kubernetes_connection_warn(cluster):
    report = run_doctor(use_internal_ip=True)
    assert report.ok and report.check("settings").status == WARN
    assert "use_internal_ip set, but the cluster is reached through kubernetes connection" in (
        report.check("settings").detail
    )
