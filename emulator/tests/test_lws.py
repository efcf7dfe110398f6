"""LeaderWorkerSets: CRD validation, group pods with the LWS env, status, cascading delete, group restart."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from cluster_emulator import ClusterEmulator, lws_schema_path, wait_until
from emu_helpers import NS, PY, api_error, pid_alive, read_log
from kubernetes import client
from kubernetes.client.rest import ApiException

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
        # As kubernetes-sigs/lws: the leader belongs to the leader StatefulSet "<lws>", the
        # workers to the group's StatefulSet "<lws>-<group>"; both label revisions as the
        # StatefulSet controller does.
        owner = pod.metadata.owner_references[0]
        sts = "trainer" if index == 0 else "trainer-0"
        assert (owner.kind, owner.name) == ("StatefulSet", sts)
        assert labels["controller-revision-hash"].startswith(f"{sts}-")
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


def _uids(core: client.CoreV1Api, name: str) -> dict[str, str]:
    pods = core.list_namespaced_pod(NS, label_selector=f"leaderworkerset.sigs.k8s.io/name={name}").items
    return {p.metadata.name: p.metadata.uid for p in pods}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Leader listens on $COORDINATOR (= $(LWS_LEADER_ADDRESS):$(RDV_PORT)); workers connect, send
# their LWS_WORKER_INDEX and read the leader's reply. "rdv-0.rdv" below is literal code text.
RENDEZVOUS = """
import os, socket, sys, time
index, size = int(os.environ["LWS_WORKER_INDEX"]), int(os.environ["LWS_GROUP_SIZE"])
host, port = os.environ["COORDINATOR"].rsplit(":", 1)
print("address", os.environ["LWS_LEADER_ADDRESS"], "argv", sys.argv[1], "literal", "rdv-0.rdv", flush=True)
print("fqdn", socket.gethostbyname(os.environ["LEADER_FQDN"]), flush=True)
if index == 0:
    server = socket.create_server((host, int(port)))
    seen = []
    while len(seen) < size - 1:
        conn, _ = server.accept()
        with conn:
            seen.append(int(conn.recv(16).decode()))
            conn.sendall(b"leader")
    print("leader saw", sorted(seen), flush=True)
