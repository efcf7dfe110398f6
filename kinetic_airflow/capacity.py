"""Where a job's nodes come from, and which Kueue queue admits it.

TPU and large-GPU capacity is scarce, and GKE offers several ways to get it, each asked for
with node labels, taints and annotations a DAG author should not have to know
(``shared/ACCELERATORS.md`` section 3 lists the facts, with sources):

* ``on-demand`` (the default): whatever node pools the accelerator's selectors match;
* ``spot``: Spot VMs (``cloud.google.com/gke-spot``), the same as ``spot=True`` / ``:spot``;
* ``flex-start``: Dynamic Workload Scheduler flex-start VMs (``cloud.google.com/gke-flex-start``),
  which run for at most 7 days (``max_run_duration`` bounds them further);
* ``queued``: flex-start with queued provisioning, where Kueue's ProvisioningRequest admission
  check obtains every node of the job at once (the ``cloud.google.com/gke-queued`` taint);
  it needs ``local_queue``;
* ``reservation:<name>`` / ``reservation:<project>/<name>``: a specific reservation;
  ``any-reservation``: any matching reservation, best effort.

``local_queue`` puts the Job, LeaderWorkerSet or JobSet in a Kueue LocalQueue
(``kueue.x-k8s.io/queue-name``), with ``priority_class`` naming a WorkloadPriorityClass.

GKE refuses some combinations only after the job was submitted, or never says why nodes do
not come; they are refused here when the DAG is parsed, with GKE's reason and the fix. This
module imports only the standard library and ``accelerators``: ``options`` loads it in every
Airflow process.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from kinetic_airflow.accelerators import AcceleratorSpec

__all__ = [
    "CAPACITY_MODELS",
    "MAX_RUN_SECONDS",
    "Capacity",
    "InvalidCapacityError",
    "Placement",
    "check_placement",
    "check_queue_name",
    "check_task_placement",
    "parse_capacity",
    "placement_of",
    "startup_timeout_for",
]

# Node labels, taints and annotations (shared/ACCELERATORS.md section 3).
LABEL_FLEX_START = "cloud.google.com/gke-flex-start"
LABEL_MAX_RUN = "cloud.google.com/gke-max-run-duration-seconds"
TAINT_QUEUED = "cloud.google.com/gke-queued"
LABEL_RESERVATION_NAME = "cloud.google.com/reservation-name"
LABEL_RESERVATION_PROJECT = "cloud.google.com/reservation-project"
LABEL_RESERVATION_AFFINITY = "cloud.google.com/reservation-affinity"
# Kueue: the queue label its job webhook reads, the priority class label, and the prefix of
# job annotations its provisioning admission check copies into the ProvisioningRequest's
# parameters (kueue.sigs.k8s.io/docs/admission-check-controllers/provisioning).
LABEL_QUEUE_NAME = "kueue.x-k8s.io/queue-name"
LABEL_PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"
ANNOTATION_PROVREQ_MAX_RUN = "provreq.kueue.x-k8s.io/maxRunDurationSeconds"

# GKE's limit for flex-start VMs ("VMs last up to 7 days", concepts/dws).
MAX_RUN_SECONDS = 7 * 24 * 3600
# How long a flex-start or queued job may wait for its VMs by default (``startup_timeout``'s
# default for these capacities, where the usual 30 minutes is one scale-up). Dynamic Workload
# Scheduler holds the pods Pending until it obtains capacity, and the wait GKE's stack states is
# the cluster autoscaler's: a ProvisioningRequest not provisioned within 7 days is failed
# (kubernetes/autoscaler cluster-autoscaler/processors/provreq/processor.go, ``refresh`` with
# ``defaultExpirationTime = 7 * 24 * time.Hour``, reason ``Expired``). No shorter bound for
# flex-start VMs without queued provisioning was found in GKE's pages (concepts/dws), so the
# same 7 days apply; a task's startup_timeout= or [kinetic] startup_timeout still wins.
FLEX_START_WAIT_SECONDS = 7 * 24 * 3600
CAPACITY_MODELS = ("on-demand", "spot", "flex-start", "queued", "reservation", "any-reservation")
# DWS covers only these TPU generations (concepts/dws: v6e, v5e, v5p; no v3/v4/TPU7x)...
_DWS_TPUS = ("v5e", "v5p", "v6e")
# ...and the autoscaler marks DWS disabled for these machine families (shared/ACCELERATORS.md).
_DWS_DISABLED_MACHINES = ("ct3-", "ct3p-", "ct4p-", "ct4l-", "ct5l-", "a3-edgegpu-8g")
_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_PROJECT = re.compile(r"[a-z][-a-z0-9]{4,28}[a-z0-9]")
_LABEL_VALUE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?")
_FORMS = (
    "'on-demand', 'spot', 'flex-start', 'queued', 'reservation:<name>', "
    "'reservation:<project>/<name>' or 'any-reservation'"
)


class InvalidCapacityError(TypeError, ValueError):
    """A capacity, queue or run duration GKE or Kueue would refuse; names the fix."""


@dataclass(frozen=True)
class Capacity:
    """One provisioning model; ``reservation``/``project`` only for a specific reservation."""

    model: str = "on-demand"
    reservation: str | None = None
    project: str | None = None

    @property
    def text(self) -> str:
        if self.model != "reservation":
            return self.model
        return f"reservation:{self.project + '/' if self.project else ''}{self.reservation}"

    @property
    def dws(self) -> bool:
        """Dynamic Workload Scheduler: flex-start VMs, with or without queued provisioning."""
        return self.model in ("flex-start", "queued")


def parse_capacity(value: Any, *, where: str = "capacity") -> Capacity:
    """``value`` as a Capacity (None: on-demand); a typo gets the closest form."""
    if value is None:
        return Capacity()
    if isinstance(value, Capacity):
        return value
    if not isinstance(value, str):
        raise InvalidCapacityError(f"{where}={value!r} is not a string; use {_FORMS}")
    text = value.strip().lower()
    for alias, model in (("ondemand", "on-demand"), ("flex", "flex-start"), ("dws", "flex-start")):
        if text.replace("_", "-") in (alias, model) or text == model.replace("-", "_"):
            text = model
    if text in CAPACITY_MODELS and text != "reservation":
        return Capacity(text)
    if text.startswith("reservation:"):
        owner, _, name = text.partition(":")[2].rpartition("/")
        if not _NAME.fullmatch(name):
            raise InvalidCapacityError(
                f"{where}={value!r} names no valid reservation ({name!r}): a reservation name is "
                "lowercase letters, digits and '-', starting with a letter, at most 63 characters, "
                "e.g. capacity='reservation:my-tpu-reservation'"
            )
        if owner and not _PROJECT.fullmatch(owner):
            raise InvalidCapacityError(
                f"{where}={value!r} names no valid project ({owner!r}): a shared reservation is "
                "'reservation:<project-id>/<name>', e.g. 'reservation:ml-capacity/tpu-v6e-res'"
            )
        return Capacity("reservation", name, owner or None)
    hint = ""
    close = difflib.get_close_matches(
        text, [m for m in CAPACITY_MODELS if m != "reservation"], n=1, cutoff=0.6
    )
    if text == "reservation":
        hint = ". Name it: capacity='reservation:<name>' (or 'any-reservation' for any matching one)"
    elif close:
        hint = f". Did you mean capacity={close[0]!r}?"
    elif "spot" in text or "preempt" in text:
        hint = ". Did you mean capacity='spot'?"
    elif "queue" in text:
        hint = ". Did you mean capacity='queued' (with local_queue=)?"
    elif "reserv" in text:
        hint = ". Did you mean capacity='any-reservation' or 'reservation:<name>'?"
    raise InvalidCapacityError(f"{where}={value!r} is not a capacity; use {_FORMS}{hint}")


def check_queue_name(value: Any, *, option: str) -> str:
    """A LocalQueue or WorkloadPriorityClass name, which Kueue reads from a label value."""
    if not isinstance(value, str) or not _LABEL_VALUE.fullmatch(value):
        fixed = re.sub(r"[^a-z0-9.-]+", "-", str(value).lower()).strip("-.")[:63].strip("-.")
        fix = f"; write {option}={fixed!r}" if fixed else f"; use a name such as {option}='team-a'"
        raise InvalidCapacityError(
            f"{option}={value!r} is not a Kueue object name: Kueue reads it from a label, so it is "
            f"lowercase letters, digits, '-' and '.', at most 63 characters{fix}"
        )
    return value


@dataclass(frozen=True)
class Placement:
    """What the cluster is asked for besides the accelerator: capacity and Kueue queue."""

    capacity: Capacity = Capacity()
    max_run_seconds: int | None = None
    local_queue: str | None = None
    priority_class: str | None = None

    @property
    def queued(self) -> bool:
        """Kueue holds the job until it admits it."""
        return self.local_queue is not None

    def node_selectors(self) -> dict[str, str]:
        """Selectors beside the accelerator's (Spot is the accelerator spec's own)."""
        model = self.capacity.model
        sel: dict[str, str] = {}
        if model == "flex-start":
            sel[LABEL_FLEX_START] = "true"
            if self.max_run_seconds:
                sel[LABEL_MAX_RUN] = str(self.max_run_seconds)
        elif model == "reservation":
            sel[LABEL_RESERVATION_NAME] = str(self.capacity.reservation)
            sel[LABEL_RESERVATION_AFFINITY] = "specific"
            if self.capacity.project:
                sel[LABEL_RESERVATION_PROJECT] = self.capacity.project
        elif model == "any-reservation":
            sel[LABEL_RESERVATION_AFFINITY] = "any"
        return sel

    def tolerations(self) -> list[dict[str, str]]:
        """Flex-start pools may carry the flex-start taint (NAP adds it only for pods that
        tolerate it); queued-provisioning pools always carry ``gke-queued``."""
        if self.capacity.model == "flex-start":
            return [{"key": LABEL_FLEX_START, "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
        if self.capacity.model == "queued":
            return [{"key": TAINT_QUEUED, "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
        return []

    def object_labels(self) -> dict[str, str]:
        """Labels of the Job / LeaderWorkerSet / JobSet itself (Kueue reads them there)."""
        labels: dict[str, str] = {}
        if self.local_queue:
            labels[LABEL_QUEUE_NAME] = self.local_queue
        if self.priority_class:
            labels[LABEL_PRIORITY_CLASS] = self.priority_class
        return labels

    def object_annotations(self) -> dict[str, str]:
        """Queued provisioning's run limit travels to the ProvisioningRequest as a parameter."""
        if self.capacity.model == "queued" and self.max_run_seconds:
            return {ANNOTATION_PROVREQ_MAX_RUN: str(self.max_run_seconds)}
        return {}


