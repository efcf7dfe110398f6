"""``kinetic-airflow jobs debug JOB``: connect this machine's editor to a ``debug=True`` job.

The job's runner (``kinetic_airflow.job.debugging``) listens with debugpy on 127.0.0.1 of its
host or pod and writes where in ``status/debug.json``. This command waits for that marker, then:

* local backend: the job runs on this machine; the command prints the attach configuration for
  the port the job listens on and returns;
* cluster backends: it listens on a local port and forwards each connection through the API
  server to the job's host-0 pod (the ``pods/{name}/portforward`` subresource over a WebSocket,
  ``v4.channel.k8s.io``, through the ``kubernetes`` client's ``kubernetes.stream.portforward``),
  until the job ends or Ctrl-C. The identity needs ``create`` on ``pods/portforward`` in the
  job's namespace.

Either way it prints the VS Code ``launch.json`` configuration (type ``debugpy``, request
``attach``) with ``pathMappings`` from the function's folder in the job to the DAG folder here;
``--json`` prints it as one line of JSON instead, first, for scripts.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import socket
import sys
import threading
import time
from typing import Any

from kinetic_airflow.cli.common import CliError, add_storage_options, resolve_job
from kinetic_airflow.cli.text import described
from kinetic_airflow.job.debugging import DEBUG_MARKER
from kinetic_airflow.job.layout import JobLayout
from kinetic_airflow.jobstore import load_job, read_json_object

__all__ = ["add_debug_command", "cmd_debug", "launch_configuration"]

_POLL_SECONDS = 0.5


def add_debug_command(actions: Any) -> None:
    parser = actions.add_parser(
        "debug",
        help="attach your editor to a debug=True job (prints the VS Code launch.json configuration)",
        **described(__doc__),
    )
    parser.add_argument("job", help="job id, or the job's URI")
    parser.add_argument(
        "--local-port",
        type=int,
        default=0,
        help="cluster jobs: the local port to forward from (default: one the system picks)",
    )
    parser.add_argument(
        "--local-root",
        help="the folder on this machine that holds the DAG file (default: the job's own folder when it "
        "exists here, else ${workspaceFolder})",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=600.0,
        help="seconds to wait for the job to start listening (default 600)",
    )
    parser.add_argument("--json", action="store_true", help="print the connection as one line of JSON")
    add_storage_options(parser)


def cmd_debug(args: argparse.Namespace) -> int:
    if args.local_port < 0 or args.local_port > 65535:
        raise CliError(f"--local-port {args.local_port} is not a port: give 1-65535, or 0 for any free one")
    storage, job_uri = resolve_job(args, args.job)
    layout = JobLayout(job_uri)
    marker = _wait_for_marker(storage, job_uri, layout, args.wait)
    info = load_job(storage, job_uri)
    ref = info.ref
    backend = ref.backend if ref is not None else (info.manifest or {}).get("backend") or "local"
    port = marker.get("port")
    if not isinstance(port, int) or not 0 < port < 65536:
        raise CliError(
            f"{layout.status(DEBUG_MARKER)} holds no port ({port!r}): the job wrote a damaged marker"
        )
    if backend == "local":
        _announce(args, info.job_id, backend, marker, "127.0.0.1", port, pod=None)
        return 0
    if ref is None or ref.k8s is None:
        raise CliError(
            f"job {info.job_id} has no cluster reference in its job.json, so its pod cannot be found; "
            "forward the port by hand: kubectl port-forward pod/POD LOCAL_PORT:" + str(port)
        )
    return _forward(args, info.job_id, ref, marker, port, storage, layout)


# The marker ----------------------------------------------------------------------------------
def _wait_for_marker(storage: Any, job_uri: str, layout: JobLayout, wait: float) -> dict[str, Any]:
    """``status/debug.json`` once the job listens; a clear error when it never will (again).

    A job whose debugger attached before (a client that detached can attach again), or that ran
    on after ``debug_wait`` (``debug_on_timeout="run"``: debugpy still listens), is connected to
    as well, with a note; debugpy itself refuses a second client while one is attached.
    """
    deadline = time.monotonic() + wait
    job_id = job_uri.rsplit("/", 1)[-1]
    while True:
        info = load_job(storage, job_uri)
        marker = info.markers.get(DEBUG_MARKER)
        state = (marker or {}).get("state")
        if state == "timed out" and marker.get("on_timeout") != "run":
            raise CliError(
                f"job {job_id} stopped waiting for a debugger (nobody attached within "
                f"{marker.get('wait_seconds')}s, debug_wait, and debug_on_timeout='fail'): clear the task to "
                "run it again and run this command while it waits, or raise debug_wait"
            )
        if info.summary is not None or "finished" in info.markers:
            raise CliError(_never_listened(job_id, info, marker is not None))
        if marker is not None:
            if state == "attached":
                print(
                    f"note: a debugger attached to job {job_id} earlier; if it is still attached, debugpy "
                    "refuses this one until it detaches",
                    file=sys.stderr,
                )
            elif state == "timed out":
                print(
                    f"note: job {job_id} runs its function without waiting (nobody attached within "
                    "debug_wait); attaching now stops at the breakpoints it has not passed yet",
                    file=sys.stderr,
                )
            return marker
        manifest = info.manifest or {}
        if manifest and not manifest.get("debug"):
            raise CliError(
                f"job {job_id} was not submitted with debug=True, so it starts no debugger: add debug=True "
                "to the task (@task.kinetic(debug=True) or KineticRunOperator(debug=True)) and run it again"
            )
        if time.monotonic() > deadline:
            raise CliError(
                f"job {job_id} did not start listening for a debugger within {wait:g}s (no "
                f"{layout.status(DEBUG_MARKER)} yet): it may still be waiting for a node or installing "
                "packages (kinetic-airflow jobs logs " + job_id + "); run this command again, or pass --wait"
            )
        time.sleep(_POLL_SECONDS)


def _never_listened(job_id: str, info: Any, listened: bool) -> str:
    what = "its debugger stopped with it" if listened else "without listening for a debugger"
    return (
        f"job {job_id} has ended ({info.state}); {what}. Debug a job while it runs: clear the task to "
        "run it again with debug=True and run this command while the job waits"
    )


# Output --------------------------------------------------------------------------------------
def launch_configuration(
    job_id: str, host: str, port: int, marker: dict[str, Any], local_root: str | None
) -> dict[str, Any]:
    """VS Code's attach configuration: where to connect and how the job's paths map to this machine's."""
    source = marker.get("source_file")
    remote_root = os.path.dirname(source) if isinstance(source, str) and source else marker.get("cwd") or "."
    if local_root is None:
        local_root = remote_root if os.path.isdir(remote_root) else "${workspaceFolder}"
    mappings = [{"localRoot": local_root, "remoteRoot": remote_root}]
    # DAG-bundle modules the job imports from its unpacked copy: map that copy to where they live here
    for unpacked, on_worker in sorted((marker.get("code_sources") or {}).items()):
        if not (isinstance(unpacked, str) and isinstance(on_worker, str)):
            continue
        relative = os.path.relpath(on_worker, remote_root)
        local = local_root if relative == "." else os.path.join(local_root, relative)
        mappings.append({"localRoot": local, "remoteRoot": unpacked})
    return {
        "name": f"kinetic job {job_id}",
        "type": "debugpy",
        "request": "attach",
        "connect": {"host": host, "port": port},
        "pathMappings": mappings,
    }


