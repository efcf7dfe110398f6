"""Accelerator strings -> what a GKE pod needs to land on TPU or GPU nodes.

This module is the single registry of accelerator facts for kinetic-airflow.
The operator, the manifest builders, the CLI and the docs all read it. It uses
only the standard library because the job runner imports it inside containers
that have no Airflow. It lives in ``kinetic_airflow.job`` because the job
reference (``job.ref.JobRef``) carries the parsed :class:`AcceleratorSpec`,
and ``job/`` imports nothing outside itself; ``kinetic_airflow.accelerators``
re-exports it under the name DAG authors and the rest of the package use.

Every fact here comes from the catalog in ``ACCELERATORS.md`` (GKE docs, GKE's
own cluster-autoscaler tables, xpk). Every string keras-kinetic 0.0.4 accepts means
the same hardware here (same nodeSelector, chips per host, hosts, tolerations; checked
against the released wheel by ``tests/test_accelerator_parity.py``), except where
kinetic contradicts GKE: the v3 node label, the value of the Spot toleration on Jobs,
shapes GKE does not offer (v3 2048 chips, v4 4096 chips, A100 80GB x16), and a few
strings kinetic reads silently (``cpu:8``, a bare ``8``, ``cpu:spot``).

Grammar (case-insensitive, surrounding whitespace ignored)::

    cpu
    gpu                      -> 1 x L4 (kinetic's default GPU)
    gpu-<N>                  -> N GPUs of the type kinetic picks: the first of H100,
                                A100 80GB, A100, L4, V100, T4, P100, P4 that comes N to a
                                machine (gpu-4 = 4 x H100)
    gpu-<type>, <type>       -> 1 GPU of that type             (gpu-l4, h100)
    gpu-<type>x<N>, <type>xN -> N GPUs on one machine           (gpu-a100x4, a100-80gbx8)
    tpu                      -> v5e, 4 chips, 2x2, one host (kinetic's default TPU)
    tpu-<N>                  -> N chips of the generation kinetic picks: the first of
                                v6e, v5p, v5e, v4, v3 whose kinetic 0.0.4 table has an
                                N-chip slice (tpu-4 = v5e 2x2, tpu-8 = v6e 2x4 on 2 hosts,
                                tpu-512 = v4 8x8x8); counts kinetic does not list take the
                                first of that order that GKE offers (tpu-6144 = v5p)
    tpu-<gen>                -> that generation's default size (kinetic's defaults)
    tpu-<gen>-<chips>        -> tpu-v5e-1, tpu-v6e-8, tpu-v5p-8, tpu7x-8, tpu-7x-8
    tpu-<gen>-<topology>     -> tpu-v5litepod-2x4, tpu-v6e-4x4, tpu-v5p-2x2x2
    tpu-<gen>-<N>t           -> one host of the generation's N-chip machine
                                (tpu-v6e-8t = 2x4 on one ct6e-standard-8t)
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
  string) uses it, and :attr:`AcceleratorSpec.google_accelerator_type`
  gives Google's name. When a count is invalid but half of it is valid on a
  generation with two TensorCores per chip (``tpu-v3-8``), the error says so.
* **8-chip v6e is two hosts, as in kinetic**: ``tpu-v6e-8`` (and ``tpu-v6e-2x4``,
  ``tpu-v6e``, ``tpu-8``) is ``2x4`` on two ``ct6e-standard-4t`` VMs, the node
  pool ``kinetic up`` makes. The one-host shape, ``2x4`` on one
  ``ct6e-standard-8t``, is ``tpu-v6e-8t`` (its normalized text, since
  ``tpu-v6e-2x4`` is the two-host one). GKE tells the two apart by the pod's
  ``google.com/tpu`` request (4 or 8). 8-chip v5e is one ``ct5lp-hightpu-8t``
  host, as in kinetic. 16 chips and up are multi-host on ``-4t`` machines.
* **Defaults** follow kinetic: ``gpu`` is one L4 (``g2-standard-4``), ``tpu``
  is v5e ``2x2`` (4 chips, one ``ct5lp-hightpu-4t`` host). A bare generation
  uses kinetic's default chip count (v3 4, v4 4, v5e 4, v5p 8, v6e 8; TPU7x 4,
  one full host).
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
  cubic such shape (``tpu-v5p-256`` -> ``4x8x8``), which is also kinetic's.
* ``spot=True`` forces Spot; ``spot=False``/``None`` keep what the string says
  (a ``:spot`` suffix is never silently dropped, not even for ``cpu``). Use
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
    "CHIPS_NOTE",
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
    "accelerator_notes",
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

#: Said in every TPU size error and by ``kinetic-airflow check``: the one convention
#: that differs from Google's own names.
CHIPS_NOTE = (
    "TPU sizes count chips, as keras-kinetic does. Google's v3, v4, v5p and TPU7x names count "
    "TensorCores (2 per chip): Google's v5p-8 is 4 chips on one host, tpu-v5p-4 here, while "
    "tpu-v5p-8 here is 8 chips on 2 hosts (Google's v5p-16)."
)


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
        note: str | None = None,
    ) -> None:
        self.text = text
        self.reason = reason
        self.choices = valid_choices() if choices is None else choices
        self.suggestion = suggestion
        self.note = note
        message = f"Invalid accelerator {text!r}: {reason}."
        if suggestion:
            message += f" Did you mean {suggestion!r}?"
        if self.choices:
            message += f" Valid: {self.choices}."
        if note:
            message += f" Note: {note}"
        super().__init__(message)

    def __reduce__(
        self,
    ) -> tuple[type[InvalidAcceleratorError], tuple[str, str, str, str | None, str | None]]:
        # Exceptions are pickled by their args; ours has a richer __init__, so
        # rebuild from the fields (Airflow and multiprocessing pickle errors).
        return (type(self), (self.text, self.reason, self.choices, self.suggestion, self.note))


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

    ``shapes`` lists the enumerated slices, each chip count once and with
    kinetic's meaning (v5e's 8 chips are one ``-8t`` host, v6e's are two ``-4t``
    hosts). ``one_host_shapes`` adds single-host shapes that only the ``-<N>t``
    spelling reaches (v6e's ``2x4`` on one ``-8t``). For 3D generations, larger
    slices follow the multiple-of-4 rule up to ``max_dims`` on
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
    one_host_shapes: tuple[TpuShape, ...] = ()

    def shape_for_chips(self, chips: int) -> TpuShape | None:
        """The slice for a chip count, or None when the generation has none."""
        for shape in self.shapes:
            if shape.chips == chips:
                return shape
        dims = _LARGE_3D.get(self.name, {}).get(chips)
        return self._large_shape(dims) if dims else None

    def shape_for_host(self, chips_per_host: int) -> TpuShape | None:
        """The single-host slice on the generation's ``-<N>t`` machine, or None."""
        for shape in (*self.one_host_shapes, *self.shapes):
            if shape.hosts == 1 and shape.chips_per_host == chips_per_host:
                return shape
        return None

    def host_sizes(self) -> tuple[int, ...]:
        """Chips per host of the generation's single-host shapes (the ``<N>t`` choices)."""
        return tuple(
            sorted({s.chips_per_host for s in (*self.shapes, *self.one_host_shapes) if s.hosts == 1})
        )

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


