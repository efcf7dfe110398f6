"""The capacity ladder (issue 41 item 3): ``capacity=[...]`` / ``accelerator=[...]`` as ordered rungs.

Parse time: every rung is checked as a single value is, and a ladder's own mistakes (an empty
list, a repeated rung, a time with a unit, two lists of different lengths, Spot forced on every
rung, the local backend) are DAG import errors naming the fix. Run time, on the emulator: a rung
whose capacity never arrives (a stocked-out node pool, or no pool at all) is withdrawn, with none
of its cluster objects left, and the next rung runs in the same Airflow try; the history, the view
and the usage figures name each attempt's rung, its wait and its chip-hours.
"""

from __future__ import annotations

import contextlib
import hashlib
from datetime import timedelta

import pytest
from cluster_emulator import NodePool
from emulated_cluster import point_kinetic_at, running_emulator
from helpers import ti_states, ti_try_numbers, xcom

from kinetic_airflow.options import KineticOptionError, validate_options

L4 = {"cloud.google.com/gke-accelerator": "nvidia-l4"}
SPOT = {"cloud.google.com/gke-spot": "true"}
V6E = {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice", "cloud.google.com/gke-tpu-topology": "2x4"}
TPU_TAINT = {"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}
NODE_POOLS = [
    NodePool("cpu", {}),
    NodePool("l4", dict(L4)),  # on-demand L4s: scale up as usual
    # Spot L4 VMs exist as a pool, but GCE has none to give: every scale-up of it fails
    NodePool("l4-spot", {**L4, **SPOT}, stockout=True),
    # TPU v6e 2x4 slices (2 hosts), likewise: on-demand ones scale up, Spot ones never arrive
    NodePool("v6e-2x4", dict(V6E), taints=[TPU_TAINT]),
    NodePool("v6e-2x4-spot", {**V6E, **SPOT}, taints=[TPU_TAINT], stockout=True),
]


# Parse time -----------------------------------------------------------------------------------
def test_a_ladder_is_its_rungs_in_order_with_the_first_as_the_tasks_own_values():
    checked = validate_options(
        {"accelerator": "gpu-l4", "capacity": [("spot", timedelta(minutes=20)), "flex-start", "on-demand"]}
    )
    assert checked["capacity"] == "spot"  # what the first job asks for
    assert [(r.capacity, r.start_within) for r in checked["ladder"]] == [
        ("spot", 1200.0),
        ("flex-start", None),
        ("on-demand", None),
    ]
    checked = validate_options({"accelerator": [("tpu-v6e-8", 600), "tpu-v5p-8"], "capacity": "spot"})
    assert checked["accelerator"] == "tpu-v6e-8" and checked["capacity"] == "spot"
    assert [(r.accelerator, r.capacity, r.start_within) for r in checked["ladder"]] == [
        ("tpu-v6e-8", None, 600.0),
        ("tpu-v5p-8", None, None),
    ]
    # two lists pair rung by rung; a one-rung list is just that value
    checked = validate_options({"accelerator": ["gpu-l4", "gpu-a100"], "capacity": ["spot", "on-demand"]})
    assert [r.label() for r in checked["ladder"]] == ["gpu-l4 on spot", "gpu-a100 on on-demand"]
    checked = validate_options({"accelerator": "gpu-l4", "capacity": ["spot"]})
    assert checked["capacity"] == "spot" and checked["ladder"] is None


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"capacity": []}, "names no rung: give one value"),
        ({"capacity": ["spot", "spot"]}, r"rung 2 \(spot\) repeats rung 1"),
        ({"capacity": [("spot", "30m"), "on-demand"]}, "units in strings are not read"),
        ({"capacity": [("spot", 0), "on-demand"]}, "must be more than 0 seconds"),
        ({"capacity": [timedelta(minutes=5), "on-demand"]}, "time to start goes with its rung"),
        ({"capacity": ["spot", "ondmand"]}, "Did you mean capacity='on-demand'"),
        ({"capacity": ["spot", "{{ params.cap }}"]}, "not templated"),
        ({"accelerator": ["gpu-l4", "tpu-v9-8"]}, "accelerator rung 2: Invalid accelerator 'tpu-v9-8'"),
        (
            {"accelerator": ["gpu-l4", "gpu-a100"], "capacity": ["spot", "on-demand", "flex-start"]},
            "give them the same length",
        ),
        (
            {"accelerator": [("gpu-l4", 60), "gpu-a100"], "capacity": [("spot", 60), "on-demand"]},
            "gives its time to start twice",
        ),
        ({"spot": True, "capacity": ["spot", "on-demand"]}, "drop spot=True"),
        ({"capacity": "spot", "rung_after_preemption": "same"}, "does nothing without a capacity ladder"),
        ({"backend": "local", "capacity": ["spot", "on-demand"]}, "needs a cluster backend"),
        (
            {"accelerator": "cpu", "capacity": ["spot", "flex-start"]},
            r"capacity ladder rung 2 \(flex-start\): .*GPUs and TPUs only",
        ),
        (
            {"backend": "gke", "accelerator": ["tpu-v6e-8t", "tpu-v5p-16"]},
            r"capacity ladder rung 2 \(tpu-v5p-16\): .*use backend='pathways'",
        ),
    ],
)
def test_a_wrong_ladder_is_refused_at_parse_time_naming_the_fix(options, words):
    with pytest.raises(KineticOptionError, match=words):
        validate_options({"accelerator": "gpu-l4", **options})