def _announce(
    args: argparse.Namespace,
    job_id: str,
    backend: str,
    marker: dict[str, Any],
    host: str,
    port: int,
    pod: str | None,
) -> None:
    config = launch_configuration(job_id, host, port, marker, args.local_root)
    deadline = marker.get("deadline")
    if args.json:
        record = {"job_id": job_id, "backend": backend, "host": host, "port": port, "pod": pod}
        record.update(job_port=marker.get("port"), deadline=deadline, launch=config)
        print(json.dumps(record), flush=True)
        return
    until = "?"
    if isinstance(deadline, (int, float)):
        until = time.strftime("%H:%M:%S UTC", time.gmtime(deadline))
    if pod is None:
        print(f"job {job_id} ({backend}): debugpy listens on {host}:{port} and waits until {until}")
    else:
        print(
            f"job {job_id} ({backend}): forwarding {host}:{port} to port {marker.get('port')} of pod {pod}; "
            f"the job waits for a debugger until {until}. Ctrl-C stops forwarding."
        )
    print("Attach VS Code (Run and Debug) with this launch.json configuration:")
    print(json.dumps({"version": "0.2.0", "configurations": [config]}, indent=2), flush=True)


# Cluster jobs: a port-forward through the API server -------------------------------------------
def _forward(
    args: argparse.Namespace,
    job_id: str,
    ref: Any,
    marker: dict[str, Any],
    port: int,
    storage: Any,
    layout: Any,
) -> int:
    core = _core_api(ref.k8s.cluster)
    namespace = ref.k8s.namespace
    pod = _host0_pod(core, namespace, job_id, marker)
    listener = socket.create_server(("127.0.0.1", args.local_port))
    local_port = listener.getsockname()[1]
    _announce(args, job_id, ref.backend, marker, "127.0.0.1", local_port, pod=pod)
    listener.settimeout(1.0)
    try:
        while True:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                if read_json_object(storage, layout.status("finished")) is not None:
                    print(f"job {job_id} has finished; stopped forwarding", file=sys.stderr)
                    return 0
                continue
            bridge = threading.Thread(
                target=_bridge, args=(core, namespace, pod, port, conn), name="kinetic-debug-forward"
            )
            bridge.daemon = True
            bridge.start()
    except KeyboardInterrupt:
        return 0
    finally:
        listener.close()


