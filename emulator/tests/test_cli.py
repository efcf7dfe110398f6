"""``python -m cluster_emulator``: kubeconfig, READY line, admin API, kubectl, SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_emulator import EmulatorAdminClient, wait_until
from emu_helpers import NS, PY, job_manifest, pid_alive, pod_manifest
from kubernetes import client, config

REPO = Path(__file__).resolve().parents[2]


def _readline(stream: Any, timeout: float) -> str:
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(stream.readline()))
    reader.start()
    reader.join(timeout)
    if not out:
        raise TimeoutError("emulator did not print READY")
    return out[0]


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("cli")
    kubeconfig = workdir / "kubeconfig"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    with (
        open(workdir / "stderr.txt", "w+") as stderr,
        subprocess.Popen(
            [PY, "-m", "cluster_emulator", "--port", "0", "--kubeconfig", str(kubeconfig)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=str(REPO),
            env=env,
        ) as proc,
    ):
        try:
            line = _readline(proc.stdout, 60)
            if not line.startswith("READY http://127.0.0.1:"):
                stderr.seek(0)
                pytest.fail(f"unexpected first line {line!r}; stderr: {stderr.read()}")
            url = line.split()[1]
            api = config.new_client_from_config(config_file=str(kubeconfig))
            yield {"proc": proc, "url": url, "kubeconfig": kubeconfig, "api": api}
            api.close()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_entry_point_serves_the_api(cli: dict[str, Any]) -> None:
    contexts, current = config.list_kube_config_contexts(str(cli["kubeconfig"]))
    assert current["name"] == "emulator" and current["context"]["cluster"] == "emulator"
    assert current["context"]["namespace"] == NS and len(contexts) == 1
    core = client.CoreV1Api(cli["api"])
    batch = client.BatchV1Api(cli["api"])
    core.create_namespaced_pod(NS, pod_manifest("cli-sleeper", "import time; time.sleep(120)"))
    batch.create_namespaced_job(NS, job_manifest("cli-job", "print('done')"))
    wait_until(lambda: core.read_namespaced_pod("cli-sleeper", NS).status.phase == "Running")
    admin = EmulatorAdminClient(cli["url"])
    assert admin.health()["status"] == "ok"
    procs = wait_until(lambda: [p for p in admin.processes() if p["pod"] == "cli-sleeper"])
    cli["sleeper_pid"] = procs[0]["pid"]
    assert admin.requests()["count"] > 0
    admin.inject_api_fault("GET", "/api/v1/namespaces/default/pods/cli-sleeper$", status=503, count=1)
    with pytest.raises(client.rest.ApiException) as info:
        core.read_namespaced_pod("cli-sleeper", NS)
    assert info.value.status == 503
    admin.clear_faults()


def test_kubectl_get(cli: dict[str, Any]) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH; the API itself is covered by the other tests")
    env = {**os.environ, "KUBECONFIG": str(cli["kubeconfig"])}

    def run(*args: str) -> str:
        done = subprocess.run([kubectl, *args], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    batch = client.BatchV1Api(cli["api"])
    wait_until(
        lambda: any(
            c.type == "Complete"
            for c in (batch.read_namespaced_job_status("cli-job", NS).status.conditions or [])
        )
    )
    pods = run("get", "pods")
    assert "NAME" in pods and "STATUS" in pods
    sleeper = next(line for line in pods.splitlines() if line.startswith("cli-sleeper"))
    assert "Running" in sleeper and "1/1" in sleeper
    assert any(line.startswith("cli-job-") and "Completed" in line for line in pods.splitlines())
    assert "cli-sleeper" in run("get", "pods", "-o", "name")
    assert "Complete" in run("get", "jobs")
    assert "Ready" in run("get", "nodes")
    assert "default" in run("get", "namespaces")
    run("get", "leaderworkersets")
    assert "cli-sleeper" in run("get", "pod", "cli-sleeper", "-o", "wide")


def test_kubectl_apply_and_wait(cli: dict[str, Any], tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH; the API itself is covered by the other tests")
    env = {**os.environ, "KUBECONFIG": str(cli["kubeconfig"])}
    manifest = tmp_path / "job.json"
    manifest.write_text(json.dumps(job_manifest("applied", "print('applied')")))
    for args in (
        ["apply", "-f", str(manifest)],  # server-side field validation (kubectl reads /openapi/v3)
        ["wait", "--for=condition=complete", "job/applied", "--timeout=30s"],
        ["delete", "-f", str(manifest)],
    ):
        done = subprocess.run([kubectl, *args], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr


def test_sigterm_stops_server_and_kills_pods(cli: dict[str, Any]) -> None:
    proc = cli["proc"]
    pid = cli.get("sleeper_pid")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    if pid is not None:
        wait_until(lambda: not pid_alive(pid), message="pod process killed on SIGTERM")