def test_a_dag_with_a_wrong_ladder_does_not_import(tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    (tmp_path / "bad_ladder.py").write_text(
        "import pendulum\nfrom airflow.sdk import dag, task\n\n"
        "@task.kinetic(backend='gke', accelerator='gpu-l4', capacity=[('spot', '20m'), 'on-demand'])\n"
        "def job():\n    return 1\n\n"
        "@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz='UTC'))\n"
        "def bad_ladder():\n    job()\n\nbad_ladder()\n"
    )
    bag = DagBag(dag_folder=str(tmp_path))
    assert not bag.dags
    assert "units in strings are not read" in bag.import_errors[str(tmp_path / "bad_ladder.py")]


# On the emulator ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from cluster_emulator.kueue_setup import kueue_queue

    with running_emulator(tmp_path_factory, NODE_POOLS) as running:
        # quota for one kinetic CPU job (1 cpu, 4Gi) at a time
        kueue_queue(running[0], "ladder-q", quota={"cpu": "1", "memory": "8Gi"}, flavor="cpu-flavor")
        yield running


@pytest.fixture
def gke_env(cluster, monkeypatch, tmp_path):
    point_kinetic_at(*cluster, monkeypatch)
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")  # storage is not the subject
    return cluster[0]


def _cluster_objects(emulator, dag_run, task_id: str) -> dict[str, list[str]]:
    """The task's Jobs and pods in the cluster, by name (kinetic's own labels find them)."""
    import kubernetes

    client = emulator.api_client()
    run = hashlib.sha256(dag_run.run_id.encode()).hexdigest()[:16]
    selector = f"kinetic.airflow/task-id={task_id.replace('_', '-')},kinetic.airflow/run-id={run}"
    jobs = kubernetes.client.BatchV1Api(client).list_namespaced_job("default", label_selector=selector)
    pods = kubernetes.client.CoreV1Api(client).list_namespaced_pod("default", label_selector=selector)
    return {
        "jobs": sorted(j.metadata.name for j in jobs.items),
        "pods": sorted(p.spec.node_name or "(unscheduled)" for p in pods.items),
    }


def _view(dag_run, task_id: str) -> dict:
    from airflow.utils.session import create_session

    from kinetic_airflow.ui.data import task_rows

    with create_session() as session:
        (row,) = task_rows(
            session,
            all_jobs=True,
            dag_ids=[dag_run.dag_id],
            dag_id=dag_run.dag_id,
            run_id=dag_run.run_id,
            task_id=task_id,
        )
    return row


def test_a_ladder_whose_first_rung_never_gets_nodes_ends_on_the_second_in_one_try(gke_env):
    import kn_ladder

    dr = kn_ladder.kn_ladder().test()
    assert ti_states(dr) == {"spot_then_on_demand": "success", "a100_else_l4": "success"}
    assert ti_try_numbers(dr) == {"spot_then_on_demand": 1, "a100_else_l4": 1}  # no Airflow retry

    # rung 2 ran it, as attempt 2 of try 1
    value = xcom(dr, "spot_then_on_demand")
    assert value.startswith("ran in ") and value.endswith("-t1a2"), value
    assert xcom(dr, "a100_else_l4") == "l4"

    # nothing of rung 1 is left in the cluster: only rung 2's Job, its pod on the on-demand pool
    for task_id in ("spot_then_on_demand", "a100_else_l4"):
        left = _cluster_objects(gke_env, dr, task_id)
        assert [name[-4:] for name in left["jobs"]] == ["t1a2"], left
        assert all(node.startswith("gke-emulator-l4-") for node in left["pods"]), left
        assert not any("l4-spot" in node for node in left["pods"]), left

    # the usage figures: both attempts, their rungs, rung 1's wait and no chip-hours for it
    usage = xcom(dr, "spot_then_on_demand", key="kinetic_usage")
    first, second = usage["attempts"]
    assert (first["attempt"], first["rung"], first["rungs"], first["capacity"], first["outcome"]) == (
        1,
        1,
        2,
        "spot",
        "withdrawn",
    )
    assert first["chip_hours"] == 0 and first["queue_seconds"] > 0  # it only waited
    # `kinetic-airflow jobs show` of the withdrawn rung says which rung it was and how it ended
    from ops_support import cli

    code, out, err = cli("jobs", "show", first["job_id"])
    assert code == 0, err
    assert "  rung: 1" in out and "  rungs: 2" in out and "  capacity: spot" in out, out
    assert "  outcome: withdrawn" in out and "  chip_hours: 0" in out, out
    assert (second["attempt"], second["rung"], second["capacity"], second["outcome"]) == (
        2,
        2,
        "on-demand",
        "success",
    )
    assert second["started_at"] and second["chips"] == 1  # it ran, and its chips count
    assert second["chip_hours"] == round(second["chips"] * second["run_seconds"] / 3600, 6)
    accelerators = [a["accelerator"] for a in xcom(dr, "a100_else_l4", key="kinetic_usage")["attempts"]]
    assert accelerators == ["gpu-a100", "gpu-l4"]

    # the history and the view: one row, two attempts, each with its rung
    row = _view(dr, "spot_then_on_demand")
    assert row["attempts"] == 2 and row["state"] == "succeeded"
    jobs = row["jobs"]
    assert [(j["attempt"], j["rung"], j["rungs"], j["capacity"], j["ending"]) for j in jobs] == [
        (1, 1, 2, "spot", "withdrawn"),
        (2, 2, 2, "on-demand", "succeeded"),
    ]
    assert jobs[0]["chip_hours"] == 0 and jobs[0]["queue_seconds"] > 0


def test_a_ladder_whose_every_rung_cannot_start_fails_the_task_saying_so(gke_env, capfd):
    import kn_ladder

    assert gke_env.stock_out("l4") == ["l4"]  # on-demand L4s are gone too now
    try:
        dr = kn_ladder.kn_ladder_used_up().test()
    finally:
        gke_env.stock_out("l4", stocked=False)
    assert ti_states(dr) == {"nothing_starts": "failed"}
    out = capfd.readouterr()
    error = out.out + out.err  # the task's error, as Airflow logs it
    assert "could not be scheduled" in error  # the last rung's own cause, as without a ladder
    assert "The capacity ladder is used up: its last rung (2 of 2) did not start either" in error
    usage = xcom(dr, "nothing_starts", key="kinetic_usage")["attempts"]
    assert [(a["rung"], a["capacity"], a["outcome"]) for a in usage] == [
        (1, "spot", "withdrawn"),
        (2, "on-demand", "failed"),
    ]
    left = _cluster_objects(gke_env, dr, "nothing_starts")
    assert left == {"jobs": [], "pods": []}, left


def test_multi_host_rungs_are_withdrawn_whole_on_pathways_and_multislice(gke_env):
    """A LeaderWorkerSet (pathways) and a JobSet (multislice) rung that never gets its slice is
    withdrawn: deleted, with its Kueue-free pods, before the next rung's group is created."""
    import kn_ladder

    gke_env.request_log.clear()
    dr = kn_ladder.kn_ladder_slices().test()
    assert ti_states(dr) == {
        "slice_spot_then_on_demand": "success",
        "multislice_spot_then_on_demand": "success",
    }
    assert xcom(dr, "slice_spot_then_on_demand") == 2  # one 2-host slice
    assert xcom(dr, "multislice_spot_then_on_demand") == 4  # two of them
    for task_id, backend, plural in (
        ("slice_spot_then_on_demand", "pathways", "leaderworkersets"),
        ("multislice_spot_then_on_demand", "multislice", "jobsets"),
    ):
        attempts = xcom(dr, task_id, key="kinetic_usage")["attempts"]
        assert [(a["backend"], a["rung"], a["capacity"], a["outcome"]) for a in attempts] == [
            (backend, 1, "spot", "withdrawn"),
            (backend, 2, "on-demand", "success"),
        ]
        # rung 1's group was deleted before rung 2's was created
        first, second = (a["job_id"] for a in attempts)
        calls = [
            (r.method, r.path)
            for r in gke_env.request_log.records
            if f"/{plural}" in r.path and r.method in ("POST", "DELETE")
        ]
        created = [i for i, (m, p) in enumerate(calls) if m == "POST"]
        deleted_first = [i for i, (m, p) in enumerate(calls) if m == "DELETE" and first in p]
        assert len(created) == 2 and deleted_first and deleted_first[0] < created[1], calls
        assert second  # named, as the log names it


def test_a_preempted_rung_resubmits_from_the_first_rung_or_the_same_one(gke_env):
    """Preempted on rung 2: by default the next attempt is rung 1 again (Spot may be back; here it
    is not, so it is withdrawn again and rung 2 runs); ``rung_after_preemption="same"`` goes
    straight back to rung 2. Withdrawn rungs do not count as preemptions."""
    import threading
    import time

    import kn_ladder
    import kubernetes

    core = kubernetes.client.CoreV1Api(gke_env.api_client())
    errors: list[BaseException] = []

    def preempt_attempt_2(task_label: str) -> None:
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                pods = core.list_namespaced_pod(
                    "default", label_selector=f"kinetic.airflow/task-id={task_label}"
                )
                for pod in pods.items:
                    if "-t1a2" not in pod.metadata.name or pod.status.phase != "Running":
                        continue
                    log = core.read_namespaced_pod_log(pod.metadata.name, "default", _preload_content=False)
                    if b"attempt 2 waits to be preempted" in log.data:
                        gke_env.preempt_pod("default", pod.metadata.name, grace_seconds=1)
                        return
                time.sleep(0.2)
            raise AssertionError(f"attempt 2 of {task_label} never ran")
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=preempt_attempt_2, args=(label,), daemon=True)
        for label in ("preempted-from-first-rung", "preempted-on-same-rung")
    ]
    for thread in threads:
        thread.start()
    dr = kn_ladder.kn_ladder_preempted().test()
    for thread in threads:
        thread.join(timeout=10)
    assert not errors, errors
    assert ti_states(dr) == {"preempted_from_first_rung": "success", "preempted_on_same_rung": "success"}
    assert ti_try_numbers(dr) == {"preempted_from_first_rung": 1, "preempted_on_same_rung": 1}

    def walked(task_id: str) -> list[tuple]:
        return [(a["rung"], a["outcome"]) for a in xcom(dr, task_id, key="kinetic_usage")["attempts"]]

    assert walked("preempted_from_first_rung") == [
        (1, "withdrawn"),
        (2, "preempted"),
        (1, "withdrawn"),
        (2, "success"),
    ]
    assert xcom(dr, "preempted_from_first_rung").endswith("-t1a4")
    assert walked("preempted_on_same_rung") == [(1, "withdrawn"), (2, "preempted"), (2, "success")]
    assert xcom(dr, "preempted_on_same_rung").endswith("-t1a3")


