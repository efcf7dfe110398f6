"""slices=N: N multi-host TPU slices as one JobSet, end to end with dag.test() against the
cluster emulator (its JobSet controller validates the JobSet against the CRD schema, creates a
child Job per slice and the headless Service; every host's pod runs as a process)."""

from __future__ import annotations

import os
import threading
import time

import pytest
from emulated_cluster import point_kinetic_at, running_emulator
from helpers import ti_states, ti_try_numbers, xcom

pytestmark = pytest.mark.timeout(300)

JOBSET = ("jobset.x-k8s.io", "v1alpha2", "default", "jobsets")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_emulator(tmp_path_factory) as running:
        yield running


@pytest.fixture
def ms_env(cluster, tmp_path, monkeypatch):
    """Job storage in a local directory: the hosts meet in KINETIC_OUTPUT_DIR."""
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    # the pods' runner is this checkout's (the venv may point at another one of the project)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
    point_kinetic_at(*cluster, monkeypatch)
    return cluster[0]


def _dag(name):
    import kn_multislice

    return getattr(kn_multislice, name)()


def _apis(emulator):
    import kubernetes

    client = emulator.api_client()
    return kubernetes.client.CustomObjectsApi(client), kubernetes.client.CoreV1Api(client)


def _selector(task_id: str) -> str:
    return f"kinetic.airflow/task-id={task_id.replace('_', '-')}"


def _jobsets(emulator, task_id: str) -> list[dict]:
    custom, _ = _apis(emulator)
    return custom.list_namespaced_custom_object(*JOBSET, label_selector=_selector(task_id))["items"]


def _pods(emulator, task_id: str) -> list:
    _, core = _apis(emulator)
    return core.list_namespaced_pod("default", label_selector=_selector(task_id)).items


