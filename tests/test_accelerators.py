"""Unit tests for kinetic_airflow.accelerators against the facts in ACCELERATORS.md.

Expected values are written out by hand from the catalog tables (not computed
from the module's own tables) so a wrong table entry fails here.
"""

from __future__ import annotations

import json
import pickle
import re

import pytest

from kinetic_airflow.accelerators import (
    CHIPS_NOTE,
    GPU_TYPES,
    LABEL_ACCELERATOR_COUNT,
    TPU_GENERATIONS,
    AcceleratorSpec,
    InvalidAcceleratorError,
    Toleration,
    accelerator_notes,
    parse_accelerator,
    valid_choices,
)

TPU_TOL = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
GPU_TOL = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SPOT_TOL = {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}


# --------------------------------------------------------------------------
# TPUs: (input, gke label, topology, chips, hosts, chips/host, machine type)
# --------------------------------------------------------------------------

TPU_CASES = [
    # default: kinetic's v5e 2x2 on one 4-chip host
    ("tpu", "v5e", "tpu-v5-lite-podslice", "2x2", 4, 1, 4, "ct5lp-hightpu-4t"),
    # v5e (= v5litepod)
    ("tpu-v5e-1", "v5e", "tpu-v5-lite-podslice", "1x1", 1, 1, 1, "ct5lp-hightpu-1t"),
    ("tpu-v5litepod-4", "v5e", "tpu-v5-lite-podslice", "2x2", 4, 1, 4, "ct5lp-hightpu-4t"),
    ("tpu-v5e-8", "v5e", "tpu-v5-lite-podslice", "2x4", 8, 1, 8, "ct5lp-hightpu-8t"),
    ("tpu-v5litepod-2x4", "v5e", "tpu-v5-lite-podslice", "2x4", 8, 1, 8, "ct5lp-hightpu-8t"),
    ("tpu-v5e-16", "v5e", "tpu-v5-lite-podslice", "4x4", 16, 4, 4, "ct5lp-hightpu-4t"),
    # v6e: 8 chips is what keras-kinetic 0.0.4 (and `kinetic up`) makes of it, two 4-chip
    # ct6e-standard-4t hosts. It used to be one -8t host here, which never scheduled on a
    # kinetic-made pool (issue 8); the one-host shape is now spelled tpu-v6e-8t.
    ("tpu-v6e-4", "v6e", "tpu-v6e-slice", "2x2", 4, 1, 4, "ct6e-standard-4t"),
    ("tpu-v6e-8", "v6e", "tpu-v6e-slice", "2x4", 8, 2, 4, "ct6e-standard-4t"),
    ("tpu-v6e-2x4", "v6e", "tpu-v6e-slice", "2x4", 8, 2, 4, "ct6e-standard-4t"),
    ("tpu-v6e", "v6e", "tpu-v6e-slice", "2x4", 8, 2, 4, "ct6e-standard-4t"),
    ("tpu-v6e-8t", "v6e", "tpu-v6e-slice", "2x4", 8, 1, 8, "ct6e-standard-8t"),
    ("v6e-8t", "v6e", "tpu-v6e-slice", "2x4", 8, 1, 8, "ct6e-standard-8t"),
    ("tpu-v6e-4t", "v6e", "tpu-v6e-slice", "2x2", 4, 1, 4, "ct6e-standard-4t"),
    ("tpu-v6e-1t", "v6e", "tpu-v6e-slice", "1x1", 1, 1, 1, "ct6e-standard-1t"),
    ("tpu-v5e-8t", "v5e", "tpu-v5-lite-podslice", "2x4", 8, 1, 8, "ct5lp-hightpu-8t"),
    ("tpu-v5p-4t", "v5p", "tpu-v5p-slice", "2x2x1", 4, 1, 4, "ct5p-hightpu-4t"),
    ("tpu-v6e-4x4", "v6e", "tpu-v6e-slice", "4x4", 16, 4, 4, "ct6e-standard-4t"),
    ("tpu-v6e-8x16", "v6e", "tpu-v6e-slice", "8x16", 128, 32, 4, "ct6e-standard-4t"),
    # v5p: chips, not TensorCores (tpu-v5p-8 is 2 hosts)
    ("tpu-v5p-4", "v5p", "tpu-v5p-slice", "2x2x1", 4, 1, 4, "ct5p-hightpu-4t"),
    ("tpu-v5p-8", "v5p", "tpu-v5p-slice", "2x2x2", 8, 2, 4, "ct5p-hightpu-4t"),
    ("tpu-v5p-256", "v5p", "tpu-v5p-slice", "4x8x8", 256, 64, 4, "ct5p-hightpu-4t"),
    ("tpu-v5p-4x4x12", "v5p", "tpu-v5p-slice", "4x4x12", 192, 48, 4, "ct5p-hightpu-4t"),
    ("tpu-v5p-6144", "v5p", "tpu-v5p-slice", "16x16x24", 6144, 1536, 4, "ct5p-hightpu-4t"),
    # v4
    ("tpu-v4-4", "v4", "tpu-v4-podslice", "2x2x1", 4, 1, 4, "ct4p-hightpu-4t"),
    ("tpu-v4-8", "v4", "tpu-v4-podslice", "2x2x2", 8, 2, 4, "ct4p-hightpu-4t"),
    ("tpu-v4-2x2x4", "v4", "tpu-v4-podslice", "2x2x4", 16, 4, 4, "ct4p-hightpu-4t"),
    ("tpu-v4-3072", "v4", "tpu-v4-podslice", "12x16x16", 3072, 768, 4, "ct4p-hightpu-4t"),
    # v3: device label for the single host, slice label (not "podslice") above
    ("tpu-v3-4", "v3", "tpu-v3-device", "2x2", 4, 1, 4, "ct3-hightpu-4t"),
    ("tpu-v3-16", "v3", "tpu-v3-slice", "4x4", 16, 4, 4, "ct3p-hightpu-4t"),
    ("tpu-v3-32x32", "v3", "tpu-v3-slice", "32x32", 1024, 256, 4, "ct3p-hightpu-4t"),
    # TPU7x (Ironwood)
    ("tpu7x-1", "tpu7x", "tpu7x", "1x1x1", 1, 1, 1, "tpu7x-standard-1t"),
    ("tpu7x-8", "tpu7x", "tpu7x", "2x2x2", 8, 2, 4, "tpu7x-standard-4t"),
    ("tpu-7x-8", "tpu7x", "tpu7x", "2x2x2", 8, 2, 4, "tpu7x-standard-4t"),
    ("tpu7x-4x4x4", "tpu7x", "tpu7x", "4x4x4", 64, 16, 4, "tpu7x-standard-4t"),
    # bare chip count: the generation keras-kinetic 0.0.4 picks, the first of v6e, v5p, v5e,
    # v4, v3 whose kinetic table lists the count. This used to search this module's larger
    # tables (tpu-4 was v6e, tpu-512 v5p), which never matched kinetic's pods (issue 8).
    ("tpu:8", "v6e", "tpu-v6e-slice", "2x4", 8, 2, 4, "ct6e-standard-4t"),
    ("tpu-1", "v5e", "tpu-v5-lite-podslice", "1x1", 1, 1, 1, "ct5lp-hightpu-1t"),
    ("tpu-4", "v5e", "tpu-v5-lite-podslice", "2x2", 4, 1, 4, "ct5lp-hightpu-4t"),
    ("tpu-16", "v6e", "tpu-v6e-slice", "4x4", 16, 4, 4, "ct6e-standard-4t"),
    ("tpu-32", "v5p", "tpu-v5p-slice", "2x4x4", 32, 8, 4, "ct5p-hightpu-4t"),
    ("tpu-64", "v5e", "tpu-v5-lite-podslice", "8x8", 64, 16, 4, "ct5lp-hightpu-4t"),
    ("tpu-256", "v5e", "tpu-v5-lite-podslice", "16x16", 256, 64, 4, "ct5lp-hightpu-4t"),
    ("tpu-512", "v4", "tpu-v4-podslice", "8x8x8", 512, 128, 4, "ct4p-hightpu-4t"),
    ("tpu-2048", "v4", "tpu-v4-podslice", "8x16x16", 2048, 512, 4, "ct4p-hightpu-4t"),
    # counts kinetic does not list: the first of the same order that GKE offers
    ("tpu-192", "v5p", "tpu-v5p-slice", "4x4x12", 192, 48, 4, "ct5p-hightpu-4t"),
]


