"""Scheduling against node pools, and every fault-injection hook."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest
import urllib3
from cluster_emulator import ClusterEmulator, NodePool, Taint, wait_until
from emu_helpers import NS, api_error, condition, pid_alive, pod_manifest, read_log, wait_pod
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

TPU_SELECTOR = {
    "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
    "cloud.google.com/gke-tpu-topology": "2x4",
}


@pytest.fixture
def core(k8s_api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(k8s_api_client)


def _events(core: client.CoreV1Api, name: str) -> list[client.CoreV1Event]:
    return core.list_namespaced_event(NS, field_selector=f"involvedObject.name={name}").items


def _running_pid(k8s: ClusterEmulator, pod: str) -> int:
    return wait_until(lambda: [p["pid"] for p in k8s.processes() if p["pod"] == pod], message="pod process")[
        0
    ]


# ------------------------------------------------------------------ scheduling
def test_unschedulable_node_selector_stays_pending(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(
        NS,
        pod_manifest(
            "nowhere", "pass", nodeSelector={"cloud.google.com/gke-accelerator": "nvidia-nonexistent"}
        ),
    )

    def unschedulable() -> Any:
        pod = core.read_namespaced_pod("nowhere", NS)
        cond = condition(pod, "PodScheduled")
        return pod if cond is not None and cond.reason == "Unschedulable" else None

    pod = wait_until(unschedulable)
    assert pod.status.phase == "Pending" and not pod.spec.node_name
    cond = condition(pod, "PodScheduled")
    assert cond.status == "False"
    assert re.match(
        r"^0/(\d+) nodes are available: \1 node\(s\) didn't match Pod's node affinity/selector\. "
        r"preemption: 0/\1 nodes are available: \1 Preemption is not helpful for scheduling\.$",
        cond.message,
    ), cond.message
    failed = wait_until(lambda: [e for e in _events(core, "nowhere") if e.reason == "FailedScheduling"])
    assert failed[0].type == "Warning" and failed[0].message == cond.message
    assert read_log(core, "nowhere") == ""  # like the real API server: no node, empty log


def test_tpu_pod_lands_on_tpu_pool_and_taints_are_enforced(core: client.CoreV1Api) -> None:
    # the default pools carry GKE's labels: the one-host 2x4 slice is the -8t machine
    one_host = {**TPU_SELECTOR, "cloud.google.com/gke-accelerator-count": "8"}
    tpu_container = {"resources": {"limits": {"google.com/tpu": "8"}}}
    manifest = pod_manifest("tpu", "print('on tpu')", nodeSelector=one_host)
    manifest["spec"]["containers"][0].update(tpu_container)
    core.create_namespaced_pod(NS, manifest)
    pod = wait_pod(core, "tpu", "Succeeded")
    assert "tpu-v6e-slice-8t-2x4" in pod.spec.node_name
    node = client.CoreV1Api(core.api_client).read_node(pod.spec.node_name)
    assert node.metadata.labels["cloud.google.com/gke-tpu-accelerator"] == "tpu-v6e-slice"
    assert node.metadata.labels["cloud.google.com/gke-tpu-topology"] == "2x4"
    assert node.metadata.labels["node.kubernetes.io/instance-type"] == "ct6e-standard-8t"
    assert "cloud.google.com/gke-spot" not in node.metadata.labels
    assert node.spec.taints[0].key == "google.com/tpu"

    core.create_namespaced_pod(NS, pod_manifest("no-toleration", "pass", nodeSelector=TPU_SELECTOR))

    def message() -> str | None:
        cond = condition(core.read_namespaced_pod("no-toleration", NS), "PodScheduled")
        return cond.message if cond is not None and cond.status == "False" else None

    # four 2x4 pools: -4t and -8t machines, each on-demand and Spot
    assert "4 node(s) had untolerated taint {google.com/tpu: present}" in wait_until(message)

    tolerating = pod_manifest(
        "tolerated",
        "pass",
        nodeSelector={**TPU_SELECTOR, "cloud.google.com/gke-spot": "true"},
        tolerations=[{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
    )
    core.create_namespaced_pod(NS, tolerating)
    wait_pod(core, "tolerated", "Succeeded")


def test_custom_node_pools(tmp_path) -> None:
    pools = [
        NodePool(
            "gpu",
            labels={"cloud.google.com/gke-accelerator": "nvidia-l4"},
            taints=[Taint("nvidia.com/gpu", "present")],
        )
    ]
    with ClusterEmulator(node_pools=pools, work_dir=tmp_path) as k8s, k8s.api_client() as api:
        core = client.CoreV1Api(api)
        assert [n.metadata.name for n in core.list_node().items] == [
            k8s.list_objects("nodes")[0]["metadata"]["name"]
        ]
        gpu = pod_manifest("gpu", "pass", nodeSelector={"cloud.google.com/gke-accelerator": "nvidia-l4"})
        gpu["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
        core.create_namespaced_pod(NS, gpu)
        wait_pod(core, "gpu", "Succeeded")
        core.create_namespaced_pod(NS, pod_manifest("cpu", "pass"))

        def message() -> str | None:
            cond = condition(core.read_namespaced_pod("cpu", NS), "PodScheduled")
            return cond.message if cond is not None and cond.status == "False" else None

        assert wait_until(message).startswith("0/1 nodes are available: 1 node(s) had untolerated taint")


def test_delay_scheduling_emulates_node_scale_up(
    core: client.CoreV1Api, k8s_cluster: ClusterEmulator
) -> None:
    k8s_cluster.delay_scheduling(1.5)
    core.create_namespaced_pod(NS, pod_manifest("scaled", "print('after scale-up')"))

    def pending_unschedulable() -> Any:
        cond = condition(core.read_namespaced_pod("scaled", NS), "PodScheduled")
        return cond if cond is not None and cond.reason == "Unschedulable" else None

    cond = wait_until(pending_unschedulable)
    assert "Insufficient cpu" in cond.message
    events = wait_until(lambda: [e for e in _events(core, "scaled") if e.reason == "TriggeredScaleUp"])
    assert events[0].message.startswith("pod triggered scale-up:")
    assert events[0].source.component == "cluster-autoscaler"
    pod = wait_pod(core, "scaled", "Succeeded")
    assert condition(pod, "PodScheduled").status == "True"
    assert read_log(core, "scaled") == "after scale-up\n"


# ---------------------------------------------------------------------- faults
def test_preempt_pod_like_gke_node_shutdown(core: client.CoreV1Api, k8s_cluster: ClusterEmulator) -> None:
    code = (
        "import signal, sys, time\n"
        "def bye(*_):\n    print('got SIGTERM', flush=True); sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, bye); print('ready', flush=True); time.sleep(60)\n"
    )
    core.create_namespaced_pod(NS, pod_manifest("spot", code))
    wait_until(lambda: "ready" in read_log(core, "spot"))
    k8s_cluster.preempt_pod(NS, "spot", grace_seconds=5)
    pod = wait_pod(core, "spot", "Failed")
    assert pod.status.reason == "Terminated"
    assert pod.status.message == "Pod was terminated in response to imminent node shutdown."
    disruption = condition(pod, "DisruptionTarget")
    assert (disruption.status, disruption.reason) == ("True", "TerminationByKubelet")
    assert disruption.message == "Pod was terminated in response to imminent node shutdown."
    assert pod.status.container_statuses[0].state.terminated.exit_code == 143
    assert "got SIGTERM" in read_log(core, "spot")


def test_preempt_escalates_to_sigkill_after_grace(
    core: client.CoreV1Api, k8s_cluster: ClusterEmulator
) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    core.create_namespaced_pod(NS, pod_manifest("stubborn", code))
    wait_until(lambda: "ready" in read_log(core, "stubborn"))
    pid = _running_pid(k8s_cluster, "stubborn")
    k8s_cluster.preempt_pod(NS, "stubborn", grace_seconds=0.3)
    pod = wait_pod(core, "stubborn", "Failed")
    assert pod.status.container_statuses[0].state.terminated.exit_code == 137
    wait_until(lambda: not pid_alive(pid))


def test_oom_kill_pod(core: client.CoreV1Api, k8s_cluster: ClusterEmulator) -> None:
    core.create_namespaced_pod(
        NS, pod_manifest("hungry", "import time; print('eating', flush=True); time.sleep(60)")
    )
    wait_until(lambda: "eating" in read_log(core, "hungry"))
    k8s_cluster.oom_kill_pod(NS, "hungry")
    pod = wait_pod(core, "hungry", "Failed")
    term = pod.status.container_statuses[0].state.terminated
    assert (term.exit_code, term.reason) == (137, "OOMKilled")


def test_image_pull_failures(core: client.CoreV1Api, k8s_cluster: ClusterEmulator) -> None:
    image = "gcr.io/missing/runner:v1"
    k8s_cluster.fail_image_pulls("gcr.io/missing/*")
    manifest = pod_manifest("pull", "print('pulled')")
    manifest["spec"]["containers"][0]["image"] = image

    core.create_namespaced_pod(NS, manifest)

    def waiting(reason: str) -> Any:
        cs = core.read_namespaced_pod("pull", NS).status.container_statuses
        state = cs[0].state.waiting if cs else None
        return state if state is not None and state.reason == reason else None

    assert image in wait_until(lambda: waiting("ErrImagePull")).message
    backoff = wait_until(lambda: waiting("ImagePullBackOff"))
    assert backoff.message.startswith(f'Back-off pulling image "{image}"')
    assert core.read_namespaced_pod("pull", NS).status.phase == "Pending"
    reasons = {(e.reason, e.type) for e in _events(core, "pull")}
    assert ("Failed", "Warning") in reasons and ("BackOff", "Normal") in reasons
    failed = [e.message for e in _events(core, "pull") if e.reason == "Failed"]
    assert any(f'Failed to pull image "{image}"' in m for m in failed)
    with pytest.raises(ApiException) as info:
        read_log(core, "pull")
    assert (
        info.value.status == 400
        and "waiting to start: trying and failing to pull image" in api_error(info.value)["message"]
    )
    k8s_cluster.clear_image_pull_failures()
    wait_pod(core, "pull", "Succeeded")
    assert read_log(core, "pull") == "pulled\n"


def test_api_faults_and_request_log(core: client.CoreV1Api, k8s_cluster: ClusterEmulator) -> None:
    k8s_cluster.inject_api_fault("GET", r"/api/v1/namespaces/default/pods$", status=500, count=2)
    for _ in range(2):
        with pytest.raises(ApiException) as info:
            core.list_namespaced_pod(NS)
        assert info.value.status == 500 and api_error(info.value)["reason"] == "InternalError"
    core.list_namespaced_pod(NS)  # the fault is used up
    core.create_namespaced_pod(NS, pod_manifest("post-ok", "pass"))  # other methods unaffected

    # urllib3 transparently retries idempotent requests that get 429 + Retry-After, so use a POST.
    k8s_cluster.inject_api_fault("POST", "pods", status=429, count=1, retry_after=2)
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod(NS, pod_manifest("throttled", "pass"))
    assert info.value.status == 429
    assert info.value.headers["Retry-After"] == "2"
    body = api_error(info.value)
    assert body["reason"] == "TooManyRequests" and body["details"]["retryAfterSeconds"] == 2

    log = k8s_cluster.request_log
    before = log.count
    core.list_namespaced_pod(NS, label_selector="a=b")
    assert log.count == before + 1
    last = log.records[-1]
    assert (last.method, last.path, last.status) == ("GET", "/api/v1/namespaces/default/pods", 200)
    assert "labelSelector=a%3Db" in last.query
    assert [r.status for r in log.filter(method="POST", path_regex="/pods$")] == [201, 429]
    assert [r.status for r in log.filter(method="GET", path_regex="/pods$")][:2] == [500, 500]
    log.clear()
    assert len(log) == 0 and log.count > before


def test_drop_watches_after_events(core: client.CoreV1Api, k8s_cluster: ClusterEmulator) -> None:
    for i in range(3):
        core.create_namespaced_pod(NS, pod_manifest(f"w{i}", "pass", {"drop": "me"}))
    k8s_cluster.drop_watches(after_events=1)
    received = []
    with pytest.raises((urllib3.exceptions.ProtocolError, urllib3.exceptions.HTTPError)):
        for event in watch.Watch().stream(
            core.list_namespaced_pod, NS, label_selector="drop=me", timeout_seconds=10
        ):
            received.append(event["type"])
    assert received == ["ADDED"]
    # The rule applied to one stream only: the next watch is fine.
    types = [
        e["type"]
        for e in watch.Watch().stream(
            core.list_namespaced_pod, NS, label_selector="drop=me", timeout_seconds=1
        )
    ]
    assert types.count("ADDED") == 3


def test_drop_open_watches_now(core: client.CoreV1Api, k8s_cluster: ClusterEmulator) -> None:
    outcome: list[str] = []
    started = threading.Event()

    def run() -> None:
        try:
            for _ in watch.Watch().stream(core.list_namespaced_pod, NS, timeout_seconds=30):
                pass
            outcome.append("ended cleanly")
        except Exception as exc:
            outcome.append(type(exc).__name__)

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: any(r.watch for r in k8s_cluster.request_log.records))
    started.set()
    wait_until(lambda: k8s_cluster.call_in_loop(lambda: len(k8s_cluster._server._watches)) > 0)
    k8s_cluster.drop_watches()
    thread.join(10)
    assert not thread.is_alive()
    assert outcome and outcome[0] != "ended cleanly"
