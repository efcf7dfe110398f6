"""Helpers for the function of a multi-host job, importable where it runs (the runner image).

A LeaderWorkerSet's hosts (and a multislice JobSet's, counted across slices) get
``KINETIC_HOST_INDEX``, ``KINETIC_NUM_HOSTS`` and ``KINETIC_COORDINATOR_ADDRESS``; on a TPU
slice JAX can also find its peers by itself (``TPU_WORKER_HOSTNAMES``), but JAX on CPU or
GPU cannot, so this names them explicitly — the same call then works on a slice, on the
cluster emulator and on one machine.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["host_count", "host_index", "host_label", "initialize_jax", "multislice_host_index"]


def multislice_host_index() -> int | None:
    """A multislice host's global index, ``slice * hosts_per_slice + completion index``; None
    outside a multislice JobSet. Its pods are Indexed Jobs, one per slice: their completion
    index counts hosts within the slice only, and Kubernetes cannot add in an env value."""
    slice_index = os.environ.get("KINETIC_SLICE_INDEX")
    per_slice = os.environ.get("KINETIC_HOSTS_PER_SLICE")
    index = os.environ.get("JOB_COMPLETION_INDEX")
    if not (slice_index and per_slice and index) or not (slice_index + per_slice + index).isdigit():
        return None
    return int(slice_index) * int(per_slice) + int(index)


def host_label(host: int, hosts_per_slice: int | None = None) -> str:
    """``host 5``, or on a multislice job ``host 5 (slice 1 host 1)``: what an error names."""
    if not hosts_per_slice:
        return f"host {host}"
    return f"host {host} (slice {host // hosts_per_slice} host {host % hosts_per_slice})"


def host_index() -> int:
    """This host's index in its job (0 is the leader, whose return value is the result)."""
    return int(os.environ.get("KINETIC_HOST_INDEX") or 0)


def host_count() -> int:
    return int(os.environ.get("KINETIC_NUM_HOSTS") or 1)


def initialize_jax(**kwargs: Any) -> None:
    """``jax.distributed.initialize()`` for this job's hosts; nothing on a one-host job."""
    if host_count() <= 1:
        return
    # Optional dependency: jax exists only inside the job's own environment.
    import jax

    jax.distributed.initialize(
        coordinator_address=os.environ["KINETIC_COORDINATOR_ADDRESS"],
        num_processes=host_count(),
        process_id=host_index(),
        cluster_detection_method="deactivate",  # all of it is given: JAX need not look
        **kwargs,
    )