def _core_api(cluster: dict[str, Any]) -> Any:
    """The ``kubernetes`` client for the job's cluster, as the operator's identity reaches it."""
    # Start-up cost (the Kubernetes client library, ~3.5 s): only this command needs its port-forward.
    import kubernetes

    # Airflow and the providers (connections): only for a cluster job, as `jobs cancel` does.
    from kinetic_airflow.backends.gke.client import api_server

    server = api_server(cluster)
    configuration = kubernetes.client.Configuration()
    configuration.host = server.host
    token = server.authorization()
    if token:
        configuration.api_key = {"authorization": token}

        # GKE tokens last about an hour and a debugging session may last longer: every new
        # forward (a debugger attaching again) asks the connection for a current one.
        def refresh(conf: Any) -> None:
            conf.api_key = {"authorization": server.authorization()}

        configuration.refresh_api_key_hook = refresh
    ca_file = server.ca_file
    if server.ca_data and not ca_file:
        import tempfile  # only for a CA given as data

        with tempfile.NamedTemporaryFile("w", suffix=".crt", delete=False) as fh:
            fh.write(server.ca_data)
        ca_file = fh.name
        atexit.register(os.unlink, ca_file)
    configuration.ssl_ca_cert = ca_file
    configuration.cert_file = server.cert_file
    configuration.key_file = server.key_file
    configuration.verify_ssl = server.verify
    configuration.tls_server_name = server.tls_server_name
    configuration.proxy = server.proxy
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration))


def _host0_pod(core: Any, namespace: str, job_id: str, marker: dict[str, Any]) -> str:
    """The running pod that wrote the marker: by its uid when the pod has one in its environment
    (LeaderWorkerSet, JobSet), else the job's one running pod."""
    pods = core.list_namespaced_pod(namespace, label_selector=f"job-id={job_id}").items
    uid = marker.get("pod_uid")
    if uid:
        pods = [p for p in pods if p.metadata.uid == uid]
    running = [p.metadata.name for p in pods if (p.status and p.status.phase) == "Running"]
    if len(running) != 1:
        raise CliError(
            f"found {len(running)} running pods of job {job_id} in namespace {namespace} that could be "
            "the one waiting for a debugger (label job-id=" + job_id + (f", uid {uid}" if uid else "") + "): "
            "check them with kubectl get pods -l job-id=" + job_id
        )
    return running[0]


def _bridge(core: Any, namespace: str, pod: str, port: int, conn: socket.socket) -> None:
    """One local connection <-> one port-forward WebSocket to ``pod``:``port``."""
    # Start-up cost (the Kubernetes client library), as in _core_api.
    from kubernetes.stream import portforward

    try:
        forward = portforward(core.connect_get_namespaced_pod_portforward, pod, namespace, ports=str(port))
    except Exception as exc:  # 403 (no create on pods/portforward), pod gone, API unreachable
        print(f"kinetic-airflow jobs debug: port-forward to pod {pod} failed: {exc}", file=sys.stderr)
        conn.close()
        return
    remote = forward.socket(port)
    remote.setblocking(True)

    def pump(src: Any, dst: Any) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for side in (src, dst):
                try:
                    side.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    back = threading.Thread(target=pump, args=(remote, conn), daemon=True)
    back.start()
    pump(conn, remote)
    back.join(5)
    error = forward.error(port)
    if error:
        print(f"kinetic-airflow jobs debug: pod {pod} port {port}: {error}", file=sys.stderr)
    conn.close()
    remote.close()
