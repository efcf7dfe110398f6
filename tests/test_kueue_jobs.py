"""Jobs in a Kueue LocalQueue, end to end with dag.test() on the cluster emulator (whose Kueue
suspends queue-labelled jobs, admits them by ClusterQueue quota and keeps their Workloads):
queued with a position and Kueue's reason, queue_timeout, eviction as a new attempt, and
queued provisioning through a ProvisioningRequest that succeeds or fails."""

from __future__ import annotations

import contextlib
import sys
import threading
import time

import pytest
from cluster_emulator import NodePool
from cluster_emulator.kueue_setup import kueue_queue, provisioning_check
from cluster_emulator.resources import KUEUE_14558
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
    # a cluster of the Kueue to come: v1beta1 no longer served (kubernetes-sigs/kueue#14558)
    with running_emulator(tmp_path_factory, NODE_POOLS, unserved_versions=[KUEUE_14558]) as running:
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
    from kinetic_airflow.backends.gke import discovery

    discovery.forget()  # what each test's cluster serves is asked again (ports are reused)
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
    return custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", "default", "workloads")["items"]


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


def _free_when_queued(emulator, out, blocker: str, errors: list) -> threading.Thread:
    """Delete ``blocker`` once the task has said it is queued and has waited longer than its
    startup_timeout (6 s) since: the queue wait must outlast it, however slow the task is to
    submit its job on a busy machine (a blocker on a timer was gone before the job came)."""

    def run() -> None:
        try:
            wait_for(lambda: any("queued in team-a" in t for t in _progress(out.parent)), "never queued", 300)
            time.sleep(8)
            _delete(emulator, blocker)
        except Exception as exc:  # reported by the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_job_waits_queued_with_its_position_then_runs_and_startup_counts_from_admission(kueue_env):
    emulator, out = kueue_env
    blocker = _blocker(emulator, 600)  # freed once the job has waited past its startup_timeout
    errors: list[Exception] = []
    freer = _free_when_queued(emulator, out, blocker, errors)
    import kn_kueue

    try:
        dr = kn_kueue.kn_kueue_turn().test()
        freer.join(5)
    finally:
        with contextlib.suppress(Exception):  # freed already, unless the task failed before
            _delete(emulator, blocker)
    assert not errors, errors
    assert ti_states(dr) == {"waits_its_turn": "success"}
    assert xcom(dr, "waits_its_turn") == "ran after the queue"
    said = "\n".join(_progress(out.parent))
    assert "queued in team-a (position 1, pending admission: " in said, said
    assert "insufficient unused quota for cpu in flavor cpu-flavor" in said  # Kueue's own words
    assert "running on node" in said  # then admitted and run


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


# How released Kueue evicts and requeues (kubernetes-sigs/kueue v0.19.2): Evicted reasons from
# apis/kueue/v1beta2/workload_types.go (WorkloadEvictedBy*, WorkloadDeactivated);
# pkg/controller/jobframework/reconciler.go ReconcileGenericJob (step 6) sets Requeued=True only
# for Preempted and NodeFailures, False otherwise; pkg/controller/core/workload_controller.go
# Reconcile sets it True later (BackoffFinished after PodsReadyTimeout / AdmissionCheck,
# ClusterQueueRestarted / LocalQueueRestarted once the stopped queue runs again); a deactivated
# Workload is not requeued. For kinetic a requeued job's attempt ended: the next attempt resumes.
# reason -> (how the test evicts, Requeued right after, the job's verdict, Requeued once admitted
# again: what the verdict names when the job is seen only after that)
EVICTIONS = {
    "Preempted": ("hook", "True", "Preempted", "Preempted"),
    "NodeFailures": ("hook", "True", "Preempted", "NodeFailures"),
    "PodsReadyTimeout": ("hook", "False", "Preempted", "BackoffFinished"),
    "AdmissionCheck": ("hook", "False", "Preempted", "BackoffFinished"),
    "ClusterQueueStopped": ("clusterqueues", "False", "Preempted", "ClusterQueueRestarted"),
    "LocalQueueStopped": ("localqueues", "False", "Preempted", "LocalQueueRestarted"),
    "Deactivated": ("workloads", "False", "KueueDeactivated", "Reactivated"),
}


def _workload_of(emulator, job_name: str) -> dict:
    found = [
        w for w in _workloads(emulator) if job_name in {r["name"] for r in w["metadata"]["ownerReferences"]}
    ]
    assert len(found) == 1, found
    return found[0]


