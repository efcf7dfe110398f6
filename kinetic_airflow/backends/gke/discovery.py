"""Which version of each API group a cluster serves, asked once per API server per process.

Custom resources change version as their projects move on: Kueue serves ``kueue.x-k8s.io/v1beta2``
since 0.15 and stops serving ``v1beta1`` (kubernetes-sigs/kueue#14558); on such a cluster a path
with a remembered version is a 404 that reads like "no such object". So no path of a custom
resource is written with a fixed version: each group's version is the first of the versions
kinetic-airflow can read (newest first, ``SPOKEN``) that the cluster lists in ``GET /apis/<group>``
(discovery; every authenticated identity may read it through the ``system:discovery`` role).

An answer is kept for the life of the process (the triggerer's triggers share it); a failed look
is not kept, so the next call asks again.
"""

from __future__ import annotations

import threading

from kinetic_airflow.backends.gke.client import ApiError, KubeApi

__all__ = [
    "JOBSET",
    "KUEUE",
    "KUEUE_VISIBILITY",
    "LWS",
    "PROVISIONING",
    "SPOKEN",
    "GroupNotServedError",
    "api_version",
    "group_path",
    "served_versions",
]

KUEUE = "kueue.x-k8s.io"
KUEUE_VISIBILITY = "visibility.kueue.x-k8s.io"
LWS = "leaderworkerset.x-k8s.io"
JOBSET = "jobset.x-k8s.io"
PROVISIONING = "autoscaling.x-k8s.io"

# The versions of each group kinetic-airflow reads and writes, preferred first. The fields it
# uses are the same in each listed version (for Kueue: a Workload's conditions, admission checks,
# labels and owners; kubernetes-sigs/kueue apis/kueue/v1beta1/workload_conversion.go).
SPOKEN: dict[str, tuple[str, ...]] = {
    KUEUE: ("v1beta2", "v1beta1"),
    KUEUE_VISIBILITY: ("v1beta2", "v1beta1"),
    LWS: ("v1",),
    JOBSET: ("v1alpha2",),
    PROVISIONING: ("v1", "v1beta1"),
}

_SERVED: dict[tuple[str, str], list[str]] = {}
# Guards the dict only; the request is made outside it (it may block, or yield under greenback).
_SERVED_LOCK = threading.Lock()


class GroupNotServedError(ApiError):
    """The cluster serves none of the versions of a group that kinetic-airflow speaks (a 404)."""

    def __init__(self, group: str, served: list[str]) -> None:
        spoken = ", ".join(SPOKEN.get(group, ()))
        if served:
            text = (
                f"the cluster serves {group} only in {', '.join(served)}, and kinetic-airflow reads "
                f"{spoken}: upgrade the {group} controller (or kinetic-airflow)"
            )
        else:
            text = f"the cluster serves no {group} API (GET /apis/{group} is a 404): install it"
        super().__init__(404, "NotFound", text)
        self.group = group
        self.served = served

    def __str__(self) -> str:
        return self.body


def served_versions(api: KubeApi, group: str) -> list[str]:
    """The versions of ``group`` the cluster serves, its preferred first ([] if none: a 404)."""
    key = (api.server.host, group)
    with _SERVED_LOCK:
        found = _SERVED.get(key)
    if found is not None:
        return list(found)
    try:
        doc = api.request("GET", f"/apis/{group}")
    except ApiError as exc:
        if exc.status != 404:
            raise
        doc = {}
    preferred = (doc.get("preferredVersion") or {}).get("version")
    versions = [str(v.get("version")) for v in doc.get("versions") or [] if v.get("version")]
    if preferred in versions:
        versions.remove(preferred)
        versions.insert(0, preferred)
    with _SERVED_LOCK:
        _SERVED[key] = versions
    return list(versions)


def api_version(api: KubeApi, group: str) -> str:
    """The version of ``group`` to call: the first of ``SPOKEN[group]`` the cluster serves.
    Raises :class:`GroupNotServedError` naming what it serves when there is none."""
    served = served_versions(api, group)
    for version in SPOKEN[group]:
        if version in served:
            return version
    raise GroupNotServedError(group, served)


def group_path(api: KubeApi, group: str) -> str:
    """``/apis/<group>/<version>`` for the version :func:`api_version` picks."""
    return f"/apis/{group}/{api_version(api, group)}"


def forget(api: KubeApi | None = None) -> None:
    """Drop the kept answers of ``api``'s server (all of them without one): after a 404 on a
    discovered path (a controller upgraded under a long-lived process), and in tests."""
    with _SERVED_LOCK:
        for key in [k for k in _SERVED if api is None or k[0] == api.server.host]:
            del _SERVED[key]
