"""Kubeconfig for the emulator (context ``emulator``).

Its user holds the admin token (``DUMMY_TOKEN``: user ``kubernetes-admin`` in ``system:masters``,
never refused, as a cluster-admin kubeconfig) unless ``token`` is given, e.g. a service account's
token from ``ClusterEmulator.service_account_token`` (then RBAC decides what it may do).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

DEFAULT_CONTEXT = "emulator"
DUMMY_TOKEN = "kinetic-emulator-token"


def kubeconfig_dict(
    url: str,
    *,
    context: str = DEFAULT_CONTEXT,
    namespace: str = "default",
    ca_data: str | None = None,
    token: str | None = None,
) -> dict[str, Any]:
    """A kubeconfig document for ``url`` that kubectl, the Python clients and Airflow's hooks accept
    (``ca_data``: base64 PEM of the CA of an HTTPS emulator)."""
    cluster: dict[str, Any] = {"server": url}
    if ca_data:
        cluster["certificate-authority-data"] = ca_data
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": context, "cluster": cluster}],
        "users": [{"name": context, "user": {"token": token or DUMMY_TOKEN}}],
        "contexts": [
            {"name": context, "context": {"cluster": context, "user": context, "namespace": namespace}}
        ],
        "current-context": context,
    }


def write_kubeconfig(
    path: str | os.PathLike[str],
    url: str,
    *,
    context: str = DEFAULT_CONTEXT,
    namespace: str = "default",
    ca_data: str | None = None,
    token: str | None = None,
) -> Path:
    """Write the kubeconfig (parent directories created, mode 0600 like kubectl does)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        yaml.safe_dump(
            kubeconfig_dict(url, context=context, namespace=namespace, ca_data=ca_data, token=token),
            fh,
            sort_keys=False,
        )
    os.chmod(tmp, 0o600)
    os.replace(tmp, target)
    return target
