"""backend="pathways": a multi-host TPU slice as one LeaderWorkerSet, end to end with dag.test()
against the cluster emulator, which runs every host's pod as a process with the LWS
environment (and validates the LeaderWorkerSet against its CRD schema)."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest
from emulated_cluster import point_kinetic_at, running_emulator
from helpers import ti_states, ti_try_numbers, xcom

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_emulator(tmp_path_factory) as running:  # every TPU pool
        yield running


@pytest.fixture
def lws_env(cluster, tmp_path, monkeypatch):
    """The hosts meet in KINETIC_OUTPUT_DIR, so job storage is a local directory here (the
    gs:// path is the same code as for Jobs, tested in test_gke_backend)."""
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    point_kinetic_at(*cluster, monkeypatch)
    return cluster[0]


def _dag(name):
    import kn_pathways

    return getattr(kn_pathways, name)()


def _apis(emulator):
    import kubernetes

    client = emulator.api_client()
    return kubernetes.client.CustomObjectsApi(client), kubernetes.client.CoreV1Api(client)


def _groups(emulator, task_id: str) -> list[dict]:
    custom, _ = _apis(emulator)
    listing = custom.list_namespaced_custom_object(
        "leaderworkerset.x-k8s.io",
        "v1",
        "default",
        "leaderworkersets",
        label_selector=f"kinetic.airflow/task-id={task_id.replace('_', '-')}",
    )
    return listing["items"]


def _pods(emulator, task_id: str) -> list:
    _, core = _apis(emulator)
    return core.list_namespaced_pod(
        "default", label_selector=f"kinetic.airflow/task-id={task_id.replace('_', '-')}"
    ).items


def _wait_gone(emulator, task_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _groups(emulator, task_id) and not _pods(emulator, task_id):
            return
        time.sleep(0.2)
    raise AssertionError(
        f"left behind: {[g['metadata']['name'] for g in _groups(emulator, task_id)]} "
        f"{[p.metadata.name for p in _pods(emulator, task_id)]}"
    )


def _task_log(capfd) -> str:
    out, err = capfd.readouterr()
    return out + err


def test_every_host_runs_and_host_0_returns(lws_env, capfd):
    dr = _dag("kn_pathways_all_hosts").test()
    assert ti_states(dr) == {"every_host_runs": "success"}
    value = xcom(dr, "every_host_runs")
    assert value["host"] == 0 and value["seen"] == [0, 1, 2, 3]
    assert value["env"] == {
        "KERAS_BACKEND": "jax",
        "JAX_PLATFORMS": "tpu",
        "TPU_WORKER_ID": "0",  # set by the LWS pod webhook, with the hostnames
        "KINETIC_NUM_HOSTS": "4",
    }
    # $(LWS_LEADER_ADDRESS):port; the emulator resolves the leader's DNS name to this machine
    host, port = value["coordinator"].rsplit(":", 1)
    assert host == "127.0.0.1" and 12000 <= int(port) < 32000, value["coordinator"]
    assert len(value["hostnames"].split(",")) == 4
    log = _task_log(capfd)
    for host in range(4):  # every host's own output, with its prefix
        assert f"[h{host}] host {host} of 4 sees [0, 1, 2, 3]" in log, log[-3000:]
    _wait_gone(lws_env, "every_host_runs")  # the slice is released once the outcome is known


def test_the_leader_worker_set_is_what_kinetic_makes(lws_env):
    from kinetic_airflow.backends.gke.pathways import PathwaysBackend
    from kinetic_airflow.job.layout import JobIdentity
    from kinetic_airflow.operators import KineticRunOperator

    op = KineticRunOperator(task_id="shape", python_callable=print, accelerator="tpu-v6e-16:spot")
    ref = op._job_ref(JobIdentity("d", "r-shape", "shape"), "pathways", os.environ["KINETIC_BASE_URI"])
    backend = PathwaysBackend()
    manifest = backend.manifest(ref)
    assert manifest["apiVersion"] == "leaderworkerset.x-k8s.io/v1"  # from discovery
    assert manifest["metadata"]["name"] == f"keras-pathways-{ref.job_id}"
    assert manifest["metadata"]["labels"]["app"] == "kinetic-pathways"
    assert manifest["metadata"]["labels"]["job-id"] == ref.job_id
    lwt = manifest["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 4 and lwt["restartPolicy"] == "None"
    pod = lwt["workerTemplate"]["spec"]
    assert pod["restartPolicy"] == "Always"
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "4x4",
        "cloud.google.com/gke-spot": "true",
    }
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"google.com/tpu": "4"}
    assert {t["key"] for t in pod["tolerations"]} >= {"google.com/tpu", "cloud.google.com/gke-spot"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "MEGASCALE_NUM_SLICES" not in env and "TPU_WORKER_ID" not in env  # see lws_manifest
    backend.submit(ref)  # the emulator validates it against the LWS CRD schema
    backend.submit(ref)  # and a second submit of the same attempt adopts it
    custom, _ = _apis(lws_env)
    found = custom.get_namespaced_custom_object(
        "leaderworkerset.x-k8s.io", "v1", "default", "leaderworkersets", manifest["metadata"]["name"]
    )
    assert found["spec"]["leaderWorkerTemplate"]["size"] == 4
    backend.cancel(ref)
    _wait_gone(lws_env, "shape")


def test_a_worker_that_raises_fails_the_task_fast_with_its_own_exception(lws_env, capfd):
    # The other hosts sleep 600 s, past this module's 300 s test timeout: the task can only end
    # in time if the failing host's own record ended it.
    dr = _dag("kn_pathways_worker_fails").test()
    assert ti_states(dr) == {"one_worker_raises": "failed"}
    log = _task_log(capfd)
    assert "HostFailure: host 2 broke: bad shard" in log, log[-3000:]
    assert "host 2 of 4" in log
    for host in range(4):
        assert f"[h{host}] host {host} starting" in log
    _wait_gone(lws_env, "one_worker_raises")


def test_a_traceback_every_host_shares_is_shown_once(lws_env, capfd):
    dr = _dag("kn_pathways_all_fail").test()
    assert ti_states(dr) == {"every_worker_raises": "failed"}
    log = _task_log(capfd)
    assert 'raise ValueError("every host: bad config")' in log, log[-3000:]
    # once in the traceback the task's log shows; the other hosts that failed alike are named
    shown = [line for line in log.splitlines() if 'raise ValueError("every host: bad config")' in line]
    assert len(shown) == 1, shown
    assert "failed with the same traceback as another host; it is shown once" in log, log[-3000:]
    _wait_gone(lws_env, "every_worker_raises")


def test_a_preempted_worker_recreates_the_group_as_attempt_2(lws_env):
    emulator = lws_env
    errors: list[BaseException] = []

    def preempt_when_ready() -> None:
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                pods = [p for p in _pods(emulator, "resumes_after_preemption") if p.status.phase == "Running"]
                out = [p for p in pods if p.metadata.labels.get("kinetic.airflow/attempt") == "1"]
                if len(out) == 4 and _all_ready(emulator):
                    victim = next(p for p in out if p.metadata.name.endswith("-0-1"))
                    emulator.preempt_pod("default", victim.metadata.name)
                    return
                time.sleep(0.2)
            raise AssertionError("attempt 1 never had 4 running hosts")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=preempt_when_ready, daemon=True)
    thread.start()
    dr = _dag("kn_pathways_preempted").test()
    thread.join(10)
    assert not errors, errors
    assert ti_states(dr) == {"resumes_after_preemption": "success"}
    assert xcom(dr, "resumes_after_preemption") == {"attempt": 2, "resumed_from": "step=7"}
    assert ti_try_numbers(dr)["resumes_after_preemption"] == 1  # no Airflow retry used
    _wait_gone(emulator, "resumes_after_preemption")


def _all_ready(emulator) -> bool:
    """Every attempt-1 host has reached the 'ready' barrier (so its checkpoint exists)."""
    for root, _, files in os.walk(os.environ["KINETIC_BASE_URI"].removeprefix("file://")):
        if "resumes_after_preemption" in root and sum(f.startswith("ready-a1-h") for f in files) == 4:
            return True
    return False


def test_an_oom_killed_host_fails_the_task_naming_it(lws_env, capfd):
    emulator = lws_env

    def oom_when_up() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pods = [p for p in _pods(emulator, "one_host_runs_out_of_memory") if p.status.phase == "Running"]
            victim = [p for p in pods if p.metadata.name.endswith("-0-3")]
            if len(pods) == 4 and victim:
                time.sleep(1.0)  # let the runner start its function
                emulator.oom_kill_pod("default", victim[0].metadata.name)
                return
            time.sleep(0.2)

    thread = threading.Thread(target=oom_when_up, daemon=True)
    thread.start()
    dr = _dag("kn_pathways_oom").test()
    thread.join(10)
    log = _task_log(capfd)
    assert ti_states(dr) == {"one_host_runs_out_of_memory": "failed"}
    assert "host 3" in log and "OOMKilled" in log, log[-3000:]
    assert "out of memory" in log  # the hint
    _wait_gone(emulator, "one_host_runs_out_of_memory")


def test_execution_timeout_deletes_the_group(lws_env):
    dr = _dag("kn_pathways_timeout").test()
    assert ti_states(dr) == {"runs_too_long": "failed"}
    _wait_gone(lws_env, "runs_too_long")


def test_four_hosts_run_a_jax_collective(lws_env, capfd):
    """Real multi-controller JAX (on CPU): every host initializes from its environment,
    all-gathers its index, checks the sum; host 0's gather is the task's XCom."""
    dr = _dag("kn_pathways_jax").test()
    log = _task_log(capfd)
    assert ti_states(dr) == {"jax_collective": "success"}, log[-4000:]
    assert xcom(dr, "jax_collective") == [1, 2, 3, 4]
    for host in range(4):
        assert f"[h{host}] process {host} of 4: allgather [1, 2, 3, 4] sum 10" in log, log[-4000:]
    _wait_gone(lws_env, "jax_collective")


def test_the_multihost_example_runs_as_it_is_on_the_emulator_walkthrough(lws_env, tmp_path):
    """dags/multihost.py with the README's emulator settings: four hosts, one JAX collective."""
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "home"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(repo / "dags"),
        "AIRFLOW__KINETIC__BACKEND": "auto",
        "AIRFLOW_VAR_KINETIC_JAX_PLATFORMS": "cpu",
    }
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    proc = subprocess.run(
        [sys.executable, str(repo / "dags" / "multihost.py")], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "mean over 4 hosts: 2.9994" in output, output[-4000:]
    for host in range(4):
        assert f"[h{host}] host {host} of 4: partial sum" in output, output[-4000:]
    _wait_gone(lws_env, "global_mean")


def test_a_cluster_without_leader_worker_sets_is_named(lws_env):
    from kinetic_airflow.backends.gke import discovery
    from kinetic_airflow.backends.gke.pathways import LwsMissingError, PathwaysBackend
    from kinetic_airflow.job.layout import JobIdentity
    from kinetic_airflow.operators import KineticRunOperator

    discovery.forget()
    lws_env.inject_api_fault("GET", r"^/apis/leaderworkerset\.x-k8s\.io/?$", 404, count=1)
    op = KineticRunOperator(task_id="nolws", python_callable=print, accelerator="tpu-v6e-16")
    ref = op._job_ref(JobIdentity("d", "r-nolws", "nolws"), "pathways", os.environ["KINETIC_BASE_URI"])
    with pytest.raises(LwsMissingError, match=r"no LeaderWorkerSet API .*kinetic up"):
        PathwaysBackend().submit(ref)
    discovery.forget()