@pytest.mark.parametrize(
    ("text", "name", "label", "topology", "chips", "hosts", "per_host", "machine"), TPU_CASES
)
def test_tpu_fields(
    text: str, name: str, label: str, topology: str, chips: int, hosts: int, per_host: int, machine: str
) -> None:
    spec = parse_accelerator(text)
    assert spec.kind == "tpu"
    assert spec.name == name
    assert spec.gke_label == label
    assert spec.topology == topology
    assert spec.chips == spec.count == chips
    assert spec.hosts == hosts
    assert spec.chips_per_host == per_host
    assert spec.machine_type == machine
    assert spec.multi_host is (hosts > 1)
    assert spec.spot is False
    assert spec.node_selectors == {
        "cloud.google.com/gke-tpu-accelerator": label,
        "cloud.google.com/gke-tpu-topology": topology,
    }
    assert spec.resources == {"google.com/tpu": str(per_host)}
    assert [t.to_k8s() for t in spec.tolerations] == [TPU_TOL]


# --------------------------------------------------------------------------
# GPUs: (input, name, gke label, count, machine type)
# --------------------------------------------------------------------------

GPU_CASES = [
    ("gpu", "l4", "nvidia-l4", 1, "g2-standard-4"),
    ("l4x4", "l4", "nvidia-l4", 4, "g2-standard-48"),
    # gpu-<N> is the GPU keras-kinetic 0.0.4 picks, its most capable with N to a machine
    # (H100). It used to be N x L4 here, which never matched kinetic's pods (issue 8).
    ("gpu-4", "h100", "nvidia-h100-80gb", 4, "a3-highgpu-4g"),
    ("gpu:1", "h100", "nvidia-h100-80gb", 1, "a3-highgpu-1g"),
    ("gpu-8", "h100", "nvidia-h100-80gb", 8, "a3-highgpu-8g"),
    ("t4x2", "t4", "nvidia-tesla-t4", 2, "n1-standard-8"),
    ("gpu-v100x8", "v100", "nvidia-tesla-v100", 8, "n1-standard-64"),
    ("gpu-a100x4", "a100", "nvidia-tesla-a100", 4, "a2-highgpu-4g"),
    ("a100x16", "a100", "nvidia-tesla-a100", 16, "a2-megagpu-16g"),
    ("a100-80gbx8", "a100-80gb", "nvidia-a100-80gb", 8, "a2-ultragpu-8g"),
    ("gpu-h100x8", "h100", "nvidia-h100-80gb", 8, "a3-highgpu-8g"),
    ("gpu:h100-megax8", "h100-mega", "nvidia-h100-mega-80gb", 8, "a3-megagpu-8g"),
    ("h200x8", "h200", "nvidia-h200-141gb", 8, "a3-ultragpu-8g"),
    ("gpu-b200x8", "b200", "nvidia-b200", 8, "a4-highgpu-8g"),
    ("gb200x4", "gb200", "nvidia-gb200", 4, "a4x-highgpu-4g"),
    ("gpu-rtx-pro-6000x2", "rtx-pro-6000", "nvidia-rtx-pro-6000", 2, "g4-standard-96"),
]


