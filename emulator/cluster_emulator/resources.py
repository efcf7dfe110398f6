"""The API resources the emulator serves, and the discovery documents describing them.

Discovery (``/api``, ``/apis``, ``/api/v1`` ...) is generated from this table so
``kubectl`` and dynamic clients see exactly what the routes accept.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from . import upstream

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceType:
    """One REST resource: where it lives and what its objects look like."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ALL_VERBS
    builtin: bool = True
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def api_version(self) -> str:
        """``v1`` for the core group, ``group/version`` otherwise."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> str:
        """Same as :attr:`api_version` (discovery calls it groupVersion)."""
        return self.api_version

    @property
    def qualified(self) -> str:
        """``jobs.batch`` style name used in error messages (``pods`` for core)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def kind_qualified(self) -> str:
        """``Job.batch`` style name used in Invalid error messages (``Pod`` for core)."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def list_kind(self) -> str:
        """Kind of the list wrapper (``PodList``)."""
        return f"{self.kind}List"


NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", False, "namespace", ("ns",), ("status",))
NODES = ResourceType("", "v1", "nodes", "Node", False, "node", ("no",), ("status",))
PODS = ResourceType("", "v1", "pods", "Pod", True, "pod", ("po",), ("status", "log"), ("all",))
EVENTS = ResourceType("", "v1", "events", "Event", True, "event", ("ev",))
SERVICES = ResourceType("", "v1", "services", "Service", True, "service", ("svc",), ("status",), ("all",))
CONFIGMAPS = ResourceType("", "v1", "configmaps", "ConfigMap", True, "configmap", ("cm",))
SECRETS = ResourceType("", "v1", "secrets", "Secret", True, "secret")
SERVICEACCOUNTS = ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True, "serviceaccount", ("sa",))
JOBS = ResourceType("batch", "v1", "jobs", "Job", True, "job", (), ("status",), ("all",))
# Made by the LeaderWorkerSet controller (leader and worker StatefulSets of each LWS); the
# emulator's LWS controller also does their pod management (see controllers.py).
STATEFULSETS = ResourceType(
    "apps", "v1", "statefulsets", "StatefulSet", True, "statefulset", ("sts",), ("status",), ("all",)
)
RESOURCEQUOTAS = ResourceType(
    "", "v1", "resourcequotas", "ResourceQuota", True, "resourcequota", ("quota",), ("status",)
)
# Custom resources are kept in their CRD's storage version (crds/UPSTREAM.json names the release)
# and served in every version the CRD marks served (``served_versions``).
LWS = ResourceType(
    "leaderworkerset.x-k8s.io",
    upstream.storage_version("leaderworkerset.x-k8s.io", "leaderworkersets"),
    "leaderworkersets",
    "LeaderWorkerSet",
    True,
    "leaderworkerset",
    ("lws",),
    ("status",),
    builtin=False,
)
# kubernetes-sigs/jobset ``config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml`` (the release
# crds/UPSTREAM.json names): no short names; the emulator's JobSet controller is jobset.py.
JOBSETS = ResourceType(
    "jobset.x-k8s.io",
    upstream.storage_version("jobset.x-k8s.io", "jobsets"),
    "jobsets",
    "JobSet",
    True,
    "jobset",
    (),
    ("status",),
    builtin=False,
)
PODTEMPLATES = ResourceType("", "v1", "podtemplates", "PodTemplate", True, "podtemplate")


def _kueue(plural: str, kind: str, namespaced: bool, short: tuple[str, ...] = ()) -> ResourceType:
    return ResourceType(
        "kueue.x-k8s.io",
        upstream.storage_version("kueue.x-k8s.io", plural),
        plural,
        kind,
        namespaced,
        kind.lower(),
        short,
        ("status",),
        builtin=False,
    )


# kubernetes-sigs/kueue ``config/components/crd/bases/kueue.x-k8s.io_*.yaml`` (the release
# crds/UPSTREAM.json names): stored in v1beta2, served as the CRDs say (conversion.py converts),
# short names as the CRDs list them; the emulator's Kueue is kueue.py.
WORKLOADS = _kueue("workloads", "Workload", True, ("kwl", "kueueworkload", "kueueworkloads"))
CLUSTERQUEUES = _kueue("clusterqueues", "ClusterQueue", False, ("cq",))
LOCALQUEUES = _kueue("localqueues", "LocalQueue", True, ("queue", "queues", "lq"))
RESOURCEFLAVORS = _kueue("resourceflavors", "ResourceFlavor", False, ("flavor", "flavors", "rf"))
WORKLOADPRIORITYCLASSES = _kueue("workloadpriorityclasses", "WorkloadPriorityClass", False, ("wpc",))
ADMISSIONCHECKS = _kueue("admissionchecks", "AdmissionCheck", False, ("ac",))
PROVISIONINGREQUESTCONFIGS = _kueue(
    "provisioningrequestconfigs", "ProvisioningRequestConfig", False, ("prc",)
)
# kubernetes/autoscaler ``cluster-autoscaler/apis/config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml``
# (the release crds/UPSTREAM.json names): short names provreq/provreqs.
PROVISIONINGREQUESTS = ResourceType(
    "autoscaling.x-k8s.io",
    upstream.storage_version("autoscaling.x-k8s.io", "provisioningrequests"),
    "provisioningrequests",
    "ProvisioningRequest",
    True,
    "provisioningrequest",
    ("provreq", "provreqs"),
    ("status",),
    builtin=False,
)
# Kueue's visibility API (kubernetes-sigs/kueue ``apis/visibility/v1beta*/types.go``, the same shape
# in both): an aggregated API whose only endpoint is the ``pendingworkloads`` subresource of
# (Cluster|Local)Queues, in the versions the release registers APIServices for
# (``config/components/visibility/apiservice_*.yaml``).
VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
VISIBILITY_CLUSTERQUEUES = ResourceType(
    VISIBILITY_GROUP,
    upstream.apiservice_versions(VISIBILITY_GROUP)[0],
    "clusterqueues",
    "ClusterQueue",
    False,
    "clusterqueue",
    (),
    ("pendingworkloads",),
    verbs=("get",),
    builtin=False,
)
VISIBILITY_LOCALQUEUES = ResourceType(
    VISIBILITY_GROUP,
    upstream.apiservice_versions(VISIBILITY_GROUP)[0],
    "localqueues",
    "LocalQueue",
    True,
    "localqueue",
    (),
    ("pendingworkloads",),
    verbs=("get",),
    builtin=False,
)
VISIBILITY_TYPES = (VISIBILITY_CLUSTERQUEUES, VISIBILITY_LOCALQUEUES)
KUEUE_TYPES = (
    WORKLOADS,
    CLUSTERQUEUES,
    LOCALQUEUES,
    RESOURCEFLAVORS,
    WORKLOADPRIORITYCLASSES,
    ADMISSIONCHECKS,
    PROVISIONINGREQUESTCONFIGS,
)
# Create-only and never stored: the API server answers it from the caller's RBAC (access.py).
SELFSUBJECTACCESSREVIEWS = ResourceType(
    "authorization.k8s.io",
    "v1",
    "selfsubjectaccessreviews",
    "SelfSubjectAccessReview",
    False,
    "selfsubjectaccessreview",
    verbs=("create",),
)

RESOURCE_TYPES: tuple[ResourceType, ...] = (
    NAMESPACES,
    NODES,
    PODS,
    EVENTS,
    SERVICES,
    CONFIGMAPS,
    SECRETS,
    SERVICEACCOUNTS,
    RESOURCEQUOTAS,
    JOBS,
    STATEFULSETS,
    LWS,
    JOBSETS,
    PODTEMPLATES,
    # before the kueue.x-k8s.io kinds, so by_plural/by_kind name the stored ones
    *VISIBILITY_TYPES,
    *KUEUE_TYPES,
    PROVISIONINGREQUESTS,
    SELFSUBJECTACCESSREVIEWS,
)

_BY_PATH = {(rt.group, rt.plural): rt for rt in RESOURCE_TYPES}
_BY_KIND = {rt.kind: rt for rt in RESOURCE_TYPES}
_BY_PLURAL = {rt.plural: rt for rt in RESOURCE_TYPES}


def served_versions(rt: ResourceType, unserved: Collection[str] = ()) -> list[str]:
    """The versions ``rt`` is served in, preferred first: a built-in kind its one version, a custom
    resource what its CRD marks ``served: true``, the visibility API its APIServices; less any
    ``group/version`` in ``unserved`` (the emulator's option modelling a newer release)."""
    if rt.builtin:
        versions = [rt.version]
    elif rt.group == VISIBILITY_GROUP:
        versions = upstream.apiservice_versions(VISIBILITY_GROUP)
    else:
        versions = upstream.served_versions(rt.group, rt.plural)
    return [v for v in versions if f"{rt.group}/{v}" not in unserved]


def deprecation_warning(rt: ResourceType, version: str) -> str | None:
    """What kube-apiserver sends in a ``Warning: 299`` header for a deprecated CRD version."""
    if rt.builtin or rt.group == VISIBILITY_GROUP:
        return None
    return upstream.deprecation_warning(rt.group, rt.plural, version)


def lookup(group: str, version: str, plural: str, unserved: Collection[str] = ()) -> ResourceType | None:
    """Resource served at ``/apis/{group}/{version}/{plural}`` (group "" for ``/api/v1``); None if
    there is none or that version is not served (a 404, as on a real API server)."""
    rt = _BY_PATH.get((group, plural))
    if rt is None or version not in served_versions(rt, unserved):
        return None
    return rt


def by_kind(kind: str) -> ResourceType | None:
    """Resource type for an object kind (``Pod`` -> pods)."""
    return _BY_KIND.get(kind)


def by_plural(plural: str) -> ResourceType:
    """Resource type for a plural name such as ``pods`` or ``leaderworkersets``."""
    try:
        return _BY_PLURAL[plural]
    except KeyError:
        raise KeyError(f"unknown resource {plural!r}; known: {sorted(_BY_PLURAL)}") from None


def group_versions(unserved: Collection[str] = ()) -> dict[str, list[str]]:
    """Named API groups and their served versions, preferred first (core group excluded)."""
    groups: dict[str, list[str]] = {}
    for rt in RESOURCE_TYPES:
        if rt.group:
            versions = groups.setdefault(rt.group, [])
            for v in served_versions(rt, unserved):
                if v not in versions:
                    versions.append(v)
    for versions in groups.values():
        versions.sort(key=upstream.version_priority)
    return {g: v for g, v in groups.items() if v}


# kubernetes-sigs/kueue#14558 ("set unserved for v1beta1 types and resources", merged 2026-08-25,
# after the pinned release; planned for 0.20 in #13957): every kueue.x-k8s.io v1beta1 CRD version
# ``served: false`` and the v1beta1 visibility APIService removed (v1beta2's stays).
KUEUE_14558 = "kueue#14558"
_SHORTHANDS = {KUEUE_14558: ("kueue.x-k8s.io/v1beta1", f"{VISIBILITY_GROUP}/v1beta1")}


def check_unserved(entries: Collection[str]) -> tuple[str, ...]:
    """``group/version`` entries to stop serving, checked against what the vendored CRDs serve
    (``kueue#14558`` expands to that change); an unknown one is an error naming the choices."""
    served = {f"{g}/{v}" for g, versions in group_versions().items() for v in versions}
    out: list[str] = []
    for entry in entries:
        for gv in _SHORTHANDS.get(entry, (entry,)):
            if gv not in served:
                raise ValueError(
                    f"cannot unserve {gv!r}: not a group/version the emulator serves; choose from "
                    f"{', '.join(sorted(served))} or {KUEUE_14558!r}"
                )
            out.append(gv)
    return tuple(out)


def api_versions_doc(server_address: str) -> dict[str, Any]:
    """``GET /api``."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def api_group_doc(group: str, unserved: Collection[str] = ()) -> dict[str, Any]:
    """``GET /apis/{group}``: its served versions, the preferred (kube-aware highest) first."""
    versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in group_versions(unserved)[group]]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": versions,
        "preferredVersion": versions[0],
    }


def api_group_list_doc(unserved: Collection[str] = ()) -> dict[str, Any]:
    """``GET /apis``."""
    groups = []
    for group in group_versions(unserved):
        doc = api_group_doc(group, unserved)
        doc.pop("kind")
        doc.pop("apiVersion")
        groups.append(doc)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def openapi_v3_root(unserved: Collection[str] = ()) -> dict[str, Any]:
    """``GET /openapi/v3``: one entry per group-version (kubectl fetches it before create/apply)."""
    gvs = ["api/v1"] + [f"apis/{g}/{v}" for g, versions in group_versions(unserved).items() for v in versions]
    return {"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash=emulator"} for gv in gvs}}


def openapi_v3_group_version(
    group: str, version: str, unserved: Collection[str] = ()
) -> dict[str, Any] | None:
    """A minimal OpenAPI v3 document for a group-version.

    It only declares, per kind, the create/patch operations with their
    ``x-kubernetes-group-version-kind`` and the ``fieldValidation`` query
    parameter: that is what kubectl checks to decide it can leave validation
    to the server (``--validate=strict`` then works without schemas here).
    """
    rts = [rt for rt in RESOURCE_TYPES if rt.group == group and version in served_versions(rt, unserved)]
    if not rts:
        return None
    params = [
        {"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
        for name in ("dryRun", "fieldManager", "fieldValidation", "pretty")
    ]
    paths: dict[str, Any] = {}
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    for rt in rts:
        gvk = {"group": rt.group, "version": version, "kind": rt.kind}
        base = f"{prefix}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else f"{prefix}/{rt.plural}"
        operation = {
            "x-kubernetes-group-version-kind": gvk,
            "parameters": params,
            "responses": {"200": {"description": "OK"}},
        }
        paths[base] = {
            "post": {**operation, "operationId": f"create{rt.kind}", "x-kubernetes-action": "post"}
        }
        paths[f"{base}/{{name}}"] = {
            "put": {**operation, "operationId": f"replace{rt.kind}", "x-kubernetes-action": "put"},
            "patch": {**operation, "operationId": f"patch{rt.kind}", "x-kubernetes-action": "patch"},
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "emulator"},
        "paths": paths,
        "components": {"schemas": {}},
    }


def api_resource_list_doc(group: str, version: str, unserved: Collection[str] = ()) -> dict[str, Any] | None:
    """``GET /api/v1`` or ``GET /apis/{group}/{version}`` (None: not served, a 404)."""
    entries: list[dict[str, Any]] = []
    for rt in RESOURCE_TYPES:
        if rt.group != group or version not in served_versions(rt, unserved):
            continue
        entry: dict[str, Any] = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": list(rt.verbs),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        entries.append(entry)
        for sub in rt.subresources:
            verbs = ["get"] if sub in ("log", "pendingworkloads") else ["get", "patch", "update"]
            entries.append(
                {
                    "name": f"{rt.plural}/{sub}",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": "PendingWorkloadsSummary" if sub == "pendingworkloads" else rt.kind,
                    "verbs": verbs,
                }
            )
    if not entries:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": entries,
    }
