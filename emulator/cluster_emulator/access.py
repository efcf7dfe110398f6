"""SelfSubjectAccessReview (authorization.k8s.io/v1): "may I do this?" answered from the emulator's RBAC.

The review asks the same authorizer the request itself would meet (rbac.py), for the user who
sends it, so a tool that asks before it acts (``kinetic-airflow doctor``) sees what the cluster
will refuse. Verbs armed with ``ClusterEmulator.deny_verb`` (``faults.denied_verbs``) are refused
on top, for every identity.

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
from .rbac import Attributes, UserInfo, authorize

__all__ = ["access_review"]


def access_review(cluster: Any, user: UserInfo, body: Any) -> dict[str, Any]:
    """The review of ``body`` by ``user`` with its ``status`` filled in (201 Created, as the API
    server answers)."""
    if not isinstance(body, dict) or body.get("kind") not in (None, "SelfSubjectAccessReview"):
        raise errors.bad_request("the body must be a SelfSubjectAccessReview")
    spec = body.get("spec") or {}
    attrs = spec.get("resourceAttributes")
    non_resource = spec.get("nonResourceAttributes")
    if isinstance(attrs, dict) == isinstance(non_resource, dict):
        raise errors.ApiError(
            422,
            "Invalid",
            "SelfSubjectAccessReview.authorization.k8s.io is invalid: spec.resourceAttributes: "
            "Invalid value: exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )
    if not isinstance(attrs, dict):
        assert isinstance(non_resource, dict)
        asked = Attributes(user, str(non_resource.get("verb") or ""), str(non_resource.get("path") or ""))
        allowed, reason = authorize(cluster.store, asked)
        return _answer(body, allowed, reason)
    verb = str(attrs.get("verb") or "")
    resource = str(attrs.get("resource") or "")
    subresource = str(attrs.get("subresource") or "")
    asked = Attributes(
        user,
        verb,
        "",
        True,
        str(attrs.get("group") or ""),
        str(attrs.get("version") or ""),
        resource,
        subresource,
        str(attrs.get("namespace") or ""),
        str(attrs.get("name") or ""),
    )
    shown = f"{resource}/{subresource}" if subresource else resource
    if cluster.faults.verb_denied(verb, shown) or cluster.faults.verb_denied("*", shown):
        return _answer(body, False, "")
    allowed, reason = authorize(cluster.store, asked)
    return _answer(body, allowed, reason)


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
