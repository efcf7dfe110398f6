"""batch/v1 Jobs through the official client: the controller, validation, cascading delete."""

from __future__ import annotations

import pytest
from cluster_emulator import ClusterEmulator, wait_until
from emu_helpers import NS, api_error, condition, job_manifest, job_pods, pid_alive, read_log, wait_job
from kubernetes import client
from kubernetes.client.rest import ApiException


@pytest.fixture
def apis(k8s_api_client: client.ApiClient) -> tuple[client.BatchV1Api, client.CoreV1Api]:
    return client.BatchV1Api(k8s_api_client), client.CoreV1Api(k8s_api_client)


def test_job_runs_its_command_and_completes(apis: tuple[client.BatchV1Api, client.CoreV1Api]) -> None:
    batch, core = apis
    created = batch.create_namespaced_job(NS, job_manifest("hello", "print('hi')"))
    assert created.metadata.uid and created.metadata.resource_version and created.metadata.creation_timestamp
    assert created.metadata.generation == 1
    assert created.spec.template.metadata.labels["job-name"] == "hello"

    job = wait_job(batch, "hello", "Complete")
    types = [c.type for c in job.status.conditions]
    assert types.index("SuccessCriteriaMet") < types.index("Complete")
    assert condition(job, "Complete").reason == "CompletionsReached"
    assert job.status.succeeded == 1 and not job.status.failed and not job.status.active
    assert job.status.start_time and job.status.completion_time
    assert job.status.uncounted_terminated_pods is not None

    (pod,) = job_pods(core, "hello")
    assert pod.metadata.name.startswith("hello-") and len(pod.metadata.name) == len("hello-") + 5
    labels = pod.metadata.labels
    assert labels["batch.kubernetes.io/job-name"] == "hello"
    assert labels["controller-uid"] == labels["batch.kubernetes.io/controller-uid"] == created.metadata.uid
    owner = pod.metadata.owner_references[0]
    assert (owner.kind, owner.name, owner.controller) == ("Job", "hello", True)
    assert pod.status.phase == "Succeeded"
    assert pod.spec.node_name
    cs = pod.status.container_statuses[0]
    assert (cs.name, cs.image, cs.ready, cs.restart_count) == ("main", "python:3.11-slim", False, 0)
    assert cs.image_id
    assert cs.state.terminated.exit_code == 0 and cs.state.terminated.reason == "Completed"
    assert cs.state.terminated.started_at and cs.state.terminated.finished_at
    assert {c.type for c in pod.status.conditions} >= {
        "PodScheduled",
        "Initialized",
        "ContainersReady",
        "Ready",
    }
    assert read_log(core, pod.metadata.name) == "hi\n"


def test_backoff_limit_retries_then_fails(apis: tuple[client.BatchV1Api, client.CoreV1Api]) -> None:
    batch, core = apis
    batch.create_namespaced_job(
        NS, job_manifest("flaky", "import sys; print('boom'); sys.exit(3)", backoff_limit=1)
    )
    job = wait_job(batch, "flaky", "Failed")
    failed = condition(job, "Failed")
    assert failed.reason == "BackoffLimitExceeded"
    assert failed.message == "Job has reached the specified backoff limit"
    assert condition(job, "FailureTarget").status == "True"
    assert job.status.failed == 2
    pods = job_pods(core, "flaky")
    assert len(pods) == 2
    for pod in pods:
        assert pod.status.phase == "Failed"
        term = pod.status.container_statuses[0].state.terminated
        assert (term.exit_code, term.reason) == (3, "Error")


