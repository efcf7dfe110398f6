"""The product against the real cluster rules the emulator holds (tests/emulator/test_control_plane_rules.py):
names that fit every object the controllers derive, pods that admission refuses failing the task
within startup_timeout with the controller's own words (and no job left behind), a transient image
pull failure that the kubelet's back-off rides out, and a watch that RBAC forbids."""

from __future__ import annotations

import re
import time

import pytest
from emulated_cluster import grant_printed_role, point_kinetic_at, running_emulator
from helpers import ti_states, xcom

from kinetic_airflow.job.layout import (
    LABEL_VALUE_MAX,
    MAX_JOB_ID,
    JobIdentity,
    NameTooLongError,
    check_derived_names,
    derived_names,
)

pytestmark = pytest.mark.timeout(300)

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_emulator(tmp_path_factory) as running:
        emulator = running[0]
        with emulator.api_client() as api:
            import kubernetes

            core = kubernetes.client.CoreV1Api(api)
            core.create_namespace({"metadata": {"name": "no-sa"}})  # no kinetic service account
            core.create_namespace({"metadata": {"name": "full-quota"}})
            core.create_namespaced_resource_quota(
                "full-quota", {"metadata": {"name": "no-more-pods"}, "spec": {"hard": {"pods": "0"}}}
            )
            core.create_namespace(
                {
                    "metadata": {
                        "name": "restricted",
                        "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
                    }
                }
            )
            for ns in ("full-quota", "restricted"):
                core.create_namespaced_service_account(ns, {"metadata": {"name": "kinetic"}})
        for ns in ("no-sa", "full-quota", "restricted"):
            grant_printed_role(emulator.url, ns)  # kinetic's identity may work there too
        yield running


@pytest.fixture
def env(cluster, tmp_path, monkeypatch):
    """Job storage in a local directory (the hosts of a slice meet in KINETIC_OUTPUT_DIR)."""
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    point_kinetic_at(*cluster, monkeypatch)
    out = tmp_path / "failures"
    out.mkdir()
    monkeypatch.setenv("KN_TEST_FAILURES", str(out))
    return cluster[0], out


def _dag(name):
    import kn_rules

    return getattr(kn_rules, name)()


def _failure(out, task_id: str) -> str:
    return (out / f"{task_id}.txt").read_text()


def _core(emulator):
    import kubernetes

    return kubernetes.client.CoreV1Api(emulator.api_client())


def _left_behind(emulator, namespace: str, task_id: str) -> list[str]:
    """The task's Jobs and LeaderWorkerSets still in ``namespace`` (a failed attempt deletes its own;
    other tests' finished Jobs wait for their TTL)."""
    import kubernetes

    api = emulator.api_client()
    selector = f"kinetic.airflow/task-id={task_id.replace('_', '-')}"
    jobs = kubernetes.client.BatchV1Api(api).list_namespaced_job(namespace, label_selector=selector).items
    groups = kubernetes.client.CustomObjectsApi(api).list_namespaced_custom_object(
        "leaderworkerset.x-k8s.io", "v1", namespace, "leaderworkersets", label_selector=selector
    )["items"]
    return [j.metadata.name for j in jobs] + [g["metadata"]["name"] for g in groups]