def placement_of(
    capacity: Any = None,
    max_run_seconds: float | None = None,
    local_queue: str | None = None,
    priority_class: str | None = None,
) -> Placement:
    return Placement(
        parse_capacity(capacity),
        int(max_run_seconds) if max_run_seconds else None,
        local_queue or None,
        priority_class or None,
    )


def startup_timeout_for(placement: Placement, given: float | None, resolved: float, default: float) -> float:
    """The startup_timeout of a job: the task's (``given``), else the configured one
    (``resolved``), except that the built-in ``default`` (one node scale-up) becomes
    ``FLEX_START_WAIT_SECONDS`` for flex-start and queued capacity, which wait for Dynamic
    Workload Scheduler to find the VMs."""
    if given is not None:
        return float(given)
    if placement.capacity.dws and float(resolved) == float(default):
        return float(FLEX_START_WAIT_SECONDS)
    return float(resolved)


def check_task_placement(options: dict[str, Any], spec: AcceleratorSpec) -> None:
    """At DAG parse time: the capacity options a task gives, with its accelerator. Configured
    ``[kinetic]`` defaults join them when the task runs (``submission.resolve_placement``)."""
    if not any(options.get(k) is not None for k in ("capacity", "max_run_duration", "local_queue")):
        return
    check_placement(
        placement_of(
            options.get("capacity"),
            options.get("max_run_duration"),
            options.get("local_queue"),
            options.get("priority_class"),
        ),
        spec,
        config_unknown=True,
    )


