"""API errors rendered as ``metav1.Status`` bodies, as the real API server does.

Clients branch on ``reason`` and ``code`` (``AlreadyExists`` -> reattach,
``NotFound`` -> gone, ``Invalid`` -> user error), so these must be exact.
"""

from __future__ import annotations

from typing import Any

from .resources import ResourceType


class ApiError(Exception):
    """An error response; :meth:`body` is the Status object."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The ``Status`` (kind Status, apiVersion v1, status Failure) for this error."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(rt: ResourceType, name: str, kind: str | None = None) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = kind or rt.plural
    return details


def not_found(rt: ResourceType, name: str) -> ApiError:
    """404 ``pods "x" not found``."""
    return ApiError(404, "NotFound", f'{rt.qualified} "{name}" not found', _details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiError:
    """409 ``jobs.batch "x" already exists``."""
    return ApiError(409, "AlreadyExists", f'{rt.qualified} "{name}" already exists', _details(rt, name))


def conflict(rt: ResourceType, name: str, why: str | None = None) -> ApiError:
    """409 Conflict (stale resourceVersion or failed precondition)."""
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {rt.qualified} "{name}": {why}',
        _details(rt, name),
    )


def invalid(rt: ResourceType, name: str, message: str, causes: list[dict[str, str]]) -> ApiError:
    """422 Invalid with field causes."""
    details = _details(rt, name, rt.kind)
    details["causes"] = causes
    return ApiError(422, "Invalid", message, details)


def bad_request(message: str) -> ApiError:
    """400 BadRequest."""
    return ApiError(400, "BadRequest", message)


def method_not_allowed(
    message: str = "the server does not allow this method on the requested resource",
) -> ApiError:
    """405 MethodNotAllowed."""
    return ApiError(405, "MethodNotAllowed", message, {})


def namespace_not_found(name: str) -> ApiError:
    """404 for a missing namespace (NamespaceLifecycle admission)."""
    return ApiError(404, "NotFound", f'namespaces "{name}" not found', {"name": name, "kind": "namespaces"})


def gone(message: str) -> ApiError:
    """410 Expired (watch from a compacted resourceVersion)."""
    return ApiError(410, "Expired", message)


def forbidden_verb(verb: str, rt: ResourceType, namespace: str | None, user: str | None = None) -> ApiError:
    """RBAC's 403 for a verb the identity's roles do not grant.

    Worded as kube-apiserver's authorization filter does (kubernetes
    ``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go``,
    ``ForbiddenStatusError``: ``<resource>.<group> is forbidden: User "<user>" cannot <verb>
    resource "<resource>" in API group "<group>" in the namespace "<ns>"``).
    """
    who = user or "system:serviceaccount:airflow:airflow"
    where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
    message = (
        f'{rt.qualified} is forbidden: User "{who}" cannot {verb} resource "{rt.plural}" '
        f'in API group "{rt.group}"{where}'
    )
    details: dict[str, Any] = {"kind": rt.plural}
    if rt.group:
        details["group"] = rt.group
    return ApiError(403, "Forbidden", message, details)
