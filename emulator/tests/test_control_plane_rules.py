"""The real controllers' and API server's rules that decide whether a pod ever exists:
LeaderWorkerSets through StatefulSets (and the 63-character revision label), ServiceAccount,
ResourceQuota and PodSecurity admission surfacing as FailedCreate, kubelet's image pull
back-off with a transient failure, and RBAC's 403 for an identity without ``watch``."""

from __future__ import annotations

from typing import Any

import pytest
from cluster_emulator import ClusterEmulator, wait_until
from emu_helpers import NS, PY, api_error, job_manifest, pod_manifest, wait_pod
from kubernetes import client
from kubernetes.client.rest import ApiException

GROUP, VERSION, PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"


@pytest.fixture
def apis(k8s_api_client: client.ApiClient) -> tuple[client.CoreV1Api, client.BatchV1Api, Any, Any]:
    return (
        client.CoreV1Api(k8s_api_client),
        client.BatchV1Api(k8s_api_client),
        client.CustomObjectsApi(k8s_api_client),
        client.AppsV1Api(k8s_api_client),
    )


def _lws(name: str, size: int = 2) -> dict[str, Any]:
    container = {"name": "w", "image": "runner:1", "command": [PY, "-c", "import time; time.sleep(60)"]}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": size,
                "workerTemplate": {"spec": {"containers": [container], "terminationGracePeriodSeconds": 1}},
            },
        },
    }


def _events(core: client.CoreV1Api, name: str, reason: str, ns: str = NS) -> list[client.CoreV1Event]:
    return [
        e
        for e in core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
        if e.reason == reason
    ]


def test_lws_pods_come_from_a_leader_and_a_worker_statefulset(apis):
    core, _, custom, apps = apis
    name = "n" * 50  # the longest name whose worker StatefulSet's revision label still fits
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, _lws(name))
    wait_pod(core, f"{name}-0-1", "Running")
    leader_sts = apps.read_namespaced_stateful_set(name, NS)
    worker_sts = apps.read_namespaced_stateful_set(f"{name}-0", NS)
    assert leader_sts.metadata.owner_references[0].kind == "LeaderWorkerSet"
    leader = core.read_namespaced_pod(f"{name}-0", NS)
    assert worker_sts.metadata.owner_references[0].kind == "Pod"
    assert worker_sts.metadata.owner_references[0].uid == leader.metadata.uid
    worker = core.read_namespaced_pod(f"{name}-0-1", NS)
    for pod, sts in ((leader, name), (worker, f"{name}-0")):
        revision = pod.metadata.labels["controller-revision-hash"]
        assert revision.startswith(f"{sts}-") and len(revision) <= 63
        assert pod.metadata.owner_references[0].name == sts
    # deleting the LWS takes its StatefulSets and pods along (ownerReferences, as the GC does)
    custom.delete_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, name, body=client.V1DeleteOptions(propagation_policy="Foreground")
    )
    wait_until(lambda: not core.list_namespaced_pod(NS).items, timeout=30, message="pods gone")
    wait_until(lambda: not apps.list_namespaced_stateful_set(NS).items, timeout=30, message="sts gone")


def test_a_statefulset_name_too_long_for_the_revision_label_gets_no_pods(apis):
    core, _, custom, _ = apis
    name = "keras-pathways-" + "j" * 42  # 57 characters: what kinetic-airflow used to make
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, _lws(name))
    events = wait_until(lambda: _events(core, name, "FailedCreate"), timeout=30)
    message = events[0].message
    assert events[0].involved_object.kind == "StatefulSet"
    assert message.startswith(f"create Pod {name}-0 in StatefulSet {name} failed error: ")
    assert "metadata.labels: Invalid value" in message and "must be no more than 63 characters" in message
    assert not core.list_namespaced_pod(NS).items  # the LWS status shows nothing more than that


def test_service_account_admission_refuses_pods_and_the_job_says_failed_create(apis):
    core, batch, _, _ = apis
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod_manifest("lonely", serviceAccountName="nope"))
    assert caught.value.status == 403
    assert api_error(caught.value)["message"] == (
        'pods "lonely" is forbidden: error looking up service account default/nope: '
        'serviceaccount "nope" not found'
    )
    batch.create_namespaced_job(NS, job_manifest("sa-job", "pass", pod_spec={"serviceAccountName": "nope"}))
    events = wait_until(lambda: _events(core, "sa-job", "FailedCreate"), timeout=30)
    assert events[0].message == (
        'Error creating: pods "sa-job-" is forbidden: error looking up service account '
        'default/nope: serviceaccount "nope" not found'
    )
    job = batch.read_namespaced_job("sa-job", NS)
    assert not job.status.active and not job.status.failed and not job.status.conditions
    # the default cluster is as `kinetic up` leaves it: the kinetic account exists in default
    core.create_namespaced_pod(NS, pod_manifest("with-kinetic", serviceAccountName="kinetic"))
    wait_pod(core, "with-kinetic", "Succeeded")