def _lite_rows(prefix: str, *, eight_on_one_host: bool) -> list[tuple[str, str, int]]:
    """v5e and v6e share one table: 1t/4t single hosts, 2x4, then 4t slices.

    ``2x4`` is what kinetic 0.0.4 makes of 8 chips: one ``-8t`` host for v5e, two
    ``-4t`` hosts for v6e (the node pool ``kinetic up`` creates for ``tpu-v6e-8``).
    """
    return [
        ("1x1", f"{prefix}-1t", 1),
        ("2x2", f"{prefix}-4t", 4),
        ("2x4", f"{prefix}-8t", 8) if eight_on_one_host else ("2x4", f"{prefix}-4t", 4),
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
        shapes=_tpu_shapes("tpu-v5-lite-podslice", _lite_rows("ct5lp-hightpu", eight_on_one_host=True)),
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
        shapes=_tpu_shapes("tpu-v6e-slice", _lite_rows("ct6e-standard", eight_on_one_host=False)),
        pod_machine_type="ct6e-standard-4t",
        one_host_shapes=_tpu_shapes("tpu-v6e-slice", [("2x4", "ct6e-standard-8t", 8)]),
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
# kinetic 0.0.4's preference order for a bare chip count (``tpu-8``), with the chip
# counts its own table lists for each generation: kinetic picks the first generation
# whose table has the count, so tpu-4 is v5e and tpu-512 is v4 although v6e and v5p
# have such slices too. (Written out from kinetic/core/accelerators.py at 0.0.4;
# tests/test_accelerator_parity.py checks the outcome against the released wheel.)
_KINETIC_TPU_COUNTS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("v6e", (8, 16)),
    ("v5p", (8, 16, 32)),
    ("v5e", (1, 4, 8, 16, 32, 64, 128, 256)),
    ("v4", (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)),
    ("v3", (4, 16, 32, 64, 128, 256, 512, 1024, 2048)),
)
_TPU_COUNT_PREFERENCE = tuple(name for name, _ in _KINETIC_TPU_COUNTS)
# The same for a bare GPU count (``gpu-4``): kinetic's "most capable first" order.
_KINETIC_GPU_COUNTS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("h100", (1, 2, 4, 8)),
    ("a100-80gb", (1, 2, 4, 8, 16)),
    ("a100", (1, 2, 4, 8, 16)),
    ("l4", (1, 2, 4, 8)),
    ("v100", (1, 2, 4, 8)),
    ("t4", (1, 2, 4)),
    ("p100", (1, 2, 4)),
    ("p4", (1, 2, 4)),
)

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
    # A one-host-only shape shares its topology with the default one (v6e 2x4), so
    # its text names the machine instead; every other shape uses its topology.
    size = f"{shape.chips_per_host}t" if shape in gen.one_host_shapes else shape.topology
    return AcceleratorSpec(
        text=f"{head}-{size}",
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
        f"tpu, tpu-<gen>-<chips> (chips, not TensorCores), tpu-<gen>-<topology>, "
        f"tpu-<gen>-<N>t (one N-chip host) with gens {gens}; append ':spot'"
    )


