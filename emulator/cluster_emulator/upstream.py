"""The upstream releases the emulator's CRDs come from, as ``crds/UPSTREAM.json`` records them.

``emulator/scripts/vendor_crds.py`` writes the manifest when it vendors a release; this module
only reads it. Serving follows the CRDs (kube-apiserver's ``apiextensions-apiserver``): a version
is routed and listed in discovery only if its CRD marks it ``served: true``; objects are kept in
the ``storage: true`` version; a ``deprecated`` version answers with its ``deprecationWarning``.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

CRD_DIR = Path(__file__).resolve().parent / "crds"
MANIFEST = CRD_DIR / "UPSTREAM.json"


@functools.lru_cache(maxsize=1)
def manifest() -> dict[str, Any]:
    """The whole manifest: project -> repository, tag, commit, files (with their versions)."""
    return json.loads(MANIFEST.read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=1)
def crds() -> dict[tuple[str, str], dict[str, Any]]:
    """(group, plural) -> the CRD's entry (file name, release, versions)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for project, entry in manifest().items():
        for name, info in entry["files"].items():
            out[(info["group"], info["plural"])] = {
                **info,
                "file": name,
                "project": project,
                "release": f"{entry['repository']}@{entry['tag']}",
            }
    return out


def crd(group: str, plural: str) -> dict[str, Any]:
    """The manifest entry of one CRD (KeyError naming the refresh command if it is not vendored)."""
    try:
        return crds()[(group, plural)]
    except KeyError:
        raise KeyError(
            f"no vendored CRD for {plural}.{group} in {MANIFEST}; vendor it with "
            "emulator/scripts/vendor_crds.py"
        ) from None


def crd_path(group: str, plural: str) -> Path:
    """Where the CRD YAML of ``plural.group`` is."""
    return CRD_DIR / crd(group, plural)["file"]


def storage_version(group: str, plural: str) -> str:
    """The version the CRD stores its objects in (exactly one is ``storage: true``)."""
    return next(v["name"] for v in crd(group, plural)["versions"] if v["storage"])


def served_versions(group: str, plural: str) -> list[str]:
    """The versions the CRD marks ``served: true``, in kube-aware priority order."""
    return sorted((v["name"] for v in crd(group, plural)["versions"] if v["served"]), key=version_priority)


def deprecation_warning(group: str, plural: str, version: str) -> str | None:
    """The warning a deprecated version answers with (apiextensions-apiserver
    ``pkg/apiserver/customresource_handler.go``: the CRD's ``deprecationWarning``, else
    ``<group>/<version> <Kind> is deprecated``)."""
    for v in crd(group, plural)["versions"]:
        if v["name"] == version and v.get("deprecated"):
            kind = crd(group, plural)["kind"]
            return v.get("deprecationWarning") or f"{group}/{version} {kind} is deprecated"
    return None


def apiservice_versions(group: str) -> list[str]:
    """Versions of an aggregated API group the vendored release registers APIServices for."""
    found = [
        svc["version"]
        for entry in manifest().values()
        for svc in entry.get("apiservices") or []
        if svc["group"] == group
    ]
    return sorted(found, key=version_priority)


_KUBE_VERSION = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(version: str) -> tuple[int, int, int, str]:
    """Sort key of kube-aware version order (k8s.io/apimachinery ``pkg/version``
    ``CompareKubeAwareVersionStrings``): GA before beta before alpha, higher numbers first,
    anything else last, alphabetically."""
    m = _KUBE_VERSION.match(version)
    if m is None:
        return (3, 0, 0, version)
    major, stage, minor = int(m.group(1)), m.group(2), int(m.group(3) or 0)
    rank = {None: 0, "beta": 1, "alpha": 2}[stage]
    return (rank, -major, -minor, "")
