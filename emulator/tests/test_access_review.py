"""SelfSubjectAccessReview as the admin: allowed, except the verbs armed with deny_verb."""

from __future__ import annotations

import kubernetes
import pytest
from cluster_emulator import EmulatorAdminClient


def _review(api_client, verb: str, resource: str, subresource: str | None = None, group: str = ""):
    client = kubernetes.client
    spec = client.V1SelfSubjectAccessReviewSpec(
        resource_attributes=client.V1ResourceAttributes(
            namespace="default", verb=verb, group=group, resource=resource, subresource=subresource
        )
    )
    api = client.AuthorizationV1Api(api_client)
    return api.create_self_subject_access_review(client.V1SelfSubjectAccessReview(spec=spec)).status


def test_everything_is_allowed_until_a_verb_is_denied(k8s_cluster, k8s_api_client):
    assert _review(k8s_api_client, "create", "jobs", group="batch").allowed
    k8s_cluster.deny_verb("watch", "jobs")
    k8s_cluster.deny_verb("get", "pods/log")
    assert not _review(k8s_api_client, "watch", "jobs", group="batch").allowed
    assert _review(k8s_api_client, "list", "jobs", group="batch").allowed  # only the denied verb
    assert _review(k8s_api_client, "get", "pods").allowed  # the pod itself, not its log
    assert not _review(k8s_api_client, "get", "pods", "log").allowed
    k8s_cluster.clear_faults()
    assert _review(k8s_api_client, "watch", "jobs", group="batch").allowed


def test_deny_every_resource_over_http(k8s_cluster, k8s_api_client):
    EmulatorAdminClient(k8s_cluster.url).deny_verb("delete", None)
    assert not _review(k8s_api_client, "delete", "leaderworkersets", group="leaderworkerset.x-k8s.io").allowed
    assert not _review(k8s_api_client, "delete", "jobs", group="batch").allowed
    assert _review(k8s_api_client, "create", "jobs", group="batch").allowed


def test_a_review_without_attributes_is_invalid(k8s_api_client):
    api = kubernetes.client.AuthorizationV1Api(k8s_api_client)
    review = kubernetes.client.V1SelfSubjectAccessReview(
        spec=kubernetes.client.V1SelfSubjectAccessReviewSpec()
    )
    with pytest.raises(kubernetes.client.ApiException) as info:
        api.create_self_subject_access_review(review)
    assert info.value.status == 422