def test_resource_quota_refuses_pods_over_it(apis):
    core, batch, _, _ = apis
    core.create_namespaced_resource_quota(
        NS,
        {"metadata": {"name": "two-pods"}, "spec": {"hard": {"pods": "1", "requests.google.com/tpu": "4"}}},
    )
    core.create_namespaced_pod(NS, pod_manifest("first", "import time; time.sleep(30)"))
    wait_pod(core, "first", "Running")
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod_manifest("second"))
    assert api_error(caught.value)["message"] == (
        'pods "second" is forbidden: exceeded quota: two-pods, '
        "requested: pods=1, used: pods=1, limited: pods=1"
    )
    batch.create_namespaced_job(NS, job_manifest("quota-job", "pass"))
    events = wait_until(lambda: _events(core, "quota-job", "FailedCreate"), timeout=30)
    assert "exceeded quota: two-pods" in events[0].message
    core.create_namespaced_resource_quota(
        NS, {"metadata": {"name": "limits"}, "spec": {"hard": {"limits.cpu": "8"}}}
    )
    core.delete_namespaced_pod("first", NS, grace_period_seconds=0)
    wait_until(lambda: not [p for p in core.list_namespaced_pod(NS).items if p.metadata.name == "first"])
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod_manifest("no-limits"))
    assert api_error(caught.value)["message"] == (
        'pods "no-limits" is forbidden: failed quota: limits: must specify limits.cpu for: main'
    )