def _stop(emulator, how: str, policy: str, workload: str) -> None:
    _, _, custom = _apis(emulator)
    patch = {"spec": {"stopPolicy": policy}}
    if how == "clusterqueues":
        custom.patch_cluster_custom_object("kueue.x-k8s.io", "v1beta2", how, "team-a", patch)
    elif how == "localqueues":
        custom.patch_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", "default", how, "team-a", patch)
    elif policy != "None":  # a Workload deactivated by hand
        body = {"spec": {"active": False}}
        custom.patch_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", "default", how, workload, body)


def _looks_until_failed(backend, ref, seen: list) -> object:
    from kinetic_airflow.backends.base import JobState

    def ended():
        status = backend.status(ref)
        seen.append(status)
        return status if status.state is JobState.FAILED else None

    return wait_for(ended, "the job never ended", 90)


@pytest.mark.parametrize("reason", list(EVICTIONS))
def test_an_evicted_kueue_job_resumes_or_fails_as_released_kueue_says_never_queued(kueue_env, reason):
    """Evicted while it runs, for each reason released Kueue evicts with: the attempt ends as a
    preemption the next attempt resumes from (Kueue admits the Workload again: at once, after its
    backoff, or when the stopped queue runs again), or as a failure when Kueue deactivated it;
    never as a job "Queued" for ever."""
    from kinetic_airflow.backends.base import JobState
    from kinetic_airflow.backends.registry import get_backend
    from kinetic_airflow.job.layout import JobLayout

    emulator, _ = kueue_env
    how, requeued, verdict, readmitted = EVICTIONS[reason]
    task = f"ev_{reason.lower()}"
    _, ref, storage = gke_job(task, time.sleep, [120], operator_kwargs={"local_queue": "team-a"})
    backend = get_backend("gke")
    name = backend.object_name(ref)
    seen: list = []
    try:
        wait_for(lambda: backend.status(ref).state is JobState.RUNNING, "the job never ran", 120)
        wait_for(
            lambda: storage.read_text_or_none(JobLayout(ref.job_uri).status("started")), "not started", 60
        )
        workload = _workload_of(emulator, name)["metadata"]["name"]
        if how == "hook":
            emulator.evict_workload("default", workload, reason=reason, message=f"test: {reason}")
        else:
            _stop(emulator, how, "HoldAndDrain", workload)
        status = _looks_until_failed(backend, ref, seen)
        assert (status.reason, status.details.get("evicted_by")) == (verdict, "kueue"), status
        assert reason in status.message or readmitted in status.message, status
        assert not [s for s in seen if s.reason == "Queued"], seen

        def requeued_condition():
            conditions = {c["type"]: c for c in _workload_of(emulator, name)["status"]["conditions"]}
            return conditions.get("Requeued")

        got = wait_for(requeued_condition, "Kueue never released the Workload", 30)
        if requeued == "True" or how != "hook":  # as it stays (a stopped queue is stopped still)
            assert (got["status"], got["reason"]) == (requeued, reason), got
        else:  # False, then True once the backoff (none here) has passed
            assert (got["status"], got["reason"]) in ((requeued, reason), ("True", "BackoffFinished")), got
    finally:
        if how != "hook":
            _stop(emulator, how, "None", "")
        _delete(emulator, name)


@pytest.mark.parametrize("status_code", [403, 404])
def test_a_failed_kueue_job_whose_workload_cannot_be_read_fails_naming_why(kueue_env, status_code):
    """Item 1 of issue 38: a Workload read refused (RBAC: 403) or on a version the cluster does not
    serve (404) never turns the job's own failure into "Queued"; the failure says why the
    Workload could not be read."""
    from kinetic_airflow.backends.registry import get_backend

    emulator, _ = kueue_env
    _, ref, _ = gke_job(f"unreadable_{status_code}", _raise, [], operator_kwargs={"local_queue": "team-a"})
    backend = get_backend("gke")
    name = backend.object_name(ref)
    seen: list = []
    try:
        emulator.inject_api_fault("GET", WORKLOADS_PATH, status_code, None)
        status = _looks_until_failed(backend, ref, seen)
        assert status.reason not in ("Queued", "Preempted", "KueueDeactivated"), status
        assert f"HTTP {status_code}" in status.details["workload_unreadable"], status
        hint = "doctor --print-rbac" if status_code == 403 else "is Kueue installed"
        assert hint in status.message, status
        assert not [s for s in seen if s.reason == "Queued"], seen
    finally:
        emulator.clear_faults()
        _delete(emulator, name)


WORKLOADS_PATH = r"/apis/kueue\.x-k8s\.io/v1beta\d/namespaces/default/workloads"