def check_placement(
    placement: Placement, spec: AcceleratorSpec, *, where: str = "", config_unknown: bool = False
) -> None:
    """GKE's and Kueue's refusals of this capacity for this accelerator, before any job exists.

    ``where``: a suffix naming where a configured value came from, for the message.
    ``config_unknown``: at DAG parse time, where ``[kinetic]`` may still give the queue or the
    capacity an option left out, so only what the task's own options contradict is refused.
    """
    capacity = placement.capacity
    model = capacity.model
    at = f" ({where})" if where else ""
    if spec.spot and model not in ("on-demand", "spot"):
        raise InvalidCapacityError(
            f"accelerator {spec.text!r} asks for Spot VMs and capacity={capacity.text!r}{at} for "
            "another provisioning model: a node is one or the other; drop ':spot' / spot=True, or "
            "use capacity='spot'"
        )
    if capacity.dws:
        if spec.kind == "cpu":
            raise InvalidCapacityError(
                f"capacity={model!r}{at} is Dynamic Workload Scheduler capacity, which GKE offers "
                "for GPUs and TPUs only; use an accelerator such as 'gpu-l4' or 'tpu-v6e-8', or "
                "capacity='on-demand' for a CPU job"
            )
        machine = spec.machine_type or ""
        if any(machine.startswith(m) or machine == m for m in _DWS_DISABLED_MACHINES):
            raise InvalidCapacityError(
                f"capacity={model!r}{at}: GKE's autoscaler has Dynamic Workload Scheduler disabled "
                f"for machine type {machine} ({spec.text}); use capacity='on-demand', 'spot' or a "
                "reservation for it"
            )
        if spec.kind == "tpu" and spec.name not in _DWS_TPUS:
            raise InvalidCapacityError(
                f"capacity={model!r}{at}: GKE's flex-start offers TPU {', '.join(_DWS_TPUS)} only, "
                f"not {spec.name} ({spec.text}); use one of those generations, or "
                "capacity='on-demand', 'spot' or a reservation"
            )
        # GKE's guidance (how-to/provisioningrequest): flex-start with queued provisioning for
        # workloads that "are required to run across multiple nodes simultaneously", flex-start
        # VMs for "smaller workloads that can run on a single node"; concepts/dws (snapshot in
        # shared/ACCELERATORS.md section 3) lists flex-start TPUs as single-host TPU slice node
        # pools. A multi-host slice's VMs come up as one unit only through queued provisioning.
        if model == "flex-start" and spec.multi_host:
            raise InvalidCapacityError(
                f"capacity='flex-start'{at}: flex-start VMs come one node pool node at a time, and "
                f"{spec.text} spans {spec.hosts} hosts that must all start together; use "
                "capacity='queued' with local_queue= (queued provisioning obtains every host at once)"
            )
    if model == "queued" and not placement.local_queue and not config_unknown:
        raise InvalidCapacityError(
            f"capacity='queued'{at} is queued provisioning through Kueue's ProvisioningRequest "
            "admission check, so the job needs a Kueue queue: set local_queue='<LocalQueue name>' "
            "(or [kinetic] local_queue); use capacity='flex-start' for flex-start without Kueue"
        )
    if placement.max_run_seconds is not None:
        if not capacity.dws and not (config_unknown and model == "on-demand"):
            raise InvalidCapacityError(
                f"max_run_duration{at} bounds flex-start VMs (capacity='flex-start' or 'queued'), "
                f"not {capacity.text!r} ones; use execution_timeout= to bound the task instead"
            )
        if placement.max_run_seconds > MAX_RUN_SECONDS:
            raise InvalidCapacityError(
                f"max_run_duration={placement.max_run_seconds}s{at} is more than the 7 days "
                f"({MAX_RUN_SECONDS}s) GKE gives a flex-start VM; use at most timedelta(days=7)"
            )
        if placement.max_run_seconds < 1:
            raise InvalidCapacityError(f"max_run_duration{at} must be at least one second; use 1 or more")
