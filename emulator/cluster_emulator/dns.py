"""Cluster DNS for pod processes: names of pods and headless Services become 127.0.0.1.

Every emulated pod shares 127.0.0.1, and there is no cluster DNS server, so a
name such as ``trainer-0.trainer.default`` (the ``LWS_LEADER_ADDRESS`` the LWS
webhook injects) does not resolve on the host. The kubelet therefore rewrites
such names in the values it hands to a container process (env values and
``$(VAR)`` expansions in command/args); the API objects keep the real names.

A name resolves as in a pod's resolver (search path ``<ns>.svc.cluster.local
svc.cluster.local cluster.local``) when it is one of::

    <host>.<svc>                       (pod in the resolving pod's namespace)
    <host>.<svc>.<ns>[.svc[.cluster.local]]
    <svc>.<ns>[.svc[.cluster.local]]   (the headless Service itself)

and ``<svc>`` is a headless Service (``clusterIP: None``) in ``<ns>``. The pod
``<host>`` need not exist yet (a leader started before its workers were created
is handed their future names, which resolve once they exist in a real cluster);
single-label names are never rewritten (too easily an ordinary word).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

CLUSTER_DOMAIN = "cluster.local"
LOOPBACK = "127.0.0.1"

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# A dotted name not glued to more name characters on either side; an FQDN's root dot is group 2.
_NAME = re.compile(rf"(?<![A-Za-z0-9_.-])({_LABEL}(?:\.{_LABEL})+)(\.?)(?![A-Za-z0-9_-]|\.[A-Za-z0-9])")
_SUFFIX = ["svc", *CLUSTER_DOMAIN.split(".")]

Headless = set[tuple[str, str]]  # (namespace, service name)


def resolves(name: str, namespace: str, headless: Headless) -> bool:
    """Whether ``name``, looked up from a pod in ``namespace``, is a pod or headless-Service name."""
    labels = name.lower().rstrip(".").split(".")
    if labels[-len(_SUFFIX) :] == _SUFFIX:
        labels = [*labels[: -len(_SUFFIX)], "svc"]
    if labels[-1] == "svc":
        body = labels[:-1]
        if len(body) == 2:  # <svc>.<ns>.svc
            return (body[1], body[0]) in headless
        if len(body) == 3:  # <host>.<svc>.<ns>.svc
            return (body[2], body[1]) in headless
        return False
    if len(labels) == 2:  # <host>.<svc> in our namespace, or <svc>.<ns>
        return (namespace, labels[1]) in headless or (labels[1], labels[0]) in headless
    if len(labels) == 3:  # <host>.<svc>.<ns>
        return (labels[2], labels[1]) in headless
    return False


def rewrite(
    text: str, namespace: str, headless: Headless, only: Iterable[tuple[int, int]] | None = None
) -> str:
    """Replace resolvable names in ``text`` with 127.0.0.1.

    ``only``: character spans (e.g. the text produced by ``$(VAR)`` expansion); a
    name is rewritten only when it overlaps one of them. None means everywhere.
    """
    if not headless or "." not in text:
        return text
    spans = None if only is None else [s for s in only if s[1] > s[0]]
    if spans is not None and not spans:
        return text

    def repl(match: re.Match[str]) -> str:
        start, end = match.span(1)
        if spans is not None and not any(s < end and start < e for s, e in spans):
            return match.group(0)
        if not resolves(match.group(1), namespace, headless):
            return match.group(0)
        # Keep a trailing dot unless it is the root of an absolute cluster name.
        absolute = match.group(1).lower().endswith(CLUSTER_DOMAIN)
        return LOOPBACK + ("" if absolute else match.group(2))

    return _NAME.sub(repl, text)