def test_active_deadline_kills_pods(
    apis: tuple[client.BatchV1Api, client.CoreV1Api], k8s_cluster: ClusterEmulator
) -> None:
    batch, core = apis
    # The deadline is generous at creation and cut short once the pod runs: a
    # 1 s deadline from the start would race a slow pod start on a loaded
    # machine (the Job fails before any pod is Running). activeDeadlineSeconds
    # is not among the fields ValidateJobSpecUpdate (kubernetes/pkg/apis/batch)
    # keeps immutable, so a Job's deadline can be changed while it runs.
    manifest = job_manifest(
        "slow", "import time; print('start', flush=True); time.sleep(60)", activeDeadlineSeconds=600
    )
    manifest["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 1
    batch.create_namespaced_job(NS, manifest)
    pod_name = wait_until(
        lambda: [p.metadata.name for p in job_pods(core, "slow") if p.status.phase == "Running"]
    )[0]
    pid = wait_until(lambda: [p["pid"] for p in k8s_cluster.processes() if p["pod"] == pod_name])[0]
    batch.patch_namespaced_job("slow", NS, {"spec": {"activeDeadlineSeconds": 1}})
    job = wait_job(batch, "slow", "Failed")
    assert condition(job, "Failed").reason == "DeadlineExceeded"
    assert condition(job, "Failed").message == "Job was active longer than specified deadline"
    wait_until(lambda: not pid_alive(pid), message="pod process killed")


def test_indexed_job_sets_completion_index(apis: tuple[client.BatchV1Api, client.CoreV1Api]) -> None:
    batch, core = apis
    manifest = job_manifest(
        "idx",
        "import os; print(os.environ['JOB_COMPLETION_INDEX'])",
        completions=3,
        parallelism=3,
        completionMode="Indexed",
    )
    batch.create_namespaced_job(NS, manifest)
    job = wait_job(batch, "idx", "Complete")
    assert job.status.completed_indexes == "0-2"
    pods = job_pods(core, "idx")
    assert len(pods) == 3
    for pod in pods:
        index = pod.metadata.annotations["batch.kubernetes.io/job-completion-index"]
        assert pod.metadata.labels["batch.kubernetes.io/job-completion-index"] == index
        assert pod.metadata.name.startswith(f"idx-{index}-")
        assert read_log(core, pod.metadata.name) == f"{index}\n"


def test_pod_failure_policy_fail_job(apis: tuple[client.BatchV1Api, client.CoreV1Api]) -> None:
    batch, _ = apis
    manifest = job_manifest(
        "pfp",
        "import sys; sys.exit(42)",
        backoff_limit=5,
        podFailurePolicy={
            "rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]
        },
    )
    batch.create_namespaced_job(NS, manifest)
    job = wait_job(batch, "pfp", "Failed")
    failed = condition(job, "Failed")
    assert failed.reason == "PodFailurePolicy"
    assert "failed with exit code 42 matching FailJob rule at index 0" in failed.message
    assert job.status.failed == 1


def test_pod_failure_policy_ignores_disruption(
    apis: tuple[client.BatchV1Api, client.CoreV1Api], k8s_cluster: ClusterEmulator, tmp_path
) -> None:
    batch, core = apis
    marker = tmp_path / "first-run"
    code = (
        "import os, sys, time\n"
        f"m = {str(marker)!r}\n"
        "if os.path.exists(m):\n    print('second'); sys.exit(0)\n"
        "open(m, 'w').close(); print('first', flush=True); time.sleep(60)\n"
    )
    manifest = job_manifest(
        "disrupted",
        code,
        backoff_limit=0,
        podFailurePolicy={
            "rules": [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
            ]
        },
    )
    batch.create_namespaced_job(NS, manifest)
    first = wait_until(
        lambda: [p.metadata.name for p in job_pods(core, "disrupted") if p.status.phase == "Running"]
    )
    wait_until(marker.exists)
    k8s_cluster.preempt_pod(NS, first[0], grace_seconds=1)
    job = wait_job(batch, "disrupted", "Complete")
    assert not job.status.failed  # the disruption was ignored, not counted against backoffLimit
    assert len(job_pods(core, "disrupted")) == 2


def test_pod_failure_policy_keeps_a_preemption_verdict_on_the_job(
    apis: tuple[client.BatchV1Api, client.CoreV1Api], k8s_cluster: ClusterEmulator
) -> None:
    """FailJob on DisruptionTarget: the Job's own condition says the pod was disrupted, so a client
    that never saw the pod (deleted since) still reads a preemption, not BackoffLimitExceeded.
    Rule 0 has an unknown action and is skipped, as upstream's matchPodFailurePolicy does."""
    batch, core = apis
    rules = [
        {"action": "SomeFutureAction", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]
    manifest = job_manifest(
        "preempted", "import time; time.sleep(60)", backoff_limit=0, podFailurePolicy={"rules": rules}
    )
    batch.create_namespaced_job(NS, manifest)
    pod = wait_until(
        lambda: [p.metadata.name for p in job_pods(core, "preempted") if p.status.phase == "Running"]
    )
    k8s_cluster.preempt_pod(NS, pod[0], grace_seconds=1)
    job = wait_job(batch, "preempted", "Failed")
    failed = condition(job, "Failed")
    assert failed.reason == "PodFailurePolicy"
    assert (
        failed.message == f"Pod {NS}/{pod[0]} has condition DisruptionTarget matching FailJob rule at index 1"
    )
    core.delete_namespaced_pod(pod[0], NS)
    wait_until(lambda: not job_pods(core, "preempted"))
    assert condition(batch.read_namespaced_job_status("preempted", NS), "Failed").reason == "PodFailurePolicy"

    # without the rule the same preemption is only a failed pod past backoffLimit
    batch.create_namespaced_job(NS, job_manifest("preempted-plain", "import time; time.sleep(60)"))
    pod = wait_until(
        lambda: [p.metadata.name for p in job_pods(core, "preempted-plain") if p.status.phase == "Running"]
    )
    k8s_cluster.preempt_pod(NS, pod[0], grace_seconds=1)
    assert condition(wait_job(batch, "preempted-plain", "Failed"), "Failed").reason == "BackoffLimitExceeded"


def test_suspend_and_resume(apis: tuple[client.BatchV1Api, client.CoreV1Api]) -> None:
    batch, core = apis
    batch.create_namespaced_job(NS, job_manifest("paused", "print('ran')", suspend=True))
    job = wait_job(batch, "paused", "Suspended")
    assert condition(job, "Suspended").reason == "JobSuspended"
    assert job_pods(core, "paused") == []
    generation = job.metadata.generation
    patched = batch.patch_namespaced_job("paused", NS, {"spec": {"suspend": False}})
    assert patched.metadata.generation == generation + 1
    job = wait_job(batch, "paused", "Complete")
    assert condition(job, "Suspended").status == "False"


def test_ttl_after_finished_deletes_job_and_pods(apis: tuple[client.BatchV1Api, client.CoreV1Api]) -> None:
    batch, core = apis
    batch.create_namespaced_job(NS, job_manifest("short-lived", "pass", ttlSecondsAfterFinished=0))

    def gone() -> bool:
        try:
            batch.read_namespaced_job("short-lived", NS)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_until(gone, message="job deleted by TTL")
    wait_until(lambda: job_pods(core, "short-lived") == [], message="pods garbage collected")


def test_on_failure_restarts_container_until_backoff_limit(
    apis: tuple[client.BatchV1Api, client.CoreV1Api],
) -> None:
    batch, core = apis
    batch.create_namespaced_job(
        NS, job_manifest("restarts", "import sys; sys.exit(1)", backoff_limit=1, restart="OnFailure")
    )
    job = wait_job(batch, "restarts", "Failed")
    assert condition(job, "Failed").reason == "BackoffLimitExceeded"
    assert job.status.failed == 1  # the one pod, deleted once its restarts hit the limit
    events = core.list_namespaced_event(NS, field_selector="reason=BackOff").items
    assert any(e.involved_object.name.startswith("restarts-") for e in events)


def test_schema_invalid_job_is_rejected_with_422(apis: tuple[client.BatchV1Api, client.CoreV1Api]) -> None:
    batch, _ = apis
    manifest = job_manifest("typo", "pass")
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["comand"] = container.pop("command")
    with pytest.raises(ApiException) as info:
        batch.create_namespaced_job(NS, manifest)
    assert info.value.status == 422
    body = api_error(info.value)
    assert (body["kind"], body["apiVersion"], body["status"], body["reason"], body["code"]) == (
        "Status",
        "v1",
        "Failure",
        "Invalid",
        422,
    )
    assert "comand" in body["message"] and body["message"].startswith('Job.batch "typo" is invalid')
    assert body["details"]["name"] == "typo" and body["details"]["kind"] == "Job"
    assert body["details"]["causes"][0]["field"] == "spec.template.spec.containers[0].comand"

    bad_restart = job_manifest("always", "pass", restart="Always")
    with pytest.raises(ApiException) as info:
        batch.create_namespaced_job(NS, bad_restart)
    assert info.value.status == 422
    assert 'Unsupported value: "Always"' in api_error(info.value)["message"]

    bad_label = job_manifest("label", "pass")
    bad_label["metadata"]["labels"] = {"dag": "my dag with spaces"}
    with pytest.raises(ApiException) as info:
        batch.create_namespaced_job(NS, bad_label)
    assert info.value.status == 422


def test_duplicate_name_is_409_already_exists(apis: tuple[client.BatchV1Api, client.CoreV1Api]) -> None:
    batch, _ = apis
    batch.create_namespaced_job(NS, job_manifest("dup", "pass"))
    with pytest.raises(ApiException) as info:
        batch.create_namespaced_job(NS, job_manifest("dup", "pass"))
    assert info.value.status == 409
    body = api_error(info.value)
    assert body["reason"] == "AlreadyExists"
    assert body["message"] == 'jobs.batch "dup" already exists'
    assert body["details"] == {"name": "dup", "group": "batch", "kind": "jobs"}


def test_foreground_delete_kills_the_process(
    apis: tuple[client.BatchV1Api, client.CoreV1Api], k8s_cluster: ClusterEmulator
) -> None:
    batch, core = apis
    batch.create_namespaced_job(NS, job_manifest("forever", "import time; time.sleep(300)"))
    pod_name = wait_until(
        lambda: [p.metadata.name for p in job_pods(core, "forever") if p.status.phase == "Running"]
    )[0]
    pid = wait_until(lambda: [p["pid"] for p in k8s_cluster.processes() if p["pod"] == pod_name])[0]
    assert pid_alive(pid)
    batch.delete_namespaced_job("forever", NS, propagation_policy="Foreground")
    pending = k8s_cluster.get_object("jobs", NS, "forever")
    if pending is not None:  # the owner waits for its dependents
        assert pending["metadata"]["deletionTimestamp"]
        assert "foregroundDeletion" in pending["metadata"]["finalizers"]
    wait_until(lambda: k8s_cluster.get_object("jobs", NS, "forever") is None, message="job removed")
    assert k8s_cluster.get_object("pods", NS, pod_name) is None
    wait_until(lambda: not pid_alive(pid), message="process killed")


def test_delete_without_policy_orphans_pods_like_batch_v1(
    apis: tuple[client.BatchV1Api, client.CoreV1Api],
) -> None:
    batch, core = apis
    batch.create_namespaced_job(NS, job_manifest("orphaner", "pass"))
    wait_job(batch, "orphaner", "Complete")
    status = batch.delete_namespaced_job("orphaner", NS)
    assert status.status == "Success"
    (pod,) = job_pods(core, "orphaner")
    assert not pod.metadata.owner_references
    core.delete_namespaced_pod(pod.metadata.name, NS)
    wait_until(lambda: job_pods(core, "orphaner") == [])


def test_background_delete_removes_job_then_pods(apis: tuple[client.BatchV1Api, client.CoreV1Api]) -> None:
    batch, core = apis
    batch.create_namespaced_job(NS, job_manifest("bg", "import time; time.sleep(300)"))
    wait_until(lambda: [p for p in job_pods(core, "bg") if p.status.phase == "Running"])
    batch.delete_namespaced_job("bg", NS, propagation_policy="Background")
    with pytest.raises(ApiException) as info:
        batch.read_namespaced_job("bg", NS)
    assert info.value.status == 404
    wait_until(lambda: job_pods(core, "bg") == [], message="pods collected")
