"""``python -m cluster_emulator --port 0 --kubeconfig PATH``.

Runs the emulator in the foreground (for Airflow processes, kubectl or other
languages to talk to), writes a kubeconfig, prints ``READY http://127.0.0.1:PORT``
once serving, and on SIGTERM/SIGINT kills every pod process and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .cluster import DEFAULT_NAMESPACES, DEFAULT_SERVICE_ACCOUNTS, Cluster
from .kubeconfig import DEFAULT_CONTEXT, write_kubeconfig
from .nodes import NodePool, Taint
from .resources import KUEUE_14558, check_unserved
from .server import ApiServer


def _load_pools(path: str | None) -> list[NodePool] | None:
    if not path:
        return None
    with open(path, encoding="utf-8") as fh:
        raw = json.load(fh)
    pools = []
    for item in raw:
        taints = [
            Taint(t["key"], t.get("value", ""), t.get("effect", "NoSchedule")) for t in item.get("taints", [])
        ]
        pools.append(
            NodePool(
                item["name"],
                labels=dict(item.get("labels") or {}),
                taints=taints,
                node_count=int(item.get("node_count", item.get("nodeCount", 1))),
                max_run_seconds=item.get("max_run_seconds", item.get("maxRunSeconds")),
            )
        )
    return pools


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command line of the emulator."""
    parser = argparse.ArgumentParser(
        prog="kinetic-cluster-emulator",
        description="Local Kubernetes API emulator that runs pod commands as local processes.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one (default)")
    parser.add_argument("--kubeconfig", help="write a kubeconfig for the emulator here")
    parser.add_argument(
        "--context", default=DEFAULT_CONTEXT, help="kubeconfig context name (default emulator)"
    )
    parser.add_argument("--namespace", default="default", help="default namespace in the kubeconfig")
    parser.add_argument(
        "--create-namespace", action="append", default=[], help="extra namespace to create (repeatable)"
    )
    parser.add_argument(
        "--service-account",
        action="append",
        default=None,
        help="namespace/name of a service account to create besides each namespace's default "
        "(repeatable; default: default/kinetic, as `kinetic up` leaves a cluster; '' for none)",
    )
    parser.add_argument(
        "--max-grace-seconds", type=float, default=5.0, help="cap on termination grace periods"
    )
    parser.add_argument(
        "--no-cluster-dns",
        action="store_true",
        help="hand pod processes cluster DNS names as they are (default: names of pods and headless "
        "Services in their env become 127.0.0.1)",
    )
    parser.add_argument("--work-dir", help="directory for pod logs (default: a temp dir removed on exit)")
    parser.add_argument("--node-pools", help="JSON file: [{name, labels, taints:[{key,value,effect}]}]")
    parser.add_argument(
        "--unserve",
        action="append",
        default=[],
        metavar="GROUP/VERSION",
        help="stop serving a version the vendored CRDs serve (repeatable), e.g. kueue.x-k8s.io/v1beta1 "
        f"as kubernetes-sigs/kueue#14558 does; '{KUEUE_14558}' is short for that change",
    )
    parser.add_argument(
        "--autopilot",
        action="store_true",
        help="act as a GKE Autopilot cluster: pods with a writable hostPath volume or a host port are "
        "refused with GKE Warden's message",
    )
    parser.add_argument("--log-level", default="WARNING", help="Python log level (default WARNING)")
    args = parser.parse_args(argv)
    try:
        check_unserved(args.unserve)
    except ValueError as exc:  # a usage error, not a traceback
        parser.error(str(exc))
    return args


async def serve(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT."""
    owns_dir = not args.work_dir
    work_dir = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="k8s-emulator-"))
    namespaces = list(DEFAULT_NAMESPACES) + [n for n in args.create_namespace if n not in DEFAULT_NAMESPACES]
    cluster = Cluster(
        work_dir=work_dir,
        node_pools=_load_pools(args.node_pools),
        namespaces=namespaces,
        max_grace_seconds=args.max_grace_seconds,
        resolve_cluster_dns=not args.no_cluster_dns,
        service_accounts=(
            DEFAULT_SERVICE_ACCOUNTS
            if args.service_account is None
            else [a for a in args.service_account if a]
        ),
        unserved_versions=check_unserved(args.unserve),
        autopilot=args.autopilot,
    )
    server = ApiServer(cluster, args.host, args.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await cluster.start()
        port = await server.start()
        url = f"http://{args.host}:{port}"
        if args.kubeconfig:
            write_kubeconfig(args.kubeconfig, url, context=args.context, namespace=args.namespace)
        print(f"READY {url}", flush=True)
        await stop.wait()
    finally:
        await server.stop()
        await cluster.stop()
        if owns_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    args = parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING))
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
