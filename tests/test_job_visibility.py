"""What a person sees of a job without opening its files: cost, links, labels, progress words.

Function-level checks; the same things through Airflow's UI and REST API under the real
scheduler are in tests/test_ui_components.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from kinetic_airflow.backends.base import BackendStatus, JobState
from kinetic_airflow.backends.gke.classify import classify
from kinetic_airflow.backends.gke.console import is_gke_cluster
from kinetic_airflow.driver import push_links
from kinetic_airflow.job.layout import JobIdentity, JobLayout
from kinetic_airflow.job.ref import JobRef
from kinetic_airflow.job.states import Stage
from kinetic_airflow.job.storage import FileStorage
from kinetic_airflow.links import LINKS_XCOM_KEY, KineticViewLink, task_tab_url
from kinetic_airflow.operators import DEFAULT_MAP_INDEX_TEMPLATE, KineticRunOperator, map_label
from kinetic_airflow.progress import Progress, ProgressTracker, progress_of
from kinetic_airflow.usage import attempt_usage, chips_of, totals
from kinetic_airflow.watch import event_job


def _ref(tmp_path, accelerator: str, attempt: int = 1) -> JobRef:
    identity = JobIdentity("d", "r", "t", -1, 1, attempt)
    return JobRef(
        job_id=identity.job_id,
        job_uri=f"file://{tmp_path}/jobs/{identity.job_id}",
        identity=identity,
        backend="gke",
        accelerator=accelerator,
        submitted_at=1000.0,
    )


def _markers(storage: FileStorage, ref: JobRef, started: float, finished: float) -> None:
    layout = JobLayout(ref.job_uri)
    storage.write_text(layout.status("started"), json.dumps({"time": started}))
    storage.write_text(layout.status("finished"), json.dumps({"time": finished}))


def test_accelerator_hours_of_a_job_of_known_length_and_chips(tmp_path):
    storage = FileStorage()
    ref = _ref(tmp_path, "tpu-v6e-8")  # 2 hosts x 4 chips
    _markers(storage, ref, started=1060.0, finished=1060.0 + 1800)
    usage = attempt_usage(storage, ref, "success")
    assert (usage["chips"], usage["spot"]) == (8, False)
    assert usage["queue_seconds"] == 60.0 and usage["run_seconds"] == 1800.0
    assert usage["chip_hours"] == 4.0  # 8 chips x half an hour
    # recorded beside the result summary, for the Kinetic view and the jobs CLI
    assert json.loads(storage.read_text(f"{ref.job_uri}/usage.json")) == usage


def test_a_preempted_spot_attempt_and_the_retry_are_summed_apart(tmp_path):
    storage = FileStorage()
    first, second = _ref(tmp_path, "tpu-v5litepod-4:spot"), _ref(tmp_path, "tpu-v5litepod-4:spot", 2)
    _markers(storage, first, started=1030.0, finished=1030.0 + 900)
    _markers(storage, second, started=2000.0, finished=2000.0 + 1800)
    attempts = [attempt_usage(storage, first, "preempted"), attempt_usage(storage, second, "success")]
    assert [a["spot"] for a in attempts] == [True, True] and attempts[0]["chips"] == 4
    summed = totals(attempts)
    assert summed["chip_hours"] == pytest.approx(4 * 0.25 + 4 * 0.5)
    assert summed["preempted_attempts"] == 1 and summed["queue_seconds"] == 30.0 + 1000.0


def test_a_job_lost_before_its_runner_started_costs_no_chip_time(tmp_path):
    ref = _ref(tmp_path, "gpu-a100x4")
    usage = attempt_usage(FileStorage(), ref, "failed", ended=1500.0)
    assert usage["chips"] == 4 and usage["run_seconds"] == 0.0 and usage["chip_hours"] == 0.0
    assert usage["queue_seconds"] is None and usage["started_at"] is None


@pytest.mark.parametrize(
    ("accelerator", "chips", "spot"),
    [("cpu", 0, False), ("gpu-l4", 1, False), ("tpu-v6e-8t", 8, False), ("tpu-v5e-1:spot", 1, True)],
)
def test_chips_are_counted_from_the_accelerator(accelerator: str, chips: int, spot: bool):
    assert chips_of(JobRef("j", "gke", "gs://b/jobs/j", accelerator=accelerator)) == (chips, spot)


def test_the_kinetic_link_opens_the_task_tab_of_the_instance():
    run = "manual__2026-12-01T10:00:00+00:00"
    assert task_tab_url("d", run, "t", -1) == (
        "/dags/d/runs/manual__2026-12-01T10%3A00%3A00%2B00%3A00/tasks/t/plugin/kinetic-job"
    )
    assert task_tab_url("d", "r", "t", 3).endswith("/tasks/t/mapped/3/plugin/kinetic-job")


def test_only_a_gke_cluster_gets_console_and_cloud_logging_links():
    assert is_gke_cluster({"project": "p", "location": "us-central1", "name": "c"})
    assert not is_gke_cluster({"kubernetes_conn_id": "kind", "project": "p", "name": "c"})
    pushed: list[tuple[str, Any]] = []

    class Ti:
        def xcom_push(self, key: str, value: Any) -> None:
            pushed.append((key, value))

    base = {"namespace": "default", "job_id": "j", "backend": "gke", "job_uri": "gs://b/jobs/j"}
    behind_a_connection = {**base, "cluster": {"kubernetes_conn_id": "emulator"}}
    push_links(Ti(), JobRef.from_dict(behind_a_connection))
    assert pushed == []  # no GKE console for a cluster behind a Kubernetes connection
    on_gke = {**base, "cluster": {"project": "p", "location": "l", "name": "c"}}
    push_links(Ti(), JobRef.from_dict(on_gke))
    ((key, links),) = pushed
    assert key == LINKS_XCOM_KEY
    assert links["console"].startswith("https://console.cloud.google.com/kubernetes/job/l/c/default/")


def test_a_local_task_has_only_the_kinetic_link():
    local = KineticRunOperator(task_id="t", python_callable=print, backend="local")
    assert [type(link) for link in local.operator_extra_links] == [KineticViewLink]
    cluster = KineticRunOperator(task_id="t", python_callable=print, backend="gke")
    assert [link.name for link in cluster.operator_extra_links] == [
        "Kinetic job",
        "Kinetic Job (GKE console)",
        "Kinetic Job logs (Cloud Logging)",
    ]


def test_sweep_labels_are_the_expanded_arguments_and_authors_can_override_them():
    from airflow.sdk import DAG, task

    with DAG("labels", schedule=None) as dag:

        @task.kinetic(backend="local")
        def train(lr: float, depth: int, name: str) -> None: ...

        @task.kinetic(backend="local", map_index_template="{{ task.op_kwargs['lr'] }}!")
        def own(lr: float) -> None: ...

        train.partial(depth=4).expand(lr=[0.01], name=["a" * 80])
        own.expand(lr=[0.5])
        KineticRunOperator.partial(task_id="classic", python_callable=print, backend="local").expand(
            op_kwargs=[{"x": 1}]
        )

    mapped = dag.task_dict["train"]
    assert mapped.map_index_template == DEFAULT_MAP_INDEX_TEMPLATE
    assert dag.task_dict["own"].map_index_template == "{{ task.op_kwargs['lr'] }}!"
    assert dag.task_dict["classic"].map_index_template == DEFAULT_MAP_INDEX_TEMPLATE

    # an unmapped instance as the worker makes it: partial and expanded arguments merged
    class Unmapped:
        task_id = "train"
        op_args: list[Any] = []
        op_kwargs = {"lr": 0.01, "depth": 4, "name": "a" * 80}

        def __init__(self) -> None:
            self.dag = dag

        def has_dag(self) -> bool:
            return True

    label = map_label(Unmapped())
    assert label.startswith("lr=0.01, name=aaaa") and "depth" not in label and label.endswith("…")
    plain = KineticRunOperator(task_id="plain", python_callable=print, dag=dag)
    assert plain.kinetic_map_label() == ""  # not mapped: Airflow shows no label


def test_progress_words_for_each_state_a_person_acts_on():
    job = JobRef.from_dict(
        {
            "job_id": "j",
            "job_uri": "gs://b/jobs/j",
            "backend": "gke",
            "hosts": 1,
            "node_selectors": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
        }
    )
    pulling = BackendStatus(
        JobState.PENDING,
        reason="Starting",
        details={"node": "gke-pool-1", "image": "runner:py3.11", "waiting": "ContainerCreating"},
    )
    assert progress_of(pulling, job).text == "pulling runner:py3.11 and starting on node gke-pool-1"
    waiting = BackendStatus(JobState.PENDING, reason="Unschedulable", message="0/3 nodes are available")
    assert progress_of(waiting, job).text == (
        'waiting for a node matching {"cloud.google.com/gke-accelerator": "nvidia-l4"} (scale-up): '
        "0/3 nodes are available"
    )
    slice_job = JobRef("j", "pathways", "gs://b/jobs/j", hosts=4)
    starting = BackendStatus(JobState.PENDING, reason="GroupStarting", message="2 of 4 hosts running")
    assert progress_of(starting, slice_job).text == "starting the slice: 2 of 4 hosts running"
    running = BackendStatus(JobState.RUNNING, details={"nodes": ["n1", "n2"]})
    assert progress_of(running, slice_job).text == "running on all 4 hosts on n1, n2"
    assert progress_of(BackendStatus(JobState.SUCCEEDED), job) is None  # the watcher says the end


def _pod(node: str, started: str, reason: str = "Completed") -> dict[str, Any]:
    ended = {"exitCode": 0 if reason == "Completed" else 128, "reason": reason, "startedAt": started}
    return {
        "metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"nodeName": node, "containers": [{"image": "runner"}]},
        "status": {
            "phase": "Succeeded" if reason == "Completed" else "Failed",
            "containerStatuses": [{"name": "job", "state": {"terminated": ended}}],
        },
    }


def test_a_job_that_ran_and_ended_between_two_looks_still_says_where_it_ran():
    """CI once saw waiting -> finished with no node: the pod ran for under a second."""
    complete = {"metadata": {"name": "j"}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    ended = classify(complete, [_pod("gke-l4-1", "2026-01-01T00:00:05Z")])
    assert ended.state is JobState.SUCCEEDED and ended.details["ran_on"] == "gke-l4-1"
    failed = {"metadata": {"name": "j"}, "status": {"conditions": [{"type": "Failed", "status": "True"}]}}
    never = classify(failed, [_pod("gke-l4-1", "1970-01-01T00:00:00Z", reason="StartError")])
    assert "ran_on" not in never.details  # the kubelet could not start it: it ran nowhere

    job = JobRef("j", "gke", "gs://b/jobs/j", hosts=1)
    told: list[str] = []
    tracker = ProgressTracker(job, told.append)
    waiting = BackendStatus(JobState.PENDING, reason="Unschedulable", message="0/3 nodes are available")
    asyncio.run(tracker.observe(waiting))
    asyncio.run(tracker.observe(ended))
    assert told[-1] == "[kinetic] running on node gke-l4-1", told
    asyncio.run(tracker.observe(ended))  # said once
    assert len(told) == 2, told
    seen = ProgressTracker(job, told.append)
    asyncio.run(seen.observe(BackendStatus(JobState.RUNNING, details={"node": "gke-l4-1"})))
    stale = Progress(Stage.HEARTBEAT_STALE, "silent")
    asyncio.run(seen.tell(stale))
    asyncio.run(seen.observe(ended))  # a look saw it run already: not said again
    assert told[2:] == ["[kinetic] running on node gke-l4-1", "[kinetic] silent"], told


def test_an_event_names_its_job_without_local_paths_or_cluster_secrets_of_any_kind():
    ref = JobRef.from_dict(
        {
            "job_id": "j",
            "backend": "gke",
            "job_uri": "gs://b/kinetic/jobs/j",
            "base_uri": "gs://b/kinetic",
            "identity": JobIdentity("d", "r", "t").to_dict(),
            "local_dir": "/home/me/.kinetic/j",
            "python": "/usr/bin/python3",
            "cluster": {"endpoint": "10.0.0.1", "ca": "LS0t..."},
            "container_env": {"A": "b"},
        }
    )
    assert set(event_job(ref)) == {"job_id", "backend", "job_uri", "base_uri", "identity"}
