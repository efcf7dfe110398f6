"""Authentication (bearer tokens) and RBAC authorization, as kube-apiserver applies them to every request.

A real API server runs each request through an authentication filter (who is asking) and an
authorization filter (may they) before any handler. The emulator does the same, so a client
holding a service account's token can do exactly what the Roles bound to that account grant,
and nothing else; the 403 it gets otherwise is the API server's own Status.

Identities (kubernetes/kubernetes v1.37, the version the emulator reports; read at commit
01aa0f3 of master, these functions unchanged for many releases):

* the admin token (``kubeconfig.DUMMY_TOKEN``) is user ``kubernetes-admin`` in group
  ``system:masters``, as the admin kubeconfig of kubeadm or GKE's cluster-admin. That group is
  authorized before RBAC is asked (``pkg/kubeapiserver/authorizer/config.go``: the privileged
  groups authorizer ``authorizerfactory.NewPrivilegedGroups(user.SystemPrivilegedGroup)`` first in
  the union), so test setup (faults, queues, node pools) is never refused;
* a token minted by the TokenRequest subresource (``POST .../serviceaccounts/NAME/token``,
  ``pkg/registry/core/serviceaccount/storage/token.go``, ``TokenREST.Create``) is user
  ``system:serviceaccount:NS:NAME`` in groups ``system:serviceaccounts``,
  ``system:serviceaccounts:NS`` and ``system:authenticated``
  (``staging/src/k8s.io/apiserver/pkg/authentication/serviceaccount/util.go``, ``UserInfo``). It is
  refused (401) once expired or once its service account is deleted or re-created (the
  validator compares the account's uid: ``pkg/serviceaccount/claims.go``, ``validator.Validate``);
* tokens given as ``static_tokens`` act as the users they map to (``--token-auth-file``);
* a request with no credentials over HTTPS is ``system:anonymous`` in ``system:unauthenticated``
  (``--anonymous-auth``, on by default), which RBAC lets read only /healthz, /livez, /readyz and
  /version. Over plain http (the emulator's default) it is the privileged ``system:unsecured``
  user, as kube-apiserver's insecure port served everyone until it was removed in 1.20
  (``pkg/kubeapiserver/server/insecure_handler.go``): kubectl and client-go send no bearer token
  over plain http, and tools must still work. A bearer token is authenticated on both;
  an unknown or expired one is 401 Unauthorized.

Authorization is RBAC (``plugin/pkg/auth/authorizer/rbac/rbac.go``, ``RBACAuthorizer.Authorize``
and ``RuleAllows``): the rules of every ClusterRoleBinding whose subjects include the user, then,
for a namespaced request, of every RoleBinding in that namespace
(``pkg/registry/rbac/validation/rule.go``, ``DefaultRuleResolver.VisitRulesFor``, ``appliesTo``)
are tried in turn; a rule allows when verb, API group, resource (``resource/subresource`` for a
subresource, ``*`` and ``*/subresource`` wildcards) and resourceNames all match
(``pkg/apis/rbac/v1/evaluation_helpers.go``). Nothing matching is a denial; a binding whose Role
does not exist adds ``RBAC: ... not found`` to the 403's message, as upstream.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from . import errors
from .resources import (
    CLUSTERROLEBINDINGS,
    CLUSTERROLES,
    ROLEBINDINGS,
    ROLES,
    SERVICEACCOUNTS,
)

__all__ = [
    "ADMIN",
    "ANONYMOUS",
    "UNSECURED",
    "Attributes",
    "Authenticator",
    "UserInfo",
    "authorize",
    "bootstrap_policy",
    "forbidden",
    "request_attributes",
    "service_account_user",
]

PRIVILEGED_GROUP = "system:masters"


@dataclass(frozen=True)
class UserInfo:
    """Who is asking: a user name and its groups (``user.Info``)."""

    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""


ADMIN = UserInfo("kubernetes-admin", (PRIVILEGED_GROUP, "system:authenticated"))
ANONYMOUS = UserInfo("system:anonymous", ("system:unauthenticated",))
UNSECURED = UserInfo("system:unsecured", (PRIVILEGED_GROUP, "system:authenticated"))


def service_account_user(namespace: str, name: str, uid: str = "") -> UserInfo:
    """The user a service account's token authenticates as."""
    return UserInfo(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
        uid,
    )


