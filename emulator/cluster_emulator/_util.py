"""Small helpers shared by the emulator modules (time formats, names, patches).

Kept dependency-free so every other module of the emulator can import it.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as _dt
import random
import re
from typing import Any

# Kubernetes' own alphabet for generated name suffixes (no vowels, no 0/1/3):
# using it keeps generated names looking like real ones.
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
ENV_VAR_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


def utcnow() -> _dt.datetime:
    """Timezone-aware now; every timestamp the emulator writes derives from it."""
    return _dt.datetime.now(_dt.timezone.utc)


def fmt_time(value: _dt.datetime | None = None) -> str:
    """RFC 3339 with second precision, like ``metav1.Time``."""
    value = value or utcnow()
    return value.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def fmt_micro(value: _dt.datetime | None = None) -> str:
    """RFC 3339 with microseconds, like ``metav1.MicroTime``."""
    value = value or utcnow()
    return value.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def fmt_nano(value: _dt.datetime) -> str:
    """Fixed-width RFC 3339 nano (kubelet's ``RFC3339NanoFixed``), the log ``timestamps=true`` prefix."""
    base = value.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{value.microsecond:06d}000Z"


def parse_time(text: str) -> _dt.datetime:
    """Parse the RFC 3339 variants clients send (``Z`` suffix, up to nanoseconds)."""
    text = text.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    match = re.match(r"^(.*T\d\d:\d\d:\d\d)(\.\d+)?(.*)$", text)
    if match and match.group(2):
        frac = match.group(2)[:7]  # keep microseconds only
        text = match.group(1) + frac + match.group(3)
    value = _dt.datetime.fromisoformat(text)
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    return value


def rand_suffix(length: int = 5) -> str:
    """Random suffix for ``generateName`` and pod names."""
    return "".join(random.choice(_NAME_ALPHABET) for _ in range(length))


def human_duration(seconds: float) -> str:
    """Go's ``duration.HumanDuration`` (what kubectl shows in AGE columns)."""
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        rest = seconds % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if days < 8:
        rest = hours % 24
        return f"{days}d{rest}h" if rest else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    return f"{days // 365}y"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; also used for strategic merge patches (lists replaced)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class JsonPatchError(ValueError):
    """An RFC 6902 operation could not be applied (mapped to HTTP 422 by the server)."""


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise JsonPatchError(f"invalid JSON pointer {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _resolve_parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, list):
            try:
                node = node[int(part)]
            except (ValueError, IndexError):
                raise JsonPatchError(f"path element {part!r} not found")
        elif isinstance(node, dict):
            if part not in node:
                raise JsonPatchError(f"path element {part!r} not found")
            node = node[part]
        else:
            raise JsonPatchError(f"cannot traverse into {part!r}")
    return node, parts[-1]


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent, last = _resolve_parent(doc, parts)
    try:
        return parent[int(last)] if isinstance(parent, list) else parent[last]
    except (KeyError, IndexError, ValueError, TypeError):
        raise JsonPatchError(f"path {path!r} not found")


def _remove(doc: Any, path: str) -> Any:
    parent, last = _resolve_parent(doc, _pointer(path))
    try:
        if isinstance(parent, list):
            return parent.pop(int(last))
        return parent.pop(last)
    except (KeyError, IndexError, ValueError, TypeError):
        raise JsonPatchError(f"path {path!r} not found")


def _add(doc: Any, path: str, value: Any, replace: bool = False) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent, last = _resolve_parent(doc, parts)
    if isinstance(parent, list):
        if last == "-":
            parent.append(value)
        else:
            try:
                index = int(last)
            except ValueError:
                raise JsonPatchError(f"invalid list index {last!r}")
            if replace:
                if not 0 <= index < len(parent):
                    raise JsonPatchError(f"path {path!r} not found")
                parent[index] = value
            else:
                if not 0 <= index <= len(parent):
                    raise JsonPatchError(f"index {index} out of range")
                parent.insert(index, value)
    elif isinstance(parent, dict):
        if replace and last not in parent:
            raise JsonPatchError(f"path {path!r} not found")
        parent[last] = value
    else:
        raise JsonPatchError(f"cannot add into {path!r}")
    return doc


def json_patch(doc: Any, operations: list[dict[str, Any]]) -> Any:
    """Apply an RFC 6902 JSON patch (the kubernetes client sends one when the body is a list)."""
    doc = copy.deepcopy(doc)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise JsonPatchError(f"invalid patch operation {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "replace":
            doc = _add(doc, path, copy.deepcopy(op.get("value")), replace=True)
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise JsonPatchError(f"test operation failed at {path!r}")
        elif kind in ("move", "copy"):
            value = _get(doc, op.get("from", ""))
            if kind == "move":
                _remove(doc, op["from"])
            doc = _add(doc, path, copy.deepcopy(value))
        else:
            raise JsonPatchError(f"unknown patch operation {kind!r}")
    return doc


def get_path(obj: Any, dotted: str) -> Any:
    """Resolve ``a.b.c`` in nested dicts (None when absent); used by field selectors."""
    node = obj
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait for ``event`` up to ``timeout`` seconds; True if it was set.

    Uses ``asyncio.wait`` rather than ``asyncio.wait_for``: on Python < 3.12
    ``wait_for`` can swallow a cancellation that races with the inner wait
    finishing, which would make stopping the emulator hang.
    """
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=max(0.0, timeout))
    finally:
        waiter.cancel()
    return event.is_set()
