"""Accelerator strings -> what a GKE pod needs to land on TPU or GPU nodes.

This module is the single registry of accelerator facts for kinetic-airflow.
The operator, the manifest builders, the CLI and the docs all read it. It uses
only the standard library because the job runner imports it inside containers
that have no Airflow.

Every fact here comes from the catalog in ``ACCELERATORS.md`` (GKE docs, GKE's
own cluster-autoscaler tables, xpk). Where keras-kinetic 0.0.4's table disagrees
with GKE (the v3 label, A100 80GB x16, missing shapes), this module follows GKE.

Grammar (case-insensitive, surrounding whitespace ignored)::

    cpu
    gpu                      -> 1 x L4 (kinetic's default GPU)
    gpu-<N>                  -> N x L4
    gpu-<type>, <type>       -> 1 GPU of that type             (gpu-l4, h100)
    gpu-<type>x<N>, <type>xN -> N GPUs on one machine           (gpu-a100x4, a100-80gbx8)
    tpu                      -> v5e, 4 chips, 2x2, one host (kinetic's default TPU)
    tpu-<N>                  -> N chips of the first generation, in kinetic's order
                                v6e, v5p, v5e, v4, v3, that has an N-chip slice
    tpu-<gen>                -> that generation's default size (kinetic's defaults)
    tpu-<gen>-<chips>        -> tpu-v5e-1, tpu-v6e-8, tpu-v5p-8, tpu7x-8, tpu-7x-8
    tpu-<gen>-<topology>     -> tpu-v5litepod-2x4, tpu-v6e-4x4, tpu-v5p-2x2x2
    <any of these>:spot      -> same hardware on Spot VMs

``gpu:``/``tpu:`` (kinetic's colon prefix) work like ``gpu-``/``tpu-``, and the
``tpu-`` prefix may be left out (``v6e-8``), as kinetic allows. ``v5e`` and
``v5litepod`` are the same generation; ``7x``/``ironwood`` mean ``tpu7x`` and
``trillium`` means ``v6e``. A GPU can also be named by its GKE label
(``nvidia-l4``).

Conventions (decisions, not facts; see the catalog's "Conventions to decide"):

* **TPU numbers count chips**, as in kinetic: ``tpu-v5p-8`` is 8 chips
  (``2x2x2``, two hosts), not Google's ``v5p-8`` (4 chips, TensorCores counted).
  Users porting ``@kinetic.run`` code expect kinetic's meaning. The topology
  form is never ambiguous, so :attr:`AcceleratorSpec.text` (the normalized
  string) always uses it, and :attr:`AcceleratorSpec.google_accelerator_type`
  gives Google's name. When a count is invalid but half of it is valid on a
  generation with two TensorCores per chip (``tpu-v3-8``), the error says so.
* **8-chip v5e/v6e is one host**: ``2x4`` on the ``-8t`` machine (8 chips per
  pod), not two ``-4t`` VMs (catalog section 6 point 8). GKE decides single vs
  multi host from the pod's ``google.com/tpu`` request, so asking for 8 chips
  is what selects the ``-8t`` machine. 16 chips and up are multi-host on
  ``-4t`` machines. The two-VM ``2x4`` shape is deliberately not offered.
* **Defaults** follow kinetic: ``gpu`` is one L4 (``g2-standard-4``), ``tpu``
  is v5e ``2x2`` (4 chips, one ``ct5lp-hightpu-4t`` host). A bare generation
  uses kinetic's default chip count (v3 4, v4 4, v5e 4, v5p 8, v6e 8; TPU7x 4,
  one full host). ``gpu-<N>`` means N L4s; kinetic instead picks "the most
  capable" GPU (H100), which on GKE is Spot/flex-start only below 8 GPUs and an
  expensive surprise.
* **``cloud.google.com/gke-accelerator-count`` is not put in the node
  selector.** GKE derives it from the pod's ``google.com/tpu`` /
  ``nvidia.com/gpu`` request (which always equals the chips/GPUs per node
  here), kinetic does not set it, and leaving it out keeps pods schedulable on
  exactly the node pools kinetic's pods use. Callers that want it can add
  ``{LABEL_ACCELERATOR_COUNT: str(spec.chips_per_host)}``.
* **3D slices above 64 chips** (v4, v5p, TPU7x) follow GKE's rule: A, B and C
  are multiples of 4 with A <= B <= C, and each sorted dimension stays within
  the GKE maximum (v4 ``12x16x16``, v5p ``16x16x24``, TPU7x ``16x16x36``; the
  TPU7x bound is only third-party evidence). A chip count maps to the most
  cubic such shape (``tpu-v5p-256`` -> ``4x8x8``).
* ``spot=True`` forces Spot; ``spot=False``/``None`` keep what the string says
  (a ``:spot`` suffix is never silently dropped). Use
  :meth:`AcceleratorSpec.with_spot` to turn Spot off.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = [
    "DEFAULT_GPU",
    "DEFAULT_TPU",
    "GPU_TYPES",
    "LABEL_ACCELERATOR_COUNT",
    "LABEL_GPU_ACCELERATOR",
    "LABEL_SPOT",
    "LABEL_TPU_ACCELERATOR",
    "LABEL_TPU_TOPOLOGY",
    "RESOURCE_GPU",
    "RESOURCE_TPU",
    "TPU_GENERATIONS",
    "AcceleratorSpec",
    "GpuType",
    "InvalidAcceleratorError",
    "Toleration",
    "TpuGeneration",
    "TpuShape",
    "parse_accelerator",
    "valid_choices",
]

# Kubernetes keys, named once so builders and tests agree on spelling.
LABEL_TPU_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
LABEL_TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
LABEL_GPU_ACCELERATOR = "cloud.google.com/gke-accelerator"
LABEL_ACCELERATOR_COUNT = "cloud.google.com/gke-accelerator-count"
LABEL_SPOT = "cloud.google.com/gke-spot"
RESOURCE_TPU = "google.com/tpu"
RESOURCE_GPU = "nvidia.com/gpu"

_SPOT_SUFFIX = ":spot"


class InvalidAcceleratorError(ValueError):
    """An accelerator string that names no hardware GKE can provide.

    A ``ValueError`` so callers validating user input can catch one type. The
    message is meant to be shown to DAG authors as is: it quotes the string,
    says what is wrong, offers a "did you mean" when one is close and lists
    what would have been accepted.
    """

    def __init__(
        self,
        text: str,
        reason: str,
        choices: str | None = None,
        suggestion: str | None = None,
    ) -> None:
        self.text = text
        self.reason = reason
        self.choices = valid_choices() if choices is None else choices
        self.suggestion = suggestion
        message = f"Invalid accelerator {text!r}: {reason}."
        if suggestion:
            message += f" Did you mean {suggestion!r}?"
        if self.choices:
            message += f" Valid: {self.choices}."
        super().__init__(message)

    def __reduce__(self) -> tuple[type[InvalidAcceleratorError], tuple[str, str, str, str | None]]:
        # Exceptions are pickled by their args; ours has a richer __init__, so
        # rebuild from the fields (Airflow and multiprocessing pickle errors).
        return (type(self), (self.text, self.reason, self.choices, self.suggestion))


@dataclass(frozen=True)
class Toleration:
    """A pod toleration; frozen so specs stay hashable and shareable."""

    key: str
    operator: str = "Exists"
    value: str | None = None
    effect: str = "NoSchedule"

    def to_k8s(self) -> dict[str, str]:
        """The camelCase dict a pod spec takes (``value`` omitted when unset,
        because ``Exists`` tolerations must not carry one)."""
        out = {"key": self.key, "operator": self.operator}
        if self.value is not None:
            out["value"] = self.value
        out["effect"] = self.effect
        return out


# --------------------------------------------------------------------------
# Catalog tables
# --------------------------------------------------------------------------


def _dims(topology: str) -> tuple[int, ...]:
    return tuple(int(d) for d in topology.split("x"))


def _product(dims: Iterable[int]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


@dataclass(frozen=True)
class TpuShape:
    """One TPU slice shape: what GKE builds and what each pod must request."""

    topology: str
    chips: int
    machine_type: str
    chips_per_host: int
    gke_label: str

    @property
    def hosts(self) -> int:
        """VMs (= pods, one TPU pod per node) in the slice."""
        return self.chips // self.chips_per_host

    @property
    def dims(self) -> tuple[int, ...]:
        return _dims(self.topology)


@dataclass(frozen=True)
class TpuGeneration:
    """A TPU generation as GKE offers it.

    ``shapes`` lists the enumerated slices (each chip count once; for v5e/v6e
    the 8-chip entry is the single-host ``-8t`` one). For 3D generations,
    larger slices follow the multiple-of-4 rule up to ``max_dims`` on
    ``pod_machine_type``.
    """

    name: str
    aliases: tuple[str, ...]
    gke_label: str
    dims: int
    tensorcores_per_chip: int
    google_prefix: str
    default_chips: int
    shapes: tuple[TpuShape, ...]
    pod_machine_type: str
    max_dims: tuple[int, int, int] | None = None
    note: str = ""

    def shape_for_chips(self, chips: int) -> TpuShape | None:
        """The slice for a chip count, or None when the generation has none."""
        for shape in self.shapes:
            if shape.chips == chips:
                return shape
        dims = _LARGE_3D.get(self.name, {}).get(chips)
        return self._large_shape(dims) if dims else None

    def chip_counts(self) -> tuple[int, ...]:
        """Every valid chip count, ascending."""
        return tuple(sorted({s.chips for s in self.shapes} | set(_LARGE_3D.get(self.name, {}))))

    def _large_shape(self, dims: tuple[int, ...]) -> TpuShape:
        return TpuShape(
            topology="x".join(map(str, dims)),
            chips=_product(dims),
            machine_type=self.pod_machine_type,
            chips_per_host=4,
            gke_label=self.gke_label,
        )

    def topology_rule(self) -> str:
        """Human-readable summary of the valid topologies (for errors)."""
        listed = ", ".join(s.topology for s in self.shapes)
        if self.max_dims is None:
            return listed
        top = "x".join(map(str, self.max_dims))
        return f"{listed}, then AxBxC with A <= B <= C, each a multiple of 4, up to {top}"


def _tpu_shapes(label: str, rows: Iterable[tuple[str, str, int]]) -> tuple[TpuShape, ...]:
    return tuple(
        TpuShape(
            topology=topo, chips=_product(_dims(topo)), machine_type=mt, chips_per_host=cph, gke_label=label
        )
        for topo, mt, cph in rows
    )


def _lite_rows(prefix: str) -> list[tuple[str, str, int]]:
    """v5e and v6e share one table: 1t/4t/8t single hosts, then 4t slices."""
    return [
        ("1x1", f"{prefix}-1t", 1),
        ("2x2", f"{prefix}-4t", 4),
        ("2x4", f"{prefix}-8t", 8),
        *((topo, f"{prefix}-4t", 4) for topo in ("4x4", "4x8", "8x8", "8x16", "16x16")),
    ]


def _cube_rows(machine_type: str) -> list[tuple[str, str, int]]:
    """v4/v5p/TPU7x slices up to one 4x4x4 cube, all on 4-chip VMs."""
    return [(topo, machine_type, 4) for topo in ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4")]


TPU_GENERATIONS: dict[str, TpuGeneration] = {
    "v3": TpuGeneration(
        name="v3",
        aliases=("v3",),
        gke_label="tpu-v3-slice",
        dims=2,
        tensorcores_per_chip=2,
        google_prefix="v3",
        default_chips=4,
        shapes=_tpu_shapes("tpu-v3-device", [("2x2", "ct3-hightpu-4t", 4)])
        + _tpu_shapes(
            "tpu-v3-slice",
            [(t, "ct3p-hightpu-4t", 4) for t in ("4x4", "4x8", "8x8", "8x16", "16x16", "16x32", "32x32")],
        ),
        pod_machine_type="ct3p-hightpu-4t",
        note="2x2 is tpu-v3-device (ct3); slices are tpu-v3-slice (ct3p); 16x32/32x32 are unconfirmed "
        "in GKE docs; no Multislice or flex-start",
    ),
    "v4": TpuGeneration(
        name="v4",
        aliases=("v4",),
        gke_label="tpu-v4-podslice",
        dims=3,
        tensorcores_per_chip=2,
        google_prefix="v4",
        default_chips=4,
        shapes=_tpu_shapes("tpu-v4-podslice", _cube_rows("ct4p-hightpu-4t")),
        pod_machine_type="ct4p-hightpu-4t",
        max_dims=(12, 16, 16),
        note="GKE maximum 12x16x16 (the 16x16x16 pod of the TPU docs is not offered by GKE)",
    ),
    "v5e": TpuGeneration(
        name="v5e",
        aliases=("v5e", "v5litepod", "v5lite"),
        gke_label="tpu-v5-lite-podslice",
        dims=2,
        tensorcores_per_chip=1,
        google_prefix="v5litepod",
        default_chips=4,
        shapes=_tpu_shapes("tpu-v5-lite-podslice", _lite_rows("ct5lp-hightpu")),
        pod_machine_type="ct5lp-hightpu-4t",
    ),
    "v5p": TpuGeneration(
        name="v5p",
        aliases=("v5p",),
        gke_label="tpu-v5p-slice",
        dims=3,
        tensorcores_per_chip=2,
        google_prefix="v5p",
        default_chips=8,
        shapes=_tpu_shapes("tpu-v5p-slice", _cube_rows("ct5p-hightpu-4t")),
        pod_machine_type="ct5p-hightpu-4t",
        max_dims=(16, 16, 24),
    ),
    "v6e": TpuGeneration(
        name="v6e",
        aliases=("v6e", "trillium"),
        gke_label="tpu-v6e-slice",
        dims=2,
        tensorcores_per_chip=1,
        google_prefix="v6e",
        default_chips=8,
        shapes=_tpu_shapes("tpu-v6e-slice", _lite_rows("ct6e-standard")),
        pod_machine_type="ct6e-standard-4t",
    ),
    "tpu7x": TpuGeneration(
        name="tpu7x",
        aliases=("tpu7x", "7x", "ironwood"),
        gke_label="tpu7x",
        dims=3,
        tensorcores_per_chip=2,
        google_prefix="tpu7x",
        default_chips=4,
        shapes=_tpu_shapes("tpu7x", [("1x1x1", "tpu7x-standard-1t", 1)])
        + _tpu_shapes("tpu7x", _cube_rows("tpu7x-standard-4t")),
        pod_machine_type="tpu7x-standard-4t",
        max_dims=(16, 16, 36),
        note="1x1x1 (tpu7x-standard-1t) is availability-restricted; multi-host node pools need a "
        "workload policy; needs GKE >= 1.34",
    ),
}


@dataclass(frozen=True)
class GpuType:
    """A GPU model as GKE offers it: label, and machine type per GPU count."""

    name: str
    gke_label: str
    machine_types: tuple[tuple[int, str], ...]
    aliases: tuple[str, ...] = ()
    arm64: bool = False
    note: str = ""

    @property
    def counts(self) -> tuple[int, ...]:
        """GPUs per machine that GKE offers for this model."""
        return tuple(c for c, _ in self.machine_types)

    def machine_type_for(self, count: int) -> str | None:
        """The default machine type for ``count`` GPUs, or None if invalid."""
        return dict(self.machine_types).get(count)


def _gpu(
    name: str, label: str, machines: dict[int, str], *aliases: str, arm64: bool = False, note: str = ""
) -> GpuType:
    return GpuType(name, label, tuple(machines.items()), (label, *aliases), arm64=arm64, note=note)


GPU_TYPES: dict[str, GpuType] = {
    g.name: g
    for g in (
        _gpu(
            "l4",
            "nvidia-l4",
            {1: "g2-standard-4", 2: "g2-standard-24", 4: "g2-standard-48", 8: "g2-standard-96"},
            note="g2-standard-8/12/16/32 also carry 1 L4",
        ),
        _gpu("t4", "nvidia-tesla-t4", {1: "n1-standard-4", 2: "n1-standard-8", 4: "n1-standard-16"}),
        _gpu(
            "v100",
            "nvidia-tesla-v100",
            {1: "n1-standard-8", 2: "n1-standard-16", 4: "n1-standard-32", 8: "n1-standard-64"},
        ),
        _gpu("p100", "nvidia-tesla-p100", {1: "n1-standard-4", 2: "n1-standard-8", 4: "n1-standard-16"}),
        _gpu("p4", "nvidia-tesla-p4", {1: "n1-standard-4", 2: "n1-standard-8", 4: "n1-standard-16"}),
        _gpu(
            "a100",
            "nvidia-tesla-a100",
            {
                1: "a2-highgpu-1g",
                2: "a2-highgpu-2g",
                4: "a2-highgpu-4g",
                8: "a2-highgpu-8g",
                16: "a2-megagpu-16g",
            },
            "a100-40gb",
        ),
        _gpu(
            "a100-80gb",
            "nvidia-a100-80gb",
            {1: "a2-ultragpu-1g", 2: "a2-ultragpu-2g", 4: "a2-ultragpu-4g", 8: "a2-ultragpu-8g"},
            note="no 16-GPU machine",
        ),
        _gpu(
            "h100",
            "nvidia-h100-80gb",
            {1: "a3-highgpu-1g", 2: "a3-highgpu-2g", 4: "a3-highgpu-4g", 8: "a3-highgpu-8g"},
            "h100-80gb",
            note="1/2/4 GPUs only as Spot or flex-start",
        ),
        _gpu("h100-mega", "nvidia-h100-mega-80gb", {8: "a3-megagpu-8g"}, "h100-mega-80gb"),
        _gpu(
            "h200",
            "nvidia-h200-141gb",
            {8: "a3-ultragpu-8g"},
            "h200-141gb",
            note="reservation, Spot or flex-start",
        ),
        _gpu("b200", "nvidia-b200", {8: "a4-highgpu-8g"}, note="reservation, Spot or flex-start"),
        _gpu("gb200", "nvidia-gb200", {4: "a4x-highgpu-4g"}, arm64=True, note="arm64 (Grace) images"),
        _gpu(
            "gb300",
            "nvidia-gb300",
            {4: "a4x-maxgpu-4g-metal"},
            arm64=True,
            note="bare metal, arm64, reservation only, no autoscaling",
        ),
        _gpu(
            "rtx-pro-6000",
            "nvidia-rtx-pro-6000",
            {1: "g4-standard-48", 2: "g4-standard-96", 4: "g4-standard-192", 8: "g4-standard-384"},
            note="needs GKE >= 1.34.0-gke.1662000",
        ),
    )
}

# Retired models get a clear message instead of "unknown".
_RETIRED_GPUS = dict.fromkeys(("k80", "nvidia-tesla-k80"), "the K80 is retired and no longer offered by GKE")

DEFAULT_GPU = "l4"
DEFAULT_TPU = "v5e"
# kinetic's preference order for a bare chip count (``tpu-8``).
_TPU_COUNT_PREFERENCE = ("v6e", "v5p", "v5e", "v4", "v3")

_GPU_ALIASES: dict[str, str] = {a: g.name for g in GPU_TYPES.values() for a in (g.name, *g.aliases)}
_TPU_ALIASES: dict[str, str] = {a: t.name for t in TPU_GENERATIONS.values() for a in (t.name, *t.aliases)}


def _large_3d_table(max_dims: tuple[int, int, int]) -> dict[int, tuple[int, int, int]]:
    """Chip count -> most cubic AxBxC (multiples of 4, A <= B <= C) above 64 chips.

    "Most cubic" = smallest C, then largest A, which reproduces the shapes
    Google lists (256 -> 4x8x8, 1024 -> 8x8x16, 6144 -> 16x16x24).
    """
    best: dict[int, tuple[int, int, int]] = {}
    for a in range(4, max_dims[0] + 1, 4):
        for b in range(a, max_dims[1] + 1, 4):
            for c in range(b, max_dims[2] + 1, 4):
                chips = a * b * c
                if chips <= 64:
                    continue
                cur = best.get(chips)
                if cur is None or (c, -a) < (cur[2], -cur[0]):
                    best[chips] = (a, b, c)
    return best


_LARGE_3D: dict[str, dict[int, tuple[int, int, int]]] = {
    gen.name: _large_3d_table(gen.max_dims) for gen in TPU_GENERATIONS.values() if gen.max_dims
}


# --------------------------------------------------------------------------
# The resolved spec
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class AcceleratorSpec:
    """Fully resolved hardware for one job: everything the pod spec needs.

    Frozen and hashable so it can be cached, compared and passed between
    threads. ``count`` is GPUs per host for GPUs and chips in the whole slice
    for TPUs (kinetic's meaning); ``chips_per_host`` is what each pod requests.
    """

    text: str
    kind: str
    name: str
    gke_label: str | None
    count: int
    chips: int
    topology: str | None
    hosts: int
    chips_per_host: int
    machine_type: str | None
    spot: bool

    def __post_init__(self) -> None:
        if self.kind not in ("cpu", "gpu", "tpu"):
            raise ValueError(f"kind must be 'cpu', 'gpu' or 'tpu', not {self.kind!r}")

    def __str__(self) -> str:
        return self.text

    @property
    def multi_host(self) -> bool:
        """True when the slice spans several VMs (LeaderWorkerSet, not a Job)."""
        return self.hosts > 1

    @property
    def node_selectors(self) -> dict[str, str]:
        """``nodeSelector`` entries (see the module docstring on why
        ``gke-accelerator-count`` is left out)."""
        sel: dict[str, str] = {}
        if self.kind == "tpu" and self.gke_label and self.topology:
            sel[LABEL_TPU_ACCELERATOR] = self.gke_label
            sel[LABEL_TPU_TOPOLOGY] = self.topology
        elif self.kind == "gpu" and self.gke_label:
            sel[LABEL_GPU_ACCELERATOR] = self.gke_label
        if self.spot:
            sel[LABEL_SPOT] = "true"
        return sel

    @property
    def resources(self) -> dict[str, str]:
        """Extended-resource limits (use them as requests too). A TPU pod must
        take every chip of its node, so this is chips per host, not the slice."""
        if self.kind == "tpu":
            return {RESOURCE_TPU: str(self.chips_per_host)}
        if self.kind == "gpu":
            return {RESOURCE_GPU: str(self.count)}
        return {}

    @property
    def tolerations(self) -> tuple[Toleration, ...]:
        """Tolerations for the accelerator taint and, for Spot, the Spot taint.

        GKE's admission controller adds the accelerator one for requested
        extended resources, but stating it keeps the manifest correct on
        clusters where that does not happen (and matches kinetic and xpk).
        """
        tols: list[Toleration] = []
        if self.kind == "tpu":
            tols.append(Toleration(RESOURCE_TPU))
        elif self.kind == "gpu":
            tols.append(Toleration(RESOURCE_GPU))
        if self.spot:
            tols.append(Toleration(LABEL_SPOT, "Equal", "true", "NoSchedule"))
        return tuple(tols)

    @property
    def google_accelerator_type(self) -> str | None:
        """Google's Cloud TPU name (``v5p-8`` for 4 v5p chips): TensorCores for
        v3/v4/v5p/TPU7x, chips for v5e/v6e. This is what ``TPU_ACCELERATOR_TYPE``
        reports inside the pod. None for GPU/CPU or unknown generations."""
        gen = TPU_GENERATIONS.get(self.name) if self.kind == "tpu" else None
        if gen is None:
            return None
        return f"{gen.google_prefix}-{self.chips * gen.tensorcores_per_chip}"

    def with_spot(self, spot: bool = True) -> AcceleratorSpec:
        """The same hardware on (or off) Spot VMs, with ``text`` kept in step."""
        base = self.text[: -len(_SPOT_SUFFIX)] if self.text.endswith(_SPOT_SUFFIX) else self.text
        return dataclasses.replace(self, spot=spot, text=base + (_SPOT_SUFFIX if spot else ""))


def _cpu_spec() -> AcceleratorSpec:
    return AcceleratorSpec("cpu", "cpu", "cpu", None, 0, 0, None, 1, 0, None, False)


def _gpu_spec(gpu: GpuType, count: int) -> AcceleratorSpec:
    text = f"gpu-{gpu.name}" + (f"x{count}" if count != 1 else "")
    return AcceleratorSpec(
        text=text,
        kind="gpu",
        name=gpu.name,
        gke_label=gpu.gke_label,
        count=count,
        chips=0,
        topology=None,
        hosts=1,
        chips_per_host=count,
        machine_type=gpu.machine_type_for(count),
        spot=False,
    )


def _tpu_spec(gen: TpuGeneration, shape: TpuShape) -> AcceleratorSpec:
    # "tpu7x" already starts with "tpu"; avoid "tpu-tpu7x-...".
    head = gen.name if gen.name.startswith("tpu") else f"tpu-{gen.name}"
    return AcceleratorSpec(
        text=f"{head}-{shape.topology}",
        kind="tpu",
        name=gen.name,
        gke_label=shape.gke_label,
        count=shape.chips,
        chips=shape.chips,
        topology=shape.topology,
        hosts=shape.hosts,
        chips_per_host=shape.chips_per_host,
        machine_type=shape.machine_type,
        spot=False,
    )


# --------------------------------------------------------------------------
# Choices and suggestions
# --------------------------------------------------------------------------


def valid_choices() -> str:
    """One-line grammar summary used in every "invalid accelerator" error."""
    gpus = ", ".join(GPU_TYPES)
    gens = ", ".join("v5e/v5litepod" if g == "v5e" else g for g in TPU_GENERATIONS)
    return (
        f"cpu; gpu, gpu-<type>, gpu-<type>x<count> with types {gpus}; "
        f"tpu, tpu-<gen>-<chips>, tpu-<gen>-<topology> with gens {gens}; append ':spot'"
    )


def _format_counts(counts: Iterable[int], limit: int = 16) -> str:
    """Comma list, shortened in the middle when long (v5p has 30+ counts)."""
    items = [str(c) for c in counts]
    if len(items) > limit:
        items = [*items[: limit - 2], "...", items[-1]]
    return ", ".join(items)


def _nearest(value: int, options: Iterable[int]) -> int | None:
    """Closest option; ties go to the larger one (the user asked for more)."""
    opts = list(options)
    if not opts:
        return None
    return min(opts, key=lambda o: (abs(o - value), -o))


def _close(word: str, options: Iterable[str]) -> str | None:
    hits = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return hits[0] if hits else None


@functools.lru_cache(maxsize=1)
def _example_strings() -> tuple[str, ...]:
    """Every canonical-looking string, for whole-string "did you mean"."""
    out = ["cpu", "gpu", "tpu"]
    for gpu in GPU_TYPES.values():
        out += [gpu.name, f"gpu-{gpu.name}"]
        out += [f"{p}{gpu.name}x{c}" for c in gpu.counts for p in ("", "gpu-")]
    for gen in TPU_GENERATIONS.values():
        for alias in gen.aliases:
            head = alias if alias.startswith("tpu") else f"tpu-{alias}"
            out.append(head)
            out += [f"{head}-{s.chips}" for s in gen.shapes]
            out += [f"{head}-{s.topology}" for s in gen.shapes]
    return tuple(dict.fromkeys(out))


# --------------------------------------------------------------------------
# Parser
# --------------------------------------------------------------------------

_PREFIX_RE = re.compile(r"(?P<kind>gpu|tpu)(?:(?P<sep>[-:])(?P<rest>.*))?")
_GPU_RE = re.compile(r"(?P<name>[a-z0-9][a-z0-9-]*?)(?:x(?P<count>\d+))?")
_TPU_RE = re.compile(r"(?P<gen>[a-z0-9]+)(?:-(?P<size>[0-9x]+))?")
_TOPOLOGY_RE = re.compile(r"\d+(?:x\d+){1,2}")
_BAD_SUFFIX_RE = re.compile(r"(?P<head>.*?):(?P<word>[a-z]+)")


@dataclass(frozen=True)
class _Ctx:
    """Where a bad token came from, so suggestions can be rebuilt in the
    user's own spelling (prefix style and ``:spot`` kept)."""

    original: str
    prefix: str
    suffix: str

    def fix(self, body: str) -> str:
        return f"{self.prefix}{body}{self.suffix}"

    def error(
        self, reason: str, suggestion_body: str | None = None, choices: str | None = None
    ) -> InvalidAcceleratorError:
        suggestion = self.fix(suggestion_body) if suggestion_body is not None else None
        return InvalidAcceleratorError(self.original, reason, choices, suggestion)


def parse_accelerator(text: str | AcceleratorSpec, *, spot: bool | None = None) -> AcceleratorSpec:
    """Resolve an accelerator string (see the module docstring for the grammar).

    ``spot=True`` forces Spot VMs; a ``:spot`` suffix also sets it; ``False`` or
    ``None`` leave the string's choice alone. An :class:`AcceleratorSpec` is
    accepted as is, so callers can take either. Raises
    :class:`InvalidAcceleratorError` (a ``ValueError``) for anything GKE cannot
    provide, and ``TypeError`` for non-strings.
    """
    if isinstance(text, AcceleratorSpec):
        return text.with_spot(True) if spot and not text.spot else text
    if not isinstance(text, str):
        raise TypeError(f"accelerator must be a string, not {type(text).__name__}")
    spec = _parse_normalized(text.strip().lower(), text)
    return spec.with_spot(True) if spot and not spec.spot else spec


def _parse_normalized(s: str, original: str) -> AcceleratorSpec:
    # Only the normalized string decides the result, so successes are cached
    # on it. A failure is parsed again so the error quotes the user's own text.
    try:
        return _parse_cached(s)
    except InvalidAcceleratorError:
        return _parse(s, original)


@functools.lru_cache(maxsize=512)
def _parse_cached(s: str) -> AcceleratorSpec:
    return _parse(s, s)


def _parse(s: str, original: str) -> AcceleratorSpec:
    spot = False
    if s.endswith(_SPOT_SUFFIX):
        spot = True
        s = s[: -len(_SPOT_SUFFIX)].rstrip()
    suffix = _SPOT_SUFFIX if spot else ""
    if not s:
        raise InvalidAcceleratorError(original, "empty accelerator string", suggestion="cpu")

    bad = _BAD_SUFFIX_RE.fullmatch(s)
    if bad and bad["head"] not in ("gpu", "tpu"):
        word = bad["word"]
        if word == "spot":
            raise InvalidAcceleratorError(
                original, "':spot' given twice", suggestion=f"{bad['head']}{_SPOT_SUFFIX}"
            )
        hint = f"{bad['head']}{_SPOT_SUFFIX}" if _close(word, ["spot"]) else None
        raise InvalidAcceleratorError(
            original, f"unknown suffix ':{word}' (only ':spot' is supported)", suggestion=hint
        )

    spec = _parse_body(s, _Ctx(original, "", suffix))
    return spec.with_spot(True) if spot else spec


def _parse_body(s: str, ctx: _Ctx) -> AcceleratorSpec:
    if s == "cpu":
        return _cpu_spec()

    m = _PREFIX_RE.fullmatch(s)
    if m:
        kind, rest = m["kind"], m["rest"]
        sub = dataclasses.replace(ctx, prefix=f"{kind}{m['sep'] or '-'}")
        if rest is None:
            if kind == "gpu":
                return _gpu_spec(GPU_TYPES[DEFAULT_GPU], 1)
            gen = TPU_GENERATIONS[DEFAULT_TPU]
            return _tpu_spec(gen, _require(gen.shape_for_chips(gen.default_chips)))
        if not rest:
            raise ctx.error(f"nothing after '{kind}{m['sep']}'", suggestion_body=kind)
        if kind == "gpu":
            return _parse_gpu(rest, sub, explicit=True)
        return _parse_tpu(rest, sub, explicit=True)

    # No prefix: kinetic accepts bare GPU names (l4x4) and TPU slices (v6e-8).
    gpu = _match_gpu(s)
    if gpu is not None:
        return _parse_gpu(s, ctx, explicit=False)
    tpu = _TPU_RE.fullmatch(s)
    if tpu and tpu["gen"] in _TPU_ALIASES:
        return _parse_tpu(s, ctx, explicit=False)
    if s.split("x")[0] in _RETIRED_GPUS or s in _RETIRED_GPUS:
        return _parse_gpu(s, ctx, explicit=False)
    if s.startswith("cpu"):
        raise ctx.error("'cpu' takes no size or options", suggestion_body="cpu")
    raise ctx.error("not a known CPU, GPU or TPU accelerator", suggestion_body=_close(s, _example_strings()))


def _require(shape: TpuShape | None) -> TpuShape:
    if shape is None:  # pragma: no cover - guards the static tables
        raise AssertionError("catalog default missing")
    return shape


def _match_gpu(s: str) -> tuple[GpuType, int | None] | None:
    m = _GPU_RE.fullmatch(s)
    if not m or m["name"] not in _GPU_ALIASES:
        return None
    return GPU_TYPES[_GPU_ALIASES[m["name"]]], (int(m["count"]) if m["count"] else None)


def _parse_gpu(rest: str, ctx: _Ctx, *, explicit: bool) -> AcceleratorSpec:
    if rest.isdigit():
        # gpu-<N>: N of the default GPU.
        return _gpu_with_count(GPU_TYPES[DEFAULT_GPU], int(rest), ctx, body=lambda c: str(c))

    matched = _match_gpu(rest)
    if matched is None:
        m = _GPU_RE.fullmatch(rest)
        name = m["name"] if m else rest
        count_part = f"x{m['count']}" if m and m["count"] else ""
        retired = _RETIRED_GPUS.get(name)
        if retired is not None:
            # T4 is the nearest live N1 GPU; keep the count when T4 has it.
            keep = count_part if count_part in ("x2", "x4") else ""
            raise ctx.error(retired, suggestion_body=f"t4{keep}", choices="GPU types " + ", ".join(GPU_TYPES))
        tpu = _TPU_RE.fullmatch(rest)
        if explicit and tpu and tpu["gen"] in _TPU_ALIASES:
            # "gpu-v6e-8": a TPU under the GPU prefix.
            raise InvalidAcceleratorError(
                ctx.original,
                f"'{rest}' is a TPU, not a GPU type",
                valid_choices(),
                f"tpu-{rest}{ctx.suffix}",
            )
        close = _close(name, _GPU_ALIASES)
        hint = f"{_GPU_ALIASES[close]}{count_part}" if close else None
        raise ctx.error(
            f"unknown GPU type '{name}'",
            suggestion_body=hint,
            choices="GPU types " + ", ".join(GPU_TYPES) + "; as gpu-<type> or gpu-<type>x<count>",
        )

    gpu, count = matched
    return _gpu_with_count(gpu, 1 if count is None else count, ctx, body=lambda c: f"{gpu.name}x{c}")


def _gpu_with_count(gpu: GpuType, count: int, ctx: _Ctx, body: Callable[[int], str]) -> AcceleratorSpec:
    if gpu.machine_type_for(count) is None:
        allowed = ", ".join(map(str, gpu.counts))
        nearest = _nearest(count, gpu.counts)
        raise ctx.error(
            f"{gpu.name} does not come with {count} GPU(s) per machine; allowed counts: {allowed}",
            suggestion_body=body(nearest) if nearest is not None else None,
            choices=f"{gpu.name} x {allowed}",
        )
    return _gpu_spec(gpu, count)


def _parse_tpu(rest: str, ctx: _Ctx, *, explicit: bool) -> AcceleratorSpec:
    if rest.isdigit():
        return _tpu_any_generation(int(rest), ctx)
    if _TOPOLOGY_RE.fullmatch(rest):
        gen = TPU_GENERATIONS[DEFAULT_TPU if len(_dims(rest)) == 2 else "v5p"]
        raise ctx.error(
            f"a topology needs a TPU generation, e.g. tpu-{gen.name}-{rest}",
            suggestion_body=f"{gen.name}-{rest}",
        )

    m = _TPU_RE.fullmatch(rest)
    gen_word = m["gen"] if m else rest.split("-", 1)[0]
    gen_name = _TPU_ALIASES.get(gen_word)
    if gen_name is None:
        if explicit and _match_gpu(rest):
            raise InvalidAcceleratorError(
                ctx.original, f"'{rest}' is a GPU, not a TPU generation", valid_choices(), f"gpu-{rest}"
            )
        close = _close(gen_word, _TPU_ALIASES)
        tail = rest[len(gen_word) :]
        raise ctx.error(
            f"unknown TPU generation '{gen_word}'",
            suggestion_body=f"{close}{tail}" if close else None,
            choices="TPU generations "
            + ", ".join(_TPU_ALIASES)
            + "; as tpu-<gen>-<chips> or tpu-<gen>-<topology>",
        )
    gen = TPU_GENERATIONS[gen_name]
    if not m:
        raise ctx.error(
            f"cannot read the slice size in '{rest}'",
            suggestion_body=f"{gen_word}-{gen.default_chips}",
            choices=f"{gen.name} chip counts {_format_counts(gen.chip_counts())}",
        )
    size = m["size"]
    if size is None:
        return _tpu_spec(gen, _require(gen.shape_for_chips(gen.default_chips)))
    if size.isdigit():
        return _tpu_by_chips(gen, gen_word, int(size), ctx)
    if _TOPOLOGY_RE.fullmatch(size):
        return _tpu_by_topology(gen, gen_word, _dims(size), ctx)
    raise ctx.error(
        f"'{size}' is neither a chip count nor a topology like 2x4 or 2x2x2",
        suggestion_body=f"{gen_word}-{gen.default_chips}",
        choices=f"{gen.name} chip counts {_format_counts(gen.chip_counts())}",
    )


def _tpu_any_generation(chips: int, ctx: _Ctx) -> AcceleratorSpec:
    for name in _TPU_COUNT_PREFERENCE:
        gen = TPU_GENERATIONS[name]
        shape = gen.shape_for_chips(chips)
        if shape is not None:
            return _tpu_spec(gen, shape)
    counts = sorted({c for n in _TPU_COUNT_PREFERENCE for c in TPU_GENERATIONS[n].chip_counts()})
    nearest = _nearest(chips, counts)
    raise ctx.error(
        f"no TPU generation has a {chips}-chip slice",
        suggestion_body=str(nearest) if nearest is not None else None,
        choices=f"chip counts {_format_counts(counts)}",
    )


def _tpu_by_chips(gen: TpuGeneration, gen_word: str, chips: int, ctx: _Ctx) -> AcceleratorSpec:
    shape = gen.shape_for_chips(chips)
    if shape is not None:
        return _tpu_spec(gen, shape)
    counts = gen.chip_counts()
    reason = f"{gen.name} has no {chips}-chip slice (counts are chips)"
    suggestion = _nearest(chips, counts)
    if gen.tensorcores_per_chip == 2 and chips % 2 == 0 and gen.shape_for_chips(chips // 2):
        # Google's names count TensorCores: "v3-8" is 4 chips.
        reason += (
            f"; Google's '{gen.google_prefix}-{chips}' counts TensorCores and is "
            f"{chips // 2} chips, i.e. tpu-{gen.name}-{chips // 2}"
        )
        suggestion = chips // 2
    raise ctx.error(
        reason,
        suggestion_body=f"{gen_word}-{suggestion}" if suggestion is not None else None,
        choices=f"{gen.name} chip counts {_format_counts(counts)}",
    )


def _tpu_by_topology(gen: TpuGeneration, gen_word: str, dims: tuple[int, ...], ctx: _Ctx) -> AcceleratorSpec:
    topo = "x".join(map(str, dims))
    chips = _product(dims)
    choices = f"{gen.name} topologies {gen.topology_rule()}"

    def fail(reason: str, better: str | None) -> InvalidAcceleratorError:
        return ctx.error(reason, suggestion_body=f"{gen_word}-{better}" if better else None, choices=choices)

    def same_or_nearest_size() -> str | None:
        near = gen.shape_for_chips(chips) or gen.shape_for_chips(_nearest(chips, gen.chip_counts()) or 0)
        return near.topology if near else None

    if len(dims) != gen.dims:
        shape_word = "3D (AxBxC)" if gen.dims == 3 else "2D (AxB)"
        raise fail(f"{gen.name} topologies are {shape_word}, not '{topo}'", same_or_nearest_size())

    for shape in gen.shapes:
        if shape.dims == dims:
            return _tpu_spec(gen, shape)

    permuted = next((s.topology for s in gen.shapes if sorted(s.dims) == sorted(dims)), None)
    if gen.max_dims is not None and chips > 64:
        if any(d % 4 for d in dims):
            raise fail(
                f"above 64 chips every dimension of a {gen.name} slice must be a multiple of 4, not '{topo}'",
                same_or_nearest_size(),
            )
        ordered = tuple(sorted(dims))
        if any(d > m for d, m in zip(ordered, gen.max_dims, strict=True)):
            top = "x".join(map(str, gen.max_dims))
            raise fail(f"'{topo}' exceeds the GKE maximum {top} for {gen.name}", same_or_nearest_size())
        if ordered != dims:
            raise fail(f"dimensions must be ordered A <= B <= C, not '{topo}'", "x".join(map(str, ordered)))
        return _tpu_spec(gen, gen._large_shape(dims))

    if permuted:
        raise fail(f"{gen.name} has no '{topo}' slice; dimension order matters", permuted)
    raise fail(f"{gen.name} has no '{topo}' slice", same_or_nearest_size())
