"""Supervisor of a local job: runs the runner, records how it ended, keeps its log.

It exists because the process that launched the job (an Airflow worker) may be
gone by the time the job ends, so nobody else could collect the exit status.
Standard library (+ kinetic_airflow.job.storage for a gs:// log copy) only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from kinetic_airflow.job.layout import CANCEL_NAME, EXIT_NAME, LOG_NAME
from kinetic_airflow.job.storage import open_storage


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kinetic_airflow.backends.local_supervisor")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--log-uri", default=None, help="also copy the log here (gs:// jobs)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    state = args.state_dir
    log_path = os.path.join(state, LOG_NAME)
    cancelled = False

    with open(log_path, "ab", buffering=0) as log:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

        def on_term(signum: int, _frame: object) -> None:
            nonlocal cancelled
            cancelled = True
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        returncode = child.wait()
        # The job's temporary directory (its TMPDIR, see LocalBackend.submit): work dir, copies of
        # Data inputs, the function's temp files. Payload, result and log live elsewhere and stay.
        shutil.rmtree(os.path.join(state, "tmp"), ignore_errors=True)

    record = {
        "returncode": returncode,
        "signal": -returncode if returncode < 0 else None,
        "cancelled": cancelled or os.path.exists(os.path.join(state, CANCEL_NAME)),
        "time": time.time(),
    }
    if args.log_uri and args.log_uri.startswith("gs://"):
        try:
            open_storage(args.log_uri).upload_file(log_path, args.log_uri)
        except Exception as exc:  # the local copy stays; say why the remote one is missing
            record["log_upload_error"] = str(exc)
    tmp = os.path.join(state, ".exit.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(record, fh)
    os.replace(tmp, os.path.join(state, EXIT_NAME))
    return 0


if __name__ == "__main__":
    sys.exit(main())