def _nothing_left_behind(emulator, namespace: str, task_id: str) -> None:
    deadline = time.monotonic() + 30
    while _left_behind(emulator, namespace, task_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _left_behind(emulator, namespace, task_id)


# Names ----------------------------------------------------------------------------------------
EXTREMES = {
    "dag_id": ["d", "x" * 250, "Ünïcode DAG / with spaces & symbols " * 6, "-" * 250],
    "task_id": ["t", "y" * 250, "group.sub_group.task_" * 11],
    "map_index": [-1, 0, 1023, 10**6],
    "try_number": [1, 99, 10**5],
    "attempt": [1, 64, 10**4],
}


def test_every_derived_name_fits_for_the_longest_identities():
    """Walks the longest DAG id / task id / map index / try / attempt through every object name and
    label value the real Job, LeaderWorkerSet and StatefulSet controllers derive (64 hosts: the
    largest TPU slice)."""
    import itertools

    assert MAX_JOB_ID == 35  # 63 - len("keras-pathways-") - len("-0-") - 10 (revision hash)
    for dag_id, task_id, map_index, try_number, attempt in itertools.product(*EXTREMES.values()):
        identity = JobIdentity(
            dag_id, "manual__2026-01-01T00:00:00+00:00", task_id, map_index, try_number, attempt
        )
        job_id = identity.job_id
        assert len(job_id) <= MAX_JOB_ID and DNS_LABEL.match(job_id), job_id
        for hosts in (1, 2, 64):
            check_derived_names(job_id, hosts)
            for what, name in derived_names(job_id, hosts).items():
                assert len(name) <= LABEL_VALUE_MAX and DNS_LABEL.match(name), (what, name)
        for key, value in identity.labels().items():
            assert len(value) <= LABEL_VALUE_MAX and LABEL_VALUE.match(value), (key, value)
    with pytest.raises(NameTooLongError, match=r"worker StatefulSet pods' controller-revision-hash"):
        check_derived_names("j" * (MAX_JOB_ID + 1), 4)


def test_a_200_character_dag_and_task_id_run_on_pathways(env):
    from kn_rules import LONG_DAG_ID, LONG_TASK_ID

    dr = _dag("kn_rules_long_names").test()
    assert ti_states(dr) == {LONG_TASK_ID: "success"}, LONG_DAG_ID
    assert xcom(dr, LONG_TASK_ID) == {"host": 0, "hosts": 4}


# Pods that cannot be created -----------------------------------------------------------------
def test_a_missing_service_account_fails_the_task_naming_it(env):
    emulator, out = env
    dr = _dag("kn_rules_missing_service_account").test()
    assert ti_states(dr) == {"needs_service_account": "failed"}
    message = _failure(out, "needs_service_account")
    assert "no pod of the job could be created within startup_timeout=3s" in message
    assert 'error looking up service account no-sa/kinetic: serviceaccount "kinetic" not found' in message
    assert "kubectl create serviceaccount" in message  # the fix
    _nothing_left_behind(emulator, "no-sa", "needs_service_account")


def test_startup_timeout_counts_whatever_the_pending_reason(env):
    """Without RBAC on events the cause of the missing pod is unknown: the job still fails at
    startup_timeout (counted from submission), saying what it waited for, and is deleted."""
    emulator, out = env
    denied = 'events is forbidden: User "airflow" cannot list resource "events" in API group ""'
    emulator.inject_api_fault("GET", r"/namespaces/no-sa/events$", status=403, count=None, message=denied)
    dr = _dag("kn_rules_missing_service_account").test()
    assert ti_states(dr) == {"needs_service_account": "failed"}
    message = _failure(out, "needs_service_account")
    assert "the job did not start within startup_timeout=3s (still pending: NoPod:" in message
    assert "Raise startup_timeout=" in message
    _nothing_left_behind(emulator, "no-sa", "needs_service_account")


def test_a_missing_service_account_fails_a_pathways_task_naming_it(env):
    emulator, out = env
    dr = _dag("kn_rules_group_missing_service_account").test()
    assert ti_states(dr) == {"group_needs_service_account": "failed"}
    message = _failure(out, "group_needs_service_account")
    assert "the StatefulSet keras-pathways-" in message  # the leader StatefulSet's own event
    assert 'serviceaccount "kinetic" not found' in message
    _nothing_left_behind(emulator, "no-sa", "group_needs_service_account")


def test_a_full_resource_quota_fails_the_task_naming_it(env):
    emulator, out = env
    dr = _dag("kn_rules_quota").test()
    assert ti_states(dr) == {"over_quota": "failed"}
    message = _failure(out, "over_quota")
    assert "exceeded quota: no-more-pods, requested: pods=1, used: pods=0, limited: pods=0" in message
    assert "raise the quota" in message
    _nothing_left_behind(emulator, "full-quota", "over_quota")


def test_a_pod_security_refusal_fails_the_task_naming_it(env):
    emulator, out = env
    dr = _dag("kn_rules_pod_security").test()
    assert ti_states(dr) == {"not_restricted": "failed"}
    message = _failure(out, "not_restricted")
    assert 'violates PodSecurity "restricted:latest"' in message
    assert "pod-security.kubernetes.io/enforce" in message  # the hint says where the rule comes from
    _nothing_left_behind(emulator, "restricted", "not_restricted")


# Image pulls and watches ---------------------------------------------------------------------
def test_a_transient_image_pull_failure_runs_the_job(env):
    emulator, _ = env
    # four failed pulls: ~10 s of ErrImagePull / ImagePullBackOff (0.5 s, doubling), which the
    # watcher surely sees (a watcher that failed on the first ErrImagePull fails here)
    emulator.fail_image_pulls("kinetic-runner:test", times=4)
    dr = _dag("kn_rules_transient_pull").test()
    assert ti_states(dr) == {"pulled_after_retries": "success"}
    assert xcom(dr, "pulled_after_retries") == "pulled"
    pulls = [
        e
        for e in _core(emulator).list_namespaced_event("default").items
        if e.reason == "Failed" and e.message.startswith('Failed to pull image "kinetic-runner:test"')
    ]
    assert sum(e.count for e in pulls) == 4  # the fault fired: four failed pulls, then it ran


def test_a_watch_rbac_forbids_fails_the_task_naming_the_verb(env):
    emulator, out = env
    emulator.deny_verb("watch", "jobs")
    dr = _dag("kn_rules_watch_forbidden").test()
    assert ti_states(dr) == {"watched_without_watch": "failed"}
    message = _failure(out, "watched_without_watch")
    assert (
        "forbidden: the cluster refused to let this identity watch /apis/batch/v1/namespaces/default/jobs"
        in message
    )
    assert 'cannot watch resource "jobs" in API group "batch"' in message
    emulator.clear_faults()
    _nothing_left_behind(emulator, "default", "watched_without_watch")
