"""backend="gke" end to end with dag.test() against the local cluster emulator (which validates
every manifest with the real Kubernetes schemas and runs pods as processes)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import cloudpickle
import pytest
from components.emulator_process import DEFAULT_NODE_POOLS
from emulated_cluster import point_kinetic_at, running_emulator
from helpers import on_storage, ti_states, ti_try_numbers, xcom
from jobkit import gke_job

# Jobs built here without the operator run functions of this module: ship them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

NODE_POOLS = list(DEFAULT_NODE_POOLS)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_emulator(tmp_path_factory, NODE_POOLS) as running:
        yield running


@pytest.fixture
def gke_env(cluster, base_uri, monkeypatch, tmp_path):
    point_kinetic_at(*cluster, monkeypatch)
    out = tmp_path / "failures"
    out.mkdir()
    monkeypatch.setenv("KN_TEST_FAILURES", str(out))
    return cluster[0], out


def _dag(name):
    import kn_gke

    return getattr(kn_gke, name)()


def _k8s(emulator):
    import kubernetes

    client = emulator.api_client()
    return kubernetes.client.BatchV1Api(client), kubernetes.client.CoreV1Api(client)


def _wait_for_pod(emulator, task_label: str, *, phase: str = "Running", timeout: float = 60) -> str:
    _, core = _k8s(emulator)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(
            "default", label_selector=f"kinetic.airflow/task-id={task_label}"
        ).items
        for pod in pods:
            if pod.status.phase == phase:
                return pod.metadata.name
        time.sleep(0.2)
    raise AssertionError(f"no {phase} pod for {task_label}")


def _in_background(fn):
    errors = []

    def run():
        try:
            fn()
        except Exception as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def _selector(dr, task_label: str) -> str:
    """Jobs of one task in one DAG run (the module's emulator outlives a single run)."""
    import hashlib

    run = hashlib.sha256(dr.run_id.encode()).hexdigest()[:16]
    return f"kinetic.airflow/task-id={task_label},kinetic.airflow/run-id={run}"


def _failure(out: Path, task_id: str) -> tuple[str, str]:
    kind, message = (out / f"{task_id}.txt").read_text().split("\n", 1)
    return kind, message


def test_cpu_gpu_tpu_jobs_user_error_and_duplicate_execute(gke_env):
    emulator, out = gke_env
    dr = _dag("kn_gke_basics").test()
    assert ti_states(dr) == {
        "on_cpu": "success",
        "on_gpu": "success",
        "on_tpu": "success",
        "raises_value_error": "failed",
    }
    value = xcom(dr, "on_cpu")
    assert value["x"] == 42 and value["attempt"] == "1"
    assert xcom(dr, "on_gpu") == "gpu ok" and xcom(dr, "on_tpu") == "tpu ok"
    kind, message = _failure(out, "raises_value_error")
    assert kind == "builtins.ValueError" and message.startswith("bad learning rate: -1")
    batch, _ = _k8s(emulator)
    jobs = batch.list_namespaced_job("default", label_selector=_selector(dr, "on-cpu")).items
    assert len(jobs) == 1  # execute ran twice; one Job
    job = jobs[0]
    assert job.spec.backoff_limit == 0 and job.metadata.labels["app"] == "kinetic"
    # the emulator is reached through a Kubernetes connection: no GKE console link to a cluster
    # that does not exist (tests/test_job_visibility.py has the links of a GKE cluster)
    with pytest.raises(AssertionError, match="no XCom 'kinetic_job_links'"):
        xcom(dr, "on_cpu", key="kinetic_job_links")
    tpu_jobs = batch.list_namespaced_job("default", label_selector=_selector(dr, "on-tpu")).items
    selectors = tpu_jobs[0].spec.template.spec.node_selector
    assert selectors == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "2x4",
    }