def accelerator_notes(spec: AcceleratorSpec) -> tuple[str, ...]:
    """What a user porting from kinetic or from Google's TPU names should know about
    ``spec`` (shown by ``kinetic-airflow check``)."""
    notes: list[str] = []
    if spec.kind == "tpu":
        gen = TPU_GENERATIONS[spec.name]
        hosts = f"{spec.hosts} hosts of {spec.chips_per_host}" if spec.multi_host else "one host"
        notes.append(
            f"{spec.text} is {spec.chips} chips on {hosts} ({spec.machine_type}); "
            f"Google calls this slice {spec.google_accelerator_type}."
        )
        if gen.tensorcores_per_chip == 2:
            half = gen.shape_for_chips(spec.chips // 2) if spec.chips % 2 == 0 else None
            where = ""
            if half:
                on = "one host" if half.hosts == 1 else f"{half.hosts} hosts"
                where = f" on {on}, tpu-{gen.name}-{spec.chips // 2} here"
            notes.append(
                f"Counts are chips, as in keras-kinetic. Google's {gen.google_prefix} names count "
                f"TensorCores (2 per chip): Google's {gen.google_prefix}-{spec.chips} is "
                f"{spec.chips // 2} chips{where}."
            )
        if gen.name == "v6e" and spec.topology == "2x4":
            if spec.multi_host:
                notes.append(
                    "tpu-v6e-8 is keras-kinetic's two ct6e-standard-4t hosts (the pool `kinetic up` "
                    "makes). For 2x4 on one ct6e-standard-8t host (Google's single-host v6e-8), "
                    "use tpu-v6e-8t."
                )
            else:
                notes.append(
                    "One ct6e-standard-8t host. tpu-v6e-8 (keras-kinetic's meaning) is two "
                    "ct6e-standard-4t hosts."
                )
        if gen.name == "v3":
            notes.append(
                "keras-kinetic 0.0.4 selects v3 nodes by tpu-v3-podslice, a label no GKE node has; "
                "this uses GKE's tpu-v3-device (2x2) / tpu-v3-slice."
            )
        if gen.note:
            notes.append(gen.note[0].upper() + gen.note[1:] + ".")
    elif spec.kind == "gpu":
        gpu = GPU_TYPES[spec.name]
        if gpu.note:
            notes.append(gpu.note[0].upper() + gpu.note[1:] + ".")
    return tuple(notes)


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
            out += [f"{head}-{n}t" for n in gen.host_sizes()]
    return tuple(dict.fromkeys(out))


# --------------------------------------------------------------------------
# Parser
# --------------------------------------------------------------------------

_PREFIX_RE = re.compile(r"(?P<kind>gpu|tpu)(?:(?P<sep>[-:])(?P<rest>.*))?")
_GPU_RE = re.compile(r"(?P<name>[a-z0-9][a-z0-9-]*?)(?:x(?P<count>\d+))?")
_TPU_RE = re.compile(r"(?P<gen>[a-z0-9]+)(?:-(?P<size>[0-9x]+t?))?")
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
        self,
        reason: str,
        suggestion_body: str | None = None,
        choices: str | None = None,
        note: str | None = None,
    ) -> InvalidAcceleratorError:
        suggestion = self.fix(suggestion_body) if suggestion_body is not None else None
        return InvalidAcceleratorError(self.original, reason, choices, suggestion, note)


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

    if s.isdigit():
        # kinetic reads a bare number as a GPU count if any GPU has it, else TPU chips.
        kind = "gpu" if any(int(s) in counts for _, counts in _KINETIC_GPU_COUNTS) else "tpu"
        raise ctx.error(
            f"a bare number is ambiguous (keras-kinetic 0.0.4 reads {s!r} as {kind}-{s}); "
            "write gpu-<N> or tpu-<N>",
            suggestion_body=f"{kind}-{s}",
        )

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
        reason = "'cpu' takes no size or options"
        if s[3:4] in (":", "-") and s[4:].isdigit():
            reason += (
                f" (keras-kinetic 0.0.4 accepts {s!r} but ignores the number: no CPU request follows"
                " from it; set CPU and memory with the operator's container resources)"
            )
        raise ctx.error(reason, suggestion_body="cpu")
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
        return _gpu_any_type(int(rest), ctx)

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


