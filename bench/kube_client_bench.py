"""What a task process pays to reach a cluster: kinetic's transport beside maintained clients.

A deferred GKE task's ``execute`` builds one Kubernetes connection in a fresh process (Airflow runs
each task in a process of its own). This measures that cost alone, which ``race_bench.py``'s
end-to-end task overhead (seconds of scheduling and waiting) cannot resolve on a busy machine: in
a new Python process that has already loaded what a GKE task process has (Airflow's SDK, urllib3,
PyYAML, aiohttp, the google provider's base hook, google-auth's requests transport), the time from
nothing to three answered requests (pods, jobs, /version) against the cluster emulator, through

* ``handwritten``: ``backends/gke/transport.py`` reading the kubeconfig itself;
* ``kubernetes``: the kubernetes python client (``kubernetes.client`` and its kubeconfig loader,
  ``ApiClient.call_api`` with raw JSON, no model objects);
* ``lightkube``: lightkube's kubeconfig and httpx client, when lightkube can be imported.

The variants run interleaved, round after round, so load from other work falls on each alike:

    .venv/bin/python bench/kube_client_bench.py --rounds 15
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PATHS = ("/api/v1/namespaces/default/pods", "/apis/batch/v1/namespaces/default/jobs", "/version")

PRELUDE = """
import json, time
import airflow.sdk, urllib3, yaml, aiohttp
from airflow.providers.google.common.hooks.base_google import GoogleBaseHook
import google.auth.transport.requests
started = time.perf_counter()
"""

VARIANTS = {
    "handwritten": """
from kinetic_airflow.backends.gke.transport import from_kubernetes_connection
server = from_kubernetes_connection({{"kube_config_path": {config!r}}})
for path in {paths!r}:
    response = server.request("GET", path)
    json.loads(response.data)
    response.release_conn()
""",
    "kubernetes": """
import kubernetes.client
import kubernetes.config.kube_config as kube_config
configuration = kubernetes.client.Configuration()
kube_config.load_kube_config(config_file={config!r}, client_configuration=configuration, persist_config=False)
api = kubernetes.client.ApiClient(configuration)
for path in {paths!r}:
    response = api.call_api(path, "GET", auth_settings=["BearerToken"], _preload_content=False,
                            _return_http_data_only=True)
    json.loads(response.data)
    response.release_conn()
""",
    "lightkube": """
from lightkube.config import client_adapter
from lightkube.config.kubeconfig import KubeConfig
http = client_adapter.Client(KubeConfig.from_file({config!r}).get(), client_adapter.ConnectionParams())
for path in {paths!r}:
    http.get(path).json()
""",
}


def start_emulator(folder: Path) -> tuple[subprocess.Popen, Path]:
    config = folder / "kubeconfig"
    process = subprocess.Popen(
        [sys.executable, "-m", "cluster_emulator", "--port", "0", "--kubeconfig", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=folder,
    )
    for line in process.stdout:
        if line.startswith("READY"):
            return process, config
    raise RuntimeError("the emulator did not start")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    variants = [v for v in VARIANTS if v != "lightkube" or importlib.util.find_spec("lightkube")]
    process, config = start_emulator(Path(tempfile.mkdtemp(prefix="kube-client-bench-")))
    seconds: dict[str, list[float]] = {v: [] for v in variants}
    try:
        for _ in range(args.rounds):
            for variant in variants:
                body = VARIANTS[variant].format(config=str(config), paths=PATHS)
                code = PRELUDE + body + "\nprint(time.perf_counter() - started)"
                out = subprocess.run(
                    [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy()
                )
                if out.returncode:
                    raise SystemExit(f"{variant} failed:\n{out.stderr[-2000:]}")
                seconds[variant].append(float(out.stdout.strip().splitlines()[-1]))
    finally:
        process.terminate()
        process.wait()
    base = statistics.median(seconds["handwritten"])
    load = os.getloadavg()[0]
    print(f"{args.rounds} rounds, load average {load:.1f} at the end ({time.strftime('%H:%M')})")
    print(f"{'variant':12} {'median':>8} {'min':>7} {'max':>7}   vs handwritten (medians)")
    for variant, values in seconds.items():
        median = statistics.median(values)
        print(
            f"{variant:12} {median:7.3f}s {min(values):6.3f}s {max(values):6.3f}s"
            f"   {median - base:+.3f}s  x{median / base:.1f}"
        )


if __name__ == "__main__":
    main()
