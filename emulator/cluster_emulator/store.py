"""In-memory object store with etcd-like resource versions and watch fan-out.

Every write bumps one cluster-wide revision (like etcd), stamps it into
``metadata.resourceVersion`` and appends an event to a bounded history so a
watch started from an older ``resourceVersion`` can be replayed without gaps,
and a too-old one gets ``410 Gone`` exactly like a real API server.

All methods must be called from the emulator's event loop thread.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .resources import ResourceType

Obj = dict[str, Any]


@dataclass(frozen=True)
class WatchEvent:
    """One change: ``type`` is ADDED, MODIFIED or DELETED; ``old`` is the previous state."""

    type: str
    rv: int
    rt: ResourceType
    namespace: str
    obj: Obj
    old: Obj | None


class Subscription:
    """A live feed of events for one resource type (and optionally one namespace)."""

    def __init__(self, rt: ResourceType, namespace: str | None) -> None:
        self.rt = rt
        self.namespace = namespace
        self.queue: asyncio.Queue[WatchEvent] = asyncio.Queue()

    def wants(self, event: WatchEvent) -> bool:
        """Whether this subscription covers ``event``."""
        return event.rt is self.rt and (self.namespace is None or self.namespace == event.namespace)


def meta(obj: Obj) -> dict[str, Any]:
    """The object's metadata dict (created if missing)."""
    return obj.setdefault("metadata", {})


class Store:
    """Objects keyed by (resource, namespace, name) plus the watch machinery."""

    def __init__(self, history_size: int = 50_000) -> None:
        self._objects: dict[tuple[str, str, str], Obj] = {}
        self._uids: dict[str, tuple[ResourceType, str, str]] = {}
        self._rv = 1
        self._history: deque[WatchEvent] = deque(maxlen=history_size)
        self._subscriptions: set[Subscription] = set()
        self._listeners: list[Callable[[WatchEvent], None]] = []

    # ------------------------------------------------------------------ reads
    @property
    def resource_version(self) -> int:
        """The latest revision (what a list returns as ``metadata.resourceVersion``)."""
        return self._rv

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> Obj | None:
        """The stored object (shared; callers must not mutate it)."""
        return self._objects.get((rt.plural, (namespace or "") if rt.namespaced else "", name))

    def list(self, rt: ResourceType, namespace: str | None = None) -> list[Obj]:
        """Stored objects of one type, sorted by namespace and name."""
        items = [
            obj
            for (plural, ns, _), obj in self._objects.items()
            if plural == rt.plural and (namespace is None or ns == namespace)
        ]
        items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return items

    def by_uid(self, uid: str) -> tuple[ResourceType, Obj] | None:
        """Find any object by its uid (the garbage collector resolves owners this way)."""
        entry = self._uids.get(uid)
        if entry is None:
            return None
        rt, ns, name = entry
        obj = self.get(rt, ns, name)
        return (rt, obj) if obj is not None else None

    def all_objects(self) -> Iterable[tuple[ResourceType, Obj]]:
        """Every stored object with its type (a snapshot list)."""
        result = []
        for obj in list(self._objects.values()):
            entry = self._uids.get(obj["metadata"].get("uid", ""))
            if entry is not None:
                result.append((entry[0], obj))
        return result

    # ----------------------------------------------------------------- writes
    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def create(self, rt: ResourceType, obj: Obj) -> Obj:
        """Insert a new object (caller checked for duplicates) and emit ADDED."""
        md = meta(obj)
        key = (rt.plural, md.get("namespace", "") if rt.namespaced else "", md["name"])
        if key in self._objects:
            raise KeyError(f"{rt.plural} {key[1]}/{key[2]} already exists")
        rv = self._next_rv()
        md["resourceVersion"] = str(rv)
        self._objects[key] = obj
        if md.get("uid"):
            self._uids[md["uid"]] = (rt, key[1], key[2])
        self._emit(WatchEvent("ADDED", rv, rt, key[1], obj, None))
        return obj

    def replace(self, rt: ResourceType, obj: Obj) -> Obj:
        """Store a new state of an existing object and emit MODIFIED."""
        md = meta(obj)
        key = (rt.plural, md.get("namespace", "") if rt.namespaced else "", md["name"])
        old = self._objects.get(key)
        if old is None:
            raise KeyError(f"{rt.plural} {key[1]}/{key[2]} does not exist")
        rv = self._next_rv()
        md["resourceVersion"] = str(rv)
        self._objects[key] = obj
        self._emit(WatchEvent("MODIFIED", rv, rt, key[1], obj, old))
        return obj

    def mutate(
        self, rt: ResourceType, namespace: str | None, name: str, fn: Callable[[Obj], None]
    ) -> Obj | None:
        """Apply ``fn`` to a copy; store it (one MODIFIED event) only when something changed."""
        current = self.get(rt, namespace, name)
        if current is None:
            return None
        updated = copy.deepcopy(current)
        fn(updated)
        if updated == current:
            return current
        return self.replace(rt, updated)

    def remove(self, rt: ResourceType, namespace: str | None, name: str) -> Obj | None:
        """Delete an object and emit DELETED (with the deletion revision, as etcd does)."""
        key = (rt.plural, (namespace or "") if rt.namespaced else "", name)
        old = self._objects.pop(key, None)
        if old is None:
            return None
        uid = old["metadata"].get("uid")
        if uid:
            self._uids.pop(uid, None)
        final = copy.deepcopy(old)
        rv = self._next_rv()
        final["metadata"]["resourceVersion"] = str(rv)
        self._emit(WatchEvent("DELETED", rv, rt, key[1], final, old))
        return final

    # ------------------------------------------------------------------ watch
    def subscribe(self, rt: ResourceType, namespace: str | None) -> Subscription:
        """Start receiving events (call in the same loop step as reading the snapshot)."""
        sub = Subscription(rt, namespace)
        self._subscriptions.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Stop receiving events."""
        self._subscriptions.discard(sub)

    def add_listener(self, listener: Callable[[WatchEvent], None]) -> None:
        """Synchronous callback for every event (controllers use it to wake up)."""
        self._listeners.append(listener)

    def oldest_replayable_rv(self) -> int:
        """Watches from a resourceVersion below this get 410 Gone."""
        if len(self._history) < (self._history.maxlen or 0):
            return 0
        return self._history[0].rv - 1

    def history_since(self, rv: int, rt: ResourceType, namespace: str | None) -> list[WatchEvent]:
        """Events after ``rv`` for a type (and namespace), oldest first."""
        return [
            ev
            for ev in self._history
            if ev.rv > rv and ev.rt is rt and (namespace is None or ev.namespace == namespace)
        ]

    def _emit(self, event: WatchEvent) -> None:
        self._history.append(event)
        for sub in list(self._subscriptions):
            if sub.wants(event):
                sub.queue.put_nowait(event)
        for listener in list(self._listeners):
            listener(event)