@on_storage("gs")  # the cluster's side: a pod's causes, API faults, its log
def test_preemption_oom_image_pull_and_unschedulable(gke_env, capfd):
    emulator, out = gke_env
    emulator.fail_image_pulls("registry.invalid/*")

    def wait_for_line(name: str, line: str) -> None:
        _, core = _k8s(emulator)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            log = core.read_namespaced_pod_log(name, "default", _preload_content=False).data.decode()
            if line in log:
                return
            time.sleep(0.1)
        raise AssertionError(f"pod {name} never printed {line!r}")

    def preempt():
        name = _wait_for_pod(emulator, "preemptible-training", timeout=300)
        wait_for_line(name, "checkpoint written")  # preempt only once attempt 1 checkpointed
        emulator.preempt_pod("default", name, grace_seconds=1)

    def oom_kill():
        name = _wait_for_pod(emulator, "memory-hog", timeout=300)
        wait_for_line(name, "allocating")  # kill it once it is really working
        emulator.oom_kill_pod("default", name)

    # dag.test runs the tasks in no fixed order: one watcher thread per fault
    threads = [_in_background(preempt), _in_background(oom_kill)]
    dr = _dag("kn_gke_faults").test()
    for thread, errors in threads:
        thread.join(5)
        assert not errors, errors
    assert ti_states(dr) == {
        "preemptible_training": "success",
        "memory_hog": "failed",
        "bad_image": "failed",
        "no_node_pool": "failed",
    }
    # preempted attempt 1 -> attempt 2 in the same Airflow try, resuming from the checkpoint
    value = xcom(dr, "preemptible_training")
    assert value["attempt"] == "2" and value["resumed_from"] == "written by attempt 1"
    assert ti_try_numbers(dr)["preemptible_training"] == 1
    kind, message = _failure(out, "memory_hog")
    assert "OOMKilled" in message and "out of memory" in message
    # The job's last line was streamed into the task log once; the error points at it.
    assert "last log lines are just above in this task log" in message
    out_text, err_text = capfd.readouterr()
    assert "allocating" in out_text + err_text
    kind, message = _failure(out, "bad_image")
    assert "registry.invalid/kinetic/missing:1" in message and "cannot be pulled" in message
    kind, message = _failure(out, "no_node_pool")
    assert kind == "kinetic_airflow.results.KineticJobError"
    assert "could not be scheduled within startup_timeout=2s" in message
    assert '"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"' in message
    batch, _ = _k8s(emulator)  # the unschedulable Job was deleted, not left pending
    assert not batch.list_namespaced_job(
        "default", label_selector="kinetic.airflow/task-id=no-node-pool"
    ).items


@on_storage("gs")  # the cluster's side: a pod's causes, API faults, its log
def test_api_faults_are_survived(gke_env):
    emulator, _ = gke_env
    emulator.inject_api_fault("POST", r".*/jobs$", status=500, count=2)
    emulator.inject_api_fault("GET", r".*/pods$", status=429, count=3, retry_after=0.2)
    emulator.drop_watches(after_events=1, streams=2)
    dr = _dag("kn_gke_api_faults").test()
    assert ti_states(dr) == {"sleeps_a_while": "success"}
    assert xcom(dr, "sleeps_a_while") == 7


@on_storage("gs")  # the cluster's side: a pod's causes, API faults, its log
def test_mark_failed_deletes_the_job(gke_env):
    """BaseTrigger.on_kill (user marks the deferred task failed / clears it) deletes our Job."""
    import asyncio

    from kinetic_airflow.triggers import KineticJobTrigger

    emulator, _ = gke_env
    _, ref, _ = gke_job("long", time.sleep, [600])
    _wait_for_pod(emulator, "long")
    trigger = KineticJobTrigger(job=ref.to_dict())
    kwargs = json.dumps(trigger.serialize()[1])
    assert "token" not in kwargs.lower() and "kube_config" not in kwargs
    asyncio.run(trigger.on_kill())
    batch, _ = _k8s(emulator)
    deadline = time.monotonic() + 30
    while (
        time.monotonic() < deadline
        and batch.list_namespaced_job("default", label_selector="job-id=" + ref.job_id).items
    ):
        time.sleep(0.2)
    assert not batch.list_namespaced_job("default", label_selector="job-id=" + ref.job_id).items


