"""What keras-kinetic 0.0.4's own tools see of kinetic-airflow jobs, as JSON.

Runs inside ``.venv-kinetic`` (never the main venv): tests/test_kinetic_interop.py starts it with
KUBECONFIG pointing at the cluster emulator and STORAGE_EMULATOR_HOST at fake GCS. Uses kinetic's
own ``kinetic.jobs.list_jobs`` / ``kinetic.attach`` / ``JobHandle.status|logs|result`` and its
``kinetic jobs list`` / ``status`` click commands.

One thing is replaced: ``ensure_credentials``, which runs ``gcloud`` (install the auth plugin, log
in, ``gcloud container clusters get-credentials``) before kinetic talks to a cluster. There is no
gcloud here; the kubeconfig and the storage emulator are already what it would set up.

argv: project cluster job_id [job_id ...]; prints one JSON object on the last line.
"""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stdout

import kinetic
import kinetic.cli.output
import kinetic.credentials
import kinetic.jobs


def _no_gcloud(*_args, **_kwargs):  # see the module docstring
    return None


kinetic.credentials.ensure_credentials = _no_gcloud
kinetic.jobs.ensure_credentials = _no_gcloud


def main() -> None:
    project, cluster, *job_ids = sys.argv[1:]
    from importlib.metadata import version

    out: dict = {"version": version("keras-kinetic"), "jobs": {}}
    listed = kinetic.jobs.list_jobs(
        project=project, cluster=cluster, zone="us-central1-a", namespace="default"
    )
    out["listed"] = [h.to_dict() for h in listed]
    for job_id in job_ids:
        handle = kinetic.attach(job_id, project=project, cluster=cluster)
        record: dict = {"handle": handle.to_dict(), "status": handle.status().value}
        try:
            record["logs"] = handle.logs()
        except Exception as exc:  # a LeaderWorkerSet deleted after its outcome has no pods
            record["logs_error"] = f"{type(exc).__name__}: {exc}"
        try:
            value = handle.result(timeout=60, cleanup=False)
            record["result"] = repr(value)
        except Exception as exc:
            record["raised"] = {
                "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
                "message": str(exc),
                "notes": getattr(exc, "__notes__", []),
            }
        out["jobs"][job_id] = record
    from kinetic.cli.commands.jobs import jobs

    for argv in (
        ["list", "--project", project, "--cluster", cluster],
        ["status", job_ids[0], "--project", project],
    ):
        buffer = io.StringIO()
        with redirect_stdout(buffer):
            kinetic.cli.output.console.file = buffer
            jobs.main(argv, standalone_mode=False)
        out["cli_" + argv[0]] = buffer.getvalue()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
