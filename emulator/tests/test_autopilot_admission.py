"""GKE Autopilot mode: GKE Warden's admission constraints (admission.py ``autopilot_violations``).

A writable hostPath volume, a hostPath outside ``/var/log/`` and a host port are refused with
Warden's words; a read-only ``/var/log`` hostPath and an emptyDir are admitted. A Job's refused
pod surfaces only as the Job controller's ``FailedCreate`` event, as on GKE.
"""

from __future__ import annotations

import json

import pytest
from cluster_emulator import ClusterEmulator, wait_until
from cluster_emulator.__main__ import parse_args
from emu_helpers import NS, api_error, container, job_manifest, pod_manifest, wait_pod
from kubernetes import client
from kubernetes.client.rest import ApiException

WARDEN = (
    'admission webhook "warden-validating.common-webhooks.networking.gke.io" denied the request: GKE Warden '
    "rejected the request because it violates one or more constraints.\nViolations details: "
)


@pytest.fixture(scope="module")
def autopilot(tmp_path_factory):
    with ClusterEmulator(autopilot=True, work_dir=tmp_path_factory.mktemp("emulator")) as k8s:
        yield k8s


def _with_volume(name: str, volume: dict, mount: dict) -> dict:
    manifest = pod_manifest(name, "pass", volumes=[{"name": "v", **volume}])
    manifest["spec"]["containers"][0]["volumeMounts"] = [{"name": "v", **mount}]
    return manifest


def _refusal(core: client.CoreV1Api, manifest: dict) -> str:
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, manifest)
    assert caught.value.status == 403
    return api_error(caught.value)["message"]


def test_a_writable_host_path_is_refused_with_wardens_message(autopilot):
    core = client.CoreV1Api(autopilot.api_client())
    message = _refusal(
        core, _with_volume("cache", {"hostPath": {"path": "/var/cache/envs"}}, {"mountPath": "/envs"})
    )
    assert message.startswith(f'pods "cache" is forbidden: {WARDEN}')
    details = json.loads(message.split("Violations details: ", 1)[1])
    assert details == {
        "[denied by autogke-no-write-mode-hostpath]": [
            "hostPath volume v in container main is accessed in write mode; disallowed in Autopilot.",
            "hostPath volume v used in container main uses path /var/cache/envs which is not allowed in "
            "Autopilot. Allowed path prefixes for hostPath volumes are: [/var/log/].",
        ]
    }
    # under /var/log but writable: only the write-mode violation
    message = _refusal(core, _with_volume("logs", {"hostPath": {"path": "/var/log/x"}}, {"mountPath": "/l"}))
    assert json.loads(message.split("Violations details: ", 1)[1]) == {
        "[denied by autogke-no-write-mode-hostpath]": [
            "hostPath volume v in container main is accessed in write mode; disallowed in Autopilot."
        ]
    }


def test_a_host_port_is_refused(autopilot):
    core = client.CoreV1Api(autopilot.api_client())
    manifest = pod_manifest("port", "pass")
    manifest["spec"]["containers"][0]["ports"] = [{"containerPort": 8471, "hostPort": 8471}]
    details = json.loads(_refusal(core, manifest).split("Violations details: ", 1)[1])
    assert details == {
        "[denied by autogke-no-host-port]": [
            "container main specifies host ports [8471], which are disallowed in Autopilot."
        ]
    }


def test_read_only_var_log_and_empty_dir_are_admitted(autopilot):
    core = client.CoreV1Api(autopilot.api_client())
    core.create_namespaced_pod(
        NS,
        _with_volume(
            "ro-logs", {"hostPath": {"path": "/var/log/pods"}}, {"mountPath": "/l", "readOnly": True}
        ),
    )
    core.create_namespaced_pod(NS, _with_volume("scratch", {"emptyDir": {}}, {"mountPath": "/envs"}))
    wait_pod(core, "ro-logs", "Succeeded")
    wait_pod(core, "scratch", "Succeeded")


def test_a_jobs_refused_pod_is_a_failed_create_event(autopilot):
    core = client.CoreV1Api(autopilot.api_client())
    batch = client.BatchV1Api(autopilot.api_client())
    spec = {
        "containers": [container("pass", volumeMounts=[{"name": "v", "mountPath": "/envs"}])],
        "volumes": [{"name": "v", "hostPath": {"path": "/var/cache/envs", "type": "DirectoryOrCreate"}}],
    }
    batch.create_namespaced_job(NS, job_manifest("hostpath-job", "pass", pod_spec=spec))

    def failed_create() -> list:
        events = core.list_namespaced_event(NS, field_selector="involvedObject.name=hostpath-job").items
        return [e for e in events if e.reason == "FailedCreate"]

    event = wait_until(failed_create, timeout=30)[0]
    assert "autogke-no-write-mode-hostpath" in event.message and "Error creating" in event.message
    assert not core.list_namespaced_pod(NS, label_selector="job-name=hostpath-job").items


def test_a_standard_cluster_admits_a_host_path(k8s_api_client):
    core = client.CoreV1Api(k8s_api_client)
    core.create_namespaced_pod(
        NS, _with_volume("std-cache", {"hostPath": {"path": "/var/cache/envs"}}, {"mountPath": "/envs"})
    )
    wait_pod(core, "std-cache", "Succeeded")


def test_the_command_line_flag():
    assert parse_args(["--autopilot"]).autopilot is True
    assert parse_args([]).autopilot is False