def test_stale_heartbeat_counts_as_node_loss(gke_env, base_uri, monkeypatch):
    """The pod still looks alive but the runner stopped beating: resubmitted like a preemption.
    The task log says so as it happens, and the try's usage counts both attempts."""
    import signal

    from kinetic_airflow.job.storage import open_storage

    monkeypatch.setenv("KINETIC_HEARTBEAT_TIMEOUT", "3")
    storage = open_storage(base_uri)

    def freeze():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            found = [u for u in storage.list(base_uri + "/outputs") if u.endswith("/attempt1.txt")]
            if found:
                os.kill(int(storage.read_text(found[0])), signal.SIGSTOP)
                return
            time.sleep(0.2)
        raise AssertionError("attempt 1 never started")

    thread, errors = _in_background(freeze)
    dr = _dag("kn_gke_stall").test()
    thread.join(5)
    assert not errors, errors
    assert ti_states(dr) == {"node_goes_silent": "success"}
    value = xcom(dr, "node_goes_silent")
    assert value["attempt"] == "2" and ti_try_numbers(dr)["node_goes_silent"] == 1
    usage = xcom(dr, "node_goes_silent", key="kinetic_usage")
    assert [a["outcome"] for a in usage["attempts"]] == ["preempted", "success"]
    assert [a["attempt"] for a in usage["attempts"]] == [1, 2] and usage["preempted_attempts"] == 1
    first = json.loads(
        storage.read_text(f"{base_uri}/jobs/{usage['attempts'][0]['job_id']}/status/progress.json")
    )
    states = [h["state"] for h in first["history"]]
    # The watcher may first see the pod still starting (pulling_image) when the machine is busy;
    # from then on the attempt runs, goes stale, and is counted as a lost node.
    startup = states[: states.index("running")] if "running" in states else states
    assert set(startup) <= {"pulling_image"}, first["history"]
    assert states[len(startup) :] == ["running", "heartbeat_stale", "preempted"], first["history"]
    assert first["history"][-2]["text"].startswith("heartbeat stale: the runner's last heartbeat is")


@on_storage("gs")  # the cluster's side: a pod's causes, API faults, its log
def test_name_clash_with_another_task_instances_job_is_refused(gke_env):
    """A 409 is adopted only for a Job labelled as this task instance's."""
    from kinetic_airflow.backends.gke.backend import GKEBackend, JobOwnershipError, k8s_job_name
    from kinetic_airflow.job.layout import JobIdentity
    from kinetic_airflow.operators import KineticRunOperator

    op = KineticRunOperator(task_id="clash", python_callable=print, backend="gke")
    base = os.environ["KINETIC_BASE_URI"]  # also names the run: one Job per parametrized test
    ref = op._job_ref(JobIdentity("d", base, "clash"), "gke", base)
    GKEBackend().submit(ref)
    GKEBackend().submit(ref)  # same task instance: adopted, no error
    batch, _ = _k8s(gke_env[0])
    job = batch.read_namespaced_job(k8s_job_name(ref), "default")
    job.metadata.labels["kinetic.airflow/ti"] = "someone-else"
    batch.patch_namespaced_job(k8s_job_name(ref), "default", {"metadata": {"labels": job.metadata.labels}})
    with pytest.raises(JobOwnershipError, match="not labelled as this task instance's"):
        GKEBackend().submit(ref)
    GKEBackend().cancel(ref)  # and cancel leaves a Job it does not own alone
    assert batch.read_namespaced_job(k8s_job_name(ref), "default").metadata.name == k8s_job_name(ref)