def _gpu_any_type(count: int, ctx: _Ctx) -> AcceleratorSpec:
    """``gpu-<N>``: the GPU kinetic 0.0.4 picks for N (its most capable with that count)."""
    for name, kinetic_counts in _KINETIC_GPU_COUNTS:
        if count not in kinetic_counts:
            continue
        gpu = GPU_TYPES[name]
        if gpu.machine_type_for(count) is None:
            # kinetic's table has a machine GKE does not (A100 80GB x16).
            others = [g for g, c in _KINETIC_GPU_COUNTS if GPU_TYPES[g].machine_type_for(count)]
            raise ctx.error(
                f"keras-kinetic 0.0.4 reads gpu-{count} as {count} x {name}, which GKE does not offer "
                f"({name} comes {', '.join(map(str, gpu.counts))} to a machine); name the GPU",
                suggestion_body=f"{others[0]}x{count}" if others else None,
                choices=_GPU_COUNT_CHOICES,
            )
        return _gpu_spec(gpu, count)
    counts = sorted({c for _, cs in _KINETIC_GPU_COUNTS for c in cs})
    nearest = _nearest(count, counts)
    raise ctx.error(
        f"no GPU comes {count} to a machine",
        suggestion_body=str(nearest) if nearest is not None else None,
        choices=_GPU_COUNT_CHOICES,
    )


_GPU_COUNT_CHOICES = (
    "gpu-<N> takes the GPU kinetic picks: gpu-1, gpu-2, gpu-4, gpu-8 are H100 (a3-highgpu; 1, 2 and 4 "
    "only as Spot or flex-start); name the GPU to choose another, e.g. gpu-l4x4"
)


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
        size_text = rest[len(gen_word) + 1 :] if rest.startswith(gen_word + "-") else ""
        raise ctx.error(
            f"cannot read the slice size in '{rest}'",
            suggestion_body=f"{gen_word}-{_closest_size(gen, size_text)}",
            choices=_generation_choices(gen, gen_word, ctx),
        )
    size = m["size"]
    if size is None:
        return _tpu_spec(gen, _require(gen.shape_for_chips(gen.default_chips)))
    if size.isdigit():
        return _tpu_by_chips(gen, gen_word, int(size), ctx)
    if size.endswith("t") and size[:-1].isdigit():
        return _tpu_by_host(gen, gen_word, int(size[:-1]), ctx)
    if _TOPOLOGY_RE.fullmatch(size):
        return _tpu_by_topology(gen, gen_word, _dims(size), ctx)
    raise ctx.error(
        f"'{size}' is neither a chip count, a topology like 2x4 or 2x2x2, nor one host like 8t",
        suggestion_body=f"{gen_word}-{_closest_size(gen, size)}",
        choices=_generation_choices(gen, gen_word, ctx),
        note=CHIPS_NOTE,
    )


def _closest_size(gen: TpuGeneration, text: str) -> str:
    """The size word nearest to a mistyped one: ``8tt`` -> ``8t`` (one 8-chip host), not ``8``
    (which on v6e is two hosts, a shape backend="gke" cannot run); else the default size."""
    words = [
        *(f"{n}t" for n in gen.host_sizes()),
        *map(str, gen.chip_counts()),
        *(s.topology for s in gen.shapes),
    ]
    return _close(text, words) or str(gen.default_chips)


