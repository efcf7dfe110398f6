"""JobSets (kubernetes-sigs/jobset at 08dfbdf): strict CRD validation and the webhook's defaults and
name checks, child Jobs with JobSet's labels and annotations, the headless Service and pod DNS
names, success, the failure policy's restarts up to maxRestarts, and cascading deletion."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest
from cluster_emulator import wait_until
from emu_helpers import NS, PY, api_error
from kubernetes import client
from kubernetes.client.rest import ApiException

GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
ANNOTATED = (
    "jobset.sigs.k8s.io/jobset-name",
    "jobset.sigs.k8s.io/replicatedjob-name",
    "jobset.sigs.k8s.io/replicatedjob-replicas",
    "jobset.sigs.k8s.io/job-index",
    "jobset.sigs.k8s.io/job-global-index",
    "jobset.sigs.k8s.io/restart-attempt",
)


def jobset_manifest(
    name: str, code: str, slices: int = 2, hosts: int = 2, failure_policy: dict[str, Any] | None = None
) -> dict[str, Any]:
    pod = {
        "spec": {
            "containers": [{"name": "main", "image": "runner:1", "command": [PY, "-c", code]}],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
        }
    }
    spec: dict[str, Any] = {
        "replicatedJobs": [
            {
                "name": "slice",
                "replicas": slices,
                "template": {
                    "spec": {"parallelism": hosts, "completions": hosts, "backoffLimit": 0, "template": pod}
                },
            }
        ]
    }
    if failure_policy is not None:
        spec["failurePolicy"] = failure_policy
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "JobSet",
        "metadata": {"name": name, "annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": "pool"}},
        "spec": spec,
    }


@pytest.fixture
def apis(
    k8s_api_client: client.ApiClient,
) -> tuple[client.CustomObjectsApi, client.BatchV1Api, client.CoreV1Api]:
    return (
        client.CustomObjectsApi(k8s_api_client),
        client.BatchV1Api(k8s_api_client),
        client.CoreV1Api(k8s_api_client),
    )


def _jobset(custom: client.CustomObjectsApi, name: str) -> dict[str, Any]:
    return custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)


def _condition(jobset: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return next((c for c in (jobset.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


def _finished(custom: client.CustomObjectsApi, name: str, ctype: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        jobset = _jobset(custom, name)
        cond = _condition(jobset, ctype)
        return jobset if cond is not None and cond["status"] == "True" else None

    return wait_until(check, timeout=60)


def test_a_jobset_runs_one_job_per_slice_with_jobset_labels_dns_names_and_completes(apis) -> None:
    custom, batch, core = apis
    code = "import socket; print(socket.gethostname(), flush=True)"
    created = custom.create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, jobset_manifest("train", code)
    )
    # the webhook's defaults (jobset_webhook.go, Default)
    assert created["spec"]["successPolicy"] == {"operator": "All"}
    assert created["spec"]["network"]["enableDNSHostnames"] is True
    rjob = created["spec"]["replicatedJobs"][0]
    assert rjob["template"]["spec"]["completionMode"] == "Indexed"
    assert rjob["groupName"] == "default"  # the CRD's default

    done = _finished(custom, "train", "Completed")
    assert done["status"]["terminalState"] == "Completed"
    assert done["status"]["replicatedJobsStatus"] == [
        {"name": "slice", "ready": 0, "succeeded": 2, "failed": 0, "active": 0, "suspended": 0}
    ]
    jobs = {
        j.metadata.name: j
        for j in batch.list_namespaced_job(NS, label_selector="jobset.sigs.k8s.io/jobset-name=train").items
    }
    assert set(jobs) == {"train-slice-0", "train-slice-1"}
    for index, job in enumerate(jobs[n] for n in ("train-slice-0", "train-slice-1")):
        labels, annotations = job.metadata.labels, job.metadata.annotations
        expected = {
            "jobset.sigs.k8s.io/jobset-name": "train",
            "jobset.sigs.k8s.io/replicatedjob-name": "slice",
            "jobset.sigs.k8s.io/replicatedjob-replicas": "2",
            "jobset.sigs.k8s.io/job-index": str(index),
            "jobset.sigs.k8s.io/job-global-index": str(index),
            "jobset.sigs.k8s.io/restart-attempt": "0",
        }
        assert {k: labels[k] for k in ANNOTATED} == expected
        assert {k: annotations[k] for k in ANNOTATED} == expected
        assert annotations["alpha.jobset.sigs.k8s.io/exclusive-topology"] == "pool"
        assert "alpha.jobset.sigs.k8s.io/exclusive-topology" not in labels  # an annotation only
        assert len(labels["jobset.sigs.k8s.io/job-key"]) == 40  # sha1 of namespace/job
        assert job.metadata.owner_references[0].kind == "JobSet"
        assert job.spec.template.spec.subdomain == "train"
    service = core.read_namespaced_service("train", NS)
    assert service.spec.cluster_ip == "None"
    assert service.spec.selector == {"jobset.sigs.k8s.io/jobset-name": "train"}
    pods = core.list_namespaced_pod(NS, label_selector="jobset.sigs.k8s.io/jobset-name=train").items
    assert sorted(p.spec.hostname for p in pods) == [
        "train-slice-0-0",
        "train-slice-0-1",
        "train-slice-1-0",
        "train-slice-1-1",
    ]


def test_a_failed_slice_restarts_every_job_until_max_restarts_then_fails_the_jobset(apis) -> None:
    custom, batch, _core = apis
    code = "import os, sys; sys.exit(3 if os.environ['JOB_COMPLETION_INDEX'] == '1' else 0)"
    manifest = jobset_manifest(
        "flaky", "import time; time.sleep(0.3)\n" + code, failure_policy={"maxRestarts": 1}
    )
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, manifest)
    failed = _finished(custom, "flaky", "Failed")
    assert failed["status"]["restarts"] == 1 and failed["status"]["restartsCountTowardsMax"] == 1
    assert failed["status"]["terminalState"] == "Failed"
    cond = _condition(failed, "Failed")
    assert cond["reason"] == "ReachedMaxRestarts"
    assert cond["message"].startswith(
        "jobset failed due to reaching max number of restarts (first failed job: flaky-slice-"
    )
    assert _condition(failed, "RestartingJobSet")["status"] == "False"
    # the restart recreated the Jobs: what is left carries restart attempt 1
    attempts = {
        j.metadata.labels["jobset.sigs.k8s.io/restart-attempt"]
        for j in batch.list_namespaced_job(NS, label_selector="jobset.sigs.k8s.io/jobset-name=flaky").items
    }
    assert attempts <= {"1"}


def test_without_a_failure_policy_a_failed_job_fails_the_jobset(apis) -> None:
    custom, _batch, _core = apis
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, jobset_manifest("brittle", "raise SystemExit(1)", slices=1, hosts=1)
    )
    cond = _condition(_finished(custom, "brittle", "Failed"), "Failed")
    assert cond["reason"] == "FailedJobs"
    assert (
        cond["message"] == "jobset failed due to one or more job failures (first failed job: brittle-slice-0)"
    )


def test_deleting_a_jobset_deletes_its_jobs_pods_and_service(apis) -> None:
    custom, batch, core = apis
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, jobset_manifest("gone", "import time; time.sleep(60)")
    )
    selector = "jobset.sigs.k8s.io/jobset-name=gone"
    wait_until(lambda: len(core.list_namespaced_pod(NS, label_selector=selector).items) == 4, timeout=30)
    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "gone")

    def cleared() -> bool:
        services = [s for s in core.list_namespaced_service(NS).items if s.metadata.name == "gone"]
        return (
            not batch.list_namespaced_job(NS, label_selector=selector).items
            and not services
            and not (core.list_namespaced_pod(NS, label_selector=selector).items)
        )

    wait_until(cleared, timeout=60)


def test_unknown_fields_and_names_too_long_for_the_children_are_refused(apis) -> None:
    custom, _batch, _core = apis
    manifest = jobset_manifest("strict", "pass")
    manifest["spec"]["replicatedJobs"][0]["replica"] = 2  # a typo strict validation must catch
    with pytest.raises(ApiException) as caught:
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, manifest)
    assert caught.value.status == 422 and "replica" in api_error(caught.value)["message"]

    long_name = "j" * 52  # "<name>-slice-1" is 60 characters: a valid Job, but its pods' names are not
    with pytest.raises(ApiException) as caught:
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, jobset_manifest(long_name, "pass"))
    message = api_error(caught.value)["message"]
    assert caught.value.status == 422
    assert "pod names generated for this JobSet will exceed 63 characters" in message


def test_kubectl_lists_jobsets_with_the_crd_printer_columns(apis, k8s_kubeconfig) -> None:
    """kubectl (Debian's kubernetes-client) as the client: resource discovery finds jobsets and the
    server-side table has the CRD's additionalPrinterColumns."""
    custom, _batch, _core = apis
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, jobset_manifest("listed", "pass", slices=1, hosts=1)
    )
    _finished(custom, "listed", "Completed")
    env = {**os.environ, "KUBECONFIG": str(k8s_kubeconfig)}
    done = subprocess.run(
        ["kubectl", "get", "jobsets", "-n", NS], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()[:2]
    names = header.split()
    assert names == ["NAME", "TERMINALSTATE", "RESTARTS", "COMPLETED", "SUSPENDED", "AGE"]
    starts = [header.index(name) for name in names] + [len(row)]
    cells = {name: row[starts[i] : starts[i + 1]].strip() for i, name in enumerate(names)}
    # an unset path (spec.suspend) is a null cell: kubectl leaves it blank
    assert cells | {"AGE": ""} == {
        "NAME": "listed",
        "TERMINALSTATE": "Completed",
        "RESTARTS": "0",
        "COMPLETED": "True",
        "SUSPENDED": "",
        "AGE": "",
    }
