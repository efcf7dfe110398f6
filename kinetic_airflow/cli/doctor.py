"""``kinetic-airflow doctor``: the command line of ``kinetic_airflow.backends.gke.doctor``.

``kinetic-airflow doctor [ACCELERATOR] [--json]`` runs the checks with ``[kinetic]`` settings
(or the options given) and exits 1 when one fails; ``--print-rbac`` prints the minimum Role
and RoleBinding for ``kubectl apply -f -`` instead.
"""

from __future__ import annotations

import json
from typing import Any

from kinetic_airflow.backends.gke.client import impersonation_chain_of
from kinetic_airflow.backends.gke.doctor import rbac_yaml, run_doctor
from kinetic_airflow.config import resolve_setting

__all__ = ["add_doctor_command", "run_doctor_command"]


def add_doctor_command(sub: Any) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="check a cluster for what a first job needs and print the fix for each miss",
        description=(
            "Check a cluster for what a first job of ACCELERATOR needs: reachable (and through which "
            "endpoint), the permissions kinetic uses, namespace and service account, Workload Identity, "
            "job storage, the LeaderWorkerSet API for multi-host TPUs, nodes for the accelerator, and the "
            "runner image's Python. Settings come from [kinetic] and KINETIC_* unless given here. Exit "
            "code 1 when a check fails."
        ),
    )
    doctor.add_argument("accelerator", nargs="?", default="cpu", help="accelerator string (default cpu)")
    doctor.add_argument("--backend", help="gke or pathways (default: from the accelerator)")
    doctor.add_argument("--namespace", help="namespace of jobs ([kinetic] namespace)")
    doctor.add_argument("--service-account", help="service account of job pods ([kinetic] service_account)")
    doctor.add_argument("--kubernetes-conn-id", help="a Kubernetes connection instead of GKE")
    doctor.add_argument("--gcp-conn-id", help="GCP connection ([kinetic] gcp_conn_id)")
    doctor.add_argument("--project", help="GCP project ([kinetic] project)")
    doctor.add_argument("--zone", help="cluster location ([kinetic] zone)")
    doctor.add_argument("--cluster", help="GKE cluster name ([kinetic] cluster)")
    endpoint = doctor.add_mutually_exclusive_group()
    endpoint.add_argument("--use-internal-ip", action="store_true", default=None, help="the private endpoint")
    endpoint.add_argument("--use-dns-endpoint", action="store_true", default=None, help="the DNS endpoint")
    doctor.add_argument("--impersonation-chain", help="service accounts to impersonate, comma separated")
    doctor.add_argument("--container-image", help="runner image ([kinetic] container_image)")
    doctor.add_argument("--base-uri", help="job storage ([kinetic] base_uri)")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument(
        "--print-rbac",
        action="store_true",
        help="print the minimum Role and RoleBinding (YAML for kubectl apply -f -) and exit",
    )
    doctor.add_argument(
        "--rbac-user",
        help="the RoleBinding's user: the Google service account email the worker and triggerer act as "
        "(default: the last of --impersonation-chain)",
    )
    doctor.add_argument(
        "--rbac-service-account",
        metavar="NAMESPACE/NAME",
        help="bind the Role to this Kubernetes service account instead of a user (Airflow running "
        "in the cluster, or a kubeconfig holding that account's token)",
    )


def run_doctor_command(args: Any) -> int:
    if args.print_rbac:
        chain = impersonation_chain_of(resolve_setting("impersonation_chain", args.impersonation_chain))
        subject = args.rbac_user or (chain[-1] if chain else None)
        namespace = args.namespace or resolve_setting("namespace")
        account = getattr(args, "rbac_service_account", None)
        if account:
            sa_namespace, _, sa_name = account.rpartition("/")
            if not sa_name or "/" in sa_namespace:
                raise SystemExit(
                    f"--rbac-service-account {account!r}: give NAMESPACE/NAME (e.g. airflow/airflow-worker) "
                    "or NAME (a service account of the Role's namespace)"
                )
            print(rbac_yaml(namespace, service_account=f"{sa_namespace or namespace}/{sa_name}"), end="")
            return 0
        print(rbac_yaml(namespace, subject) if subject else rbac_yaml(namespace), end="")
        return 0
    report = run_doctor(
        args.accelerator,
        backend=args.backend,
        namespace=args.namespace,
        service_account=args.service_account,
        kubernetes_conn_id=args.kubernetes_conn_id,
        gcp_conn_id=args.gcp_conn_id,
        project=args.project,
        zone=args.zone,
        cluster=args.cluster,
        use_internal_ip=args.use_internal_ip,
        use_dns_endpoint=args.use_dns_endpoint,
        impersonation_chain=args.impersonation_chain,
        container_image=args.container_image,
        base_uri=args.base_uri,
    )
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.render())
    return 0 if report.ok else 1
