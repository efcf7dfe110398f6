"""Accelerator strings mean what keras-kinetic 0.0.4 means (issue 8).

The oracle is the released keras-kinetic 0.0.4 wheel from PyPI, installed by
``scripts/setup-kinetic-oracle.sh`` into ``.venv-kinetic`` (``scripts/test.sh`` runs it).
``tests/kinetic_oracle.py`` runs there, enumerates every string kinetic's grammar and catalog
accept (every generation x chip count and topology, aliases, GKE labels, ``gpu-N``/``tpu-N``,
bare numbers, both prefixes and none, ``:spot``) and reports what kinetic would put in the pod
it submits, built by kinetic's own Job / LeaderWorkerSet builders. Each string kinetic accepts
must resolve here to the same nodeSelector, resources (chips or GPUs per host), host count,
tolerations and machine type, so a DAG ported from ``@kinetic.run`` schedules on node pools
made by ``kinetic up``; or be one of the deliberate, listed exceptions below.

Print the parity figure and every difference with::

    .venv/bin/python tests/test_accelerator_parity.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from kinetic_airflow.accelerators import (
    GPU_TYPES,
    TPU_GENERATIONS,
    InvalidAcceleratorError,
    parse_accelerator,
)

ROOT = Path(__file__).resolve().parent.parent
ORACLE = Path(__file__).resolve().parent / "kinetic_oracle.py"
ORACLE_PYTHON = Path(os.environ.get("KINETIC_ORACLE_PYTHON", ROOT / ".venv-kinetic" / "bin" / "python"))
KINETIC_VERSION = "0.0.4"

FIELDS = ("nodeSelector", "resources", "hosts", "tolerations", "machine_type")

# --------------------------------------------------------------------------
# Deliberate differences: strings both accept that do not resolve the same. Keyed by
# kinetic-airflow's normalized text (AcceleratorSpec.text), so every spelling of one choice
# (tpu-/tpu:/no prefix, chips or topology, case) shares one entry. Asserted exactly: a new
# difference fails the test until it is fixed or listed here with its reason.
# --------------------------------------------------------------------------

V3_LABEL = (
    "GKE labels v3 nodes tpu-v3-device (ct3-hightpu-4t, 2x2) and tpu-v3-slice (ct3p-hightpu-4t); "
    "kinetic's tpu-v3-podslice is on no GKE node, so kinetic's v3 pods never schedule"
)
SPOT_ON_JOBS = (
    "kinetic's GKE Job builder drops the value of its Spot toleration (cloud.google.com/gke-spot, "
    "operator Equal, no value), which tolerates only an empty-valued taint; GKE's Spot taint "
    "(node auto-provisioning, Autopilot; optional in Standard) is cloud.google.com/gke-spot=true:"
    "NoSchedule and GKE's docs tolerate it with value 'true', as here and as kinetic's own "
    "LeaderWorkerSet builder does"
)
V3_LABEL_AND_SPOT_ON_JOBS = f"{V3_LABEL}; and {SPOT_ON_JOBS}"
CPU_SPOT = (
    "kinetic 0.0.4 silently drops ':spot' for CPU (plain nodes, no Spot selector); here ':spot' is "
    "never dropped: the pod selects and tolerates Spot nodes"
)

# Which compared fields each reason is allowed to change.
REASON_FIELDS = {
    V3_LABEL: {"nodeSelector"},
    SPOT_ON_JOBS: {"tolerations"},
    V3_LABEL_AND_SPOT_ON_JOBS: {"nodeSelector", "tolerations"},
    CPU_SPOT: {"nodeSelector", "tolerations"},
}

_V3 = ["2x2", "4x4", "4x8", "8x8", "8x16", "16x16", "16x32", "32x32"]
_SINGLE_HOST_SPOT = [
    *(f"gpu-{name}" for name in ("l4", "t4", "v100", "a100", "a100-80gb", "h100", "p4", "p100")),
    *(f"gpu-{name}x{n}" for name in ("l4", "v100", "a100", "a100-80gb", "h100") for n in (2, 4, 8)),
    *(f"gpu-{name}x{n}" for name in ("t4", "p4", "p100") for n in (2, 4)),
    "gpu-a100x16",
    "tpu-v5e-1x1",
    "tpu-v5e-2x2",
    "tpu-v5e-2x4",
    "tpu-v4-2x2x1",
]
DELIBERATE_DIFFERENCES: dict[str, str] = {
    **dict.fromkeys([f"tpu-v3-{t}" for t in _V3], V3_LABEL),
    **dict.fromkeys([f"tpu-v3-{t}:spot" for t in _V3[1:]], V3_LABEL),
    "tpu-v3-2x2:spot": V3_LABEL_AND_SPOT_ON_JOBS,
    **dict.fromkeys([f"{s}:spot" for s in _SINGLE_HOST_SPOT], SPOT_ON_JOBS),
    "cpu:spot": CPU_SPOT,
}

# --------------------------------------------------------------------------
# Strings kinetic accepts and kinetic-airflow refuses (with an error that says why), as
# patterns over the lower-cased string; each must match something and every refusal must
# match exactly one.
# --------------------------------------------------------------------------

_SPOT = r"(:spot)?"
DELIBERATE_REFUSALS: dict[str, str] = {
    rf"(tpu[-:])?v3-(2048|32x64){_SPOT}": "the v3 pod is 1024 chips (32x32); kinetic lists a 2048-chip 32x64",
    rf"(tpu[-:])?v4-(4096|16x16x16){_SPOT}": "GKE's v4 maximum is 12x16x16 (3072 chips)",
    rf"tpu[-:]4096{_SPOT}": "kinetic picks v4 16x16x16, above GKE's v4 maximum 12x16x16",
    rf"(gpu[-:])?(a100-80gb|nvidia-a100-80gb)x16{_SPOT}": "there is no a2-ultragpu-16g: A100 80GB "
    "comes 1, 2, 4 or 8 to a machine",
    rf"gpu[-:]16{_SPOT}": "kinetic picks A100 80GB x16 (a2-ultragpu-16g), which does not exist",
    rf"cpu:\d+{_SPOT}": "kinetic ignores the number (no CPU request follows from it), so 'cpu:8' "
    "promises vCPUs it does not give",
    rf"\d+{_SPOT}": "a bare number is ambiguous: kinetic reads it as a GPU count first (8 = 8 x H100), "
    "then a TPU chip count; write gpu-N or tpu-N",
}

# The recorded figure (strings that schedule the same / strings both accept); see the module
# docstring for the command that prints it. Changes only with the enumeration or a decision.
EXPECTED_FIGURE = (636, 1034)


# --------------------------------------------------------------------------
# Oracle and comparison
# --------------------------------------------------------------------------


def _ours_candidates() -> list[str]:
    """kinetic-airflow's own spellings, so strings kinetic would accept but its tables do not
    list (none today) are compared too."""
    out = ["cpu", "gpu", "tpu"]
    for gpu in GPU_TYPES.values():
        out += [f"gpu-{gpu.name}", *(f"gpu-{gpu.name}x{c}" for c in gpu.counts)]
    for gen in TPU_GENERATIONS.values():
        for alias in gen.aliases:
            out += [f"{alias}-{c}" for c in gen.chip_counts()]
            out += [f"tpu-{alias}-{c}" for c in gen.chip_counts()]
    return out


@cache
def kinetic_results() -> dict:
    if not ORACLE_PYTHON.exists():
        pytest.fail(
            f"keras-kinetic {KINETIC_VERSION} venv missing: {ORACLE_PYTHON} does not exist. "
            "Run `bash scripts/setup-kinetic-oracle.sh` (scripts/test.sh does).",
            pytrace=False,
        )
    proc = subprocess.run(
        [str(ORACLE_PYTHON), str(ORACLE)],
        input=json.dumps(_ours_candidates()),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"kinetic oracle failed ({proc.returncode}):\n{proc.stderr[-4000:]}", pytrace=False)
    return json.loads(proc.stdout)


def _tolerations(items: list[dict]) -> list[dict]:
    return sorted((dict(sorted(t.items())) for t in items), key=lambda t: json.dumps(t))


def ours(text: str) -> dict | None:
    try:
        spec = parse_accelerator(text)
    except InvalidAcceleratorError:
        return None
    return {
        "text": spec.text,
        "nodeSelector": spec.node_selectors,
        "resources": spec.resources,
        "hosts": spec.hosts,
        "tolerations": _tolerations([t.to_k8s() for t in spec.tolerations]),
        "machine_type": spec.machine_type,
    }


def compare() -> dict:
    """Every string kinetic accepts, sorted into same / different / refused here."""
    data = kinetic_results()
    same: list[str] = []
    different: dict[str, tuple[str, set[str]]] = {}  # string -> (our text, fields that differ)
    refused: list[str] = []
    for text, theirs in data["results"].items():
        if not theirs["accepted"]:
            continue
        mine = ours(text)
        if mine is None:
            refused.append(text)
            continue
        theirs = {**theirs, "tolerations": _tolerations(theirs["tolerations"])}
        fields = {f for f in FIELDS if mine[f] != theirs[f]}
        if fields:
            different[text] = (mine["text"], fields)
        else:
            same.append(text)
    return {"data": data, "same": same, "different": different, "refused": refused}


def figures(result: dict) -> tuple[int, int, int]:
    """(identical, identical but for the Spot toleration's value, both accept)."""
    same = len(result["same"])
    spot_only = sum(
        1
        for normalized, fields in result["different"].values()
        if DELIBERATE_DIFFERENCES.get(normalized) == SPOT_ON_JOBS and fields == {"tolerations"}
    )
    return same, spot_only, same + len(result["different"])


def describe(result: dict) -> str:
    same, spot_only, total = figures(result)
    return (
        f"accelerator parity with keras-kinetic {KINETIC_VERSION}: {same} of {total} strings both accept "
        f"schedule the same (nodeSelector, resources, hosts, tolerations, machine type); "
        f"{same + spot_only} of {total} if the Spot toleration's value is not counted "
        "(kinetic-made Standard Spot pools carry no taint)"
    )


# --------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------


def test_oracle_is_keras_kinetic_0_0_4() -> None:
    data = kinetic_results()
    assert data["version"] == KINETIC_VERSION
    # The enumeration really comes from kinetic's catalog: it is large and kinetic accepts it all.
    assert len(data["generated"]) > 1000
    assert all(data["results"][s]["accepted"] for s in data["generated"])
    assert all(r["requests_equal_limits"] for r in data["results"].values() if r["accepted"])


def test_every_kinetic_string_schedules_the_same_or_is_a_listed_difference() -> None:
    result = compare()
    seen: dict[str, set[str]] = {}
    for text, (normalized, fields) in result["different"].items():
        assert normalized in DELIBERATE_DIFFERENCES, (
            f"{text!r} (here {normalized}) differs from keras-kinetic {KINETIC_VERSION} in {sorted(fields)}: "
            f"kinetic {result['data']['results'][text]} vs here {ours(text)}"
        )
        reason = DELIBERATE_DIFFERENCES[normalized]
        assert fields <= REASON_FIELDS[reason], f"{text!r}: {sorted(fields)} is more than {reason!r} explains"
        seen.setdefault(normalized, set()).update(fields)
    # Exactly the listed ones: a fixed difference must leave the list too.
    assert set(seen) == set(DELIBERATE_DIFFERENCES)
    for normalized, fields in seen.items():
        assert fields == REASON_FIELDS[DELIBERATE_DIFFERENCES[normalized]], normalized
    print(describe(result))
    same, _, total = figures(result)
    assert (same, total) == EXPECTED_FIGURE, "the recorded parity figure changed: update it and the docs"


def test_refusals_are_listed_and_explained() -> None:
    result = compare()
    matched: set[str] = set()
    for text in result["refused"]:
        hits = [p for p in DELIBERATE_REFUSALS if re.fullmatch(p, text.strip().lower())]
        assert len(hits) == 1, f"kinetic accepts {text!r} but it is refused here: {hits or 'not listed'}"
        matched.update(hits)
    assert matched == set(DELIBERATE_REFUSALS)


def main() -> None:
    result = compare()
    _, _, total = figures(result)
    accepted = total + len(result["refused"])
    version = result["data"]["version"]
    print(f"keras-kinetic {version} accepts {accepted} strings; kinetic-airflow accepts {total} of them")
    print(describe(result))
    by_reason: dict[str, list[str]] = {}
    for text, (normalized, fields) in sorted(result["different"].items()):
        reason = DELIBERATE_DIFFERENCES.get(normalized, "NOT LISTED")
        by_reason.setdefault(reason, []).append(f"{text} ({', '.join(sorted(fields))})")
    for reason, texts in by_reason.items():
        print(f"\ndiffer ({len(texts)}): {reason}\n  " + "\n  ".join(texts))
    print(f"\nrefused here ({len(result['refused'])}):\n  " + "\n  ".join(sorted(result["refused"])))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