def test_pod_security_admission_enforces_the_namespace_level(apis):
    core, batch, _, _ = apis
    core.create_namespace(
        {"metadata": {"name": "base", "labels": {"pod-security.kubernetes.io/enforce": "baseline"}}}
    )
    core.create_namespace(
        {"metadata": {"name": "strict", "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    host_path = pod_manifest("cache", volumes=[{"name": "envs", "hostPath": {"path": "/var/cache/x"}}])
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod("base", host_path)
    assert api_error(caught.value)["message"] == (
        'pods "cache" is forbidden: violates PodSecurity "baseline:latest": hostPath volumes (volume "envs")'
    )
    core.create_namespaced_pod("base", pod_manifest("plain"))  # baseline allows an ordinary pod
    batch.create_namespaced_job("strict", job_manifest("strict-job", "pass"))  # the Job itself is admitted
    events = wait_until(lambda: _events(core, "strict-job", "FailedCreate", ns="strict"), timeout=30)
    message = events[0].message
    assert message.startswith(
        'Error creating: pods "strict-job-" is forbidden: violates PodSecurity "restricted:latest": '
    )
    for rule in (
        "allowPrivilegeEscalation != false",
        "unrestricted capabilities",
        "runAsNonRoot != true",
        "seccompProfile",
    ):
        assert rule in message
    compliant = pod_manifest(
        "compliant",
        securityContext={"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    )
    compliant["spec"]["containers"][0]["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    core.create_namespaced_pod("strict", compliant)


def test_a_transient_image_pull_failure_backs_off_then_runs(apis, k8s_cluster: ClusterEmulator):
    core, _, _, _ = apis
    k8s_cluster.fail_image_pulls("python:3.11-slim", times=2)
    core.create_namespaced_pod(NS, pod_manifest("flaky-registry", "print('ran', flush=True)"))
    pod = wait_pod(core, "flaky-registry", "Succeeded", timeout=60)
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0
    failed = _events(core, "flaky-registry", "Failed")  # a repeated event counts up, as the recorder's
    pulls = [e for e in failed if e.message.startswith('Failed to pull image "python:3.11-slim"')]
    assert sum(e.count for e in pulls) == 2
    assert "Error: ImagePullBackOff" in [e.message for e in failed]
    assert _events(core, "flaky-registry", "BackOff")


def test_an_identity_without_watch_gets_403_on_watch_only(apis, k8s_cluster: ClusterEmulator):
    core, batch, _, _ = apis
    k8s_cluster.deny_verb("watch", "jobs")
    assert batch.list_namespaced_job(NS).items == []  # list is still allowed
    with pytest.raises(ApiException) as caught:
        batch.list_namespaced_job(NS, watch=True, timeout_seconds=1, _preload_content=False)
    assert caught.value.status == 403
    status = api_error(caught.value)
    assert status["reason"] == "Forbidden" and status["code"] == 403
    assert status["message"] == (
        'jobs.batch is forbidden: User "system:serviceaccount:airflow:airflow" cannot watch '
        'resource "jobs" in API group "batch" in the namespace "default"'
    )
    core.list_namespaced_pod(NS, watch=True, timeout_seconds=1, _preload_content=False).release_conn()
    k8s_cluster.clear_faults()
    batch.list_namespaced_job(NS, watch=True, timeout_seconds=1, _preload_content=False).release_conn()


def test_an_identity_without_list_gets_403_on_list_and_watch_still_works(apis, k8s_cluster: ClusterEmulator):
    core, _, _, _ = apis
    k8s_cluster.deny_verb("list", "events")
    with pytest.raises(ApiException) as caught:
        core.list_namespaced_event(NS)
    assert caught.value.status == 403
    assert api_error(caught.value)["message"] == (
        'events is forbidden: User "system:serviceaccount:airflow:airflow" cannot list '
        'resource "events" in API group "" in the namespace "default"'
    )
    core.list_namespaced_pod(NS)  # only the denied resource
    core.list_namespaced_event(NS, watch=True, timeout_seconds=1, _preload_content=False).release_conn()
    k8s_cluster.clear_faults()
    core.list_namespaced_event(NS)


def test_the_new_faults_over_http(apis, k8s_cluster: ClusterEmulator):
    """The same faults for an emulator in another process (``EmulatorAdminClient``)."""
    from cluster_emulator import EmulatorAdminClient

    core, _, _, _ = apis
    admin = EmulatorAdminClient(k8s_cluster.url)
    admin.deny_verb("watch", "pods")
    with pytest.raises(ApiException) as caught:
        core.list_namespaced_pod(NS, watch=True, timeout_seconds=1, _preload_content=False)
    assert caught.value.status == 403 and 'cannot watch resource "pods"' in api_error(caught.value)["message"]
    admin.fail_image_pulls("python:3.11-slim", times=1)
    core.create_namespaced_pod(NS, pod_manifest("one-failed-pull"))
    wait_pod(core, "one-failed-pull", "Succeeded", timeout=60)
    pulls = [e for e in _events(core, "one-failed-pull", "Failed") if e.message.startswith("Failed to pull")]
    assert sum(e.count for e in pulls) == 1
    admin.clear_faults()
    core.list_namespaced_pod(NS, watch=True, timeout_seconds=1, _preload_content=False).release_conn()


def test_a_secret_key_ref_waits_for_its_secret_and_the_secret_goes_with_its_owner(apis):
    """What a job's key Secret relies on (backends/gke/job_key.py): a container whose
    ``secretKeyRef`` names a Secret that does not exist yet waits in CreateContainerConfigError
    and starts once it exists; a Secret owned by a Job is deleted with the Job."""
    import base64

    core, batch, _, _ = apis
    code = "import os, sys; sys.exit(0 if os.environ['KEY'] == 'k3y' else 3)"
    env = [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "job-key", "key": "key"}}}]
    manifest = job_manifest("keyed", code)
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] = env
    job = batch.create_namespaced_job(NS, manifest)

    def waiting_for_the_secret() -> bool:
        pods = core.list_namespaced_pod(NS, label_selector="job-name=keyed").items
        statuses = [s for p in pods for s in (p.status.container_statuses or [])]
        return any(
            s.state.waiting and s.state.waiting.reason == "CreateContainerConfigError" for s in statuses
        )

    wait_until(waiting_for_the_secret, 30, message="CreateContainerConfigError for the missing Secret")
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "keyed", "uid": job.metadata.uid}
    core.create_namespaced_secret(
        NS,
        {
            "metadata": {"name": "job-key", "ownerReferences": [owner]},
            "data": {"key": base64.b64encode(b"k3y").decode()},
        },
    )
    wait_until(
        lambda: (batch.read_namespaced_job_status("keyed", NS).status.succeeded or 0) == 1,
        60,
        message="the Job to succeed with its key",
    )
    batch.delete_namespaced_job("keyed", NS, propagation_policy="Background")
    wait_until(
        lambda: "job-key" not in [s.metadata.name for s in core.list_namespaced_secret(NS).items],
        30,
        message="the owned Secret to be deleted with its Job",
    )
