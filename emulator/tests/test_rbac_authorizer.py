"""Authentication and RBAC: a service account's token can do what its Roles grant and nothing else,
denied with kube-apiserver's own 403 Status; the admin token is never refused."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from cluster_emulator import ClusterEmulator
from cluster_emulator.rbac import ADMIN, request_attributes
from emu_helpers import NS, api_error, job_manifest, pod_manifest, read_log, wait_pod
from kubernetes import client
from kubernetes.client.rest import ApiException

USER = f"system:serviceaccount:{NS}:bot"


def _role(rbac: client.RbacAuthorizationV1Api, name: str, rules: list[dict[str, Any]]) -> None:
    rbac.create_namespaced_role(NS, {"metadata": {"name": name}, "rules": rules})


def _bind(rbac: client.RbacAuthorizationV1Api, name: str, kind: str, role: str, subject: dict) -> None:
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role}
    rbac.create_namespaced_role_binding(
        NS, {"metadata": {"name": name}, "roleRef": ref, "subjects": [subject]}
    )


BOT = {"kind": "ServiceAccount", "name": "bot", "namespace": NS}


@pytest.fixture
def bot(k8s_cluster: ClusterEmulator, k8s_api_client: client.ApiClient) -> Any:
    """An ApiClient acting as service account default/bot, which has no Role yet."""
    client.CoreV1Api(k8s_api_client).create_namespaced_service_account(NS, {"metadata": {"name": "bot"}})
    api = k8s_cluster.api_client(k8s_cluster.service_account_token(NS, "bot"))
    yield api
    api.close()


def _denied(call: Any) -> dict[str, Any]:
    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status == 403
    return api_error(info.value)


def test_a_denied_request_is_rbacs_403_naming_verb_resource_group_and_namespace(
    k8s_api_client: client.ApiClient, bot: client.ApiClient
) -> None:
    status = _denied(lambda: client.BatchV1Api(bot).create_namespaced_job(NS, job_manifest("j", "pass")))
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'jobs.batch is forbidden: User "{USER}" cannot create resource "jobs" in API group '
        f'"batch" in the namespace "{NS}"',
        "reason": "Forbidden",
        "code": 403,
        "details": {"group": "batch", "kind": "jobs"},
    }
    rbac = client.RbacAuthorizationV1Api(k8s_api_client)
    _role(rbac, "jobs", [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get"]}])
    _bind(rbac, "jobs", "Role", "jobs", BOT)
    client.BatchV1Api(bot).create_namespaced_job(NS, job_manifest("j", "pass"))
    assert client.BatchV1Api(bot).read_namespaced_job("j", NS).metadata.name == "j"
    # only the verbs granted: list is another verb, a named get another message shape
    status = _denied(lambda: client.BatchV1Api(bot).list_namespaced_job(NS))
    assert "cannot list resource" in status["message"]
    status = _denied(lambda: client.BatchV1Api(bot).delete_namespaced_job("j", NS))
    assert status["message"].startswith(f'jobs.batch "j" is forbidden: User "{USER}" cannot delete')
    assert status["details"] == {"name": "j", "group": "batch", "kind": "jobs"}


def test_a_subresource_needs_its_own_rule(
    k8s_api_client: client.ApiClient, k8s_cluster: ClusterEmulator, bot: client.ApiClient
) -> None:
    core = client.CoreV1Api(k8s_api_client)
    core.create_namespaced_pod(NS, pod_manifest("p", "print('hi')"))
    wait_pod(core, "p", "Succeeded")
    rbac = client.RbacAuthorizationV1Api(k8s_api_client)
    _role(rbac, "pods", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}])
    _bind(rbac, "pods", "Role", "pods", BOT)
    assert client.CoreV1Api(bot).read_namespaced_pod("p", NS).metadata.name == "p"
    status = _denied(lambda: client.CoreV1Api(bot).read_namespaced_pod_log("p", NS))
    assert status["message"] == (
        f'pods "p" is forbidden: User "{USER}" cannot get resource "pods/log" in API group "" '
        f'in the namespace "{NS}"'
    )
    _role(rbac, "logs", [{"apiGroups": [""], "resources": ["*/log"], "verbs": ["get"]}])
    _bind(rbac, "logs", "Role", "logs", BOT)
    assert read_log(client.CoreV1Api(bot), "p") == "hi\n"


def test_wildcards_resource_names_cluster_roles_and_cluster_bindings(
    k8s_api_client: client.ApiClient, bot: client.ApiClient
) -> None:
    rbac = client.RbacAuthorizationV1Api(k8s_api_client)
    core = client.CoreV1Api(k8s_api_client)
    for name in ("a", "b"):
        core.create_namespaced_config_map(NS, {"metadata": {"name": name}})
    _role(
        rbac,
        "one",
        [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["a"], "verbs": ["*"]}],
    )
    _bind(rbac, "one", "Role", "one", BOT)
    mine = client.CoreV1Api(bot)
    assert mine.read_namespaced_config_map("a", NS).metadata.name == "a"
    _denied(lambda: mine.read_namespaced_config_map("b", NS))
    _denied(lambda: mine.list_namespaced_config_map(NS))  # a list names no object
    # a ClusterRole bound by a RoleBinding grants in that namespace only
    rbac.create_cluster_role(
        {
            "metadata": {"name": "reader"},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["list"]}],
        }
    )
    _bind(rbac, "reader", "ClusterRole", "reader", BOT)
    assert [c.metadata.name for c in mine.list_namespaced_config_map(NS).items] == ["a", "b"]
    status = _denied(lambda: mine.list_namespace())
    assert status["message"].endswith(
        'cannot list resource "namespaces" in API group "" at the cluster scope'
    )
    # a ClusterRoleBinding grants everywhere, to a group as well as to a name
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "reader"}
    group = {"kind": "Group", "name": f"system:serviceaccounts:{NS}"}
    rbac.create_cluster_role_binding({"metadata": {"name": "reader"}, "roleRef": ref, "subjects": [group]})
    assert "default" in [n.metadata.name for n in mine.list_namespace().items]


def test_a_binding_to_a_missing_role_says_so_in_the_403(
    k8s_api_client: client.ApiClient, bot: client.ApiClient
) -> None:
    _bind(client.RbacAuthorizationV1Api(k8s_api_client), "dangling", "Role", "nowhere", BOT)
    status = _denied(lambda: client.CoreV1Api(bot).list_namespaced_pod(NS))
    assert status["message"].endswith(
        f'in the namespace "{NS}": RBAC: role.rbac.authorization.k8s.io "nowhere" not found'
    )


def test_access_reviews_answer_for_the_asking_identity(
    k8s_api_client: client.ApiClient, bot: client.ApiClient
) -> None:
    def review(api: client.ApiClient, verb: str, resource: str, group: str = "") -> Any:
        attrs = {"namespace": NS, "verb": verb, "group": group, "resource": resource}
        body = {"spec": {"resourceAttributes": attrs}}
        return client.AuthorizationV1Api(api).create_self_subject_access_review(body).status

    assert not review(bot, "watch", "jobs", "batch").allowed
    rbac = client.RbacAuthorizationV1Api(k8s_api_client)
    _role(rbac, "watch", [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["watch"]}])
    _bind(rbac, "watch", "Role", "watch", BOT)
    answer = review(bot, "watch", "jobs", "batch")
    assert answer.allowed
    assert (
        answer.reason
        == f'RBAC: allowed by RoleBinding "watch/{NS}" of Role "watch" to ServiceAccount "bot/{NS}"'
    )
    assert not review(bot, "watch", "jobs", "").allowed  # another API group
    assert review(k8s_api_client, "delete", "anything", "any.group").allowed  # the admin


def test_tokens_unknown_expired_or_of_a_deleted_account_are_401(
    k8s_cluster: ClusterEmulator, k8s_api_client: client.ApiClient, bot: client.ApiClient
) -> None:
    def status_of(token: str | None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(f"{k8s_cluster.url}/api/v1/namespaces/{NS}/pods", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read())
            assert body["code"] == exc.code
            return exc.code

    assert status_of("made-up") == 401
    assert status_of(None) == 200  # plain http: the insecure port's privileged user (kubectl sends no token)
    token = k8s_cluster.service_account_token(NS, "bot")
    assert status_of(token) == 403  # authenticated, not authorized
    client.CoreV1Api(k8s_api_client).delete_namespaced_service_account("bot", NS)
    assert status_of(token) == 401
    with pytest.raises(ApiException) as info:  # TokenRequest refuses a short life, as upstream
        client.CoreV1Api(k8s_api_client).create_namespaced_service_account_token(
            "default", NS, {"spec": {"expirationSeconds": 60}}
        )
    assert info.value.status == 422 and "less than 10 minutes" in api_error(info.value)["message"]


def test_over_https_no_credentials_is_anonymous(tmp_path) -> None:
    """system:anonymous may read /version and health only (system:public-info-viewer)."""
    import ssl

    with ClusterEmulator(tls=True, work_dir=tmp_path / "emulator") as k8s:
        context = ssl.create_default_context(cafile=str(tmp_path / "emulator" / "tls" / "serving.crt"))
        with urllib.request.urlopen(f"{k8s.url}/version", timeout=10, context=context) as response:
            assert response.status == 200
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{k8s.url}/api/v1/namespaces/{NS}/pods", timeout=10, context=context)
        assert refused.value.code == 403
        body = json.loads(refused.value.read())
        assert body["message"] == (
            f'pods is forbidden: User "system:anonymous" cannot list resource "pods" in API group "" '
            f'in the namespace "{NS}"'
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{k8s.url}/apis", timeout=10, context=context)
        assert json.loads(refused.value.read())["message"] == (
            'forbidden: User "system:anonymous" cannot get path "/apis"'
        )


def test_discovery_and_reviews_are_open_to_every_authenticated_identity(bot: client.ApiClient) -> None:
    assert client.VersionApi(bot).get_code().git_version.startswith("v1.")
    assert "batch" in [g.name for g in client.ApisApi(bot).get_api_versions().groups]
    assert client.BatchV1Api(bot).get_api_resources().group_version == "batch/v1"


_JOBS = "/apis/batch/v1/namespaces/ns/jobs"
_SA = "/api/v1/namespaces/ns/serviceaccounts/s"
_ATTRIBUTES = [
    ("GET", "/api/v1/namespaces/ns/pods", "", ("list", "", "pods", "", "ns", "")),
    ("GET", "/api/v1/namespaces/ns/pods", "watch=true", ("watch", "", "pods", "", "ns", "")),
    ("GET", "/api/v1/watch/namespaces/ns/pods", "", ("watch", "", "pods", "", "ns", "")),
    ("GET", "/api/v1/namespaces/ns/pods/p/log", "", ("get", "", "pods", "log", "ns", "p")),
    ("GET", _JOBS, "fieldSelector=metadata.name%3Dj", ("list", "batch", "jobs", "", "ns", "j")),
    ("DELETE", _JOBS, "", ("deletecollection", "batch", "jobs", "", "ns", "")),
    ("PATCH", f"{_JOBS}/j/status", "", ("patch", "batch", "jobs", "status", "ns", "j")),
    ("GET", "/api/v1/namespaces/ns", "", ("get", "", "namespaces", "", "ns", "ns")),
    ("GET", "/api/v1/nodes", "", ("list", "", "nodes", "", "", "")),
    ("POST", f"{_SA}/token", "", ("create", "", "serviceaccounts", "token", "ns", "s")),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "query", "expected"), _ATTRIBUTES)
def test_request_attributes_as_requestinfo_reads_them(
    method: str, path: str, query: str, expected: tuple
) -> None:
    attrs = request_attributes(ADMIN, method, path, query)
    assert attrs.resource_request
    assert (
        attrs.verb,
        attrs.api_group,
        attrs.resource,
        attrs.subresource,
        attrs.namespace,
        attrs.name,
    ) == expected


@pytest.mark.parametrize(
    "path", ["/apis", "/apis/batch", "/apis/batch/v1", "/api/v1", "/version", "/openapi/v3"]
)
def test_discovery_paths_are_not_resource_requests(path: str) -> None:
    attrs = request_attributes(ADMIN, "GET", path, "")
    assert not attrs.resource_request and attrs.verb == "get"


def test_the_console_script_writes_a_service_accounts_kubeconfig(tmp_path) -> None:
    """``--service-account-kubeconfig NS/NAME=PATH``: a kubeconfig acting as that account (made if
    missing), refused what no Role grants it, beside the admin's."""
    import subprocess
    import sys
    import threading

    from kubernetes import config

    admin, bot = tmp_path / "admin.kubeconfig", tmp_path / "bot.kubeconfig"
    command = [sys.executable, "-m", "cluster_emulator", "--port", "0", "--kubeconfig", str(admin)]
    command += ["--service-account-kubeconfig", f"ml/bot={bot}", "--create-namespace", "ml"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        try:
            lines: list[str] = []
            reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
            reader.start()
            reader.join(60)
            assert lines and lines[0].startswith("READY "), lines
            with config.new_client_from_config(config_file=str(bot)) as as_bot:
                status = _denied(lambda: client.CoreV1Api(as_bot).list_namespaced_pod("ml"))
                assert 'User "system:serviceaccount:ml:bot" cannot list resource "pods"' in status["message"]
            with config.new_client_from_config(config_file=str(admin)) as as_admin:
                assert (
                    client.CoreV1Api(as_admin).read_namespaced_service_account("bot", "ml").metadata.name
                    == "bot"
                )
        finally:
            proc.terminate()
            proc.wait(30)


def test_the_console_script_refuses_a_malformed_service_account_kubeconfig(capsys) -> None:
    from cluster_emulator.__main__ import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--service-account-kubeconfig", "bot"])
    assert (
        "give NAMESPACE/NAME=PATH, e.g. default/kinetic-airflow=/tmp/kinetic.kubeconfig"
        in capsys.readouterr().err
    )
