"""DAGs for the job-lifecycle scenarios of tests/test_lifecycle_components.py.

Every kinetic function here appends one line per *execution* to
``$KINETIC_OUTPUT_DIR/executions.jsonl`` (the output directory is the same for
every try of a task instance), so a test counts how often the function really ran
— the thing exactly-once is about — independently of Airflow's and kinetic's own
bookkeeping. ``CODE_VERSION`` is rewritten by the re-run tests to prove that a
re-run runs the DAG's current code.
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.sdk import dag, task

CODE_VERSION = 1
START = pendulum.datetime(2026, 1, 1, tz="UTC")
TAGS = ["kinetic-lifecycle-test"]


def record_execution(**fields: object) -> dict:
    """What the job saw, appended to the task instance's executions file and returned."""
    entry = {
        "job_id": os.environ.get("KINETIC_JOB_ID"),
        "try_number": int(os.environ.get("KINETIC_TRY_NUMBER", "0")),
        "pid": os.getpid(),
        "code_version": CODE_VERSION,
        **fields,
    }
    out = Path(os.environ["KINETIC_OUTPUT_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "executions.jsonl", "a") as fh:
        fh.write(json.dumps(entry) + "\n")
    return entry


# TaskFlow context arguments, under the real scheduler (the DAG module has Airflow's name) --------
@task.kinetic(backend="local")
def context_values(lr: float, ds=None, ts=None, run_id=None, params=None, dag_run=None) -> dict:
    return record_execution(lr=lr, ds=ds, ts=ts, run_id=run_id, params=params, conf=dag_run.conf)


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS, params={"scale": 3})
def kn_context_args():
    context_values(0.5)


# Zero-second jobs, 20 per run: Airflow's executor-event race -------------------------------------
@task.kinetic(backend="local")
def zero_local(i: int) -> dict:
    return record_execution(i=i)


@task.kinetic(backend="gke")
def zero_gke(i: int) -> dict:
    return record_execution(i=i)


@task.kinetic(backend="local")
def short_local(i: int, seconds: float) -> dict:
    """Ends just after the task deferred: the trigger fires while the deferral is fresh."""
    time.sleep(seconds)
    return record_execution(i=i)


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS, max_active_tasks=20)
def kn_race_local():
    zero_local.expand(i=list(range(20)))


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS, max_active_tasks=20)
def kn_race_gke():
    zero_gke.expand(i=list(range(20)))


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS, max_active_tasks=20)
def kn_race_deferred():
    # wait_before_defer is 5 s: these defer, and their jobs end 1-2 s later.
    short_local.partial(seconds=6.5).expand(i=list(range(20)))


# Re-runs: clear, backfill --reprocess-behavior, a recreated run --------------------------------
@task.kinetic(backend="local")
def sweep(lr: float) -> dict:
    return record_execution(lr=lr)


@dag(schedule="@daily", start_date=START, catchup=False, tags=TAGS)
def kn_rerun():
    sweep.expand(lr=[0.1, 0.01, 0.001])


@task.kinetic(backend="local")
def slow_first_try(seconds: float) -> dict:
    """Long on its first try (so a test can clear it while it runs), instant afterwards."""
    entry = record_execution(started=True)
    if entry["try_number"] == 1:
        print(f"kn-lifecycle slow try 1 pid={os.getpid()}", flush=True)
        time.sleep(seconds)
    return entry


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS)
def kn_clear_deferred():
    slow_first_try(600)


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS)
def kn_clear_running():
    # Waits in the worker: a clear finds the task RUNNING (Airflow kills it: RESTARTING).
    slow_first_try.override(deferrable=False)(600)


# Crashes ---------------------------------------------------------------------------------------
class KillWorkerOnFirstPickle:
    """Pickling it SIGKILLs the process that pickles it, once per marker file.

    kinetic pickles the arguments after creating the job and before uploading the payload,
    so this kills the task process exactly in that window.
    """

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        import traceback

        pickled_by_kinetic = any(frame.name == "write_payload" for frame in traceback.extract_stack())
        if pickled_by_kinetic and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return (str, ("pickled",))


