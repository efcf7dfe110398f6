"""``capacity=`` and the Kueue queue options: the fields they set on the Job, the
LeaderWorkerSet and their pods (strictly valid against the schemas), GKE's refusals at DAG
parse time, and jobs landing on the matching emulator node pools."""

from __future__ import annotations

import hashlib

import kubernetes_validate
import pytest
from cluster_emulator import NodePool
from cluster_emulator.validation import validate_jobset, validate_lws
from emulated_cluster import point_kinetic_at, running_emulator
from helpers import ti_states, xcom

from kinetic_airflow.accelerators import parse_accelerator
from kinetic_airflow.backends.gke.jobset_manifest import build_jobset_manifest
from kinetic_airflow.backends.gke.lws_manifest import build_lws_manifest
from kinetic_airflow.backends.gke.manifest import build_job_manifest
from kinetic_airflow.capacity import InvalidCapacityError, check_placement, parse_capacity, placement_of

L4 = {"cloud.google.com/gke-accelerator": "nvidia-l4"}
FLEX = "cloud.google.com/gke-flex-start"
NODE_POOLS = [
    NodePool("cpu", {}),
    NodePool("cpu-spot", {"cloud.google.com/gke-spot": "true"}),
    NodePool("l4", dict(L4)),
    # as NAP makes them for pods that tolerate it: the flex-start label and its taint
    NodePool(
        "l4-flex",
        {**L4, FLEX: "true", "cloud.google.com/gke-max-run-duration-seconds": "*"},
        taints=[{"key": FLEX, "value": "true", "effect": "NoSchedule"}],
    ),
    NodePool(
        "l4-reserved",
        {
            **L4,
            "cloud.google.com/reservation-name": "l4-reserved",
            "cloud.google.com/reservation-affinity": "specific",
        },
    ),
]

# capacity -> (nodeSelector entries, tolerations, object labels, object annotations) it adds
FIELDS = {
    "on-demand": ({}, [], {}, {}),
    "spot": ({"cloud.google.com/gke-spot": "true"}, ["cloud.google.com/gke-spot"], {}, {}),
    "flex-start": (
        {FLEX: "true", "cloud.google.com/gke-max-run-duration-seconds": "7200"},
        [FLEX],
        {},
        {},
    ),
    "queued": (
        {},
        ["cloud.google.com/gke-queued"],
        {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "high"},
        {"provreq.kueue.x-k8s.io/maxRunDurationSeconds": "7200"},
    ),
    "reservation:ml-capacity/v6e-res": (
        {
            "cloud.google.com/reservation-name": "v6e-res",
            "cloud.google.com/reservation-project": "ml-capacity",
            "cloud.google.com/reservation-affinity": "specific",
        },
        [],
        {},
        {},
    ),
    "any-reservation": ({"cloud.google.com/reservation-affinity": "any"}, [], {}, {}),
}


def _placement(capacity: str):
    dws = capacity in ("flex-start", "queued")
    queue = ("team-a", "high") if capacity == "queued" else (None, None)
    return placement_of(capacity, 7200 if dws else None, *queue)


def _manifests(capacity: str):
    """The Job of a one-host TPU and the LeaderWorkerSet of a four-host one, with ``capacity``."""
    common = {
        "namespace": "ml",
        "labels": {"job-id": "abc", "app": "kinetic"},
        "annotations": {"kinetic.airflow/task-instance": "d/r/t/-1"},
        "image": "runner:tpu",
        "job_uri": "gs://b/jobs/abc",
        "placement": _placement(capacity),
    }
    tpu = "tpu-v6e-8t:spot" if capacity == "spot" else "tpu-v6e-8t"
    job = build_job_manifest(name="kinetic-abc", spec=parse_accelerator(tpu), **common)
    slice_ = parse_accelerator("tpu-v6e-16:spot" if capacity == "spot" else "tpu-v6e-16")
    lws = build_lws_manifest(name="kinetic-lws-abc", spec=slice_, api_version="v1", **common)
    jobset = build_jobset_manifest(name="kinetic-ms-abc", spec=slice_, slices=2, **common)
    return job, lws, jobset


