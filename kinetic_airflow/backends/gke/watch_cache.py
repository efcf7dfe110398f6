"""One list+watch of kinetic's Jobs and Pods per cluster and namespace, shared by all triggers.

Two hundred deferred tasks must not mean two hundred pollers: every trigger in
a triggerer process that watches jobs of the same cluster and namespace reads
from one in-memory copy kept current by two long-lived watch requests
(``app=kinetic`` Jobs and Pods). A dropped watch resumes from the last
resourceVersion; a ``410 Gone`` relists; errors back off. The cache stops
itself when nobody has asked for anything for a while.

Locks here guard dicts and sets only: no lock is held across a call that can block, start a
thread or yield. Under Airflow's triggerer every trigger runs on one thread, and a synchronous
call that needs the supervisor (a connection look-up) is suspended by greenback while the loop
runs other triggers; one of them taking a lock held across that call blocks the loop for ever.
``tests/test_lock_discipline.py`` checks the rule for every lock of the package.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
import time
from typing import Any

from kinetic_airflow.backends.gke import client
from kinetic_airflow.backends.gke.client import ApiError, KubeApi, cluster_key, kube_api

__all__ = ["ClusterWatch", "ashared_watch", "cached_watch", "shared_watch", "wait_event"]

log = logging.getLogger(__name__)

JOB_SELECTOR = "app=kinetic"
LWS_SELECTOR = "app=kinetic-pathways"  # kinetic's own label for its LeaderWorkerSets and their pods
MULTISLICE_SELECTOR = "app=kinetic-multislice"  # JobSets (backends.gke.jobset_manifest) and their pods
POD_SELECTOR = "app in (kinetic,kinetic-pathways,kinetic-multislice)"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
FAILED_CREATE = "reason=FailedCreate"
_WATCH_TIMEOUT_SECONDS = 240
_IDLE_STOP_SECONDS = 300.0


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Whether ``event`` is set within ``timeout`` seconds; a cancellation always propagates.

    Not ``asyncio.wait_for(event.wait(), timeout)``: before Python 3.12 it swallows a
    cancellation that arrives in the loop iteration in which the event is set (it returns the
    inner result instead, python/cpython#86296). A trigger's change event is set by every log
    line, so a triggerer cancelling two hundred triggers lost some of those cancellations and
    the triggers ran on. ``asyncio.wait`` never swallows one.
    """
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        done, _ = await asyncio.wait({waiter}, timeout=max(0.0, timeout))
    finally:
        waiter.cancel()
    return bool(done)


def _forbidden_text(exc: ApiError, verb: str, path: str) -> str:
    """What a 403 means for the user: the API server's own sentence names the verb and resource."""
    try:
        said = json.loads(exc.body).get("message") or ""
    except (ValueError, AttributeError):
        said = exc.body or ""
    return (
        f"forbidden: the cluster refused to let this identity {verb} {path} ({said or exc.reason}). "
        f"The Role bound to it needs the verbs get, list and watch on the resource (watch is what "
        f"keeps the shared cache current); kinetic-airflow doctor --print-rbac prints that Role"
    )