@pytest.mark.parametrize(("text", "name", "label", "count", "machine"), GPU_CASES)
def test_gpu_fields(text: str, name: str, label: str, count: int, machine: str) -> None:
    spec = parse_accelerator(text)
    assert (spec.kind, spec.name, spec.gke_label) == ("gpu", name, label)
    assert spec.count == spec.chips_per_host == count
    assert (spec.chips, spec.topology, spec.hosts, spec.multi_host) == (0, None, 1, False)
    assert spec.machine_type == machine
    assert spec.node_selectors == {"cloud.google.com/gke-accelerator": label}
    assert spec.resources == {"nvidia.com/gpu": str(count)}
    assert [t.to_k8s() for t in spec.tolerations] == [GPU_TOL]
    assert spec.google_accelerator_type is None


def test_cpu_fields() -> None:
    spec = parse_accelerator("cpu")
    assert spec == AcceleratorSpec("cpu", "cpu", "cpu", None, 0, 0, None, 1, 0, None, False)
    assert (spec.node_selectors, spec.resources, spec.tolerations, spec.multi_host) == ({}, {}, (), False)


# --------------------------------------------------------------------------
# Spot
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kwarg"),
    [("tpu-v6e-16:spot", None), ("tpu-v6e-16", True), ("tpu-v6e-16:spot", True), ("tpu-v6e-16:spot", False)],
)
def test_tpu_spot(text: str, kwarg: bool | None) -> None:
    spec = parse_accelerator(text, spot=kwarg)
    assert spec.spot is True
    assert spec.text == "tpu-v6e-4x4:spot"
    assert spec.node_selectors == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "4x4",
        "cloud.google.com/gke-spot": "true",
    }
    assert [t.to_k8s() for t in spec.tolerations] == [TPU_TOL, SPOT_TOL]
    assert spec.hosts == 4