def test_each_rungs_job_asks_for_its_rung_and_bounds_its_queue_wait_by_its_time(gke_env):
    """What each rung's job reference says: its capacity, its time to start (also the bound of its
    wait in a Kueue queue), its rung, and its backend (a multi-host TPU rung on ``auto`` is a
    LeaderWorkerSet), built by the operator the driver asks."""
    from kinetic_airflow import KineticRunOperator
    from kinetic_airflow.job.layout import JobIdentity

    op = KineticRunOperator(
        task_id="rungs",
        python_callable=lambda: 1,
        backend="auto",
        accelerator=[("tpu-v6e-8t", 30), "tpu-v6e-8"],
        capacity="spot",
        local_queue="team-a",
        queue_timeout=3600,
        startup_timeout=600,
    )
    identity = JobIdentity("d", "r", "rungs")
    first = op._rung_job_ref(identity, "file:///tmp/kinetic", 0)
    second = op._rung_job_ref(identity.next_attempt(), "file:///tmp/kinetic", 1)
    assert (first.backend, first.accelerator, first.k8s.capacity) == ("gke", "tpu-v6e-8t:spot", "spot")
    assert (first.startup_timeout, first.k8s.queue_timeout) == (30.0, 30.0)
    assert first.rung == {"rung": 1, "of": 2, "start_within": 30.0}
    assert (second.backend, second.accelerator, second.hosts) == ("pathways", "tpu-v6e-2x4:spot", 2)
    assert (second.startup_timeout, second.k8s.queue_timeout) == (600.0, 600.0)  # the task's own
    assert second.rung == {"rung": 2, "of": 2}
    assert (op.accelerator, op.capacity, op.startup_timeout) == ("tpu-v6e-8t", "spot", 600.0)  # unchanged


