"""``slices=N``: what a multislice TPU job needs of its accelerator and backend.

Multislice training joins N identical multi-host TPU slices over the data-center network
(libtpu's ``MEGASCALE_*``); on GKE it runs as one JobSet (``backends.gke.multislice``).
GKE supports it for multi-host node pools only, every slice the same type and topology,
and not on TPU v3 (ACCELERATORS.md section 4). Checked when the DAG file is parsed
(``options.validate_options``) and again with the resolved backend (``resolve_backend``).
Imports nothing of Airflow or Kubernetes: ``options`` calls it at parse time.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_slices"]

_FIX = 'e.g. @task.kinetic(accelerator="tpu-v6e-16", slices=2, backend="pathways")'


def check_slices(slices: int, accelerator: Any, backend: str | None, *, spot: bool | None = None) -> None:
    """Raise ``ValueError`` naming the problem and the fix when ``slices`` > 1 cannot run.

    ``accelerator`` is the DAG file's string (parse time) or the run's parsed spec (not parsed
    again). ``backend`` None (not given) and a templated ``accelerator`` are checked once known."""
    # (kept off config's import path)
    from kinetic_airflow.accelerators import AcceleratorSpec, parse_accelerator

    if slices <= 1:
        return
    if backend in ("local", "gke"):
        why = (
            "the local backend runs one process on this machine"
            if backend == "local"
            else "backend='gke' runs one single-host Job"
        )
        raise ValueError(
            f"slices={slices} with backend={backend!r}: {why}, not {slices} TPU slices. Multislice jobs "
            f"run as a JobSet on GKE: use backend='pathways' or backend='auto' ({_FIX}), or leave slices out."
        )
    if isinstance(accelerator, AcceleratorSpec):
        spec = accelerator
        accelerator = spec.text  # as the messages below quote it
    elif not isinstance(accelerator, str) or "{{" in accelerator:
        return
    else:
        spec = parse_accelerator(accelerator, spot=spot or None)
    if spec.kind != "tpu" or not spec.multi_host:
        shape = f"{spec.kind} on one host" if spec.kind == "tpu" else spec.kind
        raise ValueError(
            f"slices={slices} with accelerator={accelerator!r} ({shape}): multislice needs a multi-host "
            f"TPU slice such as 'tpu-v6e-16' or 'tpu-v5p-16' (GKE runs multislice on multi-host node "
            f"pools only), {_FIX}."
        )
    if spec.name.startswith("v3") or (spec.gke_label or "").startswith("tpu-v3"):
        raise ValueError(
            f"slices={slices} with accelerator={accelerator!r}: TPU v3 does not support multislice on "
            f"GKE; use v4, v5e, v5p, v6e or TPU7x slices, {_FIX}."
        )
