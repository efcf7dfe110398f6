"""Helpers on API objects that every controller of the emulator shares: status conditions and the
controller owner reference."""

from __future__ import annotations

from typing import Any

from ._util import fmt_time


def find_condition(conditions: list[dict[str, Any]], ctype: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == ctype), None)


def condition_true(conditions: list[dict[str, Any]], ctype: str) -> bool:
    cond = find_condition(conditions, ctype)
    return cond is not None and cond.get("status") == "True"


def set_condition(
    conditions: list[dict[str, Any]], ctype: str, status: str, reason: str, message: str, probe: bool = True
) -> None:
    now = fmt_time()
    cond = find_condition(conditions, ctype)
    if cond is None:
        cond = {"type": ctype}
        conditions.append(cond)
    if cond.get("status") != status:
        cond["lastTransitionTime"] = now
    cond["status"] = status
    cond["reason"] = reason
    cond["message"] = message
    if probe:
        cond["lastProbeTime"] = now


def controller_uid(obj: dict[str, Any]) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("uid")
    return None