def test_gpu_and_cpu_spot() -> None:
    gpu = parse_accelerator("gpu:l4x2:spot")
    assert gpu.node_selectors == {
        "cloud.google.com/gke-accelerator": "nvidia-l4",
        "cloud.google.com/gke-spot": "true",
    }
    assert [t.to_k8s() for t in gpu.tolerations] == [GPU_TOL, SPOT_TOL]
    cpu = parse_accelerator("CPU:SPOT")
    assert (cpu.text, cpu.node_selectors, cpu.resources) == (
        "cpu:spot",
        {"cloud.google.com/gke-spot": "true"},
        {},
    )
    assert [t.to_k8s() for t in cpu.tolerations] == [SPOT_TOL]


def test_with_spot_round_trip() -> None:
    base = parse_accelerator("tpu-v5p-8")
    on = base.with_spot()
    assert (on.spot, on.text) == (True, "tpu-v5p-2x2x2:spot")
    off = on.with_spot(False)
    assert off == base
    assert parse_accelerator(base, spot=True) == on
    assert parse_accelerator(on) is on


# --------------------------------------------------------------------------
# Normalization and conventions
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("  TPU-V5E-1  ", "tpu-v5e-1x1"),
        ("tpu:v5litepod-8", "tpu-v5e-2x4"),
        ("v6e-8", "tpu-v6e-2x4"),
        ("tpu-trillium-16", "tpu-v6e-4x4"),
        ("tpu-ironwood", "tpu7x-2x2x1"),
        ("tpu-v5p", "tpu-v5p-2x2x2"),
        ("NVIDIA-TESLA-A100x2", "gpu-a100x2"),
        ("tpu-6144", "tpu-v5p-16x16x24"),
        # the one-host 8-chip v6e keeps its own spelling: tpu-v6e-2x4 is the two-host one
        ("TPU-V6E-8T:SPOT", "tpu-v6e-8t:spot"),
        ("tpu-v5e-8t", "tpu-v5e-2x4"),
    ],
)
def test_normalized_text(text: str, normalized: str) -> None:
    assert parse_accelerator(text).text == normalized


def test_text_round_trips_for_every_catalog_shape() -> None:
    seen = 0
    for gen in TPU_GENERATIONS.values():
        for chips in gen.chip_counts():
            spec = parse_accelerator(f"tpu-{gen.name}-{chips}")
            assert spec.chips == chips
            assert spec.chips_per_host * spec.hosts == chips
            assert spec.chips_per_host <= 8  # "A VM can access up to 8 TPU chips"
            assert parse_accelerator(spec.text) == spec
            assert str(spec) == spec.text
            seen += 1
        for size in gen.host_sizes():
            spec = parse_accelerator(f"tpu-{gen.name}-{size}t")
            assert (spec.hosts, spec.chips_per_host, spec.chips) == (1, size, size)
            assert spec.machine_type.endswith(f"-{size}t")
            assert parse_accelerator(spec.text) == spec
            seen += 1
    for gpu in GPU_TYPES.values():
        for count in gpu.counts:
            spec = parse_accelerator(f"{gpu.name}x{count}")
            assert parse_accelerator(spec.text) == spec
            seen += 1
    assert seen > 100