@pytest.mark.parametrize("capacity", sorted(FIELDS))
def test_each_capacity_sets_its_fields_on_job_leader_worker_set_and_job_set(capacity):
    selectors, tolerations, labels, annotations = FIELDS[capacity]
    job, lws, jobset = _manifests(capacity)
    kubernetes_validate.validate(job, "1.33", strict=True)
    assert validate_lws(lws, strict=True) == []
    assert validate_jobset(jobset, strict=True) == []
    pods = [
        job["spec"]["template"],
        lws["spec"]["leaderWorkerTemplate"]["workerTemplate"],
        jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"],
    ]
    for owner, pod in zip((job, lws, jobset), pods, strict=True):
        spec = pod["spec"]
        for key, value in selectors.items():
            assert spec["nodeSelector"][key] == value
        assert "cloud.google.com/gke-tpu-accelerator" in spec["nodeSelector"]  # beside, not instead
        keys = [t["key"] for t in spec["tolerations"]]
        assert keys == ["google.com/tpu", *tolerations]
        # Kueue reads its labels and the ProvisioningRequest parameters from the object itself
        for key, value in labels.items():
            assert owner["metadata"]["labels"][key] == value
            assert key not in pod["metadata"]["labels"]
        for key, value in annotations.items():
            assert owner["metadata"]["annotations"][key] == value
        # Kueue's webhook suspends a queued job itself: kinetic never creates one suspended
        assert "suspend" not in owner["spec"]


REFUSED = [
    ("flex-start", "cpu", None, "GPUs and TPUs only"),
    ("queued", "cpu", "team-a", "GPUs and TPUs only"),
    ("flex-start", "tpu-v4-8", None, "Dynamic Workload Scheduler disabled for machine type ct4p"),
    ("flex-start", "tpu-v3-4", None, "Dynamic Workload Scheduler disabled for machine type ct3"),
    ("flex-start", "tpu7x-8", None, "flex-start offers TPU v5e, v5p, v6e only"),
    ("flex-start", "tpu-v6e-16", None, "use capacity='queued' with local_queue="),
    ("queued", "gpu-l4", None, "set local_queue="),
    ("flex-start", "gpu-l4:spot", None, "asks for Spot VMs"),
]


@pytest.mark.parametrize(("capacity", "accelerator", "queue", "words"), REFUSED)
def test_what_gke_refuses_is_refused_before_any_job_with_the_fix(capacity, accelerator, queue, words):
    with pytest.raises(InvalidCapacityError, match=words):
        check_placement(placement_of(capacity, None, queue), parse_accelerator(accelerator))


_IMPORTED = """
from datetime import timedelta
import pendulum
from airflow.sdk import dag, task


@task.kinetic(backend="gke", {options})
def job():
    return 1


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"))
def {name}():
    job()


{name}()
"""