def _raise() -> None:
    raise ValueError("the task's own failure")


def test_a_pending_kueue_job_whose_workload_cannot_be_read_is_not_queued(kueue_env):
    from kinetic_airflow.backends.base import JobState
    from kinetic_airflow.backends.registry import get_backend

    emulator, _ = kueue_env
    blocker = _blocker(emulator, 60)
    _, ref, _ = gke_job("unreadable_pending", time.sleep, [1], operator_kwargs={"local_queue": "team-a"})
    backend = get_backend("gke")
    try:
        wait_for(lambda: backend.status(ref).reason == "Queued", "never queued", 60)
        emulator.inject_api_fault("GET", WORKLOADS_PATH, 403, None)
        # the next read of the Workload (a queued job's is kept QUEUE_LOOK_SECONDS)
        status = wait_for(
            lambda: (s := backend.status(ref)).reason != "Queued" and s, "the Workload was not read again", 60
        )
        assert (status.state, status.reason) == (JobState.PENDING, "KueueUnreadable"), status
        assert "HTTP 403" in status.message and "doctor --print-rbac" in status.message, status
    finally:
        emulator.clear_faults()
        _delete(emulator, backend.object_name(ref))
        _delete(emulator, blocker)


def test_a_missing_local_queue_fails_at_submission_naming_the_queues_there(kueue_env):
    from kinetic_airflow.backends.gke.kueue import LocalQueueMissingError

    emulator, _ = kueue_env
    with pytest.raises(LocalQueueMissingError) as caught:
        gke_job("no_queue", time.sleep, [1], operator_kwargs={"local_queue": "team-z"})
    text = str(caught.value)
    assert "'team-z' does not exist in namespace 'default'" in text, text
    assert "(it has: dws, team-a)" in text and "local_queue=" in text, text
    batch, _, _ = _apis(emulator)
    made = batch.list_namespaced_job("default", label_selector="kinetic.airflow/task-id=no-queue").items
    assert not made  # refused before anything was created


@pytest.mark.parametrize(
    "unserved, expected",
    [
        ((), "v1beta2"),  # the pinned release: v1beta2 preferred, v1beta1 deprecated
        ((KUEUE_14558,), "v1beta2"),  # v1beta1 unserved, as kubernetes-sigs/kueue#14558 does
        (("kueue.x-k8s.io/v1beta2", "visibility.kueue.x-k8s.io/v1beta2"), "v1beta1"),  # before 0.15
    ],
)
def test_workloads_are_read_through_the_version_the_cluster_serves(tmp_path, caplog, unserved, expected):
    """Discovery picks the Kueue version (no version is remembered): a Workload read is never a
    404 for a version the cluster does not serve, and a deprecated version's Warning header is
    logged once per process."""
    import logging

    import yaml
    from cluster_emulator import ClusterEmulator

    from kinetic_airflow.backends.gke import api_warnings, discovery
    from kinetic_airflow.backends.gke.client import KubeApi
    from kinetic_airflow.backends.gke.kueue import find_workload
    from kinetic_airflow.backends.gke.transport import from_kubeconfig

    with ClusterEmulator(work_dir=tmp_path / "emu", unserved_versions=list(unserved)) as emulator:
        config = yaml.safe_load(emulator.write_kubeconfig(tmp_path / "kubeconfig").read_text())
        api = KubeApi(from_kubeconfig(config, None, tmp_path))
        discovery.forget()
        api_warnings._SEEN.clear()
        with caplog.at_level(logging.WARNING, logger=api_warnings.__name__):
            assert discovery.api_version(api, discovery.KUEUE) == expected
            assert find_workload(api, "default", "no-such-uid") is None
            assert find_workload(api, "default", "no-such-uid") is None
        paths = {r.path for r in emulator.request_log.records if "/workloads" in r.path}
        assert paths == {f"/apis/kueue.x-k8s.io/{expected}/namespaces/default/workloads"}

        def discoveries() -> int:
            return len([r for r in emulator.request_log.records if r.path == "/apis/kueue.x-k8s.io"])

        assert discoveries() == 1  # asked once, kept for the process
        discovery.forget(api)  # as after a 404 on a discovered path: asked again
        assert find_workload(api, "default", "no-such-uid") is None and discoveries() == 2
        warned = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
        if expected == "v1beta1":  # the CRD's deprecationWarning, once however many calls
            assert warned == [
                "the Kubernetes API server warns: This version is deprecated. Use v1beta2 instead. "
                "(logged once per process)"
            ]
        else:
            assert warned == []
    discovery.forget()
