"""Jobs in a Kueue LocalQueue, end to end with dag.test() on the cluster emulator (whose Kueue
suspends queue-labelled jobs, admits them by ClusterQueue quota and keeps their Workloads):
queued with a position and Kueue's reason, queue_timeout, eviction as a new attempt, and
queued provisioning through a ProvisioningRequest that succeeds or fails."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from cluster_emulator import NodePool
from cluster_emulator.kueue_setup import kueue_queue, provisioning_check
from emulated_cluster import point_kinetic_at, running_emulator
from helpers import ti_states, ti_try_numbers, xcom
from jobkit import gke_job
from ops_support import wait_for

L4 = {"cloud.google.com/gke-accelerator": "nvidia-l4"}
NODE_POOLS = [
    NodePool("cpu", {}, node_count=2),
    # a queued-provisioning pool as GKE makes it: flex-start VMs behind the gke-queued taint
    NodePool(
        "l4-queued",
        {**L4, "cloud.google.com/gke-flex-start": "true"},
        taints=[{"key": "cloud.google.com/gke-queued", "value": "true", "effect": "NoSchedule"}],
    ),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_emulator(tmp_path_factory, NODE_POOLS) as running:
        emulator = running[0]
        # quota for one kinetic CPU job (1 cpu, 4Gi) at a time
        kueue_queue(emulator, "team-a", quota={"cpu": "1", "memory": "8Gi"}, flavor="cpu-flavor")
        # no retries of a failed ProvisioningRequest: its first failure rejects the job
        provisioning_check(emulator, "dws-prov", "dws-config", backoff_limit_count=0)
        kueue_queue(
            emulator,
            "dws",
            quota={"nvidia.com/gpu": "8"},
            flavor="dws-flavor",
            node_labels={"cloud.google.com/gke-nodepool": "l4-queued"},
            admission_checks=["dws-prov"],
        )
        yield running


@pytest.fixture
def kueue_env(cluster, monkeypatch, tmp_path):
    point_kinetic_at(*cluster, monkeypatch)
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")  # storage is not the subject
    out = tmp_path / "failures"
    out.mkdir()
    monkeypatch.setenv("KN_TEST_FAILURES", str(out))
    return cluster[0], out


def _apis(emulator):
    import kubernetes

    client = emulator.api_client()
    return (
        kubernetes.client.BatchV1Api(client),
        kubernetes.client.CoreV1Api(client),
        kubernetes.client.CustomObjectsApi(client),
    )


def _blocker(emulator, seconds: float) -> str:
    """A plain Job in team-a's queue holding its whole quota for ``seconds``; its name."""
    batch, core, _ = _apis(emulator)
    name = f"blocker-{int(time.monotonic() * 1000) % 10**8}"
    container = {
        "name": "main",
        "image": "busybox",
        "command": [sys.executable, "-c", f"import time; time.sleep({seconds})"],
        "resources": {"requests": {"cpu": "1", "memory": "4Gi"}},
    }
    batch.create_namespaced_job(
        "default",
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
            "spec": {
                "backoffLimit": 0,
                "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
            },
        },
    )
    wait_for(lambda: _running(core, f"job-name={name}"), f"{name} never ran")
    return name


def _running(core, selector: str) -> str | None:
    for pod in core.list_namespaced_pod("default", label_selector=selector).items:
        if pod.status.phase == "Running":
            return pod.metadata.name
    return None


def _workloads(emulator) -> list[dict]:
    _, _, custom = _apis(emulator)
    return custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", "default", "workloads")["items"]


def _owner_names(emulator) -> set[str]:
    return {ref["name"] for w in _workloads(emulator) for ref in w["metadata"].get("ownerReferences") or []}


def _delete(emulator, name: str) -> None:
    batch, _, _ = _apis(emulator)
    batch.delete_namespaced_job(name, "default", propagation_policy="Background")


def _progress(base) -> list[str]:
    """What the task log and the Kinetic view said while this test's jobs waited (each test has
    its own job storage): the states recorded in status/progress.json."""
    import json

    texts = []
    for path in sorted(base.glob("kinetic/**/status/progress.json")):
        texts.extend(entry["text"] for entry in json.loads(path.read_text()).get("history") or [])
    return texts


def _failure(out, task_id: str) -> str:
    return (out / f"{task_id}.txt").read_text()


def test_a_job_waits_queued_with_its_position_then_runs_and_startup_counts_from_admission(kueue_env):
    emulator, out = kueue_env
    blocker = _blocker(emulator, 25)  # the queue wait is longer than the task's startup_timeout
    import kn_kueue

    dr = kn_kueue.kn_kueue_turn().test()
    assert ti_states(dr) == {"waits_its_turn": "success"}
    assert xcom(dr, "waits_its_turn") == "ran after the queue"
    said = "\n".join(_progress(out.parent))
    assert "queued in team-a (position 1, pending admission: " in said, said
    assert "insufficient unused quota for cpu in flavor cpu-flavor" in said  # Kueue's own words
    assert "running on node" in said  # then admitted and run
    _delete(emulator, blocker)


