"""Pod runtime: logs (follow, tail, timestamps, since, containers), env, restarts, init containers."""

from __future__ import annotations

import datetime as dt
import urllib.request

import pytest
from cluster_emulator import ClusterEmulator, wait_until
from emu_helpers import NS, PY, api_error, container, pod_manifest, read_log, wait_pod
from kubernetes import client
from kubernetes.client.rest import ApiException


@pytest.fixture
def core(k8s_api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(k8s_api_client)


def test_log_follow_streams_until_exit(core: client.CoreV1Api) -> None:
    code = "import time\nfor i in range(3):\n    print(f'line-{i}', flush=True); time.sleep(0.3)\n"
    core.create_namespaced_pod(NS, pod_manifest("chatty", code))
    wait_pod(core, "chatty", "Running")
    resp = core.read_namespaced_pod_log("chatty", NS, follow=True, _preload_content=False)
    chunks = []
    phase_at_first_chunk = None
    for chunk in resp.stream(64):
        if phase_at_first_chunk is None:
            phase_at_first_chunk = core.read_namespaced_pod("chatty", NS).status.phase
        chunks.append(chunk)
    assert b"".join(chunks).decode() == "line-0\nline-1\nline-2\n"
    assert phase_at_first_chunk == "Running"  # lines arrived while the process was still running
    assert core.read_namespaced_pod("chatty", NS).status.phase in ("Running", "Succeeded")
    wait_pod(core, "chatty", "Succeeded")


def test_log_options(core: client.CoreV1Api, k8s_cluster: ClusterEmulator) -> None:
    code = "import sys\nfor i in range(5): print(f'out-{i}')\nprint('oops', file=sys.stderr)\n"
    core.create_namespaced_pod(NS, pod_manifest("opts", code))
    wait_pod(core, "opts", "Succeeded")
    full = read_log(core, "opts")
    assert full.count("\n") == 6 and "oops\n" in full
    assert read_log(core, "opts", tail_lines=2).count("\n") == 2
    stamped = read_log(core, "opts", timestamps=True).splitlines()
    ts, text = stamped[0].split(" ", 1)
    assert text == "out-0" and dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).tzinfo is not None
    url = f"{k8s_cluster.url}/api/v1/namespaces/{NS}/pods/opts/log?sinceTime="
    future = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    past = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    with urllib.request.urlopen(url + future, timeout=10) as resp:
        assert resp.read() == b""
    with urllib.request.urlopen(url + past, timeout=10) as resp:
        assert resp.read().decode() == full
    assert read_log(core, "opts", since_seconds=3600) == full
    assert read_log(core, "opts", limit_bytes=4) == "out-"
    assert read_log(core, "opts", stream="Stderr") == "oops\n"


def test_multi_container_and_init_containers(core: client.CoreV1Api, tmp_path) -> None:
    shared = tmp_path / "shared.txt"
    manifest = pod_manifest("multi", "pass")
    manifest["spec"]["initContainers"] = [
        container(f"open({str(shared)!r}, 'w').write('from init'); print('init done')", name="setup")
    ]
    manifest["spec"]["containers"] = [
        container(f"print(open({str(shared)!r}).read())", name="reader"),
        container("print('sidecar')", name="other"),
    ]
    core.create_namespaced_pod(NS, manifest)
    pod = wait_pod(core, "multi", "Succeeded")
    assert pod.status.init_container_statuses[0].state.terminated.reason == "Completed"
    with pytest.raises(ApiException) as info:
        read_log(core, "multi")
    assert info.value.status == 400
    assert "a container name must be specified for pod multi" in api_error(info.value)["message"]
    assert read_log(core, "multi", container="reader") == "from init\n"
    assert read_log(core, "multi", container="other") == "sidecar\n"
    assert read_log(core, "multi", container="setup") == "init done\n"


def test_env_field_refs_working_dir_and_var_expansion(core: client.CoreV1Api, tmp_path) -> None:
    code = (
        "import os\n"
        "for k in ('PLAIN', 'POD', 'NS', 'APP', 'NOTE', 'EXPANDED', 'CM'):\n"
        "    print(k, os.environ[k])\n"
        "print('CWD', os.getcwd())\n"
    )
    core.create_namespaced_config_map(NS, {"metadata": {"name": "cfg"}, "data": {"k": "from-configmap"}})
    manifest = pod_manifest("envy", code, {"app": "envtest"})
    manifest["metadata"]["annotations"] = {"note": "hello"}
    manifest["spec"]["containers"][0].update(
        {
            "workingDir": str(tmp_path),
            "env": [
                {"name": "PLAIN", "value": "plain-value"},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "NOTE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['note']"}}},
                {"name": "EXPANDED", "value": "$(POD)-in-$(NS)"},
                {"name": "CM", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}},
            ],
        }
    )
    core.create_namespaced_pod(NS, manifest)
    wait_pod(core, "envy", "Succeeded")
    lines = dict(line.split(" ", 1) for line in read_log(core, "envy").splitlines())
    assert lines == {
        "PLAIN": "plain-value",
        "POD": "envy",
        "NS": NS,
        "APP": "envtest",
        "NOTE": "hello",
        "EXPANDED": f"envy-in-{NS}",
        "CM": "from-configmap",
        "CWD": str(tmp_path),
    }


