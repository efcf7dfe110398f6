"""aiohttp front end: the Kubernetes REST API plus the ``/_emulator`` admin API.

Routing is generic (``/api/v1/...`` and ``/apis/{group}/{version}/...``) over
the resource table, so every resource supports the same verbs: list (with
label/field selectors and pagination), watch (``?watch=true`` or the legacy
``/watch/`` prefix, with resourceVersion replay, timeouts and bookmarks),
get, create, update, patch, delete and deletecollection.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import re
import socket
import ssl
import time
from typing import Any

import yaml
from aiohttp import web

from . import errors
from ._util import parse_time, utcnow, wait_event
from .access import access_review
from .cluster import Cluster
from .conversion import from_storage, to_storage
from .faults import ApiFault, WatchDropRule
from .kueue import cluster_queue_of, pending_workloads_summary
from .portforward import serve_portforward
from .rbac import UserInfo, authorize, forbidden, request_attributes
from .resources import (
    CLUSTERQUEUES,
    LOCALQUEUES,
    PODS,
    SELFSUBJECTACCESSREVIEWS,
    SERVICEACCOUNTS,
    VISIBILITY_LOCALQUEUES,
    VISIBILITY_TYPES,
    ResourceType,
    api_group_doc,
    api_group_list_doc,
    api_resource_list_doc,
    api_versions_doc,
    deprecation_warning,
    group_versions,
    lookup,
    openapi_v3_group_version,
    openapi_v3_root,
)
from .selectors import LabelSelector, SelectorError, parse_field_selector, parse_label_selector
from .store import Subscription, WatchEvent
from .tables import to_table, wants_table

log = logging.getLogger(__name__)

_USER = web.RequestKey("user", UserInfo)  # who sent the request (rbac.py), for access reviews

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    429: "TooManyRequests",
    500: "InternalError",
    502: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=json.dumps(data, separators=(",", ":")).encode(),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def _error_response(exc: errors.ApiError) -> web.Response:
    return _json(exc.body(), exc.code, exc.headers)


def _bool(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1", "yes")


def _int(value: str | None, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise errors.bad_request(f"invalid value for {name}: {value!r}")


# The request's ``Warning`` header value (a deprecated version), set by ``_resource`` (a typed
# request key where aiohttp has them, 3.12+; a plain string key before).
_WARNING: Any = getattr(web, "RequestKey", lambda name, _type: name)("kinetic_emulator_warning", str)


def _warning_header(text: str) -> str:
    """kube-apiserver's ``Warning: 299 - "<text>"`` (k8s.io/apiserver ``pkg/warning``, RFC 7234)."""
    return '299 - "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _wire(rt: ResourceType, obj: dict[str, Any], in_list: bool = False) -> dict[str, Any]:
    """Objects in list responses omit kind/apiVersion for built-in types, like the real server."""
    if in_list and rt.builtin:
        return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
    return obj