else:
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = socket.create_connection((host, int(port)), timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with conn:
        conn.sendall(str(index).encode())
        print("worker", index, "reached", conn.recv(16).decode(), flush=True)
time.sleep(120)
"""


def test_lws_leader_address_reaches_the_leader(
    apis: tuple[client.CustomObjectsApi, client.CoreV1Api],
) -> None:
    custom, core = apis
    manifest = lws_manifest("rdv", RENDEZVOUS, size=4, tpu=False)
    container = manifest["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    container["args"] = ["$(LWS_LEADER_ADDRESS)"]
    container["env"] = [
        {"name": "RDV_PORT", "value": str(_free_port())},
        {"name": "COORDINATOR", "value": "$(LWS_LEADER_ADDRESS):$(RDV_PORT)"},
        {"name": "LEADER_FQDN", "value": "$(LWS_LEADER_ADDRESS).svc.cluster.local"},
    ]
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, manifest)
    names = ["rdv-0", "rdv-0-1", "rdv-0-2", "rdv-0-3"]
    logs = wait_until(
        lambda: (
            (found := {n: read_log(core, n) for n in _uids(core, "rdv")})
            and "leader saw" in found.get("rdv-0", "")
            and all("reached" in found.get(n, "") for n in names[1:])
            and found
        ),
        timeout=60,
        message="rendezvous over LWS_LEADER_ADDRESS",
    )
    assert "leader saw [1, 2, 3]" in logs["rdv-0"]
    for index, name in enumerate(names):
        assert "address 127.0.0.1 argv 127.0.0.1 literal rdv-0.rdv\nfqdn 127.0.0.1\n" in logs[name]
        if index:
            assert f"worker {index} reached leader" in logs[name]
        env = {e.name: e.value for e in core.read_namespaced_pod(name, NS).spec.containers[0].env}
        assert env["LWS_LEADER_ADDRESS"] == f"rdv-0.rdv.{NS}"  # the API object keeps the DNS name
        assert env["COORDINATOR"] == "$(LWS_LEADER_ADDRESS):$(RDV_PORT)"


def test_cluster_dns_rewrite_can_be_turned_off(tmp_path: Path) -> None:
    with ClusterEmulator(work_dir=tmp_path / "emu", resolve_cluster_dns=False) as emulator:
        api = emulator.api_client()
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        code = "import os, time; print(os.environ['LWS_LEADER_ADDRESS'], flush=True); time.sleep(60)"
        custom.create_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, lws_manifest("plain", code, size=1, tpu=False)
        )
        out = wait_until(lambda: _running(core, "plain") and read_log(core, "plain-0"))
        assert out == f"plain-0.plain.{NS}\n"
        api.close()


# Worker 1 fails (exit 3) and worker 2 completes (exit 0) on their first run; afterwards all sleep.
CRASH_ONCE = """
import os, sys, time
index = os.environ["LWS_WORKER_INDEX"]
marker = os.path.join(os.environ["MARKERS"], index)
first = not os.path.exists(marker)
open(marker, "a").close()
print("start", index, "first" if first else "again", flush=True)
if first and index == "1":
    sys.exit(3)
if first and index == "2":
    sys.exit(0)
time.sleep(120)
"""


def test_restart_policy_none_restarts_in_place(
    apis: tuple[client.CustomObjectsApi, client.CoreV1Api], k8s_cluster: ClusterEmulator, tmp_path: Path
) -> None:
    custom, core = apis
    manifest = lws_manifest("none", CRASH_ONCE, size=3, tpu=False)
    lwt = manifest["spec"]["leaderWorkerTemplate"]
    lwt["restartPolicy"] = "None"
    lwt["workerTemplate"]["spec"]["containers"][0]["env"] = [{"name": "MARKERS", "value": str(tmp_path)}]
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, manifest)
    uids = wait_until(lambda: len(found := _uids(core, "none")) == 3 and found)

    def statuses() -> dict[str, client.V1ContainerStatus] | None:
        pods = _running(core, "none")
        found = {p.metadata.name: p.status.container_statuses[0] for p in pods}
        ok = len(found) == 3 and all(cs.state.running for cs in found.values())
        return found if ok and found["none-0-1"].restart_count and found["none-0-2"].restart_count else None

    # A container exit (non-zero or 0) restarts that container only, in the same pod.
    found = wait_until(statuses, message="workers restarted in place")
    assert _uids(core, "none") == uids
    assert found["none-0"].restart_count == 0
    for name, code, reason in (("none-0-1", 3, "Error"), ("none-0-2", 0, "Completed")):
        cs = found[name]
        assert cs.restart_count == 1
        assert (cs.last_state.terminated.exit_code, cs.last_state.terminated.reason) == (code, reason)
        assert cs.last_state.terminated.container_id not in (None, cs.container_id)
        index = name[-1]
        assert read_log(core, name, previous=True) == f"start {index} first\n"
        # Running does not mean it printed yet.
        wait_until(lambda name=name, index=index: read_log(core, name) == f"start {index} again\n")
    with pytest.raises(ApiException) as info:
        read_log(core, "none-0", previous=True)
    assert info.value.status == 400 and "previous terminated container" in api_error(info.value)["message"]

    # OOM kill of the leader: restarted in place too.
    k8s_cluster.oom_kill_pod(NS, "none-0")

    def leader_restarted() -> client.V1ContainerStatus | None:
        cs = core.read_namespaced_pod("none-0", NS).status.container_statuses[0]
        return cs if cs.restart_count == 1 and cs.state.running else None

    cs = wait_until(leader_restarted, message="leader restarted in place")
    assert (cs.last_state.terminated.exit_code, cs.last_state.terminated.reason) == (137, "OOMKilled")
    assert _uids(core, "none") == uids

    # Preempting a worker: its StatefulSet recreates that pod only.
    k8s_cluster.preempt_pod(NS, "none-0-2", grace_seconds=0)

    def worker_replaced() -> dict[str, str] | None:
        now = _uids(core, "none")
        ok = len(_running(core, "none")) == 3 and now.get("none-0-2") not in (None, uids["none-0-2"])
        return now if ok else None

    now = wait_until(worker_replaced, message="preempted worker recreated")
    assert {n: now[n] for n in ("none-0", "none-0-1")} == {n: uids[n] for n in ("none-0", "none-0-1")}

    # Preempting the leader: the workers' StatefulSet belongs to the leader pod, so the group goes.
    k8s_cluster.preempt_pod(NS, "none-0", grace_seconds=0)

    def group_replaced() -> dict[str, str] | None:
        latest = _uids(core, "none")
        ok = len(_running(core, "none")) == 3 and not set(latest.values()) & set(now.values())
        return latest if ok else None

    wait_until(group_replaced, message="group recreated after leader loss")
    lws_events = core.list_namespaced_event(NS, field_selector="involvedObject.name=none").items
    assert not [e for e in lws_events if e.reason == "RecreateGroup"]


def test_deleting_or_preempting_a_worker_recreates_the_group(
    apis: tuple[client.CustomObjectsApi, client.CoreV1Api], k8s_cluster: ClusterEmulator
) -> None:
    custom, core = apis
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, lws_manifest("regroup", "import time; time.sleep(120)", size=3, tpu=False)
    )
    first = wait_until(lambda: len(found := _running(core, "regroup")) == 3 and found)
    old = {p.metadata.uid for p in first}

    def replaced(old: set[str]) -> set[str] | None:
        uids = {p.metadata.uid for p in _running(core, "regroup")}
        return uids if len(uids) == 3 and not uids & old else None

    core.delete_namespaced_pod("regroup-0-1", NS, grace_period_seconds=1)
    second = wait_until(lambda: replaced(old), message="group recreated after a delete")
    k8s_cluster.preempt_pod(NS, "regroup-0-2", grace_seconds=0)
    wait_until(lambda: replaced(second), message="group recreated after a preemption")
    events = core.list_namespaced_event(NS, field_selector="involvedObject.name=regroup").items
    messages = sorted(e.message for e in events if e.reason == "RecreateGroup")
    assert messages == [
        f"Worker pod regroup-0-{w} failed, deleted leader pod regroup-0 to recreate group 0" for w in (1, 2)
    ]
