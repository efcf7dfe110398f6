"""Helpers for the function of a multi-host job, importable where it runs (the runner image).

A LeaderWorkerSet's hosts get ``KINETIC_HOST_INDEX``, ``KINETIC_NUM_HOSTS`` and
``KINETIC_COORDINATOR_ADDRESS``; on a TPU slice JAX can also find its peers by itself
(``TPU_WORKER_HOSTNAMES``), but JAX on CPU or GPU cannot, so this names them explicitly —
the same call then works on a slice, on the cluster emulator and on one machine.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["host_count", "host_index", "initialize_jax"]


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