class _WatchStream:
    """Bookkeeping for one open watch connection (so it can be dropped or closed)."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.drop_now = asyncio.Event()


class ApiServer:
    """Serves a :class:`~.cluster.Cluster` over HTTP on one port."""

    BOOKMARK_INTERVAL = 5.0

    def __init__(
        self,
        cluster: Cluster,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.cluster = cluster
        self.host = host
        self.port = port
        self.ssl_context = ssl_context  # HTTPS, as a GKE control plane (tls.py)
        cluster.authenticator.secure = ssl_context is not None  # who a request without a token is
        self.app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        self.app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner: web.AppRunner | None = None
        self._watches: set[_WatchStream] = set()
        self._streams: set[asyncio.Task[Any]] = set()
        self._closing = asyncio.Event()
        self.log_stall_generation = 0  # bumped by stall_log_streams
        self.log_end_generation = 0  # bumped by end_log_streams

    @property
    def url(self) -> str:
        """Base URL clients use."""
        return f"{'https' if self.ssl_context else 'http'}://{self.host}:{self.port}"

    async def start(self) -> int:
        """Bind and serve; returns the port."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(128)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        self.cluster.port = self.port
        self._runner = web.AppRunner(
            self.app, access_log=None, handler_cancellation=True, shutdown_timeout=2.0
        )
        await self._runner.setup()
        site = web.SockSite(self._runner, sock, ssl_context=self.ssl_context)
        await site.start()
        return self.port

    async def stop(self) -> None:
        """Close open watches/log streams and stop serving."""
        self._closing.set()
        for watch in list(self._watches):
            watch.drop_now.set()
        for task in list(self._streams):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -------------------------------------------------------------- middleware
    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        path = request.path
        if path.startswith("/_emulator"):
            try:
                return await handler(request)
            except errors.ApiError as exc:
                return _error_response(exc)
        query = request.query_string
        watch = _bool(request.query.get("watch")) or "/watch/" in path
        seq = self.cluster.requests.add(request.method, path, query, watch=watch)
        response: web.StreamResponse
        try:
            self._authorize(request)
            full = f"{path}?{query}" if query else path
            fault = self.cluster.faults.take_api_fault(request.method, path)
            if fault is None and query:
                fault = self.cluster.faults.take_api_fault(request.method, full)
            if fault is not None:
                response = self._fault_response(fault)
            else:
                response = await handler(request)
        except errors.ApiError as exc:
            response = _error_response(exc)
        except (asyncio.CancelledError, ConnectionResetError):
            self.cluster.requests.set_status(seq, 499)
            raise
        except web.HTTPException:
            raise
        except Exception as exc:
            log.exception("emulator request failed: %s %s", request.method, path)
            response = _error_response(
                errors.ApiError(500, "InternalError", f"Internal error occurred: {exc!r}")
            )
        if request.get(_WARNING) and not response.prepared:  # a watch sets it before streaming
            response.headers["Warning"] = request[_WARNING]
        self.cluster.requests.set_status(seq, response.status)
        return response

    def _authorize(self, request: web.Request) -> None:
        """Authentication, then RBAC, before any handler runs (rbac.py); the user is kept on the
        request for SelfSubjectAccessReviews."""
        user = self.cluster.authenticator.authenticate(
            request.headers.get("Authorization"), self.cluster.store
        )
        attrs = request_attributes(user, request.method, request.path, request.query_string)
        request[_USER] = user
        allowed, reason = authorize(self.cluster.store, attrs)
        if not allowed:
            raise forbidden(attrs, reason)

    def _fault_response(self, fault: ApiFault) -> web.Response:
        reason = _REASONS.get(fault.status, "InternalError")
        headers: dict[str, str] = {}
        details: dict[str, Any] | None = None
        if fault.status == 429:
            message = fault.message or "Too many requests, please try again later."
            details = {"causes": [{"reason": "TooManyRequests", "message": message}]}
        else:
            message = fault.message or "Internal error occurred: injected fault (cluster emulator)"
        if fault.retry_after is not None:
            seconds = max(0, round(fault.retry_after))
            headers["Retry-After"] = str(seconds)
            details = details or {}
            details["retryAfterSeconds"] = seconds
        return _error_response(errors.ApiError(fault.status, reason, message, details, headers))

    # ----------------------------------------------------------------- routing
    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        segs = [s for s in path.split("/") if s]
        if segs and segs[0] == "_emulator":
            return await self._admin(request, segs[1:])
        if not segs:
            return _json({"paths": ["/api", "/api/v1", "/apis", "/version", "/healthz"]})
        if segs[0] in ("healthz", "livez", "readyz"):
            return web.Response(text="ok")
        if segs == ["version"]:
            return _json(self._version())
        if segs[0] == "openapi" and len(segs) >= 2 and segs[1] == "v3":
            if len(segs) == 2:
                return _json(openapi_v3_root(self.cluster.unserved_versions))
            if segs[2] == "api" and len(segs) == 4:
                doc = openapi_v3_group_version("", segs[3])
            elif segs[2] == "apis" and len(segs) == 5:
                doc = openapi_v3_group_version(segs[3], segs[4], self.cluster.unserved_versions)
            else:
                doc = None
            if doc is not None:
                return _json(doc)
        if segs[0] == "api":
            if len(segs) == 1:
                return _json(api_versions_doc(f"{self.host}:{self.port}"))
            if segs[1] != "v1":
                raise errors.ApiError(404, "NotFound", "the server could not find the requested resource")
            if len(segs) == 2:
                return _json(api_resource_list_doc("", "v1"))
            return await self._resource(request, "", "v1", segs[2:])
        if segs[0] == "apis":
            unserved = self.cluster.unserved_versions
            if len(segs) == 1:
                return _json(api_group_list_doc(unserved))
            group = segs[1]
            if group not in group_versions(unserved):
                raise errors.ApiError(404, "NotFound", "the server could not find the requested resource")
            if len(segs) == 2:
                return _json(api_group_doc(group, unserved))
            doc = api_resource_list_doc(group, segs[2], unserved)
            if doc is None:
                raise errors.ApiError(404, "NotFound", "the server could not find the requested resource")
            if len(segs) == 3:
                return _json(doc)
            return await self._resource(request, group, segs[2], segs[3:])
        raise errors.ApiError(404, "NotFound", "the server could not find the requested resource")

    def _version(self) -> dict[str, str]:
        major, minor = self.cluster.kubernetes_version.split(".")[:2]
        return {
            "major": major,
            "minor": minor,
            "emulationMajor": major,
            "emulationMinor": minor,
            "minCompatibilityMajor": major,
            "minCompatibilityMinor": str(max(0, int(minor) - 1)),
            "gitVersion": f"v{major}.{minor}.0-emulator",
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "go1.25.0",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    async def _resource(
        self, request: web.Request, group: str, version: str, rest: list[str]
    ) -> web.StreamResponse:
        watch_path = False
        if rest and rest[0] == "watch":
            watch_path = True
            rest = rest[1:]
        namespace: str | None = None
        unserved = self.cluster.unserved_versions
        if len(rest) >= 3 and rest[0] == "namespaces":
            candidate = lookup(group, version, rest[2], unserved)
            if candidate is not None and candidate.namespaced:
                namespace = rest[1]
                rest = rest[2:]
        if not rest:
            raise errors.ApiError(404, "NotFound", "the server could not find the requested resource")
        rt = lookup(group, version, rest[0], unserved)
        if rt is None or len(rest) > 3:
            raise errors.ApiError(404, "NotFound", "the server could not find the requested resource")
        warning = deprecation_warning(rt, version)
        if warning:
            request[_WARNING] = _warning_header(warning)
        # another served version of a custom resource: bodies converted in, objects out
        view = functools.partial(from_storage, rt, version=version)
        inbound = functools.partial(to_storage, rt, version=version)
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if (namespace is not None and not rt.namespaced) or (rt.namespaced and namespace is None and name):
            raise errors.ApiError(404, "NotFound", "the server could not find the requested resource")
        if sub is not None and sub not in rt.subresources:
            raise errors.ApiError(404, "NotFound", "the server could not find the requested resource")
        method = request.method
        q = request.query
        if rt in VISIBILITY_TYPES:
            # Kueue's visibility API server: only GET .../<queue>/pendingworkloads
            if sub != "pendingworkloads" or method != "GET":
                raise errors.ApiError(404, "NotFound", "the server could not find the requested resource")
            kueue = self.cluster.controllers.kueue
            if rt is VISIBILITY_LOCALQUEUES:
                cq = cluster_queue_of(self.cluster.store, namespace or "", name or "")
                if cq is None:
                    raise errors.not_found(LOCALQUEUES, name or "")
                lq: tuple[str, str] | None = (namespace or "", name or "")
            else:
                if self.cluster.store.get(CLUSTERQUEUES, None, name or "") is None:
                    raise errors.not_found(CLUSTERQUEUES, name or "")
                cq, lq = name or "", None
            offset = _int(q.get("offset"), "offset") or 0
            limit = _int(q.get("limit"), "limit") or 1000
            return _json(pending_workloads_summary(kueue, cq, lq, offset, limit, version))
        if rt is SELFSUBJECTACCESSREVIEWS and name is None and method == "POST":
            review = access_review(self.cluster, request[_USER], await self._body(request))
            return _json(review, 201)
        if rt is SERVICEACCOUNTS and sub == "token":
            if method != "POST":
                raise errors.method_not_allowed()
            token = self.cluster.request_token(namespace or "", name or "", await self._body(request))
            return _json(token, 201)
        if watch_path or (method == "GET" and _bool(q.get("watch"))):
            if self.cluster.faults.verb_denied("watch", rt.plural):
                raise errors.forbidden_verb("watch", rt, namespace)
            return await self._watch(request, rt, namespace, name, version)
        if name is None:
            if method == "GET":
                if self.cluster.faults.verb_denied("list", rt.plural):  # the same 403 as for watch
                    raise errors.forbidden_verb("list", rt, namespace)
                return self._list(request, rt, namespace, version)
            if method == "POST":
                body = inbound(await self._body(request))
                obj = self.cluster.create(
                    rt,
                    body,
                    namespace=namespace,
                    strict=self._strict(request),
                    dry_run=q.get("dryRun") == "All",
                )
                return _json(view(obj), 201)
            if method == "DELETE":
                return await self._delete_collection(request, rt, namespace)
            raise errors.method_not_allowed()
        if sub == "portforward":  # a WebSocket upgrade (GET, or POST as kubectl sends): portforward.py
            return await serve_portforward(self.cluster, request, namespace or "", name)
        if sub == "log":
            if method != "GET":
                raise errors.method_not_allowed()
            return await self._log(request, namespace or "", name)
        if method == "GET":
            obj = self.cluster.get(rt, namespace, name)
            if wants_table(request.headers.get("Accept", "")):
                meta = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
                return _json(to_table(rt, [obj], meta, q.get("includeObject", "Metadata")))
            return _json(view(obj))
        if method == "PUT":
            body = inbound(await self._body(request))
            obj = self.cluster.update(
                rt,
                namespace,
                name,
                body,
                subresource=sub,
                strict=self._strict(request),
                dry_run=q.get("dryRun") == "All",
            )
            return _json(view(obj))
        if method == "PATCH":
            raw = self._patch_in(rt, version, request.headers.get("Content-Type", ""), await request.read())
            obj, created = self.cluster.patch(
                rt,
                namespace,
                name,
                request.headers.get("Content-Type", "application/merge-patch+json"),
                raw,
                subresource=sub,
                strict=self._strict(request),
                dry_run=q.get("dryRun") == "All",
            )
            return _json(view(obj), 201 if created else 200)
        if method == "DELETE":
            if sub is not None:
                raise errors.method_not_allowed()
            return await self._delete(request, rt, namespace, name)
        raise errors.method_not_allowed()

    @staticmethod
    def _patch_in(rt: ResourceType, version: str, content_type: str, raw: bytes) -> bytes:
        """A merge or apply patch sent in another served version, its fields renamed to the storage
        version's (a partial object converts as a whole one does); a JSON patch passes as it is."""
        if version == rt.version or "json-patch" in content_type or not raw:
            return raw
        try:
            body = yaml.safe_load(raw.decode()) if "yaml" in content_type else json.loads(raw)
        except (ValueError, yaml.YAMLError):
            return raw  # the patch's own parser names the problem
        return json.dumps(to_storage(rt, body, version)).encode()

    @staticmethod
    def _strict(request: web.Request) -> bool:
        return request.query.get("fieldValidation", "Strict") not in ("Ignore", "Warn")

    @staticmethod
    async def _body(request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        try:
            if "yaml" in request.headers.get("Content-Type", ""):
                return yaml.safe_load(raw.decode())
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise errors.bad_request(f"error decoding request body: {exc}")

    # -------------------------------------------------------------------- list
    @staticmethod
    def _selectors(request: web.Request) -> tuple[LabelSelector, Any]:
        try:
            return (
                parse_label_selector(request.query.get("labelSelector")),
                parse_field_selector(request.query.get("fieldSelector")),
            )
        except SelectorError as exc:
            raise errors.bad_request(f"unable to parse requirement: {exc}")

    def _list(
        self, request: web.Request, rt: ResourceType, namespace: str | None, version: str | None = None
    ) -> web.Response:
        labels, fields = self._selectors(request)
        q = request.query
        items = [
            o
            for o in self.cluster.store.list(rt, namespace)
            if labels.matches(o["metadata"].get("labels")) and fields.matches(o)
        ]
        rv = self.cluster.store.resource_version
        offset = 0
        token = q.get("continue")
        if token:
            try:
                state = json.loads(base64.urlsafe_b64decode(token.encode()).decode())
                offset = int(state["offset"])
            except (ValueError, KeyError, TypeError):
                raise errors.bad_request("continue key is not valid")
        limit = _int(q.get("limit"), "limit") or 0
        page = items[offset : offset + limit] if limit > 0 else items[offset:]
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if limit > 0 and offset + limit < len(items):
            meta["continue"] = base64.urlsafe_b64encode(
                json.dumps({"offset": offset + limit, "rv": rv}).encode()
            ).decode()
            meta["remainingItemCount"] = len(items) - offset - limit
        if wants_table(request.headers.get("Accept", "")):
            return _json(to_table(rt, page, meta, q.get("includeObject", "Metadata")))
        version = version or rt.version
        return _json(
            {
                "kind": rt.list_kind,
                "apiVersion": f"{rt.group}/{version}" if rt.group else version,
                "metadata": meta,
                "items": [_wire(rt, from_storage(rt, o, version), in_list=True) for o in page],
            }
        )

    # ------------------------------------------------------------------ delete
    async def _delete_options(self, request: web.Request) -> dict[str, Any]:
        options: dict[str, Any] = {}
        body = await self._body(request)
        if isinstance(body, dict):
            options.update(body)
        q = request.query
        if "gracePeriodSeconds" in q:
            options["gracePeriodSeconds"] = _int(q.get("gracePeriodSeconds"), "gracePeriodSeconds")
        if "propagationPolicy" in q:
            options["propagationPolicy"] = q["propagationPolicy"]
        if "orphanDependents" in q:
            options["orphanDependents"] = _bool(q.get("orphanDependents"))
        if "dryRun" in q:
            options["dryRun"] = q.getall("dryRun")
        return options

    @staticmethod
    def _propagation(options: dict[str, Any]) -> str | None:
        policy = options.get("propagationPolicy")
        if policy is None and options.get("orphanDependents") is not None:
            policy = "Orphan" if options["orphanDependents"] else "Background"
        return policy

    async def _delete(
        self, request: web.Request, rt: ResourceType, namespace: str | None, name: str
    ) -> web.Response:
        options = await self._delete_options(request)
        obj, removed = self.cluster.delete(
            rt,
            namespace,
            name,
            propagation=self._propagation(options),
            grace=options.get("gracePeriodSeconds"),
            preconditions=options.get("preconditions"),
            dry_run="All" in (options.get("dryRun") or []),
        )
        if removed and rt is not PODS:
            details: dict[str, Any] = {"name": name}
            if rt.group:
                details["group"] = rt.group
            details["kind"] = rt.plural
            details["uid"] = obj["metadata"].get("uid", "")
            return _json(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": details,
                }
            )
        return _json(obj)

    async def _delete_collection(
        self, request: web.Request, rt: ResourceType, namespace: str | None
    ) -> web.Response:
        labels, fields = self._selectors(request)
        options = await self._delete_options(request)
        deleted = []
        for obj in list(self.cluster.store.list(rt, namespace)):
            if not (labels.matches(obj["metadata"].get("labels")) and fields.matches(obj)):
                continue
            md = obj["metadata"]
            with contextlib.suppress(errors.ApiError):
                result, _ = self.cluster.delete(
                    rt,
                    md.get("namespace"),
                    md["name"],
                    propagation=self._propagation(options),
                    grace=options.get("gracePeriodSeconds"),
                    dry_run="All" in (options.get("dryRun") or []),
                )
                deleted.append(_wire(rt, result, in_list=True))
        return _json(
            {
                "kind": rt.list_kind,
                "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": str(self.cluster.store.resource_version)},
                "items": deleted,
            }
        )

    # ------------------------------------------------------------------- watch
    async def _watch(
        self,
        request: web.Request,
        rt: ResourceType,
        namespace: str | None,
        name: str | None,
        version: str | None = None,
    ) -> web.StreamResponse:
        q = request.query
        labels, fields = self._selectors(request)
        timeout = _int(q.get("timeoutSeconds"), "timeoutSeconds")
        bookmarks = _bool(q.get("allowWatchBookmarks"))
        send_initial = _bool(q.get("sendInitialEvents"))
        rv_param = q.get("resourceVersion") or ""
        store = self.cluster.store

        def matches(obj: dict[str, Any] | None) -> bool:
            if obj is None:
                return False
            if name is not None and obj["metadata"].get("name") != name:
                return False
            return labels.matches(obj["metadata"].get("labels")) and fields.matches(obj)

        # Snapshot + subscription happen in the same loop step: nothing can slip between.
        if rv_param and rv_param != "0" and not send_initial:
            try:
                since = int(rv_param)
            except ValueError:
                raise errors.bad_request(f"invalid resource version: {rv_param}")
            if since < store.oldest_replayable_rv():
                initial: list[tuple[str, dict[str, Any], int]] | None = None
            else:
                initial = []
                for ev in store.history_since(since, rt, namespace):
                    converted = self._convert(ev, matches)
                    if converted is not None:
                        initial.append((converted[0], converted[1], ev.rv))
            last_rv = since = store.resource_version
        else:
            initial = [("ADDED", obj, 0) for obj in store.list(rt, namespace) if matches(obj)]
            last_rv = store.resource_version
            since = last_rv
        sub = store.subscribe(rt, namespace)
        stream = _WatchStream(request)
        self._watches.add(stream)
        task = asyncio.current_task()
        if task is not None:
            self._streams.add(task)
        drop_after = self.cluster.faults.claim_watch_drop()
        version = version or rt.version
        headers = {"Content-Type": "application/json"}
        if request.get(_WARNING):
            headers["Warning"] = request[_WARNING]
        response = web.StreamResponse(status=200, headers=headers)
        response.enable_chunked_encoding()
        sent = 0
        try:
            await response.prepare(request)
            if drop_after == 0:
                return self._abort(request, response)
            if initial is None:
                gone = errors.gone(
                    f"too old resource version: {rv_param} ({store.oldest_replayable_rv() + 1})"
                )
                await self._write_event(response, "ERROR", gone.body())
                await response.write_eof()
                return response
            for etype, obj, _ in initial:
                await self._write_event(response, etype, from_storage(rt, obj, version))
                sent += 1
                if drop_after is not None and sent >= drop_after:
                    return self._abort(request, response)
            if send_initial and bookmarks:
                await self._write_event(
                    response,
                    "BOOKMARK",
                    self._bookmark(rt, last_rv, {"k8s.io/initial-events-end": "true"}),
                )
            deadline = time.monotonic() + timeout if timeout else None
            next_bookmark = time.monotonic() + self.BOOKMARK_INTERVAL
            while True:
                if self._closing.is_set():
                    break
                now = time.monotonic()
                wait = 1.0
                if deadline is not None:
                    if now >= deadline:
                        break
                    wait = min(wait, deadline - now)
                if bookmarks:
                    wait = min(wait, max(0.0, next_bookmark - now))
                event = await self._next_event(sub, stream, wait)
                if stream.drop_now.is_set():
                    return self._abort(request, response)
                transport = request.transport
                if transport is None or transport.is_closing():
                    break
                if event is None:
                    if bookmarks and time.monotonic() >= next_bookmark:
                        await self._write_event(response, "BOOKMARK", self._bookmark(rt, last_rv))
                        next_bookmark = time.monotonic() + self.BOOKMARK_INTERVAL
                    continue
                if event.rv <= since:
                    continue
                last_rv = event.rv
                converted = self._convert(event, matches)
                if converted is None:
                    continue
                await self._write_event(response, converted[0], from_storage(rt, converted[1], version))
                sent += 1
                if drop_after is not None and sent >= drop_after:
                    return self._abort(request, response)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        finally:
            store.unsubscribe(sub)
            self._watches.discard(stream)
            if task is not None:
                self._streams.discard(task)
        return response

    @staticmethod
    def _abort(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
        """Drop the connection without finishing the chunked body (a network-level cut)."""
        transport = request.transport
        if transport is not None:
            transport.abort()
        return response

    @staticmethod
    async def _next_event(sub: Subscription, stream: _WatchStream, wait: float) -> WatchEvent | None:
        if not sub.queue.empty():
            return sub.queue.get_nowait()
        getter = asyncio.ensure_future(sub.queue.get())
        dropper = asyncio.ensure_future(stream.drop_now.wait())
        try:
            done, _ = await asyncio.wait(
                {getter, dropper}, timeout=max(0.0, wait), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            dropper.cancel()
            if not getter.done():
                getter.cancel()
        if getter in done and not getter.cancelled():
            return getter.result()
        return None

    @staticmethod
    def _convert(event: WatchEvent, matches: Any) -> tuple[str, dict[str, Any]] | None:
        """Map a store event onto a filtered watch (objects entering/leaving the selector: ADDED/DELETED)."""
        now_in = matches(event.obj)
        was_in = matches(event.old) if event.old is not None else False
        if event.type == "ADDED":
            return ("ADDED", event.obj) if now_in else None
        if event.type == "DELETED":
            return ("DELETED", event.obj) if (was_in or now_in) else None
        if now_in and was_in:
            return ("MODIFIED", event.obj)
        if now_in:
            return ("ADDED", event.obj)
        if was_in:
            return ("DELETED", event.obj)
        return None

    @staticmethod
    def _bookmark(rt: ResourceType, rv: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if annotations:
            meta["annotations"] = annotations
        return {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}

    @staticmethod
    async def _write_event(response: web.StreamResponse, etype: str, obj: dict[str, Any]) -> None:
        line = json.dumps({"type": etype, "object": obj}, separators=(",", ":")) + "\n"
        await response.write(line.encode())

    # --------------------------------------------------------------------- logs
    async def _log(self, request: web.Request, namespace: str, name: str) -> web.StreamResponse:
        pod = self.cluster.get(PODS, namespace, name)
        q = request.query
        spec = pod.get("spec") or {}
        names = [c["name"] for c in spec.get("containers") or []]
        init_names = [c["name"] for c in spec.get("initContainers") or []]
        container = q.get("container")
        if not container:
            if len(names) != 1:
                msg = f"a container name must be specified for pod {name}, choose one of: [{' '.join(names)}]"
                if init_names:
                    msg += f" or one of the init containers: [{' '.join(init_names)}]"
                raise errors.bad_request(msg)
            container = names[0]
        if container not in names and container not in init_names:
            raise errors.bad_request(f"container {container} is not valid for pod {name}")
        runtime = self.cluster.kubelet.runtime_for(pod["metadata"]["uid"])
        if runtime is None or not spec.get("nodeName"):
            return web.Response(body=b"", content_type="text/plain")
        state = runtime.containers.get(container) or runtime.init_containers.get(container)
        if state is None or not state.logs:
            waiting = ((state.state if state else {}) or {}).get("waiting") or {}
            reason = waiting.get("reason") or "ContainerCreating"
            if reason in ("ErrImagePull", "ImagePullBackOff"):
                reason = "trying and failing to pull image"
            raise errors.bad_request(f'container "{container}" in pod "{name}" is waiting to start: {reason}')
        previous = _bool(q.get("previous"))
        if previous:
            # The kubelet reads the run recorded in lastState.terminated (during a
            # CrashLoopBackOff that is the run that just exited).
            if state.last_log is None:
                raise errors.bad_request(
                    f'previous terminated container "{container}" in pod "{name}" not found'
                )
            log_file = state.last_log
        else:
            log_file = state.logs[-1]
        follow = _bool(q.get("follow")) and not previous
        timestamps = _bool(q.get("timestamps"))
        tail = _int(q.get("tailLines"), "tailLines")
        limit_bytes = _int(q.get("limitBytes"), "limitBytes")
        stream_filter = (q.get("stream") or "All").lower()
        since: Any = None
        if q.get("sinceTime"):
            try:
                # Whole seconds: the API server passes sinceTime on to the kubelet formatted as
                # RFC 3339 without fractions (kubernetes pkg/registry/core/pod/strategy.go,
                # LogLocation: opts.SinceTime.Format(time.RFC3339)).
                since = parse_time(q["sinceTime"]).replace(microsecond=0)
            except ValueError:
                raise errors.bad_request(f"invalid sinceTime {q['sinceTime']!r}")
        elif q.get("sinceSeconds"):
            seconds = _int(q.get("sinceSeconds"), "sinceSeconds") or 0
            since = utcnow().timestamp() - seconds

        def keep(record: Any) -> bool:
            if stream_filter in ("stdout", "stderr") and record.stream != stream_filter:
                return False
            if since is None:
                return True
            if isinstance(since, float):
                return record.time.timestamp() >= since
            return record.time >= since

        records, offset = log_file.read(log_file.current_start)  # the current file only
        records = [r for r in records if keep(r)]
        if tail is not None:
            records = records[-tail:] if tail > 0 else []
        data = b"".join(r.render(timestamps) for r in records)
        budget = limit_bytes
        if budget is not None:
            data = data[:budget]
            budget -= len(data)
        if not follow or (budget is not None and budget <= 0):
            return web.Response(body=data, content_type="text/plain")
        response = web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
        response.enable_chunked_encoding()
        task = asyncio.current_task()
        if task is not None:
            self._streams.add(task)
        stall_generation, end_generation = self.log_stall_generation, self.log_end_generation
        try:
            await response.prepare(request)
            if data:
                await response.write(data)
            while not self._closing.is_set():
                if self.log_end_generation != end_generation:
                    break  # a clean end while the container runs (a proxy's or server's timeout)
                if self.log_stall_generation != stall_generation:
                    # Half-open: the connection stays up and nothing more arrives, as when a
                    # NAT gateway forgets an idle connection (no FIN, no RST reaches the client).
                    await asyncio.sleep(0.5)
                    if request.transport is None or request.transport.is_closing():
                        break
                    continue
                changed = log_file.changed
                new, offset = log_file.read(offset)
                chunk = b"".join(r.render(timestamps) for r in new if keep(r))
                if chunk:
                    if budget is not None:
                        chunk = chunk[:budget]
                        budget -= len(chunk)
                    await response.write(chunk)
                    if budget is not None and budget <= 0:
                        break
                if log_file.done:
                    tail_records, offset = log_file.read(offset)
                    rest = b"".join(r.render(timestamps) for r in tail_records if keep(r))
                    if rest:
                        await response.write(rest if budget is None else rest[:budget])
                    break
                transport = request.transport
                if transport is None or transport.is_closing():
                    break
                await wait_event(changed, 1.0)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        finally:
            if task is not None:
                self._streams.discard(task)
        return response

    # -------------------------------------------------------------------- admin
    async def _admin(self, request: web.Request, segs: list[str]) -> web.Response:
        method = request.method
        body = await self._body(request) if method in ("POST", "PUT") else None
        body = body if isinstance(body, dict) else {}
        faults = self.cluster.faults
        route = "/".join(segs)
        if route == "health" and method == "GET":
            return _json(
                {"status": "ok", "url": self.url, "kubernetesVersion": self.cluster.kubernetes_version}
            )
        if route == "requests":
            if method == "GET":
                since = _int(request.query.get("since"), "since") or 0
                records = self.cluster.requests.since(since)
                return _json(
                    {"count": self.cluster.requests.count, "requests": [r.to_dict() for r in records]}
                )
            if method == "DELETE":
                self.cluster.requests.clear()
                return _json({"count": self.cluster.requests.count})
        if route == "processes" and method == "GET":
            return _json({"processes": self.cluster.kubelet.processes()})
        if route == "node-pools" and method == "GET":
            return _json(
                {
                    "nodePools": [
                        {
                            "name": p.name,
                            "labels": p.labels,
                            "taints": [t.to_dict() for t in p.taint_objects()],
                            "nodeCount": p.node_count,
                            "maxRunSeconds": p.max_run_seconds,
                        }
                        for p in self.cluster.node_pools
                    ]
                }
            )
        match = re.fullmatch(r"pods/([^/]+)/([^/]+)/(preempt|oom|rotate-log)", route)
        if match and method == "POST":
            ns, pod, action = match.groups()
            try:
                if action == "preempt":
                    grace = body.get("grace_seconds", body.get("graceSeconds"))
                    self.cluster.preempt_pod(ns, pod, None if grace is None else float(grace))
                elif action == "rotate-log":
                    self.cluster.rotate_container_log(ns, pod, body.get("container"))
                else:
                    self.cluster.oom_kill_pod(ns, pod, body.get("container"))
            except LookupError as exc:
                raise errors.ApiError(409, "Conflict", str(exc))
            return _json({"status": "ok"})
        match = re.fullmatch(r"workloads/([^/]+)/([^/]+)/evict", route)
        if match and method == "POST":
            try:
                self.cluster.evict_workload(
                    match.group(1),
                    match.group(2),
                    str(body.get("reason") or "Preempted"),
                    body.get("message"),
                )
            except LookupError as exc:
                raise errors.ApiError(404, "NotFound", str(exc))
            return _json({"status": "ok"})
        if route == "kueue/provisioning" and method == "POST":
            self.cluster.set_provisioning(
                float(body.get("delay_seconds", body.get("delaySeconds", 0)) or 0),
                bool(body.get("fail", False)),
                body.get("message"),
            )
            return _json({"status": "ok"})
        if route == "faults" and method == "DELETE":
            faults.clear()
            self.cluster.scheduling_changed()
            return _json({"status": "ok"})
        if route == "faults/image-pull":
            if method == "POST":
                pattern = body.get("pattern") or body.get("image")
                if not pattern:
                    raise errors.bad_request("pattern is required")
                compiled = re.compile(pattern) if body.get("regex") else pattern
                with faults.lock:
                    if body.get("times") is None:
                        faults.image_pull_patterns.append(compiled)
                    else:
                        faults.image_pull_transient.append([compiled, int(body["times"])])
                return _json({"status": "ok"})
            if method == "DELETE":
                with faults.lock:
                    faults.image_pull_patterns.clear()
                    faults.image_pull_transient.clear()
                return _json({"status": "ok"})
        if route == "faults/deny-verb" and method == "POST":
            with faults.lock:
                faults.denied_verbs.append((str(body.get("verb") or "watch"), body.get("resource")))
            return _json({"status": "ok"})
        if route == "faults/exit-report-delay" and method == "POST":
            with faults.lock:
                faults.exit_report_delay = max(0.0, float(body.get("seconds", 0)))
            return _json({"status": "ok"})
        if route == "node-pools/stockout" and method == "POST":
            try:
                pools = [str(p) for p in body.get("pools") or []]
                changed = self.cluster.stock_out(pools, bool(body.get("stocked", True)))
            except ValueError as exc:
                return _json({"status": "error", "message": str(exc)}, status=404)
            return _json({"status": "ok", "changed": changed})
        if route == "faults/scheduling-delay" and method == "POST":
            seconds = float(body.get("seconds", 0))
            with faults.lock:
                faults.scale_up_seconds = seconds
                faults.scale_up_until = time.monotonic() + seconds if seconds > 0 else 0.0
            self.cluster.scheduling_changed()
            return _json({"status": "ok"})
        if route == "faults/api":
            if method == "POST":
                count = body.get("count", 1)
                with faults.lock:
                    faults.api_faults.append(
                        ApiFault(
                            method=str(body.get("method", "*")),
                            path_regex=re.compile(body.get("path_regex", body.get("pathRegex", ".*"))),
                            status=int(body.get("status", 500)),
                            remaining=None if count is None else int(count),
                            retry_after=body.get("retry_after", body.get("retryAfter")),
                            message=body.get("message"),
                        )
                    )
                return _json({"status": "ok"})
            if method == "DELETE":
                with faults.lock:
                    faults.api_faults.clear()
                return _json({"status": "ok"})
        if route == "faults/log-stall" and method == "POST":
            self.stall_log_streams()
            return _json({"status": "ok"})
        if route == "faults/log-end" and method == "POST":
            self.end_log_streams()
            return _json({"status": "ok"})
        if route == "faults/watch-drop" and method == "POST":
            after = body.get("after_events", body.get("afterEvents"))
            streams = body.get("streams", 1)
            self.drop_watches(
                None if after is None else int(after), None if streams is None else int(streams)
            )
            return _json({"status": "ok"})
        raise errors.ApiError(404, "NotFound", f"unknown emulator admin endpoint {method} /_emulator/{route}")

    def stall_log_streams(self) -> None:
        """Every log stream open now goes silent without closing (see ``_log``); new ones work."""
        self.log_stall_generation += 1

    def end_log_streams(self) -> None:
        """Every log stream open now ends cleanly, though its container runs; new ones work."""
        self.log_end_generation += 1

    def drop_watches(self, after_events: int | None, streams: int | None = 1) -> None:
        """``None``: cut every open watch now; else cut the next ``streams`` watches after N events."""
        if after_events is None:
            for watch in list(self._watches):
                watch.drop_now.set()
            return
        with self.cluster.faults.lock:
            self.cluster.faults.watch_drop = WatchDropRule(after_events, streams)