def test_missing_command_and_missing_secret(core: client.CoreV1Api) -> None:
    no_command = pod_manifest("nocmd")
    del no_command["spec"]["containers"][0]["command"]
    core.create_namespaced_pod(NS, no_command)
    pod = wait_pod(core, "nocmd", "Failed")
    term = pod.status.container_statuses[0].state.terminated
    assert (term.exit_code, term.reason) == (128, "StartError") and "command" in term.message

    secretive = pod_manifest("secretive", "pass")
    secretive["spec"]["containers"][0]["env"] = [
        {"name": "S", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}
    ]
    core.create_namespaced_pod(NS, secretive)

    def waiting() -> str | None:
        statuses = core.read_namespaced_pod("secretive", NS).status.container_statuses or []
        state = statuses[0].state.waiting if statuses else None
        return state.message if state is not None and state.reason == "CreateContainerConfigError" else None

    assert wait_until(waiting) == 'secret "absent" not found'
    core.create_namespaced_secret(
        NS, {"metadata": {"name": "absent"}, "stringData": {"k": "v"}, "data": {"k": "dg=="}}
    )
    wait_pod(core, "secretive", "Succeeded")


def test_restart_policy_on_failure_and_previous_logs(core: client.CoreV1Api, tmp_path) -> None:
    marker = tmp_path / "ran-once"
    code = (
        "import os, sys\n"
        f"m = {str(marker)!r}\n"
        "if not os.path.exists(m):\n    open(m, 'w').close(); print('attempt 1'); sys.exit(2)\n"
        "print('attempt 2')\n"
    )
    core.create_namespaced_pod(NS, pod_manifest("retry", code, restart="OnFailure"))
    pod = wait_pod(core, "retry", "Succeeded")
    cs = pod.status.container_statuses[0]
    assert cs.restart_count == 1
    assert cs.last_state.terminated.exit_code == 2
    assert read_log(core, "retry") == "attempt 2\n"
    assert read_log(core, "retry", previous=True) == "attempt 1\n"
    events = core.list_namespaced_event(NS, field_selector="involvedObject.name=retry").items
    assert any(e.reason == "BackOff" for e in events)


def test_graceful_pod_delete(core: client.CoreV1Api, k8s_cluster: ClusterEmulator) -> None:
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
        "print('up', flush=True); time.sleep(60)"
    )
    core.create_namespaced_pod(NS, pod_manifest("graceful", code))
    wait_until(lambda: "up" in read_log(core, "graceful"))
    deleted = core.delete_namespaced_pod("graceful", NS)
    assert deleted.metadata.deletion_timestamp is not None or deleted.status is not None

    def gone() -> bool:
        try:
            core.read_namespaced_pod("graceful", NS)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_until(gone)
    assert not [p for p in k8s_cluster.processes() if p["pod"] == "graceful"]


def test_bare_python_executable_is_used(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(NS, pod_manifest("which", "import sys; print(sys.executable)"))
    wait_pod(core, "which", "Succeeded")
    assert read_log(core, "which").strip() == PY


def test_a_command_that_cannot_start_fails_the_pod_with_start_error(core: client.CoreV1Api) -> None:
    """exec fails (no such file): the pod fails with StartError naming the binary, as containerd
    reports it, and the kubelet goes on running other pods (its error path closes the container's
    pipes once each)."""
    manifest = pod_manifest("noexec")
    manifest["spec"]["containers"][0]["command"] = ["/nonexistent/kinetic-test-binary"]
    core.create_namespaced_pod(NS, manifest)
    pod = wait_pod(core, "noexec", "Failed")
    term = pod.status.container_statuses[0].state.terminated
    assert (term.exit_code, term.reason) == (128, "StartError"), term
    assert 'exec: "/nonexistent/kinetic-test-binary"' in term.message, term.message
    core.create_namespaced_pod(NS, pod_manifest("after-noexec"))
    assert wait_pod(core, "after-noexec", "Succeeded").status.phase == "Succeeded"
