"""What keras-kinetic 0.0.4 would submit for each accelerator string, as JSON.

Runs inside ``.venv-kinetic`` (``bash scripts/setup-kinetic-oracle.sh``), never in the main venv:
tests/test_accelerator_parity.py starts it as a subprocess. Reads a JSON list of extra candidate
strings on stdin, adds every string kinetic's own grammar and catalog produce, and prints one
JSON object: ``{"version": ..., "results": {string: record}}``.

A record is ``{"accepted": false, "error": ...}`` or, for a string kinetic accepts, what kinetic
puts in the pod it submits: it picks the backend as ``@kinetic.run`` does (multi-host TPU ->
Pathways LeaderWorkerSet, else a GKE Job), builds the manifest with kinetic's own builder
(``gke_client._create_job_spec`` / ``pathways_client._create_lws_spec``) and reads the pod
template's nodeSelector, resource limits and tolerations from it; ``hosts`` is the LWS group size
(1 for a Job). Nothing here talks to a cluster.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys

from kinetic.backend import gke_client, k8s_utils, pathways_client
from kinetic.core import accelerators as ka
from kinetic.core import core
from kubernetes import client


def candidates() -> list[str]:
    """Every string kinetic 0.0.4's parser is built to accept, from its own tables."""
    bodies: list[tuple[str, str]] = []
    # GPUs: name, gke label, xN for every count; gpu-N / gpu:N for every count any GPU has.
    for name, spec in ka.GPUS.items():
        for word in (name, spec.gke_label):
            bodies.append(("gpu", word))
            bodies += [("gpu", f"{word}x{count}") for count in spec.counts]
    gpu_counts = sorted({c for spec in ka.GPUS.values() for c in spec.counts})
    # TPUs: generation (and alias), gen-chips and gen-topology for every catalog entry.
    tpu_names = list(ka.TPUS) + list(ka.TPU_ALIASES)
    for word in tpu_names:
        spec = ka.TPUS[ka.TPU_ALIASES.get(word, word)]
        bodies.append(("tpu", word))
        for chips, topo in spec.topologies.items():
            bodies += [("tpu", f"{word}-{chips}"), ("tpu", f"{word}-{topo.topology}")]
    tpu_counts = sorted({c for spec in ka.TPUS.values() for c in spec.topologies})

    out = ["cpu", "gpu", "tpu", *(f"cpu:{n}" for n in (1, 4, 8))]
    for kind, body in bodies:
        # Prefixes are optional in kinetic; both separators work.
        out += [body, f"{kind}-{body}", f"{kind}:{body}"]
    for n in gpu_counts:
        out += [f"gpu-{n}", f"gpu:{n}"]
    for n in tpu_counts:
        out += [f"tpu-{n}", f"tpu:{n}"]
    # A bare number is read as a GPU count first, then a TPU chip count.
    out += [str(n) for n in sorted(set(gpu_counts) | set(tpu_counts))]
    # Case and surrounding whitespace are ignored.
    out += ["  TPU-V6E-8  ", "GPU-L4", "V5LITEPOD-2X4", "Tpu:V5P-8"]
    # Every one of them on Spot VMs.
    out += [f"{s.strip()}:spot" for s in out]
    return list(dict.fromkeys(out))


def _pod_fields(pod_spec: dict) -> dict:
    (container,) = pod_spec["containers"]
    limits = container.get("resources", {}).get("limits") or {}
    requests = container.get("resources", {}).get("requests") or {}
    return {
        "nodeSelector": pod_spec.get("nodeSelector") or {},
        "resources": limits,
        "requests_equal_limits": requests == limits,
        "tolerations": pod_spec.get("tolerations") or [],
    }


def record(text: str) -> dict:
    try:
        parsed = ka.parse_accelerator(text)
    except ValueError as exc:
        return {"accepted": False, "error": str(exc)}
    accel_config = k8s_utils.parse_accelerator(text)
    backend = core._resolve_backend_name(text, None)
    if backend == "pathways":
        hosts = parsed.num_nodes if isinstance(parsed, ka.TpuConfig) else 1
        lws = pathways_client._create_lws_spec(
            job_name="keras-pathways-parity",
            container_uri="image",
            accel_config=accel_config,
            job_id="parity",
            bucket_name="bucket",
            num_workers=hosts - 1,
            namespace="default",
        )
        group = lws["spec"]["leaderWorkerTemplate"]
        fields = _pod_fields(group["workerTemplate"]["spec"])
        assert _pod_fields(group["leaderTemplate"]["spec"]) == fields
        hosts = group["size"]
    else:
        job = gke_client._create_job_spec(
            job_name="kinetic-parity",
            container_uri="image",
            accel_config=accel_config,
            job_id="parity",
            bucket_name="bucket",
            namespace="default",
        )
        manifest = client.ApiClient().sanitize_for_serialization(job)
        fields = _pod_fields(manifest["spec"]["template"]["spec"])
        hosts = 1
    if parsed is None:
        kind, name, machine_type = "cpu", "cpu", None
    elif isinstance(parsed, ka.TpuConfig):
        kind, name, machine_type = "tpu", parsed.name, parsed.machine_type
    else:
        kind, name, machine_type = "gpu", parsed.name, parsed.machine_type
    return {
        "accepted": True,
        "backend": backend,
        "kind": kind,
        "name": name,
        "machine_type": machine_type,
        "hosts": hosts,
        **fields,
    }


def main() -> None:
    extra = json.load(sys.stdin)
    generated = candidates()
    strings = list(dict.fromkeys([*generated, *extra]))
    print(
        json.dumps(
            {
                "version": importlib.metadata.version("keras-kinetic"),
                "generated": generated,
                "results": {s: record(s) for s in strings},
            }
        )
    )


if __name__ == "__main__":
    main()