def test_a_ladder_on_a_configured_local_backend_is_refused_before_any_job(gke_env, monkeypatch, capfd):
    import kn_ladder

    monkeypatch.setenv("KINETIC_BACKEND", "local")
    dr = kn_ladder.kn_ladder_configured_local().test()
    assert ti_states(dr) == {"ladder_on_configured_backend": "failed"}
    out = capfd.readouterr()
    assert "a capacity ladder (2 rungs: spot, on-demand) needs a cluster backend" in out.out + out.err
    assert _cluster_objects(gke_env, dr, "ladder_on_configured_backend") == {"jobs": [], "pods": []}


def test_a_rung_kueue_does_not_admit_in_its_time_is_withdrawn_with_its_workload(gke_env):
    """Kueue not admitting: rung 1 waits in its queue past its time to start (a blocker holds the
    quota), is withdrawn, and its Workload goes with its Job; rung 2 is queued in the same try and
    runs once the blocker is gone (freed when rung 2's Workload exists, not on a timer)."""
    import sys
    import threading

    import kn_ladder
    import kubernetes
    from ops_support import wait_for

    client = gke_env.api_client()
    batch = kubernetes.client.BatchV1Api(client)
    custom = kubernetes.client.CustomObjectsApi(client)
    core = kubernetes.client.CoreV1Api(client)
    container = {
        "name": "main",
        "image": "busybox",
        "command": [sys.executable, "-c", "import time; time.sleep(600)"],
        "resources": {"requests": {"cpu": "1", "memory": "4Gi"}},
    }
    batch.create_namespaced_job(
        "default",
        {
            "metadata": {"name": "ladder-blocker", "labels": {"kueue.x-k8s.io/queue-name": "ladder-q"}},
            "spec": {
                "backoffLimit": 0,
                "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
            },
        },
    )
    running = core.list_namespaced_pod
    wait_for(
        lambda: any(
            p.status.phase == "Running"
            for p in running("default", label_selector="job-name=ladder-blocker").items
        ),
        "the blocker never ran",
    )

    def owners() -> set[str]:
        listed = custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", "default", "workloads")
        return {ref["name"] for w in listed["items"] for ref in w["metadata"].get("ownerReferences") or []}

    errors: list[BaseException] = []

    def free_when_rung_2_is_queued() -> None:
        try:
            wait_for(lambda: any(n.endswith("-t1a2") for n in owners()), "rung 2 was never queued", 240)
            batch.delete_namespaced_job("ladder-blocker", "default", propagation_policy="Background")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=free_when_rung_2_is_queued, daemon=True)
    thread.start()
    try:
        dr = kn_ladder.kn_ladder_kueue().test()
    finally:
        thread.join(timeout=10)
        with contextlib.suppress(kubernetes.client.ApiException):
            batch.delete_namespaced_job("ladder-blocker", "default", propagation_policy="Background")
    assert not errors, errors
    assert ti_states(dr) == {"queued_spot_then_on_demand": "success"}
    assert xcom(dr, "queued_spot_then_on_demand") == "admitted on rung 2"
    attempts = xcom(dr, "queued_spot_then_on_demand", key="kinetic_usage")["attempts"]
    assert [(a["rung"], a["capacity"], a["outcome"]) for a in attempts] == [
        (1, "spot", "withdrawn"),
        (2, "on-demand", "success"),
    ]
    first = attempts[0]["job_id"]
    wait_for(lambda: not any(first in n for n in owners()), f"rung 1's Workload left: {owners()}")
    assert not [j for j in batch.list_namespaced_job("default").items if first in j.metadata.name]