def test_gke_accelerator_count_is_not_selected() -> None:
    # Documented convention: GKE derives it from the google.com/tpu request.
    for text in ("tpu-v6e-8", "tpu-v6e-16", "gpu-l4x2"):
        assert LABEL_ACCELERATOR_COUNT not in parse_accelerator(text).node_selectors


@pytest.mark.parametrize(
    ("text", "google_name"),
    [("tpu-v5p-4", "v5p-8"), ("tpu-v5e-8", "v5litepod-8"), ("tpu7x-4", "tpu7x-8"), ("tpu-v3-4", "v3-8")],
)
def test_google_accelerator_type_counts_tensorcores(text: str, google_name: str) -> None:
    assert parse_accelerator(text).google_accelerator_type == google_name


def test_catalog_tables() -> None:
    assert set(TPU_GENERATIONS) == {"v3", "v4", "v5e", "v5p", "v6e", "tpu7x"}
    assert GPU_TYPES["a100-80gb"].counts == (1, 2, 4, 8)
    assert GPU_TYPES["a100"].counts == (1, 2, 4, 8, 16)
    assert GPU_TYPES["gb200"].arm64 and not GPU_TYPES["l4"].arm64
    assert {g.dims for g in TPU_GENERATIONS.values() if g.name in ("v4", "v5p", "tpu7x")} == {3}
    assert {g.dims for g in TPU_GENERATIONS.values() if g.name in ("v3", "v5e", "v6e")} == {2}
    assert TPU_GENERATIONS["v4"].chip_counts()[-1] == 3072
    assert TPU_GENERATIONS["v5p"].chip_counts()[-1] == 6144
    # Every > 64-chip 3D shape follows the multiple-of-4, A <= B <= C rule.
    for name in ("v4", "v5p", "tpu7x"):
        for chips in TPU_GENERATIONS[name].chip_counts():
            dims = TPU_GENERATIONS[name].shape_for_chips(chips).dims  # type: ignore[union-attr]
            if chips > 64:
                assert all(d % 4 == 0 for d in dims) and list(dims) == sorted(dims)


def test_toleration_to_k8s() -> None:
    assert Toleration("google.com/tpu").to_k8s() == TPU_TOL
    assert Toleration("a", "Equal", "b", "NoExecute").to_k8s() == {
        "key": "a",
        "operator": "Equal",
        "value": "b",
        "effect": "NoExecute",
    }


def test_valid_choices_summary() -> None:
    text = valid_choices()
    for part in (
        "cpu;",
        "gpu-<type>x<count>",
        "a100-80gb",
        "rtx-pro-6000",
        "v5e/v5litepod",
        "(chips, not TensorCores)",
        "tpu-<gen>-<N>t (one N-chip host)",
        "tpu7x",
        ":spot",
    ):
        assert part in text


# --------------------------------------------------------------------------
# Errors: (input, substrings the message must contain)
# --------------------------------------------------------------------------

