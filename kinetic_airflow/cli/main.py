"""``kinetic-airflow``: small command-line helpers around the accelerator catalog and job files.

kinetic-airflow accelerators            list accelerator strings by generation/type
kinetic-airflow check tpu-v5p-8         show what a string resolves to (selectors, resources, notes)
kinetic-airflow show JOB_URI            a job's manifest, markers and result summary
kinetic-airflow jobs list|logs|result|cancel|show   find jobs and act on them (kinetic_airflow.cli.jobs)
kinetic-airflow gc --older-than 30d     delete old job files, find orphans (kinetic_airflow.cli.gc)
kinetic-airflow reproduce JOB [--pdb]   run a stored job here (kinetic_airflow.cli.reproduce)
kinetic-airflow image [--kind tpu]      build and push the runner image (kinetic_airflow.cli.image)
kinetic-airflow doctor [tpu-v6e-8]      check a cluster for a first job, say fixes (backends/gke/doctor)
"""

from __future__ import annotations

import argparse
import json
import sys

from kinetic_airflow.accelerators import (
    CHIPS_NOTE,
    GPU_TYPES,
    TPU_GENERATIONS,
    InvalidAcceleratorError,
    accelerator_notes,
    parse_accelerator,
)
from kinetic_airflow.cli.doctor import add_doctor_command, run_doctor_command
from kinetic_airflow.cli.gc import add_gc_command, run_gc
from kinetic_airflow.cli.image import add_image_command, run_image
from kinetic_airflow.cli.jobs import add_job_commands, run_jobs_command
from kinetic_airflow.cli.reproduce import add_reproduce_command, run_reproduce
from kinetic_airflow.cli.text import described
from kinetic_airflow.job.layout import JobLayout
from kinetic_airflow.job.storage import open_storage


def _accelerators() -> None:
    print("cpu")
    for name, gpu in GPU_TYPES.items():
        print(f"gpu-{name}  counts {', '.join(map(str, gpu.counts))}")
    print("gpu-<N>  the GPU keras-kinetic picks for N: H100 for 1, 2, 4, 8 (gpu-4 = gpu-h100x4)")
    for name, gen in TPU_GENERATIONS.items():
        head = name if name.startswith("tpu") else f"tpu-{name}"
        one_host = ", ".join(f"{head}-{n}t" for n in gen.host_sizes())
        print(f"{head}  chips {', '.join(map(str, gen.chip_counts()))}; one host: {one_host}")
    print(
        "tpu-v6e-8 is 2x4 on two ct6e-standard-4t hosts, as in keras-kinetic; tpu-v6e-8t is 2x4 on "
        "one ct6e-standard-8t host"
    )
    print("tpu-<N>  the generation keras-kinetic picks for N chips (tpu-4 = tpu-v5e-4, tpu-8 = tpu-v6e-8)")
    print(CHIPS_NOTE)
    print("append ':spot' to any of them for Spot VMs")


def _check(text: str) -> int:
    try:
        spec = parse_accelerator(text)
    except InvalidAcceleratorError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(
        json.dumps(
            {
                "accelerator": spec.text,
                "kind": spec.kind,
                "chips": spec.chips,
                "hosts": spec.hosts,
                "chips_per_host": spec.chips_per_host,
                "machine_type": spec.machine_type,
                "google_accelerator_type": spec.google_accelerator_type,
                "node_selectors": spec.node_selectors,
                "resources": spec.resources,
                "tolerations": [t.to_k8s() for t in spec.tolerations],
                "notes": list(accelerator_notes(spec)),
            },
            indent=2,
        )
    )
    return 0


def _show(job_uri: str) -> int:
    layout = JobLayout(job_uri.rstrip("/"))
    storage = open_storage(job_uri)
    for label, uri in (("manifest", layout.manifest), ("result", layout.result_summary())):
        text = storage.read_text_or_none(uri)
        print(f"== {label}: {uri}")
        print(json.dumps(json.loads(text), indent=2) if text else "(none)")
    print("== status markers")
    for uri in storage.list(layout.job_uri + "/status"):
        print(f"{uri.rsplit('/', 1)[-1]}: {storage.read_text(uri)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Every command and its help, plain text (``kinetic_airflow.cli.text``)."""
    parser = argparse.ArgumentParser(prog="kinetic-airflow", **described(__doc__))
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("accelerators", help="list accelerator strings", description=_ACCELERATORS_HELP)
    check = sub.add_parser("check", help="resolve an accelerator string", description=_CHECK_HELP)
    check.add_argument("accelerator")
    show = sub.add_parser("show", help="show a job's files", description=_SHOW_HELP)
    show.add_argument("job_uri")
    add_job_commands(sub)
    add_gc_command(sub)
    add_reproduce_command(sub)
    add_image_command(sub)
    add_doctor_command(sub)
    return parser


_ACCELERATORS_HELP = "List the accelerator strings of every TPU generation and GPU type, with their sizes."
_CHECK_HELP = (
    "Show what an accelerator string resolves to: chips, hosts, machine type, Google's name for the "
    "slice, node selectors, resources, tolerations and notes (as JSON)."
)
_SHOW_HELP = "Show a job's manifest, result summary and status markers, read from its job URI."


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "doctor":
        return run_doctor_command(args)
    if args.command == "image":
        return run_image(args)
    if args.command in ("jobs", "gc", "reproduce"):
        return {"jobs": run_jobs_command, "gc": run_gc, "reproduce": run_reproduce}[args.command](args)
    if args.command == "accelerators":
        _accelerators()
        return 0
    if args.command == "check":
        return _check(args.accelerator)
    return _show(args.job_uri)


if __name__ == "__main__":
    sys.exit(main())