@dataclass
class _Minted:
    namespace: str
    name: str
    uid: str
    expires: float  # time.time() seconds


@dataclass
class Authenticator:
    """Bearer tokens: the admin's, static ones, and those minted for service accounts."""

    static_tokens: dict[str, UserInfo] = field(default_factory=dict)
    secure: bool = False  # served over HTTPS: no credentials is anonymous, not the insecure port's user
    _minted: dict[str, _Minted] = field(default_factory=dict)

    def mint(self, namespace: str, name: str, uid: str, expiration_seconds: int) -> tuple[str, float]:
        """A new token for the service account ``namespace/name`` (its ``uid``); returns it and
        when it expires (epoch seconds)."""
        token = "emu-sa." + secrets.token_urlsafe(32)
        expires = time.time() + expiration_seconds
        self._minted[token] = _Minted(namespace, name, uid, expires)
        return token, expires

    def authenticate(self, authorization: str | None, store: Any) -> UserInfo:
        """The user of a request's ``Authorization`` header; raises 401 for a token nobody issued,
        one that expired, or one whose service account is gone."""
        if not authorization:
            return ANONYMOUS if self.secure else UNSECURED
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise _unauthorized()
        if token in self.static_tokens:
            return self.static_tokens[token]
        minted = self._minted.get(token)
        if minted is None or minted.expires <= time.time():
            raise _unauthorized()
        account = store.get(SERVICEACCOUNTS, minted.namespace, minted.name)
        if account is None or account["metadata"].get("uid") != minted.uid:
            raise _unauthorized()
        return service_account_user(minted.namespace, minted.name, minted.uid)


def _unauthorized() -> errors.ApiError:
    # staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/status.go via
    # filters/authentication.go (unauthorized): a Status with message and reason Unauthorized.
    return errors.ApiError(401, "Unauthorized", "Unauthorized")


# Request attributes ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Attributes:
    """What a request does, as the authorizer sees it (``authorizer.AttributesRecord``)."""

    user: UserInfo
    verb: str
    path: str
    resource_request: bool = False
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def combined_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


_METHOD_VERBS = {
    "POST": "create",
    "GET": "get",
    "HEAD": "get",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}


def request_attributes(user: UserInfo, method: str, path: str, query: str) -> Attributes:
    """Verb, group, resource, subresource, namespace and name of a request, read from its path the
    way ``staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go``
    (``RequestInfoFactory.NewRequestInfo``) reads them: ``/api/v1/...`` and
    ``/apis/GROUP/VERSION/...`` are resource requests (anything shorter is discovery, a
    non-resource URL whose verb is the lower-case method); a GET without a name is ``list``, or
    ``watch`` with ``watch=true`` or under ``/watch/``; a DELETE without a name is
    ``deletecollection``; a ``metadata.name=X`` field selector on list/watch names X."""
    parts = [p for p in path.split("/") if p]
    plain = Attributes(user, method.lower(), path)
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return plain
    prefix, parts = parts[0], parts[1:]
    group = ""
    if prefix == "apis":
        if len(parts) < 3:
            return plain
        group, parts = parts[0], parts[1:]
    version, parts = parts[0], parts[1:]
    verb = _METHOD_VERBS.get(method.upper(), "")
    if parts[0] == "watch":
        if len(parts) < 2:
            return plain
        verb, parts = "watch", parts[1:]
    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in ("status", "finalize"):
            parts = parts[2:]
    resource = parts[0]
    name = parts[1] if len(parts) >= 2 else ""
    subresource = parts[2] if len(parts) >= 3 else ""
    params = parse_qs(query)
    if not name and verb == "get":
        verb = "watch" if (params.get("watch") or [""])[0].lower() in ("true", "1") else "list"
        for term in (params.get("fieldSelector") or [""])[0].split(","):
            key, sep, value = term.partition("=")
            if sep and key.strip() == "metadata.name" and not value.startswith("="):
                name = value.strip()
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(user, verb, path, True, group, version, resource, subresource, namespace, name)