def _generation_choices(gen: TpuGeneration, gen_word: str, ctx: _Ctx) -> str:
    """Every way to size a slice of ``gen``, in the user's spelling: chips, one host, topology."""
    head = f"{ctx.prefix}{gen_word}"
    hosts = ", ".join(f"{head}-{n}t" for n in gen.host_sizes())
    return (
        f"{head}-<chips> with {gen.name} chip counts {_format_counts(gen.chip_counts())}; "
        f"one host: {hosts}; or a topology: {gen.topology_rule()}"
    )


def _tpu_any_generation(chips: int, ctx: _Ctx) -> AcceleratorSpec:
    """``tpu-<N>``: the generation kinetic 0.0.4 picks, else the first that GKE offers."""
    for name, kinetic_counts in _KINETIC_TPU_COUNTS:
        if chips not in kinetic_counts:
            continue
        gen = TPU_GENERATIONS[name]
        shape = gen.shape_for_chips(chips)
        if shape is None:
            # kinetic's table has a slice GKE does not (v4 16x16x16).
            others = [n for n in _TPU_COUNT_PREFERENCE if TPU_GENERATIONS[n].shape_for_chips(chips)]
            raise ctx.error(
                f"keras-kinetic 0.0.4 reads tpu-{chips} as {name}, which GKE does not offer with "
                f"{chips} chips ({name} chip counts {_format_counts(gen.chip_counts())}); "
                "name the generation",
                suggestion_body=f"{others[0]}-{chips}" if others else None,
                note=CHIPS_NOTE,
            )
        return _tpu_spec(gen, shape)
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
        note=CHIPS_NOTE,
    )


def _tpu_by_host(gen: TpuGeneration, gen_word: str, chips: int, ctx: _Ctx) -> AcceleratorSpec:
    """``tpu-<gen>-<N>t``: one host of the generation's N-chip machine."""
    shape = gen.shape_for_host(chips)
    if shape is not None:
        return _tpu_spec(gen, shape)
    sizes = gen.host_sizes()
    reason = f"{gen.name} has no single-host machine with {chips} chips"
    several = gen.shape_for_chips(chips)
    if several:
        reason += f"; tpu-{gen.name}-{chips} is {chips} chips on {several.hosts} hosts"
    raise ctx.error(
        reason,
        suggestion_body=f"{gen_word}-{_nearest(chips, sizes)}t" if sizes else None,
        choices=f"{gen.name} single hosts " + ", ".join(f"{n}t" for n in sizes),
        note=CHIPS_NOTE,
    )


def _tpu_by_chips(gen: TpuGeneration, gen_word: str, chips: int, ctx: _Ctx) -> AcceleratorSpec:
    shape = gen.shape_for_chips(chips)
    if shape is not None:
        return _tpu_spec(gen, shape)
    counts = gen.chip_counts()
    reason = f"{gen.name} has no {chips}-chip slice (counts are chips)" + _kinetic_only(gen.name, chips)
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
        choices=_generation_choices(gen, gen_word, ctx),
        note=CHIPS_NOTE,
    )


def _tpu_by_topology(gen: TpuGeneration, gen_word: str, dims: tuple[int, ...], ctx: _Ctx) -> AcceleratorSpec:
    topo = "x".join(map(str, dims))
    chips = _product(dims)
    choices = f"{gen.name} topologies {gen.topology_rule()}"

    def fail(reason: str, better: str | None) -> InvalidAcceleratorError:
        suggestion = f"{gen_word}-{better}" if better else None
        return ctx.error(reason, suggestion_body=suggestion, choices=choices, note=CHIPS_NOTE)

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
            raise fail(
                f"'{topo}' exceeds the GKE maximum {top} for {gen.name}" + _kinetic_only(gen.name, chips),
                same_or_nearest_size(),
            )
        if ordered != dims:
            raise fail(f"dimensions must be ordered A <= B <= C, not '{topo}'", "x".join(map(str, ordered)))
        return _tpu_spec(gen, gen._large_shape(dims))

    if permuted:
        raise fail(f"{gen.name} has no '{topo}' slice; dimension order matters", permuted)
    raise fail(f"{gen.name} has no '{topo}' slice" + _kinetic_only(gen.name, chips), same_or_nearest_size())


def _kinetic_only(gen_name: str, chips: int) -> str:
    """Why a slice kinetic 0.0.4's table lists is refused (v3 2048, v4 4096)."""
    kinetic = dict(_KINETIC_TPU_COUNTS).get(gen_name, ())
    if chips in kinetic and TPU_GENERATIONS[gen_name].shape_for_chips(chips) is None:
        return f"; keras-kinetic 0.0.4 lists a {chips}-chip {gen_name} slice, GKE does not offer one"
    return ""