def test_a_dag_asking_gke_for_what_it_refuses_does_not_import(tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    cases = {
        "cpu_flex": ('accelerator="cpu", capacity="flex-start"', "GPUs and TPUs only"),
        "slice_flex": ('accelerator="tpu-v6e-16", capacity="flex-start"', "spans 4 hosts"),
        "long_run": ('accelerator="gpu-l4", max_run_duration=timedelta(days=8)', "more than the 7 days"),
        "spot_flex": ('accelerator="gpu-l4:spot", capacity="flex-start"', "asks for Spot VMs"),
    }
    for name, (options, _) in cases.items():
        (tmp_path / f"{name}.py").write_text(_IMPORTED.format(options=options, name=name))
    bag = DagBag(dag_folder=str(tmp_path))
    assert not bag.dags
    for name, (_, words) in cases.items():
        assert words in bag.import_errors[str(tmp_path / f"{name}.py")]


def test_run_duration_is_gkes_seven_days_at_most_and_only_for_flex_start():
    check_placement(placement_of("flex-start", 7 * 86400), parse_accelerator("gpu-l4"))
    with pytest.raises(InvalidCapacityError, match=r"more than the 7 days \(604800s\)"):
        check_placement(placement_of("flex-start", 7 * 86400 + 1), parse_accelerator("gpu-l4"))
    with pytest.raises(InvalidCapacityError, match="use execution_timeout= to bound the task"):
        check_placement(placement_of("spot", 3600), parse_accelerator("gpu-l4"))


def test_flex_start_and_queued_jobs_wait_as_long_as_gke_does_for_their_vms():
    """startup_timeout's built-in 30 minutes is one node scale-up; Dynamic Workload Scheduler may
    take days (the autoscaler fails a ProvisioningRequest after 7), so flex-start and queued jobs
    default to 7 days. A task's or a configured startup_timeout still wins."""
    from kinetic_airflow.capacity import FLEX_START_WAIT_SECONDS, startup_timeout_for

    assert FLEX_START_WAIT_SECONDS == 7 * 24 * 3600
    flex, queued, spot = (
        placement_of("flex-start"),
        placement_of("queued", local_queue="q"),
        placement_of("spot"),
    )
    assert startup_timeout_for(flex, None, 1800.0, 1800.0) == FLEX_START_WAIT_SECONDS
    assert startup_timeout_for(queued, None, 1800.0, 1800.0) == FLEX_START_WAIT_SECONDS
    assert startup_timeout_for(spot, None, 1800.0, 1800.0) == 1800.0
    assert startup_timeout_for(flex, 600.0, 1800.0, 1800.0) == 600.0  # the task's
    assert startup_timeout_for(flex, None, 3600.0, 1800.0) == 3600.0  # [kinetic] startup_timeout


def test_capacity_spellings():
    assert parse_capacity("reservation:ml-capacity/v6e").text == "reservation:ml-capacity/v6e"
    assert parse_capacity("Flex_Start").text == "flex-start"
    assert parse_capacity(None).text == "on-demand"
    with pytest.raises(InvalidCapacityError, match="Did you mean capacity='flex-start'"):
        parse_capacity("flex-strat")
    with pytest.raises(InvalidCapacityError, match=r"Name it: capacity='reservation:<name>'"):
        parse_capacity("reservation")
    with pytest.raises(InvalidCapacityError, match="names no valid reservation"):
        parse_capacity("reservation:My_Res")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_emulator(tmp_path_factory, NODE_POOLS) as running:
        yield running


@pytest.fixture
def gke_env(cluster, monkeypatch, tmp_path):
    point_kinetic_at(*cluster, monkeypatch)
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")  # storage is not the subject
    return cluster[0]


def _nodes(emulator, dag_run, task_id: str) -> set[str]:
    import kubernetes

    core = kubernetes.client.CoreV1Api(emulator.api_client())
    run = hashlib.sha256(dag_run.run_id.encode()).hexdigest()[:16]
    label = task_id.replace("_", "-")
    pods = core.list_namespaced_pod(
        "default", label_selector=f"kinetic.airflow/task-id={label},kinetic.airflow/run-id={run}"
    ).items
    assert pods, f"no pod of {task_id}"
    nodes = [core.read_node(pod.spec.node_name) for pod in pods]
    return {node.metadata.labels["cloud.google.com/gke-nodepool"] for node in nodes}


def test_jobs_run_on_the_node_pools_of_their_capacity(gke_env):
    import kn_capacity

    dr = kn_capacity.kn_capacity().test()
    assert ti_states(dr) == {"on_flex_start": "success", "on_reservation": "success", "on_spot": "success"}
    assert xcom(dr, "on_flex_start") == "flex-start ok"
    assert _nodes(gke_env, dr, "on_flex_start") == {"l4-flex"}
    assert _nodes(gke_env, dr, "on_reservation") == {"l4-reserved"}
    assert _nodes(gke_env, dr, "on_spot") == {"cpu-spot"}


def test_a_flex_start_job_waits_for_its_provisioned_node_then_runs(gke_env, tmp_path):
    """DWS flex-start: the pod is pending until GKE's autoscaler brings up a flex-start node
    (the emulator's scale-up delay, with the autoscaler's TriggeredScaleUp); the job waits, as
    waiting for a node, and runs on it."""
    import json

    import kn_capacity

    gke_env.delay_scheduling(6)
    try:
        dr = kn_capacity.kn_flex_start_waits().test()
    finally:
        gke_env.delay_scheduling(0)
    assert ti_states(dr) == {"on_flex_start": "success"}
    assert xcom(dr, "on_flex_start") == "flex-start ok"
    assert _nodes(gke_env, dr, "on_flex_start") == {"l4-flex"}
    said = [
        entry["text"]
        for path in sorted(tmp_path.glob("kinetic/**/status/progress.json"))
        for entry in json.loads(path.read_text()).get("history") or []
    ]
    assert any("(scale-up)" in text for text in said), said


def test_a_configured_capacity_is_checked_with_the_task_before_any_job(gke_env, monkeypatch, capfd):
    import kn_capacity

    # the task says capacity="queued"; no [kinetic] local_queue gives it the queue it needs
    monkeypatch.setenv("AIRFLOW__KINETIC__PRIORITY_CLASS", "high")
    dr = kn_capacity.kn_capacity_refused().test()
    assert ti_states(dr) == {"queued_without_a_queue": "failed"}
    out = capfd.readouterr()
    assert "so the job needs a Kueue queue: set local_queue=" in out.out + out.err
    assert "(from [kinetic] priority_class)" in out.out + out.err  # where the rest came from
    import kubernetes

    batch = kubernetes.client.BatchV1Api(gke_env.api_client())
    run = hashlib.sha256(dr.run_id.encode()).hexdigest()[:16]
    assert batch.list_namespaced_job("default", label_selector=f"kinetic.airflow/run-id={run}").items == []