ERROR_CASES = [
    # GPU counts GKE does not offer
    ("a100-80gbx16", ["16 GPU(s)", "allowed counts: 1, 2, 4, 8", "Did you mean 'a100-80gbx8'"]),
    ("gpu-h200x4", ["allowed counts: 8", "Did you mean 'gpu-h200x8'"]),
    ("gpu-3", ["no GPU comes 3 to a machine", "H100", "Did you mean 'gpu-4'"]),
    # keras-kinetic accepts these; GKE has no such machine or the string is ambiguous
    ("gpu-16", ["keras-kinetic 0.0.4 reads gpu-16 as 16 x a100-80gb", "Did you mean 'gpu-a100x16'"]),
    ("8", ["bare number is ambiguous", "reads '8' as gpu-8", "Did you mean 'gpu-8'"]),
    ("32", ["reads '32' as tpu-32", "Did you mean 'tpu-32'"]),
    ("cpu:4", ["takes no size", "ignores the number", "Did you mean 'cpu'"]),
    ("tpu-4096", ["reads tpu-4096 as v4", "Did you mean 'tpu-v5p-4096'", "count TensorCores"]),
    ("tpu-v4-4096", ["keras-kinetic 0.0.4 lists a 4096-chip v4 slice, GKE does not offer one"]),
    ("tpu-v3-32x64", ["keras-kinetic 0.0.4 lists a 2048-chip v3 slice", "Did you mean 'tpu-v3-32x32'"]),
    # -<N>t names one host of an N-chip machine
    ("tpu-v6e-16t", ["no single-host machine with 16 chips", "on 4 hosts", "Did you mean 'tpu-v6e-8t'"]),
    ("tpu-v5p-8t", ["no single-host machine with 8 chips", "on 2 hosts", "Did you mean 'tpu-v5p-4t'"]),
    # a mistyped -<N>t stays one host (tpu-v6e-8 is two, which backend="gke" cannot run), and every
    # list of a generation's sizes shows its one-host strings
    ("tpu-v6e-8tt", ["Did you mean 'tpu-v6e-8t'?", "one host: tpu-v6e-1t, tpu-v6e-4t, tpu-v6e-8t"]),
    ("v6e-4tt", ["Did you mean 'tpu-v6e-4t'?"]),
    ("tpu-v5litepod-8tt:spot", ["Did you mean 'tpu-v5litepod-8t:spot'?", "one host: tpu-v5litepod-1t,"]),
    ("tpu-v6e-7", ["no 7-chip slice", "one host: tpu-v6e-1t, tpu-v6e-4t, tpu-v6e-8t", "1, 4, 8, 16"]),
    ("tpu-v6e-8x", ["neither a chip count", "one host: tpu-v6e-1t, tpu-v6e-4t, tpu-v6e-8t"]),
    # unknown names with close matches
    ("gpu-h10x8", ["unknown GPU type 'h10'", "Did you mean 'gpu-h100x8'", "rtx-pro-6000"]),
    ("tpu-v6-8", ["unknown TPU generation 'v6'", "Did you mean 'tpu-v6e-8'", "tpu7x"]),
    ("gpu-k80x4", ["retired", "Did you mean 'gpu-t4x4'"]),
    ("gpu-v6e-8", ["is a TPU", "Did you mean 'tpu-v6e-8'"]),
    ("tpu-l4", ["is a GPU", "Did you mean 'gpu-l4'"]),
    ("cpu:8", ["takes no size", "Did you mean 'cpu'"]),
    ("quantum", ["not a known", valid_choices()]),
    ("", ["empty", "Did you mean 'cpu'"]),
    ("tpu-v6e-8:spto", ["unknown suffix ':spto'", "Did you mean 'tpu-v6e-8:spot'"]),
    # TPU chip counts that match no shape
    ("tpu-v5e-3", ["no 3-chip slice", "1, 4, 8, 16, 32, 64, 128, 256", "Did you mean 'tpu-v5e-4'"]),
    # every TPU size error says that sizes count chips, not Google's TensorCores
    ("tpu-v5p-3", ["Note: TPU sizes count chips", "Google's v5p-8 is 4 chips on one host"]),
    ("tpu-v3-8", ["counts TensorCores", "4 chips", "Did you mean 'tpu-v3-4'", "4, 16, 32"]),
    ("tpu-v3-2048", ["no 2048-chip slice", "Did you mean 'tpu-v3-1024'"]),
    ("tpu-3", ["no TPU generation has a 3-chip slice", "Did you mean 'tpu-4'"]),
    # TPU topology shape rules
    ("tpu-v5p-2x4", ["3D (AxBxC)", "Did you mean 'tpu-v5p-2x2x2'", "up to 16x16x24"]),
    ("tpu-v6e-2x2x2", ["2D (AxB)", "Did you mean 'tpu-v6e-2x4'", "1x1, 2x2, 2x4"]),
    ("tpu-v5p-4x4x6", ["multiple of 4", "Did you mean"]),
    ("tpu-v5p-8x4x4", ["A <= B <= C", "Did you mean 'tpu-v5p-4x4x8'"]),
    ("tpu-v4-16x16x16", ["exceeds the GKE maximum 12x16x16", "Did you mean 'tpu-v4-12x16x16'"]),
    ("tpu-v6e-4x2", ["no '4x2' slice", "Did you mean 'tpu-v6e-2x4'"]),
    ("tpu-v4-1x2x2", ["no '1x2x2' slice", "Did you mean 'tpu-v4-2x2x1'"]),
    ("tpu-2x4", ["needs a TPU generation", "Did you mean 'tpu-v5e-2x4'"]),
]