def _wait_gone(emulator, task_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _jobsets(emulator, task_id) and not _pods(emulator, task_id):
            return
        time.sleep(0.2)
    raise AssertionError(f"left behind: {[j['metadata']['name'] for j in _jobsets(emulator, task_id)]}")


def _task_log(capfd) -> str:
    out, err = capfd.readouterr()
    return out + err


def test_the_job_set_is_what_kinetic_makes(ms_env):
    from kinetic_airflow.backends.gke.multislice import MultisliceBackend
    from kinetic_airflow.job.layout import JobIdentity
    from kinetic_airflow.job.ref import JobRef
    from kinetic_airflow.operators import KineticRunOperator
    from kinetic_airflow.usage import chips_of

    op = KineticRunOperator(
        task_id="shape", python_callable=print, accelerator="tpu-v6e-16:spot", slices=2, backend="pathways"
    )
    assert op._backend_name() == "multislice"
    ref = op._job_ref(JobIdentity("d", "r-shape", "shape"), "multislice", os.environ["KINETIC_BASE_URI"])
    assert ref.hosts == 8 and ref.k8s.slices == 2
    assert JobRef.from_dict(ref.to_dict()) == ref
    assert chips_of(ref) == (32, True)  # 16 chips x 2 slices
    one = KineticRunOperator(task_id="one", python_callable=print, accelerator="tpu-v6e-16")
    assert "slices" not in one._job_ref(JobIdentity("d", "r", "one"), "pathways", "file:///x").to_dict()

    backend = MultisliceBackend()
    manifest = backend.manifest(ref)
    name = f"kinetic-ms-{ref.job_id}"
    assert manifest["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and manifest["kind"] == "JobSet"
    assert manifest["metadata"]["name"] == name
    assert manifest["metadata"]["annotations"]["alpha.jobset.sigs.k8s.io/exclusive-topology"] == (
        "cloud.google.com/gke-nodepool"
    )
    assert manifest["spec"]["failurePolicy"] == {"maxRestarts": 0}
    (rjob,) = manifest["spec"]["replicatedJobs"]
    assert rjob["name"] == "s" and rjob["replicas"] == 2
    job = rjob["template"]["spec"]
    assert (job["completionMode"], job["parallelism"], job["completions"], job["backoffLimit"]) == (
        "Indexed",
        4,
        4,
        0,
    )
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "4x4"
    assert pod["containers"][0]["resources"]["limits"] == {"google.com/tpu": "4"}
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["MEGASCALE_NUM_SLICES"]["value"] == "2" and env["KINETIC_NUM_HOSTS"]["value"] == "8"
    assert env["MEGASCALE_COORDINATOR_ADDRESS"]["value"] == f"{name}-s-0-0.{name}"
    label = "metadata.labels['jobset.sigs.k8s.io/job-index']"
    assert env["MEGASCALE_SLICE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == label
    assert env["KINETIC_SLICE_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == label
    assert env["KINETIC_HOSTS_PER_SLICE"]["value"] == "4" and "MEGASCALE_PORT" in env

    backend.submit(ref)  # the emulator validates it strictly against the JobSet CRD and webhook
    backend.submit(ref)  # a second submit of the same attempt adopts it
    custom, _ = _apis(ms_env)
    found = custom.get_namespaced_custom_object(*JOBSET, name)
    assert found["spec"]["replicatedJobs"][0]["replicas"] == 2
    backend.cancel(ref)
    _wait_gone(ms_env, "shape")


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (
            {"accelerator": "tpu-v6e-16", "slices": 2, "backend": "local"},
            "the local backend runs one process",
        ),
        ({"accelerator": "tpu-v6e-16", "slices": 2, "backend": "gke"}, "use backend='pathways'"),
        ({"accelerator": "tpu-v6e-4t", "slices": 2}, "multislice needs a multi-host TPU slice"),
        ({"accelerator": "gpu-l4", "slices": 3, "backend": "auto"}, "such as 'tpu-v6e-16'"),
    ],
)
def test_slices_that_cannot_run_are_refused_at_parse_time(kwargs, fragment):
    from kinetic_airflow.operators import KineticRunOperator

    with pytest.raises(ValueError) as caught:
        KineticRunOperator(task_id="bad", python_callable=print, **kwargs)
    assert fragment in str(caught.value)


def test_two_slices_run_one_jax_collective(ms_env, capfd):
    """Real multi-controller JAX (on CPU) over 2 slices x 4 hosts: 8 processes, one all-gather;
    host 0's result is the task's XCom."""
    dr = _dag("kn_multislice_jax").test()
    log = _task_log(capfd)
    assert ti_states(dr) == {"multislice_collective": "success"}, log[-4000:]
    value = xcom(dr, "multislice_collective")
    assert value["gathered"] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert value["env"] == {
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "0",
        "MEGASCALE_PORT": "8081",
        "KINETIC_NUM_HOSTS": "8",
    }
    assert value["megascale_coordinator"] == "127.0.0.1"  # the emulator's DNS for slice 0 host 0
    for host in range(8):
        s, h = divmod(host, 4)
        line = f"[s{s} h{h}] process {host} of 8 (slice {s}): allgather [1, 2, 3, 4, 5, 6, 7, 8]"
        assert line in log, log[-4000:]
    _wait_gone(ms_env, "multislice_collective")  # the JobSet is deleted once the outcome is known


def test_a_failing_host_in_slice_1_fails_the_attempt_naming_slice_and_host(ms_env, capfd):
    dr = _dag("kn_multislice_host_fails").test()
    assert ti_states(dr) == {"slice_1_host_fails": "failed"}
    log = _task_log(capfd)
    assert "HostFailure: bad shard on host 6" in log, log[-3000:]
    assert "host 6 (slice 1 host 2) of 8" in log, log[-3000:]
    assert "[s1 h2] host 6 starting" in log
    _wait_gone(ms_env, "slice_1_host_fails")


def test_a_preempted_slice_1_pod_is_a_new_attempt_of_the_whole_group(ms_env):
    emulator = ms_env
    errors: list[BaseException] = []

    def preempt_when_ready() -> None:
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                pods = [p for p in _pods(emulator, "multislice_resumes") if p.status.phase == "Running"]
                first = [p for p in pods if p.metadata.labels.get("kinetic.airflow/attempt") == "1"]
                if len(first) == 8 and _all_ready():
                    victim = next(
                        p for p in first if p.metadata.labels["jobset.sigs.k8s.io/job-index"] == "1"
                    )
                    emulator.preempt_pod("default", victim.metadata.name)
                    return
                time.sleep(0.2)
            raise AssertionError("attempt 1 never had 8 running hosts")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=preempt_when_ready, daemon=True)
    thread.start()
    dr = _dag("kn_multislice_preempted").test()
    thread.join(10)
    assert not errors, errors
    assert ti_states(dr) == {"multislice_resumes": "success"}
    assert xcom(dr, "multislice_resumes") == {"attempt": 2, "hosts": 8}
    assert ti_try_numbers(dr)["multislice_resumes"] == 1  # no Airflow retry used
    _wait_gone(emulator, "multislice_resumes")


def _all_ready() -> bool:
    for root, _, files in os.walk(os.environ["KINETIC_BASE_URI"].removeprefix("file://")):
        if "multislice_resumes" in root and sum(f.startswith("ready-a1-h") for f in files) == 8:
            return True
    return False
