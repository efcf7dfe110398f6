"""Kueue in the emulator (kueue.py): each rule through the real API with the official client."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from cluster_emulator import ClusterEmulator, EmulatorAdminClient, NodePool, wait_until
from cluster_emulator.kueue import KueueController, queue_timestamp, workload_name
from cluster_emulator.kueue_setup import (
    kueue_queue,
    provisioning_check,
    workload_priority_class,
)
from cluster_emulator.resources import (
    JOBS,
    JOBSETS,
    KUEUE_14558,
    LWS,
    PROVISIONINGREQUESTS,
    WORKLOADS,
)
from cluster_emulator.validation import validate_crd_object
from emu_helpers import NS, PY, api_error, condition, job_manifest, wait_job
from kubernetes import client
from kubernetes.client.rest import ApiException

# The preferred version of the pinned release; every test here runs on a cluster that no longer
# serves v1beta1 (kubernetes-sigs/kueue#14558), the v1beta1 tests at the end on one that does.
G, V = "kueue.x-k8s.io", "v1beta2"


@pytest.fixture
def k8s_cluster(tmp_path: Any) -> Any:
    emulator = ClusterEmulator(work_dir=tmp_path / "k8s-emulator", unserved_versions=[KUEUE_14558])
    emulator.start()
    try:
        yield emulator
    finally:
        emulator.stop()


def queued_job(
    name: str,
    code: str = "pass",
    queue: str = "lq",
    cpu: str = "1",
    priority: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    job = job_manifest(name, code, **extra)
    job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = queue
    if priority:
        job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = priority
    job["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu}}
    return job


@pytest.fixture
def apis(k8s_cluster: ClusterEmulator) -> Any:
    api = k8s_cluster.api_client()
    yield client.BatchV1Api(api), client.CustomObjectsApi(api), client.CoreV1Api(api)
    api.close()


def wl_of(custom: client.CustomObjectsApi, batch: client.BatchV1Api, job: str) -> dict[str, Any]:
    uid = batch.read_namespaced_job(job, NS).metadata.uid
    name = workload_name(job, uid, JOBS)
    return wait_until(lambda: _get(custom, name), timeout=10, message=f"workload {name}")


def visibility(k8s: ClusterEmulator, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{k8s.url}{path}", timeout=10) as resp:
        return json.loads(resp.read())


def _get(custom: client.CustomObjectsApi, name: str) -> dict[str, Any] | None:
    try:
        return custom.get_namespaced_custom_object(G, V, NS, "workloads", name)
    except ApiException:
        return None


def cond(wl: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in (wl.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def wait_cond(
    custom: client.CustomObjectsApi, name: str, ctype: str, status: str = "True", timeout: float = 20
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        wl = _get(custom, name)
        return wl if wl and cond(wl, ctype).get("status") == status else None

    return wait_until(check, timeout=timeout, message=f"{name} {ctype}={status}")


def test_job_suspended_on_create_and_workload_fields(k8s_cluster: ClusterEmulator, apis: Any) -> None:
    batch, custom, _ = apis
    workload_priority_class(k8s_cluster, "high", 1000)
    job = queued_job("susp", priority="high", parallelism=2)
    batch.create_namespaced_job(NS, job)
    got = batch.read_namespaced_job("susp", NS)
    assert got.spec.suspend is True
    wl = wl_of(custom, batch, "susp")
    assert (
        wl["metadata"]["name"].startswith("job-susp-") and len(wl["metadata"]["name"]) == len("job-susp-") + 5
    )
    assert wl["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == got.metadata.uid
    ref = wl["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
        "Job",
        "susp",
        got.metadata.uid,
        True,
    )
    assert wl["spec"]["queueName"] == "lq" and wl["spec"]["priority"] == 1000
    assert wl["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "high",
    }  # fmt: skip
    ps = wl["spec"]["podSets"][0]
    assert ps["name"] == "main" and ps["count"] == 2
    assert ps["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"
    # no LocalQueue yet: inadmissible with upstream's message; v0.19.2 (UnadmittedWorkloadsObservability
    # off by default) gives the legacy reason Inadmissible, not Misconfigured, and no Admitted
    # condition for a Workload never admitted (SyncAdmittedCondition)
    wl = wait_cond(custom, wl["metadata"]["name"], "QuotaReserved", "False")
    assert cond(wl, "QuotaReserved")["reason"] == "Inadmissible"
    assert cond(wl, "QuotaReserved")["message"] == "LocalQueue lq doesn't exist"
    assert cond(wl, "Admitted") == {}


def test_quota_for_one_second_pending_then_runs(k8s_cluster: ClusterEmulator, apis: Any) -> None:
    batch, custom, _ = apis
    pool = {"cloud.google.com/gke-nodepool": "default-pool"}
    kueue_queue(k8s_cluster, "cq", quota={"cpu": "1"}, flavor="f1", node_labels=pool, local_queue="lq")
    batch.create_namespaced_job(NS, queued_job("first", "import time; time.sleep(1.5)"))
    first = wl_of(custom, batch, "first")["metadata"]["name"]
    wait_cond(custom, first, "Admitted")
    batch.create_namespaced_job(NS, queued_job("second", "print('second ran')"))
    second = wl_of(custom, batch, "second")["metadata"]["name"]
    wl = wait_cond(custom, second, "QuotaReserved", "False")
    qr = cond(wl, "QuotaReserved")
    assert qr["reason"] == "Pending"  # v0.19.2: the fallback of WaitingForQuota (gate off)
    assert (
        qr["message"] == "couldn't assign flavors to pod set main: "
        "insufficient unused quota for cpu in flavor f1, 1 more needed"
    )
    summary = visibility(
        k8s_cluster,
        f"/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/{NS}/localqueues/lq/pendingworkloads",
    )
    assert summary["kind"] == "PendingWorkloadsSummary"
    assert [
        (i["metadata"]["name"], i["positionInLocalQueue"], i["positionInClusterQueue"])
        for i in summary["items"]
    ] == [(second, 0, 0)]
    cq_summary = visibility(
        k8s_cluster, "/apis/visibility.kueue.x-k8s.io/v1beta2/clusterqueues/cq/pendingworkloads"
    )
    assert cq_summary["items"][0]["localQueueName"] == "lq"
    # the flavor's node labels were injected into the admitted job
    assert batch.read_namespaced_job("first", NS).spec.template.spec.node_selector == pool
    assert batch.read_namespaced_job("second", NS).spec.suspend is True
    wait_job(batch, "first", "Complete")
    wait_cond(custom, first, "Finished")
    wait_cond(custom, second, "Admitted")
    wait_job(batch, "second", "Complete")
    assert cond(_get(custom, second), "QuotaReserved")["message"] == "Quota reserved in ClusterQueue cq"


def test_priority_order(k8s_cluster: ClusterEmulator, apis: Any) -> None:
    batch, custom, _ = apis
    workload_priority_class(k8s_cluster, "low", 10)
    workload_priority_class(k8s_cluster, "high", 100)
    kueue_queue(k8s_cluster, "cq", quota={"cpu": "1"}, local_queue="lq")
    # the blocker holds the quota until both are queued (a timer could end first on a busy machine)
    batch.create_namespaced_job(NS, queued_job("blocker", "import time; time.sleep(120)"))
    wait_cond(custom, wl_of(custom, batch, "blocker")["metadata"]["name"], "Admitted")
    batch.create_namespaced_job(NS, queued_job("low1", priority="low"))
    low = wl_of(custom, batch, "low1")["metadata"]["name"]
    wait_cond(custom, low, "QuotaReserved", "False")
    # high1 too holds the quota once admitted: low1 must still be waiting when it is read
    batch.create_namespaced_job(NS, queued_job("high1", "import time; time.sleep(120)", priority="high"))
    high = wl_of(custom, batch, "high1")["metadata"]["name"]
    wait_cond(custom, high, "QuotaReserved", "False")
    summary = visibility(
        k8s_cluster, "/apis/visibility.kueue.x-k8s.io/v1beta2/clusterqueues/cq/pendingworkloads"
    )
    assert [i["metadata"]["name"] for i in summary["items"]] == [high, low]
    assert [i["positionInClusterQueue"] for i in summary["items"]] == [0, 1]
    batch.delete_namespaced_job("blocker", NS, propagation_policy="Background")
    wait_cond(custom, high, "Admitted")
    assert cond(_get(custom, low), "QuotaReserved")["status"] == "False"


def test_evict_hook_resuspends_and_requeues(k8s_cluster: ClusterEmulator, apis: Any) -> None:
    batch, custom, core = apis
    kueue_queue(k8s_cluster, "cq", quota={"cpu": "1"}, local_queue="lq")
    batch.create_namespaced_job(NS, queued_job("ev", "import time; time.sleep(30)"))
    name = wl_of(custom, batch, "ev")["metadata"]["name"]
    wait_cond(custom, name, "Admitted")

    def running() -> list[str]:
        pods = core.list_namespaced_pod(NS, label_selector="job-name=ev").items
        return [
            p.metadata.name for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp
        ]

    first_pod = wait_until(running, timeout=15)[0]
    k8s_cluster.evict_workload(NS, name, reason="Preempted", message="maintenance")
    wl = wait_cond(custom, name, "Requeued")
    assert cond(wl, "Requeued")["reason"] == "Preempted"
    assert cond(wl, "Requeued")["message"] == "maintenance"
    # the job was suspended: its pod is gone before the quota was released
    pod_names = [p.metadata.name for p in core.list_namespaced_pod(NS, label_selector="job-name=ev").items]
    assert first_pod not in pod_names or core.read_namespaced_pod(first_pod, NS).metadata.deletion_timestamp
    # quota free again: re-admitted, Evicted reset, a new pod runs
    wl = wait_cond(custom, name, "Evicted", "False")
    assert cond(wl, "Evicted")["reason"] == "QuotaReserved"
    assert cond(wl, "Evicted")["message"] == "Previously: maintenance"
    assert cond(wl, "Admitted")["status"] == "True"
    assert wait_until(lambda: [p for p in running() if p != first_pod], timeout=15)
    assert batch.read_namespaced_job("ev", NS).spec.suspend is False


def test_preemption_by_priority(k8s_cluster: ClusterEmulator, apis: Any) -> None:
    batch, custom, _ = apis
    workload_priority_class(k8s_cluster, "low", 10)
    workload_priority_class(k8s_cluster, "high", 100)
    kueue_queue(k8s_cluster, "cq", quota={"cpu": "1"}, local_queue="lq", within_cluster_queue="LowerPriority")
    batch.create_namespaced_job(NS, queued_job("victim", "import time; time.sleep(30)", priority="low"))
    victim = wl_of(custom, batch, "victim")["metadata"]["name"]
    wait_cond(custom, victim, "Admitted")
    batch.create_namespaced_job(NS, queued_job("boss", "print('boss')", priority="high"))
    boss = wl_of(custom, batch, "boss")["metadata"]["name"]
    wl = wait_cond(custom, victim, "Evicted")
    assert cond(wl, "Evicted")["reason"] == "Preempted"
    assert cond(wl, "Preempted")["reason"] == "InClusterQueue"
    assert cond(wl, "Evicted")["message"].startswith("Preempted to accommodate a workload (UID: ")
    assert "due to prioritization in the ClusterQueue" in cond(wl, "Evicted")["message"]
    wait_cond(custom, boss, "Admitted")
    wait_job(batch, "boss", "Complete")
    wait_cond(custom, victim, "Admitted", timeout=20)


def test_provisioning_delay_then_run(k8s_cluster: ClusterEmulator, apis: Any) -> None:
    batch, custom, core = apis
    provisioning_check(k8s_cluster, "dws-prov", "dws-config")
    kueue_queue(k8s_cluster, "cq", quota={"cpu": "2"}, local_queue="lq", admission_checks=["dws-prov"])
    k8s_cluster.set_provisioning(delay_seconds=1.0)
    batch.create_namespaced_job(NS, queued_job("prov", "print('provisioned run')"))
    name = wl_of(custom, batch, "prov")["metadata"]["name"]
    wl = wait_cond(custom, name, "QuotaReserved")
    assert cond(wl, "Admitted") == {}  # v0.19.2: never admitted, no Admitted condition yet
    assert wl["status"]["admissionChecks"][0]["name"] == "dws-prov"
    assert wl["status"]["admissionChecks"][0]["state"] == "Pending"
    pr_name = f"{name}-dws-prov-1"
    pr = wait_until(lambda: _pr(custom, pr_name), timeout=10)
    assert pr["spec"]["provisioningClassName"] == "queued-provisioning.gke.io"
    assert pr["spec"]["podSets"] == [{"podTemplateRef": {"name": f"ppt-{pr_name}-main"}, "count": 1}]
    assert (
        core.read_namespaced_pod_template(f"ppt-{pr_name}-main", NS).template.spec.containers[0].name
        == "main"
    )
    assert batch.read_namespaced_job("prov", NS).spec.suspend is True
    wl = wait_cond(custom, name, "Admitted")
    check = wl["status"]["admissionChecks"][0]
    assert check["state"] == "Ready"
    assert check["message"] == "Provisioning Request was successfully provisioned."
    # what the controllers wrote is valid against the vendored CRDs
    assert validate_crd_object(WORKLOADS, _get(custom, name)) == []
    assert validate_crd_object(PROVISIONINGREQUESTS, _pr(custom, pr_name)) == []
    job = wait_job(batch, "prov", "Complete")
    ann = job.spec.template.metadata.annotations
    assert ann["autoscaling.x-k8s.io/consume-provisioning-request"] == pr_name
    assert ann["autoscaling.x-k8s.io/provisioning-class-name"] == "queued-provisioning.gke.io"


def _pr(custom: client.CustomObjectsApi, name: str) -> dict[str, Any] | None:
    try:
        return custom.get_namespaced_custom_object(
            "autoscaling.x-k8s.io", "v1", NS, "provisioningrequests", name
        )
    except ApiException:
        return None


def test_provisioning_failure_rejects(k8s_cluster: ClusterEmulator, apis: Any) -> None:
    batch, custom, _ = apis
    provisioning_check(k8s_cluster, "dws-prov", "dws-config", backoff_limit_count=0)
    kueue_queue(k8s_cluster, "cq", quota={"cpu": "2"}, local_queue="lq", admission_checks=["dws-prov"])
    k8s_cluster.set_provisioning(fail=True, message="no capacity in us-central1")
    batch.create_namespaced_job(NS, queued_job("nocap"))
    name = wl_of(custom, batch, "nocap")["metadata"]["name"]
    wl = wait_cond(custom, name, "Evicted")
    assert cond(wl, "Evicted")["reason"] == "DeactivatedDueToAdmissionCheck"
    assert cond(wl, "Evicted")["message"] == (
        "The workload is deactivated due to AdmissionCheck in Rejected state: "
        '"dws-prov" (no capacity in us-central1)'
    )
    wl = wait_cond(custom, name, "QuotaReserved", "False")
    assert wl["spec"]["active"] is False
    assert batch.read_namespaced_job("nocap", NS).spec.suspend is True
    events = k8s_cluster.events_for(NS, name) if hasattr(k8s_cluster, "events_for") else []
    assert not events or any(e["reason"] == "AdmissionCheckRejected" for e in events)


def test_provisioning_retry_then_success(k8s_cluster: ClusterEmulator, apis: Any) -> None:
    batch, custom, _ = apis
    provisioning_check(k8s_cluster, "dws-prov", "dws-config", backoff_limit_count=1, backoff_base_seconds=1)
    kueue_queue(k8s_cluster, "cq", quota={"cpu": "2"}, local_queue="lq", admission_checks=["dws-prov"])
    k8s_cluster.set_provisioning(fail=True, message="stockout")
    batch.create_namespaced_job(NS, queued_job("retry"))
    name = wl_of(custom, batch, "retry")["metadata"]["name"]
    wl = wait_cond(custom, name, "Evicted")
    assert cond(wl, "Evicted")["reason"] == "AdmissionCheck"
    assert cond(wl, "Evicted")["message"] == (
        'Evicted due to AdmissionCheck in Retry state: "dws-prov" (Retrying after failure: stockout)'
    )
    assert cond(wl, "Admitted") == {}  # v0.19.2, gate off: never admitted, so never written
    k8s_cluster.set_provisioning()
    wait_until(lambda: _pr(custom, f"{name}-dws-prov-2"), timeout=15)
    wait_job(batch, "retry", "Complete", timeout=20)


def test_flex_start_max_run_duration(tmp_path: Any) -> None:
    pools = [
        NodePool(
            "flex-pool",
            labels={"cloud.google.com/gke-flex-start": "true", "pool": "flex"},
            max_run_seconds=1.0,
        )
    ]
    with ClusterEmulator(work_dir=tmp_path / "emu", node_pools=pools) as k8s:
        core = client.CoreV1Api(k8s.api_client())
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "flex"},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"pool": "flex"},
                "containers": [
                    {
                        "name": "main",
                        "image": "x",
                        "command": ["python3", "-c", "import time; time.sleep(60)"],
                    }
                ],
            },
        }
        core.create_namespaced_pod(NS, pod)
        got = wait_until(
            lambda: (p := core.read_namespaced_pod("flex", NS)) and p.status.phase == "Failed" and p,
            timeout=20,
        )
        assert got.status.reason == "Terminated"
        assert condition(got, "DisruptionTarget").status == "True"


def test_job_deletion_deletes_workload(k8s_cluster: ClusterEmulator, apis: Any) -> None:
    batch, custom, _ = apis
    kueue_queue(k8s_cluster, "cq", quota={"cpu": "1"}, local_queue="lq")
    batch.create_namespaced_job(NS, queued_job("gone", "import time; time.sleep(30)"))
    name = wl_of(custom, batch, "gone")["metadata"]["name"]
    wait_cond(custom, name, "Admitted")
    batch.delete_namespaced_job("gone", NS, propagation_policy="Background")
    wait_until(lambda: _get(custom, name) is None, timeout=15)


def test_strict_crd_validation_rejects_bad_clusterqueue(k8s_cluster: ClusterEmulator, apis: Any) -> None:
    _, custom, _ = apis
    bad = {
        "apiVersion": f"{G}/{V}",
        "kind": "ClusterQueue",
        "metadata": {"name": "bad"},
        "spec": {
            "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [{"name": "f", "resourcez": []}]}]
        },
    }
    with pytest.raises(ApiException) as exc:
        custom.create_cluster_custom_object(G, V, "clusterqueues", bad)
    assert exc.value.status == 422
    body = api_error(exc.value)
    assert body["reason"] == "Invalid"
    assert "resourcez" in body["message"] or "resources" in body["message"]


def test_inactive_clusterqueue_message(k8s_cluster: ClusterEmulator, apis: Any) -> None:
    batch, custom, _ = apis
    api = custom
    api.create_cluster_custom_object(
        G,
        V,
        "clusterqueues",
        {
            "apiVersion": f"{G}/{V}",
            "kind": "ClusterQueue",
            "metadata": {"name": "cq"},
            "spec": {
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu"],
                        "flavors": [{"name": "missing", "resources": [{"name": "cpu", "nominalQuota": "1"}]}],
                    }
                ]
            },
        },
    )
    api.create_namespaced_custom_object(
        G,
        V,
        NS,
        "localqueues",
        {
            "apiVersion": f"{G}/{V}",
            "kind": "LocalQueue",
            "metadata": {"name": "lq"},
            "spec": {"clusterQueue": "cq"},
        },
    )
    batch.create_namespaced_job(NS, queued_job("inact"))
    name = wl_of(custom, batch, "inact")["metadata"]["name"]
    wl = wait_until(
        lambda: (w := _get(custom, name)) and cond(w, "QuotaReserved").get("reason") == "Inadmissible" and w,
        timeout=10,
    )
    assert cond(wl, "QuotaReserved")["message"] == "ClusterQueue cq is inactive"
    # v0.19.2 clusterqueue.go inactiveReason: the first cause's reason, every cause in the message
    active = cond(api.get_cluster_custom_object(G, V, "clusterqueues", "cq"), "Active")
    assert (active["status"], active["reason"]) == ("False", "FlavorNotFound")
    assert active["message"] == "Can't admit new workloads: references missing ResourceFlavor(s): missing."
    api.patch_cluster_custom_object(G, V, "clusterqueues", "cq", {"spec": {"stopPolicy": "Hold"}})

    def stopped() -> dict[str, Any] | None:
        got = cond(api.get_cluster_custom_object(G, V, "clusterqueues", "cq"), "Active")
        return got if got.get("reason") == "Stopped" else None

    active = wait_until(stopped, timeout=10)
    assert active["message"] == (
        "Can't admit new workloads: is stopped, references missing ResourceFlavor(s): missing."
    )


def test_jobset_suspended_admitted_and_runs(k8s_cluster: ClusterEmulator, apis: Any) -> None:
    _, custom, _ = apis
    kueue_queue(k8s_cluster, "cq", quota={"cpu": "4"}, local_queue="lq")
    pod = {
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "command": [PY, "-c", "print('js')"],
                    "resources": {"requests": {"cpu": "1"}},
                }
            ],
        }
    }
    js = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js", "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "slice",
                    "replicas": 2,
                    "template": {"spec": {"parallelism": 2, "completions": 2, "template": pod}},
                }
            ]
        },
    }
    created = custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", NS, "jobsets", js)
    assert created["spec"]["suspend"] is True
    name = workload_name("js", created["metadata"]["uid"], JOBSETS)
    assert name.startswith("jobset-js-")
    wl = wait_cond(custom, name, "Admitted")
    assert [(p["name"], p["count"]) for p in wl["spec"]["podSets"]] == [("slice", 4)]
    assert wl["status"]["admission"]["podSetAssignments"][0]["resourceUsage"] == {"cpu": "4"}
    wait_cond(custom, name, "Finished", timeout=30)
    assert cond(_get(custom, name), "Finished")["reason"] == "Succeeded"


def test_lws_pods_gated_until_admitted(k8s_cluster: ClusterEmulator, apis: Any) -> None:
    _, custom, core = apis
    container = {
        "name": "worker",
        "image": "x",
        "command": [PY, "-c", "import time; time.sleep(30)"],
        "resources": {"limits": {"google.com/tpu": "4"}},
    }
    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "lw", "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": 2,
                "workerTemplate": {
                    "spec": {
                        "containers": [container],
                        "terminationGracePeriodSeconds": 1,
                        "nodeSelector": {
                            "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
                            "cloud.google.com/gke-tpu-topology": "2x4",
                        },
                    }
                },
            },
        },
    }
    created = custom.create_namespaced_custom_object(
        "leaderworkerset.x-k8s.io", "v1", NS, "leaderworkersets", lws
    )
    name = workload_name("lw-0", created["metadata"]["uid"], LWS)
    wl = wait_cond(custom, name, "QuotaReserved", "False")
    assert cond(wl, "QuotaReserved")["message"] == "LocalQueue lq doesn't exist"
    # v0.19.2 leaderworkerset_reconciler.go podSets: no leaderTemplate -> one pod set "main" x size
    assert [(p["name"], p["count"]) for p in wl["spec"]["podSets"]] == [("main", 2)]

    def gated() -> list[client.V1Pod]:
        pods = core.list_namespaced_pod(NS, label_selector="leaderworkerset.sigs.k8s.io/name=lw").items
        ok = len(pods) == 2 and all(
            [g.name for g in p.spec.scheduling_gates or []] == ["kueue.x-k8s.io/admission"]
            and condition(p, "PodScheduled")
            and condition(p, "PodScheduled").reason == "SchedulingGated"
            for p in pods
        )
        return pods if ok else []

    wait_until(gated, timeout=15)
    kueue_queue(k8s_cluster, "cq", quota={"google.com/tpu": "8"}, local_queue="lq")
    wait_cond(custom, name, "Admitted")

    def running() -> list[client.V1Pod]:
        pods = core.list_namespaced_pod(NS, label_selector="leaderworkerset.sigs.k8s.io/name=lw").items
        return pods if len(pods) == 2 and all(p.status.phase == "Running" for p in pods) else []

    pods = wait_until(running, timeout=20)
    assert all(not p.spec.scheduling_gates for p in pods)


def test_lws_with_leader_template_has_leader_and_worker_pod_sets(
    k8s_cluster: ClusterEmulator, apis: Any
) -> None:
    """v0.19.2 ``leaderworkerset_reconciler.go`` ``podSets``: a leaderTemplate gives "leader" x1 and
    "worker" x (size - 1), the worker pod set kept even at count 0."""
    _, custom, _ = apis
    container = {
        "name": "c",
        "image": "x",
        "command": [PY, "-c", "pass"],
        "resources": {"requests": {"cpu": "1"}},
    }

    def lws(name: str, size: int) -> dict[str, Any]:
        template = {"spec": {"containers": [container]}}
        return {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
            "spec": {
                "replicas": 1,
                "leaderWorkerTemplate": {
                    "size": size,
                    "leaderTemplate": template,
                    "workerTemplate": template,
                },
            },
        }

    for name, size, want in (
        ("lw3", 3, [("leader", 1), ("worker", 2)]),
        ("lw1", 1, [("leader", 1), ("worker", 0)]),
    ):
        created = custom.create_namespaced_custom_object(
            "leaderworkerset.x-k8s.io", "v1", NS, "leaderworkersets", lws(name, size)
        )
        wl_name = workload_name(f"{name}-0", created["metadata"]["uid"], LWS)
        wl = wait_until(lambda n=wl_name: _get(custom, n), timeout=10, message=wl_name)
        assert [(p["name"], p["count"]) for p in wl["spec"]["podSets"]] == want


def test_missing_workload_priority_class_creates_no_workload(k8s_cluster: ClusterEmulator, apis: Any) -> None:
    """v0.19.2 ``jobframework/reconciler.go`` ``prepareWorkload`` -> ``ExtractPriority``: a
    ``kueue.x-k8s.io/priority-class`` naming no WorkloadPriorityClass is a NotFound error, so no
    Workload is created (the job stays suspended) until the class exists."""
    batch, custom, _ = apis
    kueue_queue(k8s_cluster, "cq", quota={"cpu": "2"}, local_queue="lq")
    batch.create_namespaced_job(NS, queued_job("nopc", priority="later"))
    uid = batch.read_namespaced_job("nopc", NS).metadata.uid
    name = workload_name("nopc", uid, JOBS)
    with pytest.raises(TimeoutError):
        wait_until(lambda: _get(custom, name), timeout=1.5, message="no Workload without its class")
    assert batch.read_namespaced_job("nopc", NS).spec.suspend is True
    workload_priority_class(k8s_cluster, "later", 7)
    wl = wait_until(lambda: _get(custom, name), timeout=10, message=name)
    assert wl["spec"]["priority"] == 7
    assert wl["spec"]["priorityClassRef"]["name"] == "later"
    wait_cond(custom, name, "Admitted")


def test_queue_order_uses_eviction_time_only_for_pods_ready_timeout_and_admission_check() -> None:
    """v0.19.2 ``pkg/workload/workload.go`` ``Ordering.GetQueueOrderTimestamp``: an evicted
    Workload is ordered by its eviction time only when evicted by ``PodsReadyTimeout`` or
    ``AdmissionCheck``; after any other eviction (e.g. ``Preempted``) by its creation time."""

    def wl(name: str, created: str, evicted: tuple[str, str] | None = None) -> dict[str, Any]:
        conds = []
        if evicted:
            conds = [
                {"type": "Evicted", "status": "True", "reason": evicted[0], "lastTransitionTime": evicted[1]}
            ]
        return {
            "metadata": {"name": name, "uid": name, "creationTimestamp": created},
            "spec": {"priority": 0},
            "status": {"conditions": conds},
        }

    later = wl("later", "2026-01-01T00:00:10Z")
    preempted = wl("preempted", "2026-01-01T00:00:00Z", ("Preempted", "2026-01-01T00:01:00Z"))
    check = wl("check", "2026-01-01T00:00:01Z", ("AdmissionCheck", "2026-01-01T00:02:00Z"))
    timeout = wl("timeout", "2026-01-01T00:00:02Z", ("PodsReadyTimeout", "2026-01-01T00:00:30Z"))
    assert queue_timestamp(preempted) == "2026-01-01T00:00:00Z"
    assert queue_timestamp(check) == "2026-01-01T00:02:00Z"
    order = KueueController(None).queue_order([check, later, timeout, preempted])
    assert [w["metadata"]["name"] for w in order] == ["preempted", "later", "timeout", "check"]


def test_admin_api_hooks(k8s_cluster: ClusterEmulator, apis: Any) -> None:
    batch, custom, _ = apis
    admin = EmulatorAdminClient(k8s_cluster.url)
    kueue_queue(k8s_cluster, "cq", quota={"cpu": "1"}, local_queue="lq")
    provisioning_check(k8s_cluster, "dws-prov", "dws-config", backoff_limit_count=0)
    admin.set_provisioning(delay_seconds=0, fail=False, message="ok from admin")
    assert k8s_cluster.cluster.controllers.kueue.provisioning["message"] == "ok from admin"
    batch.create_namespaced_job(NS, queued_job("adm", "import time; time.sleep(30)"))
    name = wl_of(custom, batch, "adm")["metadata"]["name"]
    wait_cond(custom, name, "Admitted")
    # an upstream reason after which Kueue requeues at once (reconciler.go setRequeued)
    admin.evict_workload(NS, name, reason="NodeFailures", message="drained")
    wl = wait_cond(custom, name, "Requeued")
    assert (cond(wl, "Requeued")["reason"], cond(wl, "Requeued")["message"]) == ("NodeFailures", "drained")


@pytest.mark.parametrize("strategy", ["StrictFIFO", "BestEffortFIFO"])
def test_queueing_strategy(k8s_cluster: ClusterEmulator, apis: Any, strategy: str) -> None:
    batch, custom, _ = apis
    kueue_queue(k8s_cluster, "cq", quota={"cpu": "2"}, local_queue="lq", queueing_strategy=strategy)
    batch.create_namespaced_job(NS, queued_job("run", "import time; time.sleep(30)"))
    wait_cond(custom, wl_of(custom, batch, "run")["metadata"]["name"], "Admitted")
    batch.create_namespaced_job(NS, queued_job("big", cpu="2"))
    big = wl_of(custom, batch, "big")["metadata"]["name"]
    wait_cond(custom, big, "QuotaReserved", "False")
    batch.create_namespaced_job(NS, queued_job("small", "import time; time.sleep(30)"))
    small = wl_of(custom, batch, "small")["metadata"]["name"]
    if strategy == "BestEffortFIFO":
        wait_cond(custom, small, "Admitted")
    else:  # the head (big) blocks the queue: small stays queued behind it
        summary = wait_until(
            lambda: (
                (
                    v := visibility(
                        k8s_cluster,
                        "/apis/visibility.kueue.x-k8s.io/v1beta2/clusterqueues/cq/pendingworkloads",
                    )
                )
                and len(v["items"]) == 2
                and v
            ),
            timeout=10,
        )
        assert [i["metadata"]["name"] for i in summary["items"]] == [big, small]
        assert cond(_get(custom, small), "QuotaReserved").get("status") != "True"


def test_workload_table_and_discovery(k8s_cluster: ClusterEmulator, apis: Any) -> None:
    batch, custom, _ = apis
    batch.create_namespaced_job(NS, queued_job("tbl"))
    wl_of(custom, batch, "tbl")
    req = urllib.request.Request(
        f"{k8s_cluster.url}/apis/kueue.x-k8s.io/v1beta2/namespaces/{NS}/workloads",
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        table = json.loads(resp.read())
    assert [c["name"] for c in table["columnDefinitions"]] == [
        "Name", "Queue", "Reserved in", "Admitted", "Finished", "Age",
    ]  # fmt: skip
    assert table["rows"][0]["cells"][1] == "lq"
    doc = visibility(k8s_cluster, "/apis/visibility.kueue.x-k8s.io/v1beta2")
    names = {r["name"]: r for r in doc["resources"]}
    assert names["clusterqueues/pendingworkloads"]["kind"] == "PendingWorkloadsSummary"
    assert names["localqueues/pendingworkloads"]["namespaced"] is True
    kueue_doc = visibility(k8s_cluster, "/apis/kueue.x-k8s.io/v1beta2")
    assert {r["name"]: r.get("shortNames") for r in kueue_doc["resources"]}["workloads"] == [
        "kwl", "kueueworkload", "kueueworkloads",
    ]  # fmt: skip


# How kubernetes-sigs/kueue v0.19.2 sets ``Requeued`` after an eviction: the job is stopped, then
# ``pkg/controller/jobframework/reconciler.go`` ``ReconcileGenericJob`` (step 6) sets it True only
# for Preempted and NodeFailures, else False with the eviction's reason; the workload controller
# (``pkg/controller/core/workload_controller.go`` ``Reconcile``) turns it True later: after the
# backoff (BackoffFinished) or once the stopped queue runs again (...Restarted).
# reason -> (how the eviction is made, Requeued right after, Requeued when it is admitted again)
REQUEUED_AFTER = {
    "Preempted": ("hook", ("True", "Preempted"), ("True", "Preempted")),
    "NodeFailures": ("hook", ("True", "NodeFailures"), ("True", "NodeFailures")),
    "PodsReadyTimeout": ("hook", ("False", "PodsReadyTimeout"), ("True", "BackoffFinished")),
    "AdmissionCheck": ("hook", ("False", "AdmissionCheck"), ("True", "BackoffFinished")),
    "ClusterQueueStopped": (
        "clusterqueues",
        ("False", "ClusterQueueStopped"),
        ("True", "ClusterQueueRestarted"),
    ),
    "LocalQueueStopped": ("localqueues", ("False", "LocalQueueStopped"), ("True", "LocalQueueRestarted")),
}


def _requeued_history(
    custom: client.CustomObjectsApi, name: str, until: tuple[str, str], since: str
) -> list[Any]:
    """Every Requeued (status, reason) the Workload shows after resourceVersion ``since`` (taken
    before the change: the watch replays from there however late this thread starts)."""
    from kubernetes import watch

    seen: list[tuple[str, str]] = []
    w = watch.Watch()
    for event in w.stream(
        custom.list_namespaced_custom_object, G, V, NS, "workloads",
        field_selector=f"metadata.name={name}", timeout_seconds=30, resource_version=since,
    ):  # fmt: skip
        rq = cond(event["object"], "Requeued")
        pair = (rq.get("status"), rq.get("reason"))
        if rq and (not seen or seen[-1] != pair):
            seen.append(pair)
        if pair == until and cond(event["object"], "Admitted").get("status") == "True":
            w.stop()
    return seen


@pytest.mark.parametrize("reason", sorted(REQUEUED_AFTER))
def test_requeued_as_released_kueue_sets_it(k8s_cluster: ClusterEmulator, apis: Any, reason: str) -> None:
    import threading

    batch, custom, _ = apis
    how, first, last = REQUEUED_AFTER[reason]
    kueue_queue(k8s_cluster, "cq", quota={"cpu": "1"}, local_queue="lq")
    batch.create_namespaced_job(NS, queued_job("rq", "import time; time.sleep(60)"))
    name = wl_of(custom, batch, "rq")["metadata"]["name"]
    since = wait_cond(custom, name, "Admitted")["metadata"]["resourceVersion"]
    history: list[Any] = []
    watcher = threading.Thread(target=lambda: history.extend(_requeued_history(custom, name, last, since)))
    watcher.start()
    if how == "hook":
        k8s_cluster.evict_workload(NS, name, reason=reason, message="test")
    else:
        patch = {"spec": {"stopPolicy": "HoldAndDrain"}}
        if how == "clusterqueues":
            custom.patch_cluster_custom_object(G, V, how, "cq", patch)
        else:
            custom.patch_namespaced_custom_object(G, V, NS, how, "lq", patch)
        wl = wait_cond(custom, name, "Requeued", "False")
        assert (cond(wl, "Evicted")["reason"], cond(wl, "Requeued")["reason"]) == (reason, reason)
        assert cond(wl, "Admitted")["status"] == "False"  # held while the queue is stopped
        # v0.19.2 (UnadmittedWorkloadsObservability off): SyncAdmittedCondition after a first
        # admission, no checks -> NoReservation; the stopped queue blocks with the legacy reason
        assert cond(wl, "Admitted")["reason"] == "NoReservation"
        blocked = "ClusterQueue cq is inactive" if how == "clusterqueues" else "LocalQueue lq is inactive"
        wl = wait_until(
            lambda: (w := _get(custom, name)) and cond(w, "QuotaReserved").get("message") == blocked and w,
            timeout=10,
        )
        assert cond(wl, "QuotaReserved")["reason"] == "Inadmissible"
        none = {"spec": {"stopPolicy": "None"}}
        if how == "clusterqueues":
            custom.patch_cluster_custom_object(G, V, how, "cq", none)
        else:
            custom.patch_namespaced_custom_object(G, V, NS, how, "lq", none)
    watcher.join(35)
    assert history[0] == first and history[-1] == last, history
    assert cond(wait_cond(custom, name, "Admitted"), "Requeued")["status"] == "True"


# ------------------------------------------------------------------- served versions (v1beta1)
def test_v1beta1_served_deprecated_and_converted_on_the_pinned_release(tmp_path: Any) -> None:
    """The pinned release serves v1beta1 (deprecated) beside v1beta2: objects are kept in v1beta2
    and converted (apis/kueue/v1beta1/*_conversion.go); every v1beta1 answer carries the CRD's
    deprecationWarning as kube-apiserver's Warning header."""
    with ClusterEmulator(work_dir=tmp_path / "emu") as k8s:
        api = k8s.api_client()
        batch, custom = client.BatchV1Api(api), client.CustomObjectsApi(api)
        workload_priority_class(k8s, "high", 1000)
        # a v1beta1 ClusterQueue: cohort and admissionChecks read back in v1beta2's shape
        cq1 = {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "ClusterQueue",
            "metadata": {"name": "cq"},
            "spec": {"namespaceSelector": {}, "cohort": "team", "admissionChecks": ["dws-prov"]},
        }
        custom.create_cluster_custom_object(G, "v1beta1", "clusterqueues", cq1)
        cq2 = custom.get_cluster_custom_object(G, "v1beta2", "clusterqueues", "cq")
        assert cq2["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        assert cq2["spec"]["cohortName"] == "team" and "cohort" not in cq2["spec"]
        assert cq2["spec"]["admissionChecksStrategy"] == {"admissionChecks": [{"name": "dws-prov"}]}
        cq1_back = custom.get_cluster_custom_object(G, "v1beta1", "clusterqueues", "cq")
        assert cq1_back["spec"]["cohort"] == "team"
        # a Workload Kueue made (stored in v1beta2) read as v1beta1: priorityClassSource + Name
        batch.create_namespaced_job(NS, queued_job("conv", priority="high"))
        uid = batch.read_namespaced_job("conv", NS).metadata.uid
        name = workload_name("conv", uid, JOBS)
        wait_until(lambda: _get(custom, name), timeout=10)
        old = custom.get_namespaced_custom_object(G, "v1beta1", NS, "workloads", name)
        assert old["apiVersion"] == "kueue.x-k8s.io/v1beta1"
        assert (old["spec"]["priorityClassSource"], old["spec"]["priorityClassName"]) == (
            "kueue.x-k8s.io/workloadpriorityclass", "high",
        )  # fmt: skip
        assert "priorityClassRef" not in old["spec"]
        listed = custom.list_namespaced_custom_object(G, "v1beta1", NS, "workloads")
        assert listed["apiVersion"] == "kueue.x-k8s.io/v1beta1"
        assert listed["items"][0]["spec"]["priorityClassName"] == "high"
        # the deprecation warning, on v1beta1 only
        for version, warned in (("v1beta1", True), ("v1beta2", False)):
            with urllib.request.urlopen(f"{k8s.url}/apis/{G}/{version}/namespaces/{NS}/workloads") as r:
                header = r.headers.get("Warning")
            assert header == ('299 - "This version is deprecated. Use v1beta2 instead."' if warned else None)
        group = visibility(k8s, "/apis/kueue.x-k8s.io")
        assert [v["version"] for v in group["versions"]] == ["v1beta2", "v1beta1"]
        assert group["preferredVersion"]["version"] == "v1beta2"
        api.close()


def test_unserved_versions_are_404_and_gone_from_discovery(k8s_cluster: ClusterEmulator) -> None:
    """kubernetes-sigs/kueue#14558 (this module's cluster): v1beta1 is a 404 as on a real API
    server, for the CRDs and the visibility API alike; v1beta2 is all discovery lists."""
    for path in (
        f"/apis/{G}/v1beta1/namespaces/{NS}/workloads",
        f"/apis/{G}/v1beta1",
        "/apis/visibility.kueue.x-k8s.io/v1beta1/clusterqueues/cq/pendingworkloads",
    ):
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(f"{k8s_cluster.url}{path}", timeout=10)
        assert caught.value.code == 404, path
    groups = {g["name"]: g for g in visibility(k8s_cluster, "/apis")["groups"]}
    for group in (G, "visibility.kueue.x-k8s.io"):
        assert [v["version"] for v in groups[group]["versions"]] == ["v1beta2"]
    assert [v["version"] for v in groups["autoscaling.x-k8s.io"]["versions"]] == ["v1", "v1beta1"]


def test_unserve_option_is_checked_and_on_the_command_line(capsys: Any) -> None:
    from cluster_emulator.__main__ import parse_args
    from cluster_emulator.resources import check_unserved

    assert check_unserved([KUEUE_14558]) == ("kueue.x-k8s.io/v1beta1", "visibility.kueue.x-k8s.io/v1beta1")
    with pytest.raises(ValueError, match=r"cannot unserve 'kueue.x-k8s.io/v9': .* choose from .*kueue#14558"):
        check_unserved(["kueue.x-k8s.io/v9"])
    with pytest.raises(SystemExit):  # a usage error naming the choices, not a traceback
        parse_args(["--unserve", "kueue.x-k8s.io/v9"])
    assert "error: cannot unserve 'kueue.x-k8s.io/v9'" in capsys.readouterr().err
    assert parse_args(["--unserve", KUEUE_14558, "--unserve", "jobset.x-k8s.io/v1alpha2"]).unserve == [
        KUEUE_14558, "jobset.x-k8s.io/v1alpha2",
    ]  # fmt: skip


# --------------------------------------------------------------------- the vendored CRDs
def test_vendored_crds_match_their_manifest() -> None:
    """crds/UPSTREAM.json names each release (tag and commit) and is what the files are: the
    hashes and the served/storage versions read from the YAML agree with it."""
    import hashlib

    import yaml
    from cluster_emulator import upstream

    manifest = upstream.manifest()
    assert manifest["kueue"]["tag"] == "v0.19.2" and len(manifest["kueue"]["commit"]) == 40
    for project, entry in manifest.items():
        assert (upstream.CRD_DIR / entry["license"]).is_file(), project
        for name, info in entry["files"].items():
            data = (upstream.CRD_DIR / name).read_bytes()
            assert hashlib.sha256(data).hexdigest() == info["sha256"], name
            crd = yaml.load(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            got = [(v["name"], v["served"], v["storage"]) for v in crd["spec"]["versions"]]
            assert got == [(v["name"], v["served"], v["storage"]) for v in info["versions"]], name


def test_vendor_script_records_the_release(tmp_path: Any) -> None:
    """vendor_crds.vendor reads a tag out of a bare git repository and records tag and commit."""
    import importlib.util
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "vendor_crds.py"
    spec = importlib.util.spec_from_file_location("vendor_crds", script)
    assert spec is not None and spec.loader is not None
    vendor_crds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vendor_crds)
    work = tmp_path / "jobset"
    crd_path = work / "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"
    crd_path.parent.mkdir(parents=True)
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "spec": {
            "group": "jobset.x-k8s.io",
            "names": {"plural": "jobsets", "kind": "JobSet"},
            "scope": "Namespaced",
            "versions": [{"name": "v1alpha2", "served": True, "storage": True}],
        },
    }
    crd_path.write_text(json.dumps(crd))
    (work / "LICENSE").write_text("Apache License 2.0\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(work)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "release"], check=True)
    subprocess.run([*git, "tag", "v9.9.9"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout
    out = tmp_path / "out"
    entry = vendor_crds.vendor("jobset", work / ".git", "v9.9.9", out)
    assert (entry["tag"], entry["commit"]) == ("v9.9.9", commit.strip())
    info = entry["files"]["jobset.x-k8s.io_jobsets.yaml"]
    assert info["versions"] == [{"name": "v1alpha2", "served": True, "storage": True}]
    assert (out / "LICENSE.jobset").read_text() == "Apache License 2.0\n"
    with pytest.raises(vendor_crds.VendorError, match=r"no tag 'v0.0.1'.*git --git-dir=.* tag"):
        vendor_crds.vendor("jobset", work / ".git", "v0.0.1", out)
