"""The capacity ladder: ordered rungs of (accelerator, capacity, time to start) a task falls back on.

A task may give ``capacity`` and/or ``accelerator`` as a list::

    @task.kinetic(accelerator="tpu-v6e-8", capacity=[("spot", timedelta(minutes=20)), "on-demand"])
    @task.kinetic(accelerator=["tpu-v6e-8", "tpu-v5p-8"], capacity="spot")

Each item is one rung, tried in order within one Airflow try: the first rung's job is submitted;
if it has not started within its time to start (default the task's ``startup_timeout``), because
its pods are unschedulable, the autoscaler cannot scale up, Kueue does not admit it or Dynamic
Workload Scheduler does not provision it, the job is withdrawn (its cluster objects deleted; its
payload, logs and output directory kept) and the next rung is submitted as the next attempt of
the same try. A rung's time to start is written with the rung, as a pair
``(value, seconds or timedelta)``; a string with a unit is refused, as for every duration.

When both options are lists they are paired rung by rung (the same length; a time is given on
either side, not both); a scalar beside a list is the same on every rung.

This module only reads and checks the rungs (the option table calls it at DAG parse time); the
driver walks them (``driver.JobDriver``) and the operator builds each rung's job.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

__all__ = [
    "LADDER_CAUSES",
    "LadderError",
    "Rung",
    "check_ladder_backend",
    "ladder_of",
    "rung_items",
]

# The failure causes (watch / startup) that mean "this rung's capacity did not come": the
# ladder moves on. Any other failure (the image, the code, a refused pod) would fail on every rung.
LADDER_CAUSES = frozenset({"unschedulable", "startup_timeout", "queue_timeout", "provisioning_failed"})

_PAIR_EXAMPLE = "capacity=[('spot', timedelta(minutes=20)), 'on-demand']"


class LadderError(TypeError, ValueError):
    """A ladder the task cannot run: names the rung, what is wrong and the fix."""


@dataclass(frozen=True)
class Rung:
    """One rung: what is asked for, and how long it may take to start (None: startup_timeout)."""

    accelerator: str | None  # None: the task's own (its accelerator is no list)
    capacity: str | None  # None: the task's own (its capacity is no list)
    start_within: float | None = None

    def label(self) -> str:
        """``tpu-v6e-8 on spot`` (how the log and the view name a rung)."""
        return " on ".join(part for part in (self.accelerator, self.capacity) if part)

    def to_dict(self, index: int, count: int) -> dict[str, Any]:
        """What the job reference and the history keep of the rung (1-based ``rung``)."""
        out: dict[str, Any] = {"rung": index + 1, "of": count}
        if self.start_within is not None:
            out["start_within"] = self.start_within
        return out


def _seconds(option: str, index: int, value: Any) -> float:
    """A rung's time to start, in seconds; an error naming the rung and the fix."""
    where = f"{option} rung {index + 1}"
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        raise LadderError(
            f"{where}: the time to start {value!r} is a string (units in strings are not read); "
            f"write a number of seconds or a datetime.timedelta, e.g. {_PAIR_EXAMPLE}"
        )
    else:
        raise LadderError(
            f"{where}: the time to start {value!r} is not a duration; write a number of seconds or a "
            f"datetime.timedelta, e.g. {_PAIR_EXAMPLE}"
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise LadderError(f"{where}: the time to start must be more than 0 seconds, not {value!r}")
    return seconds


def rung_items(option: str, value: Any) -> list[tuple[str, float | None]]:
    """A list-form option's rungs as (text, seconds or None), each text still unchecked as an
    accelerator / capacity (the caller checks those). ``LadderError`` for a wrong shape."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise LadderError(f"{option}={value!r} is not a list of rungs")
    if not value:
        raise LadderError(
            f"{option}=[] names no rung: give one value ({option}='...') or a list of them, e.g. "
            f"{_PAIR_EXAMPLE}"
        )
    items: list[tuple[str, float | None]] = []
    for index, item in enumerate(value):
        seconds: float | None = None
        if isinstance(item, (tuple, list)):
            if len(item) != 2 or not isinstance(item[0], str):
                raise LadderError(
                    f"{option} rung {index + 1} is {item!r}: a rung is a string or a pair (string, time "
                    f"to start), e.g. {_PAIR_EXAMPLE}"
                )
            item, seconds = item[0], _seconds(option, index, item[1])
        if not isinstance(item, str):
            hint = (
                f"; a rung's time to start goes with its rung, e.g. {_PAIR_EXAMPLE}"
                if isinstance(item, (timedelta, numbers.Real))
                else ""
            )
            raise LadderError(f"{option} rung {index + 1} is {item!r}, not a string{hint}")
        if "{{" in item:
            raise LadderError(
                f"{option} rung {index + 1} is {item!r}: the rungs of a ladder are not templated (each is "
                "checked when the DAG is parsed); write the values themselves, or give one templated "
                f"{option} without a ladder"
            )
        items.append((item, seconds))
    return items


def ladder_of(accelerator: Any, capacity: Any) -> list[Rung] | None:
    """The rungs that ``accelerator`` and ``capacity`` (as given, either possibly a list) make;
    None when neither is a list (one rung: no ladder). A rung's accelerator (capacity) is None
    when that option is no list: the task's own value, the same on every rung. Texts are returned
    as given: the caller checks them as the option table checks a single value."""
    acc_list = isinstance(accelerator, (list, tuple))
    cap_list = isinstance(capacity, (list, tuple))
    if not acc_list and not cap_list:
        return None
    accs = rung_items("accelerator", accelerator) if acc_list else None
    caps = rung_items("capacity", capacity) if cap_list else None
    if accs is not None and caps is not None and len(accs) != len(caps):
        raise LadderError(
            f"accelerator has {len(accs)} rungs and capacity {len(caps)}: two ladders are paired rung by "
            "rung, so give them the same length (repeat a value where it stays the same), or make one "
            "of them a single value"
        )
    count = len(accs if accs is not None else caps)  # type: ignore[arg-type]
    rungs: list[Rung] = []
    for index in range(count):
        acc, acc_time = accs[index] if accs is not None else (None, None)
        cap, cap_time = caps[index] if caps is not None else (None, None)
        if acc_time is not None and cap_time is not None:
            raise LadderError(
                f"rung {index + 1} gives its time to start twice (accelerator and capacity): give it "
                "once, on either list"
            )
        rung = Rung(acc, cap, acc_time if acc_time is not None else cap_time)
        for earlier, other in enumerate(rungs):
            if (other.accelerator, other.capacity) == (rung.accelerator, rung.capacity):
                raise LadderError(
                    f"rung {index + 1} ({rung.label()}) repeats rung {earlier + 1}: a ladder falls back to "
                    "something else; drop the repeat (or give the first one a longer time to start)"
                )
        rungs.append(rung)
    return rungs


def check_ladder_backend(rungs: Sequence[Rung] | None, backend: str | None) -> None:
    """A ladder of two or more rungs needs a cluster: refuse it on the local backend."""
    if rungs is not None and len(rungs) > 1 and backend == "local":
        raise LadderError(
            f"a capacity ladder ({len(rungs)} rungs: {', '.join(r.label() for r in rungs)}) needs a cluster "
            "backend: the local backend runs the job in a process on this machine, whose capacity never "
            "changes, so no rung could fail to start and the ladder would never move. Give one "
            "accelerator and capacity for a local run, or use backend='gke' (or 'auto')"
        )
