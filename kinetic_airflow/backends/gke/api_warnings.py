"""kube-apiserver's ``Warning`` response headers, logged once per process each.

The API server answers a call to a deprecated API version (a CRD version marked
``deprecated``, e.g. Kueue's ``kueue.x-k8s.io/v1beta1`` since 0.15) with
``Warning: 299 - "<text>"`` (k8s.io/apiserver ``pkg/warning``; RFC 7234 warn-code 299). The same
warning comes with every call, so it is logged the first time only: an operator learns that
the cluster is about to stop serving something the product still calls.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["log_api_warnings"]

log = logging.getLogger(__name__)

# one warning value: code, agent, quoted text (a header may hold several, comma-separated)
_WARNING = re.compile(r'(\d{3})\s+\S+\s+"((?:[^"\\]|\\.)*)"')
_SEEN: set[str] = set()
_SEEN_LOCK = threading.Lock()


def warning_texts(header: str | None) -> list[str]:
    """The texts of the ``299`` warnings in a ``Warning`` header value."""
    return [re.sub(r"\\(.)", r"\1", text) for code, text in _WARNING.findall(header or "") if code == "299"]


def log_api_warnings(headers: Mapping[str, Any] | None) -> None:
    """Log each new ``Warning: 299`` text of a response once per process (WARNING level)."""
    if not headers:
        return
    getall = getattr(headers, "getlist", None)
    values = getall("Warning") if getall else [headers.get("Warning")]
    for value in values:
        for text in warning_texts(value):
            with _SEEN_LOCK:
                if text in _SEEN:
                    continue
                _SEEN.add(text)
            log.warning("the Kubernetes API server warns: %s (logged once per process)", text)
