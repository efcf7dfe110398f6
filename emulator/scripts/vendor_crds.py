"""Vendor the CRDs the emulator serves from one named upstream release, and record it.

    python emulator/scripts/vendor_crds.py kueue /path/to/kueue.git v0.19.2

reads the release's CRD YAMLs (and, for Kueue, its visibility APIServices) straight out of a
bare git directory of the upstream repository (``git show TAG:path``), writes them to
``emulator/cluster_emulator/crds/`` with the project's LICENSE, and rewrites that project's entry
of ``crds/UPSTREAM.json``: the repository, tag, commit, each file's path upstream and SHA-256,
and each CRD's versions (served, storage, deprecated, deprecationWarning). The emulator serves
what that manifest says (``cluster_emulator.crds``), so a refresh is one command per project and
the pinned release is never remembered, only recorded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

CRDS = Path(__file__).resolve().parents[1] / "cluster_emulator" / "crds"
MANIFEST = CRDS / "UPSTREAM.json"

# project -> repository, the CRD files in it (path in the repository), its licence, and APIServices
PROJECTS: dict[str, dict[str, Any]] = {
    "kueue": {
        "repository": "kubernetes-sigs/kueue",
        "crds": [
            f"config/components/crd/bases/kueue.x-k8s.io_{plural}.yaml"
            for plural in (
                "workloads",
                "clusterqueues",
                "localqueues",
                "resourceflavors",
                "workloadpriorityclasses",
                "admissionchecks",
                "provisioningrequestconfigs",
            )
        ],
        "apiservices": [
            "config/components/visibility/apiservice_v1beta1.yaml",
            "config/components/visibility/apiservice_v1beta2.yaml",
        ],
    },
    "jobset": {
        "repository": "kubernetes-sigs/jobset",
        "crds": ["config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"],
    },
    "leaderworkerset": {
        "repository": "kubernetes-sigs/lws",
        "crds": ["config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml"],
    },
    "autoscaler": {
        "repository": "kubernetes/autoscaler",
        "crds": ["cluster-autoscaler/apis/config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml"],
    },
}


class VendorError(Exception):
    """A refresh that cannot be done as asked (the message says what to do instead)."""


def _git(git_dir: Path, *args: str) -> bytes:
    try:
        return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True).stdout
    except subprocess.CalledProcessError as exc:
        raise VendorError(
            f"git {' '.join(args)} failed in {git_dir}: {exc.stderr.decode(errors='replace').strip()}"
        ) from None


def crd_versions(crd: dict[str, Any]) -> dict[str, Any]:
    """What the emulator needs of one CRD to serve it: group, names, scope and its versions."""
    spec = crd["spec"]
    return {
        "group": spec["group"],
        "plural": spec["names"]["plural"],
        "kind": spec["names"]["kind"],
        "shortNames": list(spec["names"].get("shortNames") or []),
        "categories": list(spec["names"].get("categories") or []),
        "namespaced": spec["scope"] == "Namespaced",
        "versions": [
            {
                "name": v["name"],
                "served": bool(v.get("served")),
                "storage": bool(v.get("storage")),
                **({"deprecated": True} if v.get("deprecated") else {}),
                **({"deprecationWarning": v["deprecationWarning"]} if v.get("deprecationWarning") else {}),
            }
            for v in spec["versions"]
        ],
    }


def vendor(project: str, git_dir: Path, tag: str, out: Path = CRDS) -> dict[str, Any]:
    """Copy ``project``'s CRDs at ``tag`` into ``out`` and return its manifest entry."""
    if project not in PROJECTS:
        raise VendorError(f"unknown project {project!r}; choose one of {', '.join(sorted(PROJECTS))}")
    info = PROJECTS[project]
    if not (git_dir / "HEAD").is_file():
        raise VendorError(
            f"{git_dir} is not a git directory: pass a bare clone of the upstream repository "
            f"(git clone --bare https://github.com/{info['repository']})"
        )
    tags = _git(git_dir, "tag", "--list", tag).decode().split()
    if tag not in tags:
        raise VendorError(
            f"{git_dir} has no tag {tag!r}; list them with `git --git-dir={git_dir} tag` "
            f"(a bare clone of https://github.com/{info['repository']})"
        )
    commit = _git(git_dir, "rev-parse", f"{tag}^{{commit}}").decode().strip()
    out.mkdir(parents=True, exist_ok=True)
    entry: dict[str, Any] = {
        "repository": info["repository"],
        "tag": tag,
        "commit": commit,
        "license": f"LICENSE.{project}",
        "files": {},
    }
    (out / f"LICENSE.{project}").write_bytes(_git(git_dir, "show", f"{commit}:LICENSE"))
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for path in info["crds"]:
        data = _git(git_dir, "show", f"{commit}:{path}")
        name = Path(path).name
        (out / name).write_bytes(data)
        entry["files"][name] = {
            "path": path,
            "sha256": hashlib.sha256(data).hexdigest(),
            **crd_versions(yaml.load(data, Loader=loader)),
        }
    services = []
    for path in info.get("apiservices", []):
        doc = yaml.safe_load(_git(git_dir, "show", f"{commit}:{path}"))
        services.append({"path": path, "group": doc["spec"]["group"], "version": doc["spec"]["version"]})
    if services:
        entry["apiservices"] = services
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("project", choices=sorted(PROJECTS))
    parser.add_argument("git_dir", type=Path, help="a bare git directory of the upstream repository")
    parser.add_argument("tag", help="the release tag to vendor, e.g. v0.19.2")
    args = parser.parse_args(argv)
    try:
        entry = vendor(args.project, args.git_dir, args.tag)
    except VendorError as exc:
        print(f"vendor_crds: {exc}", file=sys.stderr)
        return 2
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    manifest[args.project] = entry
    MANIFEST.write_text(json.dumps(dict(sorted(manifest.items())), indent=2) + "\n")
    print(
        f"{args.project}: {entry['repository']} {entry['tag']} ({entry['commit'][:12]}), "
        f"{len(entry['files'])} CRD(s) -> {CRDS}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
