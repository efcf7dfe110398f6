"""DAGs the end-to-end tests run with dag.test(). Storage comes from KINETIC_BASE_URI."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pendulum
from airflow.sdk import dag, task
from kn_test_util import execute_twice, read_text, record_failure, write_text

from kinetic_airflow import Data, load_result

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "volume_src"
SECRET_SHA256 = "8fc72cfd7a91177d2946599f2135f3d324baaa5fdb5c843aa971784afdb4269f"
START = pendulum.datetime(2026, 1, 1, tz="UTC")


class TrainingDiverged(Exception):
    """A user exception class defined in the DAG file (pickled by value)."""

    def __init__(self, step: int) -> None:
        super().__init__(f"loss is NaN at step {step}")
        self.step = step


@task.kinetic(accelerator="cpu")
def add(a: int, b: int) -> int:
    print(f"adding {a} and {b}")
    return a + b


@task.kinetic(multiple_outputs=True)
def stats(values: list[float]) -> dict:
    return {"mean": sum(values) / len(values), "n": len(values)}


@task.kinetic
def square(x: int) -> int:
    return x * x


@task.kinetic
def make_array(n: int):
    import numpy as np

    return np.arange(n, dtype="float64")


@task.kinetic
def array_total(arr) -> float:
    import numpy as np

    assert isinstance(arr, np.ndarray), type(arr)
    return float(arr.sum())


@task
def plain_total(ref) -> float:
    return float(load_result(ref).sum())


@task.kinetic(capture_env_vars=["KN_TEST_*"])
def read_env() -> dict:
    # The secret's value must reach the job but never Airflow's plain-text stores (this
    # file's source is one of them: only the secret's digest appears here).
    return {
        "names": sorted(k for k in os.environ if k.startswith("KN_TEST_")),
        "color": os.environ["KN_TEST_COLOR"],
        "secret_ok": hashlib.sha256(os.environ["KN_TEST_SECRET_TOKEN"].encode()).hexdigest() == SECRET_SHA256,
    }


@task.kinetic
def read_volume(single_file, folder) -> dict:
    # A directory and a file passed as Data arguments. (A volume mount path is refused on the local
    # backend, which never writes outside the job's own directories; tests/test_everyday_surface.py.)
    return {
        "mounted": sorted(p.relative_to(folder).as_posix() for p in Path(folder).rglob("*") if p.is_file()),
        "arg_lines": Path(single_file).read_text().split(),
    }


@dag(schedule=None, start_date=START, catchup=False)
def kn_values():
    add(2, 3)
    stats([1.0, 2.0, 3.0, 6.0])
    square.expand(x=[1, 2, 3, 4])
    arr = make_array(1000)
    array_total(arr)
    plain_total(arr)
    read_env()
    read_volume(Data(str(DATA_DIR / "lines.txt")), Data(str(DATA_DIR)))


@task.kinetic(on_failure_callback=record_failure)
def diverge():
    raise TrainingDiverged(step=42)


@task.kinetic(on_failure_callback=record_failure)
def exits_nonzero():
    print("about to exit")
    sys.exit(3)


@task.kinetic(on_failure_callback=record_failure)
def exits_zero():
    sys.exit(0)


@task.kinetic(on_failure_callback=record_failure)
def returns_unpicklable():
    import threading

    return threading.Lock()


@dag(schedule=None, start_date=START, catchup=False)
def kn_failures():
    diverge()
    exits_nonzero()
    exits_zero()
    returns_unpicklable()


@task.kinetic(retries=1, retry_delay=pendulum.duration(seconds=0))
def resumable_training() -> dict:
    ckpt = os.environ["KINETIC_OUTPUT_DIR"].rstrip("/") + "/checkpoint.txt"
    found = read_text(ckpt)
    if found is None:
        write_text(ckpt, f"step-100 written by job {os.environ['KINETIC_JOB_ID']}")
        raise RuntimeError("simulated crash after the first checkpoint")
    return {"resumed_from": found, "job": os.environ["KINETIC_JOB_ID"]}


@dag(schedule=None, start_date=START, catchup=False)
def kn_retry():
    resumable_training()


@task.kinetic(pre_execute=execute_twice)
def slow_once() -> int:
    import time

    time.sleep(2)
    return os.getpid()


@task.kinetic(execution_timeout=pendulum.duration(seconds=3), on_failure_callback=record_failure)
def runs_too_long():
    import time

    print(f"pid {os.getpid()}", flush=True)
    time.sleep(600)


@task.kinetic(deferrable=False)
def in_worker(x: int) -> int:
    return x + 1


def _power(base: int, exp: int) -> int:
    return base**exp


@dag(schedule=None, start_date=START, catchup=False)
def kn_semantics():
    from functools import partial

    from kinetic_airflow import KineticRunOperator

    slow_once()
    runs_too_long()
    in_worker(41)
    KineticRunOperator(task_id="classic_lambda", python_callable=lambda x, y: x * y, op_args=[6, 7])
    KineticRunOperator(task_id="classic_partial", python_callable=partial(_power, 2), op_kwargs={"exp": 10})


kn_values()
kn_failures()
kn_retry()
kn_semantics()