@pytest.mark.parametrize(("text", "fragments"), ERROR_CASES)
def test_errors(text: str, fragments: list[str]) -> None:
    with pytest.raises(InvalidAcceleratorError) as info:
        parse_accelerator(text)
    message = str(info.value)
    assert message.startswith(f"Invalid accelerator {text!r}: ")
    for fragment in fragments:
        assert fragment in message
    assert isinstance(info.value, ValueError)


def test_notes_say_what_the_numbers_count() -> None:
    # `kinetic-airflow check` shows these: someone who types Google's v5p-8 learns it is 8
    # chips on 2 hosts here, and the two 8-chip v6e shapes point at each other.
    v5p = " ".join(accelerator_notes(parse_accelerator("tpu-v5p-8")))
    assert "8 chips on 2 hosts of 4" in v5p and "Google calls this slice v5p-16" in v5p
    assert "Google's v5p-8 is 4 chips on one host, tpu-v5p-4 here" in v5p
    two = " ".join(accelerator_notes(parse_accelerator("tpu-v6e-8")))
    assert "two ct6e-standard-4t hosts" in two and "use tpu-v6e-8t" in two
    one = " ".join(accelerator_notes(parse_accelerator("tpu-v6e-8t")))
    assert "One ct6e-standard-8t host" in one and "tpu-v6e-8 (keras-kinetic's meaning)" in one
    assert "tpu-v3-podslice" in " ".join(accelerator_notes(parse_accelerator("tpu-v3-4")))
    assert "Spot or flex-start" in " ".join(accelerator_notes(parse_accelerator("gpu-4")))
    assert accelerator_notes(parse_accelerator("cpu")) == ()
    assert "count TensorCores" in CHIPS_NOTE and "tpu-v5p-8 here is 8 chips on 2 hosts" in CHIPS_NOTE


def test_cli_check_and_listing_explain_counts(capsys: pytest.CaptureFixture[str]) -> None:
    from kinetic_airflow.cli.main import main

    assert main(["check", "tpu-v5p-8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["chips"], out["hosts"], out["chips_per_host"]) == (8, 2, 4)
    assert out["google_accelerator_type"] == "v5p-16"
    assert any("Google's v5p-8 is 4 chips on one host" in note for note in out["notes"])
    assert main(["check", "tpu-v6e-8t"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["accelerator"], out["hosts"], out["resources"]) == ("tpu-v6e-8t", 1, {"google.com/tpu": "8"})
    assert main(["check", "tpu-v5p-3"]) == 2
    assert "TPU sizes count chips" in capsys.readouterr().err
    assert main(["accelerators"]) == 0
    listing = capsys.readouterr().out
    assert "tpu-v6e-8t is 2x4 on one ct6e-standard-8t host" in listing
    assert "tpu7x-4t" in listing and CHIPS_NOTE in listing
    for word in re.findall(r"\b(?:tpu-v[0-9a-z]+|tpu7x)-\d+t\b", listing):
        assert parse_accelerator(word).hosts == 1, word


def test_error_keeps_user_spelling_and_pickles() -> None:
    with pytest.raises(InvalidAcceleratorError) as info:
        parse_accelerator("  GPU:A100-80GBx16:spot ")
    err = info.value
    assert err.text == "  GPU:A100-80GBx16:spot "
    assert err.suggestion == "gpu:a100-80gbx8:spot"
    clone = pickle.loads(pickle.dumps(err))
    assert (type(clone), str(clone), clone.suggestion) == (InvalidAcceleratorError, str(err), err.suggestion)
    with pytest.raises(InvalidAcceleratorError) as info:
        parse_accelerator("tpu-v5p-3")
    noted = pickle.loads(pickle.dumps(info.value))
    assert noted.note == CHIPS_NOTE and str(noted) == str(info.value)


def test_non_string_is_type_error() -> None:
    with pytest.raises(TypeError):
        parse_accelerator(8)  # type: ignore[arg-type]
