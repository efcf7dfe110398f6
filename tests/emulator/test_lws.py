"""LeaderWorkerSets: CRD validation, group pods with the LWS env, status, cascading delete, group restart."""

from __future__ import annotations

from typing import Any

import pytest
from emu_helpers import NS, PY, api_error, pid_alive, read_log
from kubernetes import client
from kubernetes.client.rest import ApiException

from kinetic_airflow.testing.cluster import ClusterEmulator, lws_schema_path, wait_until

GROUP, VERSION, PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
ENV_DUMP = (
    "import os, time\n"
    "for k in ('LWS_LEADER_ADDRESS', 'LWS_GROUP_SIZE', 'LWS_WORKER_INDEX',\n"
    "          'TPU_WORKER_ID', 'TPU_WORKER_HOSTNAMES', 'TPU_PROCESS_ADDRESSES'):\n"
    "    print(k, os.environ.get(k), flush=True)\n"
    "time.sleep(120)\n"
)


def lws_manifest(name: str, code: str = ENV_DUMP, size: int = 3, tpu: bool = True) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "worker", "image": "runner:1", "command": [PY, "-c", code]}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 1}
    if tpu:
        container["resources"] = {"limits": {"google.com/tpu": "4"}}
        spec["nodeSelector"] = {
            "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
            "cloud.google.com/gke-tpu-topology": "4x4",
        }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "labels": {"app": "lws-test"}},
        "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": size, "workerTemplate": {"spec": spec}}},
    }


@pytest.fixture
def apis(k8s_api_client: client.ApiClient) -> tuple[client.CustomObjectsApi, client.CoreV1Api]:
    return client.CustomObjectsApi(k8s_api_client), client.CoreV1Api(k8s_api_client)


def _running(core: client.CoreV1Api, name: str) -> list[client.V1Pod]:
    pods = core.list_namespaced_pod(NS, label_selector=f"leaderworkerset.sigs.k8s.io/name={name}").items
    return pods if pods and all(p.status.phase == "Running" for p in pods) else []


def test_schema_is_packaged() -> None:
    assert lws_schema_path().is_file()