@on_storage("gs")  # the cluster's side: a pod's causes, API faults, its log
def test_a_job_past_its_active_deadline_is_the_same_timeout_as_everywhere(gke_env):
    """Kubernetes enforcing activeDeadlineSeconds gives the task the same AirflowTaskTimeout (type and
    message) as the trigger's own deadline and the local backend do."""
    import asyncio

    from airflow.sdk.exceptions import AirflowTaskTimeout

    from kinetic_airflow.backends.gke.backend import GKEBackend
    from kinetic_airflow.driver import JobDriver
    from kinetic_airflow.watch import JobEvent, JobWatcher

    # Kubernetes stops it after 3 s; the watcher itself has no deadline.
    op, ref, storage = gke_job("deadline", time.sleep, [600], active_deadline_seconds=3)
    event = asyncio.run(JobWatcher(ref, storage, GKEBackend(), poll_interval=0.3).wait())
    assert event["status"] == "timeout" and event["cause"] == "timeout", event
    with pytest.raises(AirflowTaskTimeout) as raised:
        JobDriver(op, {})._outcome(ref, JobEvent.from_dict(event))
    assert "the task's execution_timeout passed while the job was running; the job was stopped" in str(
        raised.value
    )


def _count_to(n: int) -> None:
    for i in range(n):
        print(f"count {i}", flush=True)


@on_storage("gs")  # the cluster's side: a pod's causes, API faults, its log
def test_pod_log_survives_stream_errors_and_a_capped_log_names_kubectl(gke_env):
    """A 403 on the log stream used to end following for good; it is retried now. The cap notice
    names where the whole log is on a cluster (no job.log exists there)."""
    import asyncio

    from kinetic_airflow.backends.gke.backend import GKEBackend
    from kinetic_airflow.watch import JobWatcher

    emulator, _ = gke_env
    emulator.inject_api_fault("GET", r"/pods/[^/]+/log", status=403, count=3)
    _, ref, storage = gke_job("counting", _count_to, [200])
    shown: list[str] = []
    watcher = JobWatcher(
        ref, storage, GKEBackend(), poll_interval=0.3, log_max_lines=40, emit_log=shown.append
    )
    event = asyncio.run(watcher.wait())
    assert event["status"] == "success", event
    counted = [line for line in shown if line.startswith("count ")]
    assert counted[:5] == [f"count {i}" for i in range(5)] and counted[-1] == "count 199"
    (notice,) = [line for line in shown if "log_max_lines=40" in line]
    assert f"kubectl logs -n default job/kinetic-{ref.job_id}" in notice
    assert "job.log" not in notice


@on_storage("gs")  # the cluster's side: a pod's causes, API faults, its log
def test_the_accelerator_is_parsed_once_from_preflight_to_the_manifest(gke_env, monkeypatch):
    """The rendered accelerator is parsed by preflight; the job reference carries that spec to the
    backend, which reads it instead of parsing ``job.accelerator`` again. Decoding a stored
    reference parses its string once more: decoding is the boundary."""
    import kinetic_airflow.job.accelerators as registry
    from kinetic_airflow.backends.gke.backend import GKEBackend
    from kinetic_airflow.job.layout import JobIdentity
    from kinetic_airflow.job.ref import JobRef
    from kinetic_airflow.operators import KineticRunOperator
    from kinetic_airflow.submission import preflight

    op = KineticRunOperator(task_id="once", python_callable=print, accelerator="gpu-l4", backend="gke")
    real, calls = registry.parse_accelerator, []

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    for module in list(sys.modules.values()):  # every module's own binding of the function
        if getattr(module, "__name__", "").startswith("kinetic_airflow"):
            if getattr(module, "parse_accelerator", None) is real:
                monkeypatch.setattr(module, "parse_accelerator", counting)
    target = preflight(op, {})
    base = os.environ["KINETIC_BASE_URI"]
    ref = op._job_ref(JobIdentity("d", base, "once"), target.backend, target.base_uri, target.spec)
    manifest = GKEBackend().manifest(ref)
    assert calls == ["gpu-l4"], calls
    assert ref.spec == target.spec == real("gpu-l4") and ref.accelerator == "gpu-l4"
    pod = manifest["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["cloud.google.com/gke-accelerator"] == "nvidia-l4"
    decoded = JobRef.from_dict(json.loads(json.dumps(ref.to_dict())))
    assert calls == ["gpu-l4", "gpu-l4"] and decoded.spec == ref.spec and decoded == ref
    assert GKEBackend().manifest(decoded) == manifest and len(calls) == 2