@task.kinetic(backend="local", retries=1, retry_delay=timedelta(seconds=1))
def survives_crash_before_payload(token: object) -> dict:
    return record_execution(token=str(token))


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS)
def kn_crash_before_payload():
    survives_crash_before_payload(KillWorkerOnFirstPickle(os.environ.get("KN_CRASH_MARKER", "/nonexistent")))


@task.kinetic(backend="local", retries=1, retry_delay=timedelta(seconds=1))
def runs_through_worker_crash(seconds: float) -> dict:
    print(f"kn-lifecycle crash-after-payload pid={os.getpid()}", flush=True)
    time.sleep(seconds)
    return record_execution()


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS)
def kn_crash_after_payload():
    # Long enough to outlive the crash's detection: a killed task process is seen at once, a lost
    # Celery worker only after [scheduler] task_instance_heartbeat_timeout (tests set it).
    runs_through_worker_crash(float(os.environ.get("KN_WORKER_CRASH_JOB_SECONDS", "12")))


@task.kinetic(backend="local")
def chatty(i: int, lines: int, pause_every: int) -> dict:
    """Numbered log lines with quiet gaps (a test crashes the triggerer inside a gap)."""
    for n in range(lines):
        print(f"kn-line task={i} n={n}", flush=True)
        time.sleep(2.5 if (n + 1) % pause_every == 0 else 0.02)
    return record_execution(i=i)


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS, max_active_tasks=5)
def kn_triggerer_crash():
    chatty.partial(lines=60, pause_every=10).expand(i=list(range(5)))


@task.kinetic(backend="local")
def steady(seconds: float) -> dict:
    time.sleep(seconds)
    return record_execution()


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS)
def kn_scheduler_restart():
    steady(20)


@task.kinetic(backend="local", deferrable=False, execution_timeout=timedelta(seconds=8))
def too_slow_in_worker() -> None:
    print(f"kn-lifecycle too-slow pid={os.getpid()}", flush=True)
    record_execution()
    time.sleep(600)


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS)
def kn_not_deferrable_timeout():
    too_slow_in_worker()


# Multi-host TPU slices (backend="auto" -> pathways: a LeaderWorkerSet of 4 hosts) -------------
@task.kinetic(backend="auto", accelerator="tpu-v6e-16", container_env={"JAX_PLATFORMS": "cpu"})
def slice_collective() -> list:
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    jax.distributed.initialize(
        coordinator_address=os.environ["KINETIC_COORDINATOR_ADDRESS"],
        num_processes=int(os.environ["KINETIC_NUM_HOSTS"]),
        process_id=int(os.environ["KINETIC_HOST_INDEX"]),
        cluster_detection_method="deactivate",
    )
    gathered = multihost_utils.process_allgather(jnp.array([jax.process_index() + 1]))
    print(f"kn-slice process {jax.process_index()} gathered {gathered.ravel().tolist()}", flush=True)
    if jax.process_index() == 0:
        record_execution()
    return gathered.ravel().tolist()


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS)
def kn_slice():
    slice_collective()


# Multislice (slices=2 of tpu-v6e-16: one JobSet, 2 x 4 hosts, one JAX collective) ------------
@task.kinetic(backend="auto", accelerator="tpu-v6e-16", slices=2, container_env={"JAX_PLATFORMS": "cpu"})
def multislice_collective() -> list:
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    from kinetic_airflow.job.multihost import initialize_jax

    initialize_jax()
    me = jax.process_index()
    gathered = multihost_utils.process_allgather(jnp.array([me + 1])).ravel().tolist()
    print(
        f"kn-multislice process {me} (slice {os.environ['MEGASCALE_SLICE_ID']}) gathered {gathered}",
        flush=True,
    )
    if me == 0:
        record_execution()
    return gathered


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS)
def kn_multislice():
    multislice_collective()


@task.kinetic(backend="auto", accelerator="tpu-v6e-16")
def slice_slow_first_try() -> dict:
    """Try 1 runs until it is stopped (marked failed or cleared); a later try returns at once."""
    if os.environ["KINETIC_HOST_INDEX"] == "0":
        entry = record_execution()
    else:
        entry = {}
    if int(os.environ["KINETIC_TRY_NUMBER"]) == 1:
        time.sleep(600)
    return entry


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS)
def kn_slice_mark_failed():
    slice_slow_first_try()


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS)
def kn_slice_clear():
    slice_slow_first_try()