class _Collection(threading.Thread):
    """Keeps ``objects`` (name -> dict) in step with the API for one resource type.

    A 403 (RBAC without ``list`` or ``watch``) is not retried into a stale cache that calls
    itself synced: ``forbidden`` says which verb was refused, ``synced`` is cleared, and
    watchers are woken to report it. ``required=False`` (the FailedCreate events) only loses
    that collection's information.
    """

    def __init__(
        self,
        owner: ClusterWatch,
        path: str,
        selector: str = "",
        *,
        field_selector: str = "",
        required: bool = True,
    ) -> None:
        super().__init__(name=f"kinetic-watch{path}", daemon=True)
        self.owner = owner
        self.path = path
        self.selector = selector
        self.field_selector = field_selector
        self.required = required
        self.objects: dict[str, dict[str, Any]] = {}
        self.synced = threading.Event()
        self.resource_version: str | None = None
        self.lock = threading.Lock()
        self.forbidden: str | None = None

    def _selectors(self) -> dict[str, str]:
        query = {"labelSelector": self.selector} if self.selector else {}
        if self.field_selector:
            query["fieldSelector"] = self.field_selector
        return query

    def _relist(self) -> None:
        try:
            listing = self.owner.api.request("GET", self.path, query=self._selectors())
        except ApiError as exc:
            if exc.status == 403:
                raise _Forbidden(_forbidden_text(exc, "list", self.path)) from exc
            raise
        with self.lock:
            self.objects = {item["metadata"]["name"]: item for item in listing.get("items", [])}
        self.resource_version = listing.get("metadata", {}).get("resourceVersion")
        self.synced.set()
        self.owner.sync_changed()
        self.owner.notify(None)  # changes missed while the watch was down are in this listing

    def _watch_once(self) -> None:
        try:
            response = self.owner.api.request(
                "GET",
                self.path,
                query={
                    **self._selectors(),
                    "watch": "true",
                    "resourceVersion": self.resource_version,
                    "allowWatchBookmarks": "true",
                    "timeoutSeconds": _WATCH_TIMEOUT_SECONDS,
                },
                stream=True,
                timeout=(10, _WATCH_TIMEOUT_SECONDS + 30),
            )
        except ApiError as exc:
            if exc.status == 403:
                raise _Forbidden(_forbidden_text(exc, "watch", self.path)) from exc
            raise
        if self.forbidden is not None:  # the verb is granted again: trust the cache once more
            self.forbidden = None
            self.synced.set()
            self.owner.sync_changed()
        buffer = b""
        try:
            for chunk in response.stream(65536, decode_content=True):
                if self.owner.stopped.is_set():
                    return
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        self._apply(json.loads(line))
        finally:
            response.release_conn()

    def _apply(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            raise ApiError(code or 500, obj.get("reason", "WatchError"), json.dumps(obj))
        rv = obj.get("metadata", {}).get("resourceVersion")
        if rv:
            self.resource_version = rv
        if kind == "BOOKMARK":
            return
        name = obj["metadata"]["name"]
        with self.lock:
            if kind == "DELETED":
                self.objects.pop(name, None)
            else:
                self.objects[name] = obj
        involved = obj.get("involvedObject") or {}
        if involved:  # an event: about a Job "<name>" or a StatefulSet "<lws>" / "<lws>-<group>"
            about = str(involved.get("name") or "")
            self.owner.notify(about)
            self.owner.notify(re.sub(r"-\d+$", "", about))
            return
        # A Job is known by its name, a pod by the job-name label the Job controller gives it (a
        # JobSet's pod by its JobSet: its job-name is the slice's child Job).
        labels = obj["metadata"].get("labels", {})
        self.owner.notify(labels.get(JOBSET_NAME_LABEL) or labels.get("job-name") or name)

    def run(self) -> None:
        backoff = 0.2
        while not self.owner.stopped.is_set():
            try:
                if self.resource_version is None:
                    self._relist()
                self._watch_once()
                backoff = 0.2
            except _Forbidden as exc:
                first = self.forbidden is None
                self.forbidden = str(exc)
                self.synced.clear()
                self.resource_version = None  # granted again later: relist, do not trust old state
                if first:
                    log.warning("%s", exc)
                    self.owner.sync_changed()  # who awaits the first listing must stop waiting
                    self.owner.notify(None)  # every watcher of this namespace must hear it
                self.owner.stopped.wait(backoff)
                backoff = min(backoff * 2, 15.0)
            except ApiError as exc:
                if exc.status == 410:  # our resourceVersion is too old: start over
                    self.resource_version = None
                    continue
                log.warning("watch of %s failed (%s); retrying in %.1fs", self.path, exc, backoff)
                self.owner.stopped.wait(backoff)
                backoff = min(backoff * 2, 15.0)
                self.resource_version = None if exc.status in (0, 500) else self.resource_version
            except Exception as exc:  # a dropped connection: resume from the last version
                log.info("watch of %s interrupted (%s); resuming", self.path, exc)
                self.owner.stopped.wait(backoff)
                backoff = min(backoff * 2, 15.0)

    def get(self, name: str) -> dict[str, Any] | None:
        with self.lock:
            return self.objects.get(name)

    def select(self, label: str, value: str) -> list[dict[str, Any]]:
        with self.lock:
            return [o for o in self.objects.values() if o["metadata"].get("labels", {}).get(label) == value]

    def about(self, names: set[str]) -> list[dict[str, Any]]:
        """Events whose involvedObject is one of ``names``."""
        with self.lock:
            return [o for o in self.objects.values() if (o.get("involvedObject") or {}).get("name") in names]


class _Forbidden(Exception):
    """A 403 on list or watch; the text names the refused verb and what the Role must grant."""


class ClusterWatch:
    def __init__(self, api: KubeApi, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.stopped = threading.Event()
        self.last_used = time.monotonic()
        # job name -> (loop, event) of the watchers waiting for that job to change
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._waiters_lock = threading.Lock()
        # (loop, event) of the coroutines in ``await_synced``: set whenever a collection lists,
        # is refused by RBAC, or the watch stops (guarded by _waiters_lock too)
        self._sync_waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self.jobs = _Collection(self, KubeApi.jobs_path(namespace), JOB_SELECTOR)
        self.pods = _Collection(self, KubeApi.pods_path(namespace), POD_SELECTOR)
        # Why pods are missing: the Job and StatefulSet controllers' FailedCreate events (quota,
        # admission, service account). Rare, so cheap to keep; without RBAC on events a refused
        # pod is still caught by startup_timeout, only less precisely.
        self.events = _Collection(
            self, f"/api/v1/namespaces/{namespace}/events", field_selector=FAILED_CREATE, required=False
        )
        self.groups: _Collection | None = None  # LeaderWorkerSets, watched once a job needs them
        self.jobsets: _Collection | None = None  # JobSets (multislice), likewise
        self._groups_lock = threading.Lock()

    def start(self) -> None:
        self.jobs.start()
        self.pods.start()
        self.events.start()

    def _collections(self) -> list[_Collection]:
        return [c for c in (self.jobs, self.pods, self.groups, self.jobsets) if c is not None]

    @property
    def forbidden(self) -> str | None:
        """Why the cache cannot be trusted, if RBAC refused a list or watch it needs."""
        return next((c.forbidden for c in self._collections() if c.forbidden), None)

    def failed_creates(self, names: set[str]) -> list[dict[str, Any]]:
        """FailedCreate events about the objects ``names``, oldest first."""
        self.last_used = time.monotonic()
        found = self.events.about(names)
        return sorted(found, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    def _all_listed(self) -> bool:
        return all(c.synced.is_set() for c in self._collections())

    def wait_synced(self, timeout: float = 30.0) -> bool:
        """Whether every needed collection has listed within ``timeout``; False at once when RBAC
        refuses one (``forbidden``), which no amount of waiting mends.

        Blocks its thread: for synchronous callers only. A trigger uses ``await_synced``.
        """
        deadline = time.monotonic() + timeout
        for collection in self._collections():
            while not collection.synced.wait(max(0.0, min(0.2, deadline - time.monotonic()))):
                if self.forbidden is not None or time.monotonic() >= deadline:
                    return False
        return True

    async def await_synced(self, timeout: float = 30.0) -> bool:
        """``wait_synced`` on the event loop: the caller sleeps on an ``asyncio.Event`` that the
        watch threads set, and no worker thread waits for it.

        A triggerer restarted with forty deferred jobs starts forty triggers at once while the
        namespace's watch makes its first listing (or relists after a 410). Parking a thread of
        the loop's default executor per trigger for that time would starve every other blocking
        call the triggerer makes there (storage reads, token refreshes, connection look-ups);
        here they all wait on the loop for free. False when ``timeout`` passes, RBAC refuses a
        listing (``forbidden``) or the watch is stopped; the caller then reads directly.
        """
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        entry = (loop, woken)
        deadline = loop.time() + timeout
        with self._waiters_lock:
            self._sync_waiters.add(entry)
        try:
            while True:
                woken.clear()  # before looking: a change after the look sets it again
                if self.forbidden is not None or self.stopped.is_set():
                    return False
                if self._all_listed():
                    return True
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                await wait_event(woken, remaining)
        finally:
            with self._waiters_lock:
                self._sync_waiters.discard(entry)

    def sync_changed(self) -> None:
        """Wake every ``await_synced`` (called from the watch threads, and by ``stop``)."""
        with self._waiters_lock:
            waiters = list(self._sync_waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # that loop has closed meanwhile
                loop.call_soon_threadsafe(event.set)

    def job(self, name: str) -> dict[str, Any] | None:
        self.last_used = time.monotonic()
        return self.jobs.get(name)

    def watch_groups(self, path: str) -> None:
        """Start watching LeaderWorkerSets at ``path`` (their API version comes from discovery)."""
        if self.groups is not None:
            return
        candidate = _Collection(self, path, LWS_SELECTOR)
        with self._groups_lock:
            won = self.groups is None
            if won:
                self.groups = candidate
        if won:
            candidate.start()

    def group(self, name: str) -> dict[str, Any] | None:
        self.last_used = time.monotonic()
        return self.groups.get(name) if self.groups is not None else None

    def watch_jobsets(self, path: str) -> None:
        """Start watching JobSets at ``path`` (multislice jobs; kinetic's own only)."""
        if self.jobsets is not None:
            return
        candidate = _Collection(self, path, MULTISLICE_SELECTOR)
        with self._groups_lock:
            won = self.jobsets is None
            if won:
                self.jobsets = candidate
        if won:
            candidate.start()

    def jobset(self, name: str) -> dict[str, Any] | None:
        self.last_used = time.monotonic()
        return self.jobsets.get(name) if self.jobsets is not None else None

    def pods_of_jobset(self, jobset_name: str) -> list[dict[str, Any]]:
        """Every slice's pods of a JobSet (their job-name label names one slice's Job)."""
        self.last_used = time.monotonic()
        return self.pods.select(JOBSET_NAME_LABEL, jobset_name)

    def pods_of(self, job_name: str) -> list[dict[str, Any]]:
        self.last_used = time.monotonic()
        return self.pods.select("job-name", job_name)

    def notify(self, job_name: str | None) -> None:
        """Wake whoever waits on ``job_name`` (everyone for None: a relist may have changed any
        job). Called from the watch threads; each waiter's event is set in its own loop."""
        with self._waiters_lock:
            if job_name is None:
                waiters = [entry for entries in self._waiters.values() for entry in entries]
            else:
                waiters = list(self._waiters.get(job_name, ()))
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # that loop has closed meanwhile
                loop.call_soon_threadsafe(event.set)

    def subscribe(self, job_name: str, event: asyncio.Event) -> None:
        """Set ``event`` (in the running loop) whenever the Job or one of its pods changes.

        This is what makes completion event-driven: a trigger sleeps on its event instead of
        polling, and wakes within milliseconds of the pod's termination reaching the watch.
        """
        self.last_used = time.monotonic()
        entry = (asyncio.get_running_loop(), event)
        with self._waiters_lock:
            self._waiters.setdefault(job_name, set()).add(entry)

    def unsubscribe(self, job_name: str, event: asyncio.Event) -> None:
        entry = (asyncio.get_running_loop(), event)
        with self._waiters_lock:
            waiting = self._waiters.get(job_name)
            if waiting is not None:
                waiting.discard(entry)
                if not waiting:
                    del self._waiters[job_name]

    @property
    def synced(self) -> bool:
        """Both collections listed and their watch threads alive: the cache may be trusted."""
        collections = self._collections()
        return all(c.synced.is_set() and c.is_alive() for c in collections) and not self.stopped.is_set()

    @property
    def idle(self) -> bool:
        with self._waiters_lock:
            waited_on = bool(self._waiters)  # a watcher sleeping until this watch wakes it is a user
        return not waited_on and time.monotonic() - self.last_used > _IDLE_STOP_SECONDS

    def stop(self) -> None:
        self.stopped.set()
        self.sync_changed()


_WATCHES: dict[tuple[str, str], ClusterWatch] = {}
_WATCHES_LOCK = threading.Lock()  # guards the dict only (see the module docstring)


def cached_watch(cluster: dict[str, Any], namespace: str) -> ClusterWatch | None:
    """The running watch of (cluster, namespace), if there is one; never does I/O."""
    with _WATCHES_LOCK:
        watch = _WATCHES.get((cluster_key(cluster), namespace))
    if watch is None or watch.stopped.is_set():
        return None
    watch.last_used = time.monotonic()
    return watch


def shared_watch(cluster: dict[str, Any], namespace: str) -> ClusterWatch:
    """The process-wide watch of (cluster, namespace), started on first use.

    The first use builds the cluster's client: call it from a worker thread in async code
    (``ashared_watch``), never on the event loop's thread.
    """
    found = cached_watch(cluster, namespace)
    if found is not None:
        return found
    key = (cluster_key(cluster), namespace)
    candidate = ClusterWatch(kube_api(cluster), namespace)  # nothing started yet
    with _WATCHES_LOCK:
        idle = [(k, w) for k, w in _WATCHES.items() if k != key and w.idle]
        for other_key, _ in idle:
            del _WATCHES[other_key]
        watch = _WATCHES.get(key)
        if watch is None or watch.stopped.is_set():
            watch = _WATCHES[key] = candidate
    for _, other in idle:
        other.stop()
    if watch is candidate:
        candidate.start()
    watch.last_used = time.monotonic()
    return watch


async def ashared_watch(cluster: dict[str, Any], namespace: str) -> ClusterWatch:
    """``shared_watch`` for the event loop: a running watch at once, a new one made in a thread."""
    found = cached_watch(cluster, namespace)
    if found is not None:
        return found
    return await asyncio.to_thread(shared_watch, cluster, namespace)


def reset_shared_state() -> None:
    """Stop all watches and forget cached clients (tests point one connection id at new clusters)."""
    with _WATCHES_LOCK:
        watches = list(_WATCHES.values())
        _WATCHES.clear()
    for watch in watches:
        watch.stop()
    with client._CLIENTS_LOCK:
        client._CLIENTS.clear()
