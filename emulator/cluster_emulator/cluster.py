"""The emulated control plane: object CRUD with admission, events, deletion and garbage collection.

The HTTP layer, the controllers and the kubelet all go through :class:`Cluster`
so an object created by the Job controller is indistinguishable from one a
client POSTed (same defaulting, same watch events, same deletion rules).
Everything here runs on the emulator's event loop.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as _dt
import fnmatch
import math
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from . import errors
from ._util import JsonPatchError, fmt_time, json_patch, merge_patch, parse_time, rand_suffix, utcnow
from .admission import PodAdmission
from .controllers import ControllerManager
from .faults import FaultState, RequestLog
from .kubeconfig import DUMMY_TOKEN
from .kubelet import Kubelet
from .kueue import kueue_default_suspend, kueue_gate_pod
from .nodes import NodePool, default_node_pools, make_nodes, node_object
from .rbac import ADMIN, Authenticator, UserInfo, bootstrap_policy
from .resources import (
    EVENTS,
    JOBS,
    JOBSETS,
    KUEUE_TYPES,
    LWS,
    NAMESPACES,
    NODES,
    PODS,
    PROVISIONINGREQUESTS,
    SERVICEACCOUNTS,
    SERVICES,
    ResourceType,
)
from .store import Store
from .validation import (
    K8S_VERSION,
    InvalidError,
    check_immutable,
    default_crd_object,
    default_job,
    default_jobset,
    default_lws,
    default_pod,
    validate_object,
)

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
# Service accounts besides each namespace's "default", as ``namespace/name``: a cluster as
# keras-kinetic's ``kinetic up`` leaves it has ``kinetic`` in ``default`` (only there). Pods
# naming any other account are refused by ServiceAccount admission (admission.py).
DEFAULT_SERVICE_ACCOUNTS = ("default/kinetic",)

# Resources whose main endpoint ignores status changes (status is a subresource).
_STATUS_SUBRESOURCE = {
    PODS,
    JOBS,
    LWS,
    JOBSETS,
    NAMESPACES,
    NODES,
    SERVICES,
    *KUEUE_TYPES,
    PROVISIONINGREQUESTS,
}
_GENERATION = {PODS, JOBS, LWS, JOBSETS, SERVICES, *KUEUE_TYPES, PROVISIONINGREQUESTS}
_SERVER_FIELDS = (
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "managedFields",
    "selfLink",
)


def owner_uids(obj: dict[str, Any]) -> list[str]:
    """UIDs in ``metadata.ownerReferences``."""
    return [ref.get("uid", "") for ref in obj["metadata"].get("ownerReferences") or []]


def qos_class(spec: dict[str, Any]) -> str:
    """Pod QoS class from container requests/limits (cpu and memory only)."""
    containers = list(spec.get("containers") or []) + list(spec.get("initContainers") or [])
    any_set = False
    guaranteed = True
    for container in containers:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = resources.get("requests") or {}
        for res in ("cpu", "memory"):
            if res in limits or res in requests:
                any_set = True
            if res not in limits or requests.get(res, limits.get(res)) != limits.get(res):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


class Cluster:
    """State and behaviour of the emulated cluster (no HTTP here)."""

    def __init__(
        self,
        *,
        work_dir: Path,
        node_pools: Sequence[NodePool] | None = None,
        namespaces: Sequence[str] = DEFAULT_NAMESPACES,
        max_grace_seconds: float = 5.0,
        inherit_env: bool = True,
        extra_env: dict[str, str] | None = None,
        resolve_cluster_dns: bool = True,
        restart_backoff: float = 0.5,
        job_backoff: float = 0.2,
        image_pull_backoff: float = 0.5,
        event_ttl_seconds: float = 3600.0,
        service_accounts: Sequence[str] = DEFAULT_SERVICE_ACCOUNTS,
        unserved_versions: Sequence[str] = (),
        autopilot: bool = False,
        static_tokens: dict[str, UserInfo] | None = None,
    ) -> None:
        self.store = Store()
        # group/versions the vendored CRDs serve but this cluster does not (resources.served_versions)
        self.unserved_versions = frozenset(unserved_versions)
        # GKE Autopilot: GKE Warden's admission constraints apply to pods (admission.py)
        self.autopilot = autopilot
        # Who a bearer token is (rbac.py): the admin kubeconfig's token, any static ones, and the
        # tokens minted for service accounts.
        self.authenticator = Authenticator({DUMMY_TOKEN: ADMIN, **(static_tokens or {})})
        self.service_accounts = list(service_accounts)
        self.event_ttl_seconds = event_ttl_seconds
        self._next_event_gc = 0.0
        self.faults = FaultState()
        self.requests = RequestLog()
        self.node_pools = list(node_pools) if node_pools is not None else default_node_pools()
        self.nodes = make_nodes(self.node_pools)
        self.namespaces = list(namespaces)
        self.work_dir = work_dir
        self.port = 0
        self.kubernetes_version = K8S_VERSION
        self.kubelet = Kubelet(
            self,
            work_dir / "pods",
            max_grace_seconds=max_grace_seconds,
            inherit_env=inherit_env,
            extra_env=extra_env or {},
            resolve_cluster_dns=resolve_cluster_dns,
            restart_backoff=restart_backoff,
            image_pull_backoff=image_pull_backoff,
        )
        self.controllers = ControllerManager(self, job_backoff=job_backoff)
        self.admission = PodAdmission(self)
        self._event_index: dict[tuple[str, str, str, str, str], tuple[str, str]] = {}
        self.store.add_listener(lambda event: None if event.rt is EVENTS else self.controllers.wake())

    # --------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Create the built-in namespaces, nodes and service accounts; start the controllers."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        for name in self.namespaces:
            self.create(NAMESPACES, {"metadata": {"name": name}}, validate=False)
        for rt, obj in bootstrap_policy():
            self.create(rt, obj, validate=False)
        for account in self.service_accounts:
            ns, _, name = account.rpartition("/")
            if self.store.get(NAMESPACES, None, ns or "default") is None:
                self.create(NAMESPACES, {"metadata": {"name": ns}}, validate=False)
            if self.store.get(SERVICEACCOUNTS, ns or "default", name) is None:
                sa = {"metadata": {"name": name, "namespace": ns or "default"}}
                self.create(SERVICEACCOUNTS, sa, validate=False)
        created = fmt_time()
        kubelet_version = f"v{self.kubernetes_version}.0-emulator"
        for node in self.nodes:
            self.create(NODES, node_object(node, created, kubelet_version), validate=False)
        self.controllers.start()

    async def stop(self) -> None:
        """Stop controllers and kill every pod process."""
        await self.controllers.stop()
        await self.kubelet.shutdown()

    # ------------------------------------------------------------------ events
    def record_event(
        self,
        obj: dict[str, Any],
        etype: str,
        reason: str,
        message: str,
        *,
        component: str,
        host: str | None = None,
    ) -> None:
        """Record a core/v1 Event about ``obj`` (repeated ones bump ``count``, as the recorder does)."""
        md = obj["metadata"]
        namespace = md.get("namespace") or "default"
        ns_obj = self.store.get(NAMESPACES, None, namespace)
        if ns_obj is None or ns_obj["metadata"].get("deletionTimestamp"):
            return  # the API server refuses new content in a terminating namespace
        key = (md.get("uid", ""), reason, message, etype, component)
        now = fmt_time()
        existing = self._event_index.get(key)
        if existing is not None and self.store.get(EVENTS, existing[0], existing[1]) is not None:

            def bump(ev: dict[str, Any]) -> None:
                ev["count"] = int(ev.get("count") or 1) + 1
                ev["lastTimestamp"] = now

            self.store.mutate(EVENTS, existing[0], existing[1], bump)
            return
        name = f"{md['name']}.{time.time_ns():x}"
        source: dict[str, str] = {"component": component}
        if host:
            source["host"] = host
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {
                "kind": obj.get("kind", ""),
                "namespace": md.get("namespace", ""),
                "name": md["name"],
                "uid": md.get("uid", ""),
                "apiVersion": obj.get("apiVersion", ""),
                "resourceVersion": md.get("resourceVersion", ""),
            },
            "reason": reason,
            "message": message,
            "source": source,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "type": etype,
            "eventTime": None,
            "reportingComponent": component,
            "reportingInstance": host or "",
        }
        self._stamp(EVENTS, event)
        self.store.create(EVENTS, event)
        self._event_index[key] = (namespace, name)

    # -------------------------------------------------------------------- CRUD
    def _stamp(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        md = obj["metadata"]
        md["uid"] = str(uuid.uuid4())
        md["creationTimestamp"] = fmt_time()
        if rt in _GENERATION:
            md["generation"] = 1

    def _check_type(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        kind = obj.setdefault("kind", rt.kind)
        api_version = obj.setdefault("apiVersion", rt.api_version)
        if kind != rt.kind or api_version != rt.api_version:
            raise errors.bad_request(
                f"the API version in the data ({api_version}) does not match the expected API version "
                f"({rt.api_version})"
                if api_version != rt.api_version
                else f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})"
            )

    def create(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        *,
        namespace: str | None = None,
        validate: bool = True,
        strict: bool = True,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Admit and store a new object; raises :class:`~.errors.ApiError`."""
        if not isinstance(obj, dict):
            raise errors.bad_request("the request body must be a JSON object")
        obj = copy.deepcopy(obj)
        self._check_type(rt, obj)
        md = obj.setdefault("metadata", {})
        if not isinstance(md, dict):
            raise errors.bad_request("metadata must be an object")
        for key in _SERVER_FIELDS:
            md.pop(key, None)
        if rt.namespaced:
            body_ns = md.get("namespace")
            ns = namespace or body_ns or "default"
            if body_ns and namespace and body_ns != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            md["namespace"] = ns
            if self.store.get(NAMESPACES, None, ns) is None:
                raise errors.namespace_not_found(ns)
            ns_obj = self.store.get(NAMESPACES, None, ns)
            if ns_obj and ns_obj["metadata"].get("deletionTimestamp"):
                raise errors.ApiError(
                    403,
                    "Forbidden",
                    f'{rt.qualified} "{md.get("name", "")}" is forbidden: unable to create new content in '
                    f"namespace {ns} because it is being terminated",
                )
        else:
            md.pop("namespace", None)
            ns = ""
        sent_name = md.get("name") or md.get("generateName") or ""
        if not md.get("name") and md.get("generateName"):
            for _ in range(10):
                candidate = f"{md['generateName']}{rand_suffix()}"
                if self.store.get(rt, ns, candidate) is None:
                    md["name"] = candidate
                    break
        if not md.get("name"):
            raise errors.invalid(
                rt,
                "",
                f'{rt.kind_qualified} "" is invalid: metadata.name: Required value: '
                "name or generateName is required",
                [{"reason": "FieldValueRequired", "message": "Required value", "field": "metadata.name"}],
            )
        name = md["name"]
        if validate:
            try:
                validate_object(rt, obj, strict=strict)
            except InvalidError as exc:
                raise errors.invalid(rt, name, str(exc), exc.causes)
        if self.store.get(rt, ns, name) is not None:
            raise errors.already_exists(rt, name)
        if rt is PODS:
            kueue_gate_pod(self, obj)  # Kueue's pod webhook, before the scheduler sees it
            self.admission.admit(obj, sent_name)  # also for controllers' pods (validate=False)
        self._stamp(rt, obj)
        uid = md["uid"]
        if rt is PODS:
            default_pod(obj)
            obj["status"] = {"phase": "Pending", "qosClass": qos_class(obj["spec"])}
        elif rt is JOBS:
            default_job(obj, uid)
            kueue_default_suspend(obj)
            obj["status"] = {}
        elif rt is LWS:
            default_lws(obj)
            obj["status"] = {}
        elif rt is JOBSETS:
            default_jobset(obj)
            kueue_default_suspend(obj)
            obj["status"] = {}
        elif rt in KUEUE_TYPES or rt is PROVISIONINGREQUESTS:
            default_crd_object(rt, obj)
            obj.setdefault("status", {})
        elif rt is NAMESPACES:
            md.setdefault("labels", {})["kubernetes.io/metadata.name"] = name
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
        if dry_run:
            return obj
        self.store.create(rt, obj)
        if rt is NAMESPACES and self.store.get(SERVICEACCOUNTS, name, "default") is None:
            self.create(SERVICEACCOUNTS, {"metadata": {"name": "default", "namespace": name}}, validate=False)
        if rt is PODS:
            self.kubelet.pod_added(obj)
        return copy.deepcopy(obj)

    def request_token(self, namespace: str, name: str, body: Any) -> dict[str, Any]:
        """TokenRequest (``POST .../serviceaccounts/NAME/token``): a bearer token for the service
        account, valid ``spec.expirationSeconds`` (default 3600, at least 600, as
        ``pkg/apis/authentication/validation`` and ``TokenREST.Create`` in
        ``pkg/registry/core/serviceaccount/storage/token.go`` require)."""
        body = body if isinstance(body, dict) else {}
        if body.get("kind") not in (None, "TokenRequest"):
            raise errors.bad_request(f"the kind in the data ({body.get('kind')}) does not match TokenRequest")
        spec = body.get("spec") or {}
        seconds = spec.get("expirationSeconds", 3600)
        if not isinstance(seconds, int) or seconds < 600:
            raise errors.ApiError(
                422,
                "Invalid",
                f'TokenRequest.authentication.k8s.io "{name}" is invalid: spec.expirationSeconds: '
                f"Invalid value: {seconds}: may not specify a duration less than 10 minutes",
            )
        account = self.store.get(SERVICEACCOUNTS, namespace, name)
        if account is None:
            raise errors.not_found(SERVICEACCOUNTS, name)
        token, expires = self.authenticator.mint(namespace, name, account["metadata"]["uid"], seconds)
        md = body.get("metadata") or {}
        expiry = fmt_time(_dt.datetime.fromtimestamp(expires, _dt.UTC))
        audiences = spec.get("audiences") or ["https://kubernetes.default.svc"]
        return {
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "creationTimestamp": md.get("creationTimestamp"),
            },
            "spec": {
                "audiences": audiences,
                "expirationSeconds": seconds,
                "boundObjectRef": spec.get("boundObjectRef"),
            },
            "status": {"token": token, "expirationTimestamp": expiry},
        }

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        """A copy of one object; 404 ApiError if missing."""
        obj = self.store.get(rt, namespace, name)
        if obj is None:
            raise errors.not_found(rt, name)
        return copy.deepcopy(obj)

    def _apply_update(
        self,
        rt: ResourceType,
        current: dict[str, Any],
        new: dict[str, Any],
        *,
        subresource: str | None,
        strict: bool,
        dry_run: bool,
        check_rv: bool = True,
    ) -> dict[str, Any]:
        md_cur = current["metadata"]
        name = md_cur["name"]
        if not isinstance(new, dict):
            raise errors.bad_request("the request body must be a JSON object")
        new = copy.deepcopy(new)
        new.setdefault("kind", rt.kind)
        new.setdefault("apiVersion", rt.api_version)
        self._check_type(rt, new)
        md = new.setdefault("metadata", {})
        if md.get("name") and md["name"] != name:
            raise errors.bad_request(
                f"the name of the object ({md['name']}) does not match the name on the URL ({name})"
            )
        if check_rv and md.get("resourceVersion") and md["resourceVersion"] != md_cur.get("resourceVersion"):
            raise errors.conflict(rt, name)
        if subresource == "status":
            result = copy.deepcopy(current)
            result["status"] = new.get("status") or {}
        else:
            result = new
            for key in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ):
                if key in md_cur:
                    md[key] = md_cur[key]
                else:
                    md.pop(key, None)
            md["name"] = name
            if rt.namespaced:
                md["namespace"] = md_cur["namespace"]
            else:
                md.pop("namespace", None)
            md.pop("resourceVersion", None)
            md["resourceVersion"] = md_cur.get("resourceVersion")
            if rt in _STATUS_SUBRESOURCE:
                if "status" in current:
                    result["status"] = copy.deepcopy(current["status"])
                else:
                    result.pop("status", None)
            if rt in (PODS, JOBS, LWS, JOBSETS, *KUEUE_TYPES, PROVISIONINGREQUESTS):
                try:
                    validate_object(rt, result, strict=strict)
                except InvalidError as exc:
                    raise errors.invalid(rt, name, str(exc), exc.causes)
                causes = check_immutable(rt, current, result)
                if causes:
                    summary = ", ".join(f"{c['field']}: {c['message']}" for c in causes)
                    raise errors.invalid(
                        rt, name, f'{rt.kind_qualified} "{name}" is invalid: {summary}', causes
                    )
            if rt in _GENERATION and result.get("spec") != current.get("spec"):
                md["generation"] = int(md_cur.get("generation") or 1) + 1
        result["metadata"]["resourceVersion"] = md_cur.get("resourceVersion")
        if result == current:
            return copy.deepcopy(current)
        if dry_run:
            return result
        stored = self.store.replace(rt, result)
        self._maybe_finalize(rt, stored)
        return copy.deepcopy(stored)

    def update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: dict[str, Any],
        *,
        subresource: str | None = None,
        strict: bool = True,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """PUT semantics (optimistic concurrency on ``metadata.resourceVersion``)."""
        current = self.store.get(rt, namespace, name)
        if current is None:
            raise errors.not_found(rt, name)
        return self._apply_update(rt, current, body, subresource=subresource, strict=strict, dry_run=dry_run)

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        content_type: str,
        raw: bytes,
        *,
        subresource: str | None = None,
        strict: bool = True,
        dry_run: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """PATCH (json-patch, merge-patch, strategic-merge-patch as merge, apply as merge/create).

        Returns the object and whether it was created (server-side apply of a missing object).
        """
        ctype = content_type.split(";", 1)[0].strip().lower()
        try:
            if ctype == "application/apply-patch+yaml":
                patch = yaml.safe_load(raw.decode() or "{}")
            else:
                patch = yaml.safe_load(raw.decode() or "null") if raw else None
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise errors.bad_request(f"error decoding patch: {exc}")
        current = self.store.get(rt, namespace, name)
        if current is None:
            if ctype == "application/apply-patch+yaml" and isinstance(patch, dict):
                patch.setdefault("metadata", {})["name"] = name
                return self.create(rt, patch, namespace=namespace, strict=strict, dry_run=dry_run), True
            raise errors.not_found(rt, name)
        if ctype == "application/json-patch+json":
            if not isinstance(patch, list):
                raise errors.bad_request("json patch must be a list of operations")
            try:
                new = json_patch(current, patch)
            except JsonPatchError as exc:
                raise errors.ApiError(
                    422, "Invalid", f"the server rejected our request due to an error in our request: {exc}"
                )
        elif ctype in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
            "application/apply-patch+yaml",
            "application/json",
        ):
            if not isinstance(patch, dict):
                raise errors.bad_request("merge patch must be a JSON object")
            new = merge_patch(current, patch)
        else:
            raise errors.ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media "
                "types include: application/json-patch+json, application/merge-patch+json, "
                "application/apply-patch+yaml, application/strategic-merge-patch+json",
            )
        explicit_rv = isinstance(patch, dict) and bool((patch.get("metadata") or {}).get("resourceVersion"))
        obj = self._apply_update(
            rt, current, new, subresource=subresource, strict=strict, dry_run=dry_run, check_rv=explicit_rv
        )
        return obj, False

    # ------------------------------------------------------------------ delete
    def dependents(self, uid: str) -> list[tuple[ResourceType, dict[str, Any]]]:
        """Objects listing ``uid`` in their ownerReferences."""
        return [(rt, obj) for rt, obj in self.store.all_objects() if uid in owner_uids(obj)]

    def delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        *,
        propagation: str | None = None,
        grace: float | None = None,
        preconditions: dict[str, Any] | None = None,
        dry_run: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """Delete with Kubernetes semantics; returns (object, removed_now).

        Jobs default to ``Orphan`` propagation (as in batch/v1), everything else to
        ``Background``. Pods terminate gracefully: the object stays (with a
        deletionTimestamp) until its processes have exited.
        """
        current = self.store.get(rt, namespace, name)
        if current is None:
            raise errors.not_found(rt, name)
        md = current["metadata"]
        if preconditions:
            if preconditions.get("uid") and preconditions["uid"] != md.get("uid"):
                raise errors.conflict(
                    rt,
                    name,
                    f"Precondition failed: UID in precondition: {preconditions['uid']}, "
                    f"UID in object meta: {md.get('uid')}",
                )
            rv = preconditions.get("resourceVersion")
            if rv and rv != md.get("resourceVersion"):
                raise errors.conflict(
                    rt,
                    name,
                    f"Precondition failed: ResourceVersion in precondition: {rv}, "
                    f"ResourceVersion in object meta: {md.get('resourceVersion')}",
                )
        if propagation not in (None, "Orphan", "Background", "Foreground"):
            raise errors.bad_request(f'propagationPolicy: Unsupported value: "{propagation}"')
        if dry_run:
            return copy.deepcopy(current), False
        if rt is PODS:
            return self._delete_pod(current, grace)
        if rt is NAMESPACES:
            return self._delete_namespace(current)
        if propagation is None:
            propagation = "Orphan" if rt is JOBS else "Background"
        uid = md["uid"]
        if md.get("deletionTimestamp"):
            return copy.deepcopy(current), False
        if propagation == "Foreground":

            def mark(obj: dict[str, Any]) -> None:
                m = obj["metadata"]
                m["deletionTimestamp"] = fmt_time()
                m["deletionGracePeriodSeconds"] = 0
                finalizers = m.setdefault("finalizers", [])
                if "foregroundDeletion" not in finalizers:
                    finalizers.append("foregroundDeletion")

            updated = self.store.mutate(rt, namespace, name, mark)
            for dep_rt, dep in self.dependents(uid):
                self._delete_quietly(dep_rt, dep, "Foreground")
            self.controllers.wake()
            return copy.deepcopy(updated or current), False
        if propagation == "Orphan":
            for dep_rt, dep in self.dependents(uid):

                def strip(obj: dict[str, Any], owner: str = uid) -> None:
                    refs = [r for r in obj["metadata"].get("ownerReferences") or [] if r.get("uid") != owner]
                    if refs:
                        obj["metadata"]["ownerReferences"] = refs
                    else:
                        obj["metadata"].pop("ownerReferences", None)

                self.store.mutate(dep_rt, dep["metadata"].get("namespace"), dep["metadata"]["name"], strip)
        if md.get("finalizers"):

            def mark_deleted(obj: dict[str, Any]) -> None:
                obj["metadata"]["deletionTimestamp"] = fmt_time()
                obj["metadata"]["deletionGracePeriodSeconds"] = 0

            updated = self.store.mutate(rt, namespace, name, mark_deleted)
            return copy.deepcopy(updated or current), False
        final = self.store.remove(rt, namespace, name)
        if propagation == "Background":
            for dep_rt, dep in self.dependents(uid):
                self._delete_quietly(dep_rt, dep, "Background")
        return final or current, True

    def _delete_quietly(self, rt: ResourceType, obj: dict[str, Any], propagation: str) -> None:
        md = obj["metadata"]
        try:
            self.delete(rt, md.get("namespace"), md["name"], propagation=propagation)
        except errors.ApiError:
            pass

    def _delete_pod(self, pod: dict[str, Any], grace: float | None) -> tuple[dict[str, Any], bool]:
        md = pod["metadata"]
        uid = md["uid"]
        grace_s = self.kubelet.grace_for(pod, grace)
        running = self.kubelet.is_active(uid)
        if md.get("deletionTimestamp"):
            if running:
                self.kubelet.kill_pod(uid, "delete", grace_s)
            if grace_s > 0 or md.get("finalizers"):
                return copy.deepcopy(pod), False
        if grace_s <= 0 or not running:
            if running:
                self.kubelet.kill_pod(uid, "delete", 0)
            if md.get("finalizers"):

                def mark(obj: dict[str, Any]) -> None:
                    obj["metadata"]["deletionTimestamp"] = fmt_time()
                    obj["metadata"]["deletionGracePeriodSeconds"] = 0

                updated = self.store.mutate(PODS, md["namespace"], md["name"], mark)
                return copy.deepcopy(updated or pod), False
            final = self.store.remove(PODS, md["namespace"], md["name"])
            if not running:
                self.kubelet.forget(uid)
            return final or pod, True

        def mark_graceful(obj: dict[str, Any]) -> None:
            when = utcnow() + _dt.timedelta(seconds=grace_s)
            obj["metadata"]["deletionTimestamp"] = fmt_time(when)
            obj["metadata"]["deletionGracePeriodSeconds"] = math.ceil(grace_s)

        updated = self.store.mutate(PODS, md["namespace"], md["name"], mark_graceful)
        self.kubelet.kill_pod(uid, "delete", grace_s)
        return copy.deepcopy(updated or pod), False

    def finish_pod_deletion(self, namespace: str, name: str, uid: str) -> None:
        """Called by the kubelet once a deleted pod's processes are gone: remove the object."""
        pod = self.store.get(PODS, namespace, name)
        if pod is None or pod["metadata"].get("uid") != uid:
            self.kubelet.forget(uid)
            return
        if not pod["metadata"].get("deletionTimestamp"):

            def mark(obj: dict[str, Any]) -> None:
                obj["metadata"]["deletionTimestamp"] = fmt_time()
                obj["metadata"]["deletionGracePeriodSeconds"] = 0

            self.store.mutate(PODS, namespace, name, mark)
        if not self.store.get(PODS, namespace, name)["metadata"].get("finalizers"):
            self.store.remove(PODS, namespace, name)
            self.kubelet.forget(uid)

    def _delete_namespace(self, ns: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        name = ns["metadata"]["name"]
        if not ns["metadata"].get("deletionTimestamp"):

            def mark(obj: dict[str, Any]) -> None:
                obj["metadata"]["deletionTimestamp"] = fmt_time()
                obj["metadata"]["deletionGracePeriodSeconds"] = 0
                obj["status"] = {"phase": "Terminating"}

            self.store.mutate(NAMESPACES, None, name, mark)
            for rt, obj in self.store.all_objects():
                if rt.namespaced and obj["metadata"].get("namespace") == name:
                    self._delete_quietly(rt, obj, "Background")
        self.controllers.wake()
        return copy.deepcopy(self.store.get(NAMESPACES, None, name) or ns), False

    def _maybe_finalize(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        md = obj["metadata"]
        if not md.get("deletionTimestamp") or md.get("finalizers"):
            return
        if rt is PODS and self.kubelet.is_active(md["uid"]):
            return
        if rt is NAMESPACES:
            return
        self.store.remove(rt, md.get("namespace"), md["name"])
        if rt is PODS:
            self.kubelet.forget(md["uid"])
        else:
            for dep_rt, dep in self.dependents(md["uid"]):
                self._delete_quietly(dep_rt, dep, "Background")

    def gc_pass(self) -> None:
        """Garbage collector: orphans whose owners are gone, foreground owners, terminating namespaces."""
        self._expire_events()
        objects = self.store.all_objects()
        uids = {obj["metadata"].get("uid") for _, obj in objects}
        has_dependents: set[str] = set()
        for rt, obj in objects:
            owners = owner_uids(obj)
            if not owners:
                continue
            has_dependents.update(owners)
            if all(o not in uids for o in owners) and not obj["metadata"].get("deletionTimestamp"):
                self._delete_quietly(rt, obj, "Background")
        for rt, obj in objects:
            md = obj["metadata"]
            if not md.get("deletionTimestamp"):
                continue
            if "foregroundDeletion" in (md.get("finalizers") or []) and md.get("uid") not in has_dependents:

                def unfinalize(o: dict[str, Any]) -> None:
                    o["metadata"]["finalizers"] = [
                        f for f in o["metadata"].get("finalizers") or [] if f != "foregroundDeletion"
                    ]
                    if not o["metadata"]["finalizers"]:
                        o["metadata"].pop("finalizers")

                updated = self.store.mutate(rt, md.get("namespace"), md["name"], unfinalize)
                if updated is not None:
                    self._maybe_finalize(rt, updated)
            elif rt is NAMESPACES:
                name = md["name"]
                remaining = [
                    (t, o)
                    for t, o in self.store.all_objects()
                    if t.namespaced and o["metadata"].get("namespace") == name
                ]
                for t, o in remaining:
                    if not o["metadata"].get("deletionTimestamp"):
                        self._delete_quietly(t, o, "Background")
                if not remaining:
                    self.store.remove(NAMESPACES, None, name)

    def _expire_events(self) -> None:
        """Drop Events older than the TTL (kube-apiserver's --event-ttl, 1 h by default)."""
        now = time.monotonic()
        if now < self._next_event_gc:
            return
        self._next_event_gc = now + 10.0
        cutoff = utcnow() - _dt.timedelta(seconds=self.event_ttl_seconds)
        for event in self.store.list(EVENTS):
            stamp = event.get("lastTimestamp") or event["metadata"].get("creationTimestamp")
            if stamp and parse_time(stamp) < cutoff:
                self.store.remove(EVENTS, event["metadata"]["namespace"], event["metadata"]["name"])

    # ------------------------------------------------------------- faults API
    def preempt_pod(self, namespace: str, name: str, grace_seconds: float | None = None) -> None:
        """See :meth:`ClusterEmulator.preempt_pod`."""
        pod = self.get(PODS, namespace, name)
        grace = self.kubelet.grace_for(pod) if grace_seconds is None else max(0.0, float(grace_seconds))
        self.kubelet.preempt(pod, grace)

    def oom_kill_pod(self, namespace: str, name: str, container: str | None = None) -> None:
        """See :meth:`ClusterEmulator.oom_kill_pod`."""
        pod = self.get(PODS, namespace, name)
        self.kubelet.oom_kill(pod, container)

    def rotate_container_log(self, namespace: str, name: str, container: str | None = None) -> None:
        """See :meth:`ClusterEmulator.rotate_container_log`."""
        self.kubelet.rotate_log(self.get(PODS, namespace, name), container)

    def evict_workload(
        self, namespace: str, name: str, reason: str = "Preempted", message: str | None = None
    ) -> None:
        """See :meth:`ClusterEmulator.evict_workload`."""
        self.controllers.kueue.evict(namespace, name, reason, message)
        self.controllers.wake()

    def set_provisioning(
        self, delay_seconds: float = 0.0, fail: bool = False, message: str | None = None
    ) -> None:
        """See :meth:`ClusterEmulator.set_provisioning`."""
        self.controllers.kueue.provisioning = {
            "delay_seconds": float(delay_seconds),
            "fail": bool(fail),
            "message": message,
        }
        self.controllers.wake()

    def stock_out(self, patterns: Sequence[str], stocked: bool = True) -> list[str]:
        """Mark the node pools ``patterns`` (fnmatch) as stocked out (``NodePool.stockout``) or
        back; the pools changed. A pattern matching no pool is a ``ValueError`` (a typo would
        silently model nothing)."""
        pools = self.node_pools
        found = {pattern: [p for p in pools if fnmatch.fnmatchcase(p.name, pattern)] for pattern in patterns}
        missing = [pattern for pattern, matched in found.items() if not matched]
        if missing:
            raise ValueError(f"stock_out: no node pool matches {', '.join(map(repr, missing))}")
        changed = []
        for matched in found.values():
            for pool in matched:
                pool.stockout = stocked
                changed.append(pool.name)
        self.scheduling_changed()
        return changed

    def scheduling_changed(self) -> None:
        """Wake pods waiting for nodes (after a scale-up delay was changed)."""
        self.kubelet.nodes_changed.set()
        self.kubelet.nodes_changed = asyncio.Event()