def test_queue_timeout_fails_with_the_queues_reason_and_leaves_no_workload(kueue_env):
    emulator, out = kueue_env
    blocker = _blocker(emulator, 120)
    import kn_kueue

    try:
        dr = kn_kueue.kn_kueue_timeout().test()
        assert ti_states(dr) == {"waits_too_long": "failed"}
        message = _failure(out, "waits_too_long")
        assert "not admitted within queue_timeout=4s" in message
        assert "queued in team-a (position 1, pending admission: " in message
        assert "raise queue_timeout=" in message

        # the job was deleted, and its Workload with it (other tests' finished Jobs keep theirs
        # until their TTL; this one must leave none)
        def left() -> set[str]:
            return {n for n in _owner_names(emulator) if n.startswith("kinetic-kn-kueue-timeout")}

        wait_for(lambda: not left(), f"workloads left: {left()}")
        assert blocker in _owner_names(emulator)  # the queue itself was untouched
    finally:
        _delete(emulator, blocker)


def test_an_eviction_by_kueue_is_attempt_2_resuming_from_the_checkpoint(kueue_env):
    emulator, _ = kueue_env
    _, core, _ = _apis(emulator)
    errors: list[Exception] = []

    def evict() -> None:
        try:
            pod = wait_for(
                lambda: _running(core, "kinetic.airflow/task-id=evicted-training"), "no running pod", 300
            )
            wait_for(
                lambda: (
                    "checkpoint written"
                    in core.read_namespaced_pod_log(pod, "default", _preload_content=False).data.decode()
                ),
                "never checkpointed",
            )
            job = core.read_namespaced_pod(pod, "default").metadata.labels["job-name"]
            (workload,) = [
                w
                for w in _workloads(emulator)
                if job in {r["name"] for r in w["metadata"]["ownerReferences"]}
            ]
            emulator.evict_workload("default", workload["metadata"]["name"], reason="Preempted")
        except Exception as exc:  # reported by the test below
            errors.append(exc)

    thread = threading.Thread(target=evict, daemon=True)
    thread.start()
    import kn_kueue

    dr = kn_kueue.kn_kueue_eviction().test()
    thread.join(5)
    assert not errors, errors
    assert ti_states(dr) == {"evicted_training": "success"}
    assert xcom(dr, "evicted_training") == {"resumed_from": "written by attempt 1", "attempt": "2"}
    assert ti_try_numbers(dr)["evicted_training"] == 1  # the same Airflow try


def test_queued_provisioning_waits_for_its_nodes_and_a_rejected_request_fails_naming_it(kueue_env):
    emulator, out = kueue_env
    import kn_kueue

    emulator.set_provisioning(delay_seconds=2)
    dr = kn_kueue.kn_kueue_provisioning().test()
    assert ti_states(dr) == {"provisioned": "success"}
    said = "\n".join(_progress(out.parent))
    assert "admission check dws-prov" in said, said  # the wait said what it waits for

    emulator.set_provisioning(delay_seconds=1, fail=True, message="GCE out of resources in us-central1-a")
    dr = kn_kueue.kn_kueue_provisioning().test()
    assert ti_states(dr) == {"provisioned": "failed"}
    message = _failure(out, "provisioned")
    assert "ProvisioningRequest " in message and "GCE out of resources in us-central1-a" in message


def test_a_pod_failing_right_after_an_eviction_is_told_by_a_fresh_workload_read(kueue_env):
    """The backend reads a job's Workload at most every QUEUE_LOOK_SECONDS, but not when the job
    has just failed: the read it holds may predate the eviction that stopped the pod, and would
    turn Kueue's preemption into the task's failure (exit 143). Evicted within seconds of the
    Workload's last read, the job must still show as preempted."""
    from kinetic_airflow.backends.base import JobState
    from kinetic_airflow.backends.registry import get_backend
    from kinetic_airflow.job.layout import JobLayout

    emulator, _ = kueue_env
    _, ref, storage = gke_job("evicted_look", time.sleep, [120], operator_kwargs={"local_queue": "team-a"})
    backend = get_backend("gke")
    name = backend.object_name(ref)
    started = JobLayout(ref.job_uri).status("started")
    try:
        # Pending looks read the Workload and keep the read for QUEUE_LOOK_SECONDS.
        wait_for(lambda: backend.status(ref).state is JobState.RUNNING, "the job never ran", 120)
        # ... and the function has started: a pod evicted before its runner began leaves nothing
        # run, so the pod Kueue starts again runs the attempt as the first one would have.
        wait_for(lambda: storage.read_text_or_none(started), "the function never started", 60)
        (workload,) = [
            w for w in _workloads(emulator) if name in {r["name"] for r in w["metadata"]["ownerReferences"]}
        ]
        emulator.evict_workload("default", workload["metadata"]["name"], reason="Preempted")

        def ended():
            status = backend.status(ref)
            return status if status.state is JobState.FAILED else None

        status = wait_for(ended, "the evicted job never stopped", 60)
        assert status.reason == "Preempted", status
        assert status.details.get("evicted_by") == "kueue", status
    finally:
        _delete(emulator, name)