# RBAC -----------------------------------------------------------------------------------------
def _matches(values: list[str] | None, wanted: str, wildcard: str = "*") -> bool:
    return any(v == wildcard or v == wanted for v in values or ())


def _resource_matches(rule: dict[str, Any], attrs: Attributes) -> bool:
    for resource in rule.get("resources") or ():
        if resource == "*" or resource == attrs.combined_resource:
            return True
        if attrs.subresource and resource == f"*/{attrs.subresource}":
            return True
    return False


def _url_matches(rule: dict[str, Any], path: str) -> bool:
    for url in rule.get("nonResourceURLs") or ():
        if url == "*" or url == path or (url.endswith("*") and path.startswith(url.rstrip("*"))):
            return True
    return False


def rule_allows(rule: dict[str, Any], attrs: Attributes) -> bool:
    """``RuleAllows``: one PolicyRule against one request."""
    if not _matches(rule.get("verbs"), attrs.verb):
        return False
    if not attrs.resource_request:
        return _url_matches(rule, attrs.path)
    names = rule.get("resourceNames") or []
    return (
        _matches(rule.get("apiGroups"), attrs.api_group)
        and _resource_matches(rule, attrs)
        and (not names or attrs.name in names)
    )


def _applies(user: UserInfo, subject: dict[str, Any], binding_namespace: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return user.name == name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return bool(namespace) and user.name == f"system:serviceaccount:{namespace}:{name}"
    return False


def _describe(subject: dict[str, Any], binding_namespace: str) -> str:
    if subject.get("kind") == "ServiceAccount":
        return f'ServiceAccount "{subject.get("name")}/{subject.get("namespace") or binding_namespace}"'
    return f'{subject.get("kind")} "{subject.get("name")}"'


def _role_rules(store: Any, ref: dict[str, Any], namespace: str) -> tuple[list[dict[str, Any]], str]:
    kind, name = ref.get("kind"), ref.get("name") or ""
    if kind == "Role":
        role = store.get(ROLES, namespace, name)
        missing = f'role.rbac.authorization.k8s.io "{name}" not found'
    elif kind == "ClusterRole":
        role = store.get(CLUSTERROLES, None, name)
        missing = f'clusterrole.rbac.authorization.k8s.io "{name}" not found'
    else:
        return [], f'unsupported role reference kind: "{kind}"'
    if role is None:
        return [], missing
    return list(role.get("rules") or []), ""


def authorize(store: Any, attrs: Attributes) -> tuple[bool, str]:
    """Whether RBAC allows the request, and the reason (``RBAC: allowed by ...`` when it does;
    the bindings that could not be resolved when it does not)."""
    if PRIVILEGED_GROUP in attrs.user.groups:
        return True, ""
    problems: list[str] = []
    scopes: list[tuple[Any, str, str]] = [(CLUSTERROLEBINDINGS, "", "ClusterRoleBinding")]
    if attrs.namespace:
        scopes.append((ROLEBINDINGS, attrs.namespace, "RoleBinding"))
    for rt, namespace, label in scopes:
        for binding in store.list(rt, namespace or None):
            subject = next(
                (s for s in binding.get("subjects") or () if _applies(attrs.user, s, namespace)), None
            )
            if subject is None:
                continue
            ref = binding.get("roleRef") or {}
            rules, problem = _role_rules(store, ref, namespace)
            if problem:
                problems.append(problem)
                continue
            for rule in rules:
                if rule_allows(rule, attrs):
                    name = binding["metadata"]["name"]
                    shown = f"{name}/{namespace}" if namespace else name
                    return True, (
                        f'RBAC: allowed by {label} "{shown}" of {ref.get("kind")} "{ref.get("name")}" '
                        f"to {_describe(subject, namespace)}"
                    )
    if not problems:
        return False, ""
    joined = problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
    return False, f"RBAC: {joined}"


def forbidden(attrs: Attributes, reason: str = "") -> errors.ApiError:
    """The 403 the authorization filter answers: ``staging/src/k8s.io/apiserver/pkg/endpoints/
    handlers/responsewriters/errors.go`` (``Forbidden``, ``forbiddenMessage``) wrapped by
    ``apierrors.NewForbidden`` (``staging/src/k8s.io/apimachinery/pkg/api/errors/errors.go``):
    ``jobs.batch "x" is forbidden: User "..." cannot create resource "jobs" in API group "batch"
    in the namespace "ns"``, reason Forbidden, details {name, group, kind: the resource}."""
    who = attrs.user.name
    if not attrs.resource_request:
        message = f'forbidden: User "{who}" cannot {attrs.verb} path "{attrs.path}"'
        if reason:
            message += f": {reason}"
        return errors.ApiError(403, "Forbidden", message, {})
    where = f' in the namespace "{attrs.namespace}"' if attrs.namespace else " at the cluster scope"
    said = (
        f'User "{who}" cannot {attrs.verb} resource "{attrs.combined_resource}" '
        f'in API group "{attrs.api_group}"{where}'
    )
    if reason:
        said += f": {reason}"
    qualified = f"{attrs.resource}.{attrs.api_group}" if attrs.api_group else attrs.resource
    named = f' "{attrs.name}"' if attrs.name else ""
    details: dict[str, Any] = {}
    if attrs.name:
        details["name"] = attrs.name
    if attrs.api_group:
        details["group"] = attrs.api_group
    details["kind"] = attrs.resource
    return errors.ApiError(403, "Forbidden", f"{qualified}{named} is forbidden: {said}", details)


# Bootstrap policy -----------------------------------------------------------------------------
def bootstrap_policy() -> list[tuple[Any, dict[str, Any]]]:
    """The default ClusterRoles and ClusterRoleBindings every cluster has that matter to a client
    (``plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go``, ``clusterRoles`` and
    ``clusterRoleBindings``): ``cluster-admin`` for ``system:masters``; discovery
    (``system:discovery``) and "may I" reviews (``system:basic-user``) for every authenticated
    user; health and version (``system:public-info-viewer``) for everyone."""
    label = {"kubernetes.io/bootstrapping": "rbac-defaults"}
    discovery = ["/livez", "/readyz", "/healthz", "/version", "/version/"]
    discovery += ["/openapi", "/openapi/*", "/api", "/api/*", "/apis", "/apis/*"]
    roles: dict[str, list[dict[str, Any]]] = {
        "cluster-admin": [
            {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
            {"nonResourceURLs": ["*"], "verbs": ["*"]},
        ],
        "system:discovery": [{"nonResourceURLs": discovery, "verbs": ["get"]}],
        "system:basic-user": [
            {
                "apiGroups": ["authorization.k8s.io"],
                "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                "verbs": ["create"],
            },
            {
                "apiGroups": ["authentication.k8s.io"],
                "resources": ["selfsubjectreviews"],
                "verbs": ["create"],
            },
        ],
        "system:public-info-viewer": [
            {"nonResourceURLs": ["/livez", "/readyz", "/healthz", "/version", "/version/"], "verbs": ["get"]}
        ],
    }
    bound = {
        "cluster-admin": [PRIVILEGED_GROUP],
        "system:discovery": ["system:authenticated"],
        "system:basic-user": ["system:authenticated"],
        "system:public-info-viewer": ["system:authenticated", "system:unauthenticated"],
    }
    objects: list[tuple[Any, dict[str, Any]]] = []
    for name, rules in roles.items():
        objects.append((CLUSTERROLES, {"metadata": {"name": name, "labels": dict(label)}, "rules": rules}))
    for name, groups in bound.items():
        subjects = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g} for g in groups]
        binding = {
            "metadata": {"name": name, "labels": dict(label)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": subjects,
        }
        objects.append((CLUSTERROLEBINDINGS, binding))
    return objects