def test_lws_size_3_runs_group_with_lws_env(
    apis: tuple[client.CustomObjectsApi, client.CoreV1Api], k8s_cluster: ClusterEmulator
) -> None:
    custom, core = apis
    created = custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, lws_manifest("trainer"))
    assert created["metadata"]["uid"] and created["metadata"]["generation"] == 1
    assert created["spec"]["startupPolicy"] == "LeaderCreated"  # CRD defaults applied
    assert created["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"

    pods = wait_until(lambda: len(_running(core, "trainer")) == 3 and _running(core, "trainer"))
    by_name = {p.metadata.name: p for p in pods}
    assert set(by_name) == {"trainer-0", "trainer-0-1", "trainer-0-2"}
    hostnames = "trainer-0.trainer,trainer-0-1.trainer,trainer-0-2.trainer"
    addresses = "trainer-0.trainer:8476,trainer-0-1.trainer:8476,trainer-0-2.trainer:8476"
    for index, name in enumerate(["trainer-0", "trainer-0-1", "trainer-0-2"]):
        pod = by_name[name]
        labels = pod.metadata.labels
        assert labels["leaderworkerset.sigs.k8s.io/name"] == "trainer"
        assert labels["leaderworkerset.sigs.k8s.io/group-index"] == "0"
        assert labels["leaderworkerset.sigs.k8s.io/worker-index"] == str(index)
        assert pod.metadata.annotations["leaderworkerset.sigs.k8s.io/size"] == "3"
        assert pod.spec.subdomain == "trainer" and pod.spec.hostname == name
        assert pod.metadata.owner_references[0].kind == "LeaderWorkerSet"
        assert "tpu-v5-lite-podslice" in pod.spec.node_name
        # The pod spec shows what the LWS webhook injects (cluster DNS names) ...
        spec_env = {e.name: e.value for e in pod.spec.containers[0].env}
        assert list(spec_env)[:3] == ["LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"]
        assert spec_env == {
            "LWS_LEADER_ADDRESS": f"trainer-0.trainer.{NS}",
            "LWS_GROUP_SIZE": "3",
            "LWS_WORKER_INDEX": str(index),
            "TPU_WORKER_HOSTNAMES": hostnames,
            "TPU_WORKER_ID": str(index),
            "TPU_NAME": "trainer-0",
            "TPU_PROCESS_ADDRESSES": addresses,
            "TPU_PROCESS_PORT": "8476",
        }
        # ... and the process gets them resolved to the (shared) pod IP.
        out = wait_until(lambda name=name: read_log(core, name).count("\n") >= 6 and read_log(core, name))
        values = dict(line.split(" ", 1) for line in out.splitlines())
        assert values == {
            "LWS_LEADER_ADDRESS": "127.0.0.1",
            "LWS_GROUP_SIZE": "3",
            "LWS_WORKER_INDEX": str(index),
            "TPU_WORKER_ID": str(index),
            "TPU_WORKER_HOSTNAMES": "127.0.0.1,127.0.0.1,127.0.0.1",
            "TPU_PROCESS_ADDRESSES": "127.0.0.1:8476,127.0.0.1:8476,127.0.0.1:8476",
        }
    assert "leader-name" not in str(by_name["trainer-0"].metadata.annotations)
    worker_annotations = by_name["trainer-0-2"].metadata.annotations
    assert worker_annotations["leaderworkerset.sigs.k8s.io/leader-name"] == "trainer-0"
    assert worker_annotations["leaderworkerset.sigs.k8s.io/leader-requests-tpus"] == "true"

    def available() -> dict[str, Any] | None:
        obj = custom.get_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, "trainer")
        conds = {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}
        return obj if conds.get("Available", {}).get("status") == "True" else None

    status = wait_until(available)["status"]
    assert status["readyReplicas"] == 1 and status["replicas"] == 1
    assert (
        status["hpaPodSelector"]
        == "leaderworkerset.sigs.k8s.io/name=trainer,leaderworkerset.sigs.k8s.io/worker-index=0"
    )
    assert core.read_namespaced_service("trainer", NS).spec.cluster_ip == "None"
    listed = custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, label_selector="app=lws-test")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["trainer"]

    pids = [p["pid"] for p in k8s_cluster.processes() if p["pod"].startswith("trainer-")]
    assert len(pids) == 3
    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "trainer")
    wait_until(
        lambda: (
            core.list_namespaced_pod(NS, label_selector="leaderworkerset.sigs.k8s.io/name=trainer").items
            == []
        ),
        message="LWS pods deleted",
    )
    wait_until(lambda: not any(pid_alive(pid) for pid in pids), message="LWS processes killed")
    wait_until(
        lambda: "trainer" not in {s.metadata.name for s in core.list_namespaced_service(NS).items},
        message="headless service deleted",
    )


def test_invalid_lws_is_rejected(apis: tuple[client.CustomObjectsApi, client.CoreV1Api]) -> None:
    custom, _ = apis
    typo = lws_manifest("typo")
    typo["spec"]["leaderWorkerTemplate"]["sise"] = typo["spec"]["leaderWorkerTemplate"].pop("size")
    with pytest.raises(ApiException) as info:
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, typo)
    assert info.value.status == 422
    body = api_error(info.value)
    assert body["reason"] == "Invalid" and "sise" in body["message"]
    assert body["message"].startswith('LeaderWorkerSet.leaderworkerset.x-k8s.io "typo" is invalid')

    bad_enum = lws_manifest("enum")
    bad_enum["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Sometimes"
    with pytest.raises(ApiException) as info:
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, bad_enum)
    assert info.value.status == 422 and "Sometimes" in api_error(info.value)["message"]

    custom.create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, lws_manifest("once", tpu=False, size=1)
    )
    with pytest.raises(ApiException) as info:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, lws_manifest("once", tpu=False, size=1)
        )
    assert info.value.status == 409


def test_container_restart_recreates_the_group(
    apis: tuple[client.CustomObjectsApi, client.CoreV1Api], k8s_cluster: ClusterEmulator
) -> None:
    custom, core = apis
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, lws_manifest("group", "import time; time.sleep(120)", size=2, tpu=False)
    )
    first = wait_until(lambda: len(_running(core, "group")) == 2 and _running(core, "group"))
    old_uids = {p.metadata.uid for p in first}
    k8s_cluster.oom_kill_pod(NS, "group-0-1")  # restartPolicy Always: the kubelet restarts it ...

    def recreated() -> list[client.V1Pod] | None:  # ... and LWS recreates the whole group
        pods = _running(core, "group")
        uids = {p.metadata.uid for p in pods}
        return pods if len(pods) == 2 and not (uids & old_uids) else None

    pods = wait_until(recreated, message="group recreated")
    assert all(p.status.container_statuses[0].restart_count == 0 for p in pods)
