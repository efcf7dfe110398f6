"""The cluster emulator as the cluster of every kinetic job in a test module (dag.test() tier).

kinetic reaches it as a service account bound to exactly the Role that
``kinetic-airflow doctor --print-rbac`` prints (``grant_printed_role``), through a kubeconfig
holding that account's token: a call the Role does not grant is refused as on a real cluster.
Test setup that needs more (faults, queues, other namespaces) uses the admin identity
(``emulator.api_client()``), as a cluster admin would.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from cluster_emulator import ClusterEmulator
from cluster_emulator.kubeconfig import DUMMY_TOKEN

__all__ = [
    "PRODUCT_ACCOUNT",
    "grant_printed_role",
    "point_kinetic_at",
    "printed_role",
    "product_token",
    "running_emulator",
]

# The Kubernetes service account kinetic acts as in tests (a Google service account on GKE).
PRODUCT_ACCOUNT = "default/kinetic-airflow"


def printed_role(namespace: str, account: str = PRODUCT_ACCOUNT) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Role and RoleBinding ``kinetic-airflow doctor --print-rbac --namespace NAMESPACE
    --rbac-service-account ACCOUNT`` prints, as YAML documents read back."""
    from kinetic_airflow.backends.gke.doctor import rbac_yaml

    role, binding = yaml.safe_load_all(rbac_yaml(namespace, service_account=account))
    return role, binding


def _admin_post(url: str, path: str, body: dict[str, Any], *, conflict_ok: bool = False) -> dict[str, Any]:
    """POST as the emulator's admin (plain http; its admin kubeconfig's token)."""
    request = urllib.request.Request(
        f"{url}{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {DUMMY_TOKEN}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if conflict_ok and exc.code == 409:
            return {}
        raise AssertionError(f"POST {path}: {exc.code} {exc.read().decode(errors='replace')}") from None


def grant_printed_role(url: str, namespace: str = "default", account: str = PRODUCT_ACCOUNT) -> None:
    """As the cluster's admin: create the service account ``account`` if missing, then apply
    exactly the printed Role and RoleBinding in ``namespace``."""
    sa_namespace, _, sa_name = account.rpartition("/")
    accounts = f"/api/v1/namespaces/{sa_namespace}/serviceaccounts"
    _admin_post(url, accounts, {"metadata": {"name": sa_name}}, conflict_ok=True)
    role, binding = printed_role(namespace, account)
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    _admin_post(url, f"{rbac}/roles", role)
    _admin_post(url, f"{rbac}/rolebindings", binding)


def product_token(url: str, account: str = PRODUCT_ACCOUNT, seconds: int = 86400) -> str:
    """A bearer token of ``account`` (TokenRequest, as ``kubectl create token``), minted by the admin."""
    sa_namespace, _, sa_name = account.rpartition("/")
    path = f"/api/v1/namespaces/{sa_namespace}/serviceaccounts/{sa_name}/token"
    return str(_admin_post(url, path, {"spec": {"expirationSeconds": seconds}})["status"]["token"])


@contextmanager
def running_emulator(
    tmp_path_factory: Any,
    node_pools: Any = None,
    namespaces: Sequence[str] = ("default",),
    **options: Any,
) -> Iterator[tuple[ClusterEmulator, Path]]:
    """An emulator (its default pools: every TPU and GPU type) and kinetic's kubeconfig for it:
    the printed Role's service account in each of ``namespaces``; ``options``: more
    ClusterEmulator arguments (e.g. unserved_versions)."""
    from kinetic_airflow.backends.gke.watch_cache import reset_shared_state

    kwargs = {"node_pools": node_pools, **options} if node_pools is not None else dict(options)
    emulator = ClusterEmulator(work_dir=tmp_path_factory.mktemp("emulator"), **kwargs)
    emulator.start()
    try:
        for namespace in namespaces:
            grant_printed_role(emulator.url, namespace)
        token = product_token(emulator.url)
        kubeconfig = emulator.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config", token=token)
        yield emulator, kubeconfig
    finally:
        reset_shared_state()
        emulator.stop()


def point_kinetic_at(emulator: ClusterEmulator, kubeconfig: Path, monkeypatch: Any) -> None:
    """A Kubernetes connection to the emulator, this venv as the runner image, no faults left armed."""
    from kinetic_airflow.backends.gke.watch_cache import reset_shared_state

    emulator.clear_faults()
    reset_shared_state()
    conn = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig), "namespace": "default"}}
    monkeypatch.setenv("AIRFLOW_CONN_KINETIC_EMULATOR", json.dumps(conn))
    monkeypatch.setenv("KINETIC_KUBERNETES_CONN_ID", "kinetic_emulator")
    monkeypatch.setenv("KINETIC_RUNNER_PYTHON", sys.executable)
    monkeypatch.setenv("KINETIC_CONTAINER_IMAGE", "kinetic-runner:test")


# The identity GKE knows the test service-account key's token ("source-token", minted by
# test_gke_access.google_endpoints) as: a Google user, bound to the printed Role like Airflow's.
GOOGLE_WORKER = "worker@p.iam.gserviceaccount.com"


def google_worker_tokens() -> dict[str, Any]:
    """``static_tokens`` for a TLS emulator standing in for GKE: the key's token is GOOGLE_WORKER."""
    from cluster_emulator.rbac import UserInfo

    return {"source-token": UserInfo(GOOGLE_WORKER, ("system:authenticated",))}


def bind_google_worker(emulator: ClusterEmulator, namespace: str = "default") -> None:
    """As the admin: exactly the Role `doctor --print-rbac --rbac-user GOOGLE_WORKER` prints."""
    import kubernetes.client
    import yaml

    from kinetic_airflow.backends.gke.doctor import rbac_yaml

    rbac = kubernetes.client.RbacAuthorizationV1Api(emulator.api_client())
    role, binding = yaml.safe_load_all(rbac_yaml(namespace, GOOGLE_WORKER))
    rbac.create_namespaced_role(namespace, role)
    rbac.create_namespaced_role_binding(namespace, binding)
