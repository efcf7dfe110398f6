"""SelfSubjectAccessReview (authorization.k8s.io/v1): "may I do this?" answered from the emulator's RBAC.

The emulator has no users or Roles: every identity may do everything, except the (verb,
resource) pairs armed with ``ClusterEmulator.deny_verb`` (``faults.denied_verbs``). A review
answers from that same set, so a tool that asks before it acts (``kinetic-airflow doctor``)
sees what the cluster will refuse.

Upstream: kubernetes/kubernetes ``pkg/registry/authorization/selfsubjectaccessreview/rest.go``
(``REST.Create``: the spec's resourceAttributes are authorized for the requesting user and
the review comes back with ``status.allowed`` / ``status.reason``; nothing is stored) and
``plugin/pkg/auth/authorizer/rbac/rbac.go`` (``RBACAuthorizer.Authorize``: RBAC never denies
explicitly, so a missing grant is ``allowed: false`` with no ``denied``). The resource of a
subresource is ``<resource>/<subresource>`` (``pods/log``), as in a Role's rules.
"""

from __future__ import annotations

import copy
from typing import Any

from . import errors
from .faults import FaultState

__all__ = ["access_review"]

_USER = "system:serviceaccount:default:emulator"  # who the emulator says is asking


def access_review(faults: FaultState, body: Any) -> dict[str, Any]:
    """The review of ``body`` with its ``status`` filled in (201 Created, as the API server answers)."""
    if not isinstance(body, dict) or body.get("kind") not in (None, "SelfSubjectAccessReview"):
        raise errors.bad_request("the body must be a SelfSubjectAccessReview")
    spec = body.get("spec") or {}
    attrs = spec.get("resourceAttributes")
    if not isinstance(attrs, dict):
        if spec.get("nonResourceAttributes"):
            return _answer(body, True, "non-resource URLs are allowed in the emulator")
        raise errors.ApiError(
            422,
            "Invalid",
            "SelfSubjectAccessReview.authorization.k8s.io is invalid: spec.resourceAttributes: "
            "Invalid value: exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )
    verb = str(attrs.get("verb") or "")
    resource = str(attrs.get("resource") or "")
    if attrs.get("subresource"):
        resource = f"{resource}/{attrs['subresource']}"
    if faults.verb_denied(verb, resource) or faults.verb_denied("*", resource):
        return _answer(body, False, "")
    return _answer(body, True, f'RBAC: allowed by ClusterRoleBinding "emulator-admin" to User "{_USER}"')


def _answer(body: dict[str, Any], allowed: bool, reason: str) -> dict[str, Any]:
    review = copy.deepcopy(body)
    review.setdefault("apiVersion", "authorization.k8s.io/v1")
    review.setdefault("kind", "SelfSubjectAccessReview")
    review.setdefault("metadata", {}).setdefault("creationTimestamp", None)
    status: dict[str, Any] = {"allowed": allowed}
    if reason:
        status["reason"] = reason
    review["status"] = status
    return review