# The DAG folder's own code reaches the job ------------------------------------------------------
@task.kinetic(backend="local")
def imports_dag_folder_package(x: int) -> int:
    import kn_lifecycle_lib  # in the body only: shipped in the bundle's code archive

    record_execution()
    return kn_lifecycle_lib.double(x)


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS)
def kn_bundle_code():
    imports_dag_folder_package(21)


# A writer of job storage, and nothing else (issue 24) ---------------------------------------------
_TAMPER = """
import hashlib, json, os, sys, time
job_dir, evil = sys.argv[1], bytes.fromhex(sys.argv[2])
deadline = time.time() + 120
while time.time() < deadline:
    try:
        summary = json.load(open(os.path.join(job_dir, "result.json")))
    except (OSError, ValueError):
        time.sleep(0.01)
        continue
    open(os.path.join(job_dir, "result.pkl"), "wb").write(evil)
    summary["integrity"]["sha256"] = hashlib.sha256(evil).hexdigest()
    open(os.path.join(job_dir, "result.json"), "w").write(json.dumps(summary))
    break
"""


def evil_pickle() -> bytes:
    """What a bucket writer plants: a pickle that writes ``$KN_INTEGRITY_MARKER`` when loaded."""
    import pickle

    class Evil:
        def __reduce__(self):
            return (exec, (f"open({os.environ['KN_INTEGRITY_MARKER']!r}, 'w').write('code ran')",))

    return pickle.dumps(Evil())


@task.kinetic(backend="local")
def tampered_before_the_worker_loads_it() -> str:
    """Starts an attacker that replaces this job's envelope as soon as the runner has written it
    (the task has deferred by then: the worker reads it seconds later)."""
    import subprocess
    import sys

    from kinetic_airflow.job.storage import uri_to_local_path

    job_dir = uri_to_local_path(f"{os.environ['KINETIC_BASE_URI']}/jobs/{os.environ['KINETIC_JOB_ID']}")
    subprocess.Popen(
        [sys.executable, "-c", _TAMPER, job_dir, evil_pickle().hex()], start_new_session=True, close_fds=True
    )
    time.sleep(8)  # past wait_before_defer (5 s): the task defers
    return "the worker must never see this"


@task.kinetic(backend="local")
def produce_bytes() -> bytes:
    return b"weights" * 10  # bytes: XCom gets a reference with the verified digest


@task
def overwrite_the_stored_result(ref: dict) -> None:
    """A bucket writer replaces the envelope after the worker verified it."""
    from kinetic_airflow.job.storage import uri_to_local_path

    with open(uri_to_local_path(ref["__kinetic_result_ref__"]), "wb") as fh:
        fh.write(evil_pickle())


@task
def load_it(ref: dict) -> int:
    from kinetic_airflow import load_result

    return len(load_result(ref))


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS)
def kn_integrity():
    tampered_before_the_worker_loads_it()
    ref = produce_bytes()
    overwrite_the_stored_result(ref) >> load_it(ref)


# Two DAGs share one Kueue ClusterQueue with quota for one job --------------------------------
@task.kinetic(backend="gke", local_queue="shared")
def queued_training(name: str) -> dict:
    started = time.time()
    time.sleep(12)
    return record_execution(name=name, started=started, ended=time.time())


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS)
def kn_queue_team_a():
    queued_training("a")


@dag(schedule=None, start_date=START, catchup=False, tags=TAGS)
def kn_queue_team_b():
    queued_training("b")


kn_context_args()
kn_race_local()
kn_race_gke()
kn_race_deferred()
kn_rerun()
kn_clear_deferred()
kn_clear_running()
kn_crash_before_payload()
kn_crash_after_payload()
kn_triggerer_crash()
kn_scheduler_restart()
kn_not_deferrable_timeout()
kn_slice()
kn_multislice()
kn_slice_mark_failed()
kn_slice_clear()
kn_bundle_code()
kn_integrity()
kn_queue_team_a()
kn_queue_team_b()
