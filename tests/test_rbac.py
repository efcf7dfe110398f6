"""Issue 38: every rule of the Role ``kinetic-airflow doctor --print-rbac`` prints is needed.

kinetic acts as the service account bound to exactly that Role (tests/emulated_cluster.py), on
the emulator, which enforces RBAC as kube-apiserver does. Each test takes one rule out of the
Role and shows what then fails, with an error naming the missing verb and resource and the fix:
doctor's permission check for every rule, and the feature itself where a job shows it (submit
of a Job, a LeaderWorkerSet, a JobSet, its key Secret; the status read of its pods).
"""

from __future__ import annotations

import copy

import kubernetes
import pytest
from cluster_emulator import NodePool
from emulated_cluster import point_kinetic_at, printed_role, running_emulator

from kinetic_airflow.backends.gke.doctor import FAIL, REQUIRED_RULES, WARN, RoleRule, run_doctor

NS = "default"
TPU = {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice", "cloud.google.com/gke-tpu-topology": "*"}
POOLS = [NodePool("cpu", {}), NodePool("v6e", TPU, node_count=4)]
# An accelerator whose job runs on each backend.
ACCELERATOR = {"gke": "cpu", "pathways": "tpu-v6e-8", "multislice": "tpu-v6e-8"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_emulator(tmp_path_factory, POOLS) as running:
        yield running


@pytest.fixture
def env(cluster, monkeypatch, tmp_path):
    """kinetic pointed at the emulator; the Role put back as printed after each test."""
    emulator = cluster[0]
    point_kinetic_at(*cluster, monkeypatch)
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    monkeypatch.setenv("KINETIC_NAMESPACE", NS)
    yield emulator
    _set_rules(emulator, printed_role(NS)[0]["rules"])


def _set_rules(emulator, rules: list[dict]) -> None:
    role = copy.deepcopy(printed_role(NS)[0])
    role["rules"] = rules
    with emulator.api_client() as admin:  # the cluster admin edits the Role
        kubernetes.client.RbacAuthorizationV1Api(admin).replace_namespaced_role(
            role["metadata"]["name"], NS, role
        )


def _remove(emulator, rule: RoleRule) -> None:
    """The printed Role without ``rule``; kinetic's watch caches start afresh."""
    from kinetic_airflow.backends.gke.watch_cache import reset_shared_state

    kept = [r for r in printed_role(NS)[0]["rules"] if r["resources"] != [rule.resource]]
    assert len(kept) == len(REQUIRED_RULES) - 1
    _set_rules(emulator, kept)
    reset_shared_state()


def _rule(resource: str) -> RoleRule:
    return next(r for r in REQUIRED_RULES if r.resource == resource)


def test_the_printed_role_is_the_table_and_kinetic_works_with_it(env):
    """With the Role as printed, doctor finds every verb granted (the identity is the Role's)."""
    role, binding = printed_role(NS)
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in role["rules"]] == [
        ([r.group], [r.resource], list(r.verbs)) for r in REQUIRED_RULES
    ]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kinetic-airflow", "namespace": NS}]
    report = run_doctor("cpu")
    assert report.check("permissions").status == "ok", report.render()
    assert "other features' permissions" not in [c.name for c in report.checks]


@pytest.mark.parametrize("resource", [r.resource for r in REQUIRED_RULES if r.needed_by != "doctor"])
def test_doctor_names_every_verb_of_a_removed_rule(env, monkeypatch, resource):
    """Doctor asks the cluster about every rule: one a feature of this accelerator needs fails,
    another feature's only warns, and both name each verb and the resource."""
    rule = _rule(resource)
    _remove(env, rule)
    if rule.needed_by == "kueue":
        monkeypatch.setenv("AIRFLOW__KINETIC__LOCAL_QUEUE", "team-a")
    accelerator = ACCELERATOR.get(rule.needed_by, "cpu")
    report = run_doctor(accelerator)
    missing = ", ".join(f"{verb} {rule.resource}" for verb in rule.verbs)
    # doctor checks single-slice backends without debug=True: JobSets and port-forwards only warn
    if rule.needed_by in ("multislice", "debug"):
        check = report.check("other features' permissions")
        assert check.status == WARN, report.render()
        assert f"may not: {missing}; needed only for {rule.why}" in check.detail
        assert "kinetic-airflow doctor --print-rbac --namespace default" in check.fix
        return
    check = report.check("permissions")
    expected = WARN if rule.resource == "events" else FAIL
    assert check.status == expected, report.render()
    assert check.detail.startswith(f"in namespace {NS} the identity may not: {missing}"), check.detail
    assert "kinetic-airflow doctor --print-rbac --namespace default" in check.fix
    if rule.needed_by in ("gke", "pathways", "kueue"):  # another feature's rule, from the cpu side
        other = run_doctor("cpu" if rule.needed_by != "gke" else "tpu-v6e-8")
        if rule.needed_by != "kueue":
            assert other.check("other features' permissions").status == WARN
            assert missing in other.check("other features' permissions").detail


@pytest.mark.parametrize("resource", ["namespaces", "serviceaccounts"])
def test_doctor_reads_of_its_own_warn_naming_the_rule(env, resource):
    _remove(env, _rule(resource))
    report = run_doctor("cpu")
    name = "namespace" if resource == "namespaces" else "service account"
    check = report.check(name)
    assert check.status == WARN, report.render()
    assert f"(get {resource}" in check.detail
    assert "kinetic-airflow doctor --print-rbac" in check.fix


def _submit(backend: str, accelerator: str, **operator_kwargs) -> None:
    """Submit a job as the operator would (jobkit.gke_job, which names the operator's backend and
    the registry's alike; slices > 1 make the operator's pathways a multislice job)."""
    import os
    import uuid

    from jobkit import key_of

    from kinetic_airflow.backends.registry import get_backend
    from kinetic_airflow.job.layout import JobIdentity
    from kinetic_airflow.operators import KineticRunOperator

    op = KineticRunOperator(
        task_id="refused", python_callable=print, backend=backend, accelerator=accelerator, **operator_kwargs
    )
    name = op._backend_name()
    identity = JobIdentity("d", f"r-{uuid.uuid4().hex[:8]}", "refused")
    ref = op._job_ref(identity, name, os.environ["KINETIC_BASE_URI"])
    get_backend(name).submit(ref, job_key=key_of(ref.job_uri))


def _submit_refused(backend: str, accelerator: str, **operator_kwargs) -> str:
    from kinetic_airflow.backends.gke.client import ApiError

    with pytest.raises(ApiError) as refused:
        _submit(backend, accelerator, **operator_kwargs)
    assert refused.value.status == 403
    return str(refused.value)


@pytest.mark.parametrize(
    ("resource", "backend", "accelerator", "kwargs"),
    [
        ("jobs", "gke", "cpu", {}),
        ("leaderworkersets", "pathways", "tpu-v6e-8", {}),
        ("jobsets", "pathways", "tpu-v6e-8", {"slices": 2}),
        ("secrets", "gke", "cpu", {}),
    ],
)
def test_submitting_without_a_rule_fails_naming_the_grant(env, resource, backend, accelerator, kwargs):
    rule = _rule(resource)
    _remove(env, rule)
    message = _submit_refused(backend, accelerator, **kwargs)
    group = f'"{rule.group}"'
    assert f'cannot create resource "{resource}" in API group {group} in the namespace "{NS}"' in message
    assert f"Grant create on {resource} (API group {group}) to the identity kinetic uses" in message
    assert "kinetic-airflow doctor --print-rbac prints the Role" in message


def test_reading_a_jobs_pods_without_their_rule_fails_the_status_naming_it(env):
    """Without list/watch on pods kinetic cannot follow the job: the worker's read is an error
    naming the grant, the trigger's look a failure naming the refused verb and the pods' path,
    never a job waiting for ever."""
    import asyncio

    from jobkit import gke_job

    from kinetic_airflow.backends.base import JobState
    from kinetic_airflow.backends.gke.client import ApiError
    from kinetic_airflow.backends.registry import get_backend

    _, ref, _ = gke_job("podless", lambda: 1, [])
    backend = get_backend("gke")
    try:
        _remove(env, _rule("pods"))
        with pytest.raises(ApiError) as refused:
            backend.status(ref)
        assert 'cannot list resource "pods" in API group "" in the namespace "default"' in str(refused.value)
        assert 'Grant list on pods (API group "") to the identity kinetic uses' in str(refused.value)
        status = asyncio.run(backend.astatus(ref))
        assert status.state == JobState.FAILED and status.reason == "Forbidden", status
        assert f"list /api/v1/namespaces/{NS}/pods" in status.message
        assert 'cannot list resource "pods" in API group ""' in status.message
        assert "kinetic-airflow doctor --print-rbac prints that Role" in status.message
    finally:
        _set_rules(env, printed_role(NS)[0]["rules"])
        backend.cancel(ref)


def test_following_a_log_without_its_rule_stops_at_once_naming_the_grant(env):
    """Without get on pods/log the job's log cannot reach the task log: the stream says so once,
    naming the grant, and ends instead of reconnecting for minutes."""
    import asyncio
    import logging
    import sys
    import time

    from kinetic_airflow.backends.gke.client import kube_api
    from kinetic_airflow.backends.gke.logstream import PodLogStream

    with env.api_client() as admin:  # a pod that has written a line, made by the admin
        pod = {
            "metadata": {"name": "talks"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {"name": "main", "image": "busybox", "command": [sys.executable, "-c", "print(1)"]}
                ],
            },
        }
        core = kubernetes.client.CoreV1Api(admin)
        core.create_namespaced_pod(NS, pod)
        deadline = time.monotonic() + 60
        while core.read_namespaced_pod("talks", NS).status.phase != "Succeeded":
            assert time.monotonic() < deadline
            time.sleep(0.2)
    _remove(env, _rule("pods/log"))
    api = kube_api({"kubernetes_conn_id": "kinetic_emulator"})

    async def follow() -> PodLogStream:
        stream = PodLogStream(api, NS, "talks", "main")
        stream.start()
        await asyncio.wait_for(stream.done.wait(), 60)
        return stream

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("kinetic_airflow.backends.gke.logstream")  # whatever Airflow's config
    logger.addHandler(handler)
    try:
        stream = asyncio.run(follow())
    finally:
        logger.removeHandler(handler)
    assert stream.received == 0
    said = [r.getMessage() for r in records]
    warned = [m for m in said if "cannot follow the log of pod talks" in m]
    assert len(warned) == 1, said
    assert 'cannot get resource "pods/log" in API group ""' in warned[0]
    assert 'Grant get on pods/log (API group "")' in warned[0]
    assert "kinetic-airflow doctor --print-rbac" in warned[0]
