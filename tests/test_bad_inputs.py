"""Every bad input gets a message that names the problem and the fix."""

from __future__ import annotations

import functools
import logging
import textwrap
import threading

import pytest

from kinetic_airflow import Data, InvalidAcceleratorError, KineticRunOperator, kinetic_task
from kinetic_airflow.envcapture import capture_env
from kinetic_airflow.job.payload import PayloadError, write_payload
from kinetic_airflow.job.storage import FileStorage


def _plain(x):
    return x


class Model:
    @classmethod
    def build(cls):
        return cls()

    @staticmethod
    def helper():
        return 1


def test_wrong_accelerator_is_a_dag_import_error(tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    (tmp_path / "bad_accel.py").write_text(
        textwrap.dedent(
            """
            import pendulum
            from airflow.sdk import dag, task

            @task.kinetic(accelerator="tpu-v6e-7")
            def train():
                return 1

            @dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1))
            def bad_accel():
                train()

            bad_accel()
            """
        )
    )
    bag = DagBag(dag_folder=str(tmp_path))
    (error,) = bag.import_errors.values()
    assert "Invalid accelerator 'tpu-v6e-7'" in error
    assert "1, 4, 8" in error  # the valid chip counts for v6e are listed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu-a100-80gbx16", "allowed counts"),
        ("tpu-v9-8", "Valid:"),
        ("tpuv6e-8", "Did you mean .tpu-v6e-8."),
        ("gpu-l5", "unknown GPU type .l5.*Valid: GPU types l4"),
    ],
)
def test_accelerator_messages(text, expected):
    with pytest.raises(InvalidAcceleratorError, match=expected):
        kinetic_task(accelerator=text)


def test_classmethod_and_staticmethod_objects_rejected():
    with pytest.raises(TypeError, match=r"classmethod object .*pass the bound method"):
        kinetic_task(Model.__dict__["build"])
    with pytest.raises(TypeError, match="staticmethod object"):
        kinetic_task(accelerator="cpu")(Model.__dict__["helper"])


def test_lru_cache_and_non_callables_rejected():
    with pytest.raises(TypeError, match=r"lru_cache/cache wrapper \(_plain\).*Decorate the undecorated"):
        kinetic_task(functools.lru_cache(_plain))
    with pytest.raises(TypeError, match=r"functools\.lru_cache/cache wrapper"):
        KineticRunOperator(task_id="t", python_callable=functools.cache(_plain))
    with pytest.raises(TypeError, match=r"kinetic needs a callable .* got int"):
        KineticRunOperator(task_id="t", python_callable=3)


def test_partials_and_callable_objects_get_names():
    class Trainer:
        def __call__(self, lr):
            return lr

    op = KineticRunOperator(task_id="p", python_callable=functools.partial(_plain, 1))
    assert op.python_callable.__name__ == "_plain"
    op = KineticRunOperator(task_id="c", python_callable=Trainer(), op_args=[0.1])
    assert op.python_callable.__name__ == "Trainer"
    assert kinetic_task(functools.partial(_plain, 2)).function.__name__ == "_plain"


@pytest.mark.parametrize(
    ("volumes", "expected"),
    [
        ({"data": Data("/tmp")}, "must be an absolute path"),
        ({"/data": "/tmp/x"}, r"must be a kinetic_airflow.Data object.*Data\('/tmp/x'\)"),
        (["/data"], "must be a dict of absolute mount path"),
    ],
)
def test_bad_volumes(volumes, expected):
    with pytest.raises((TypeError, ValueError), match=expected):
        kinetic_task(volumes=volumes)


def test_bad_backend_and_capture_patterns():
    with pytest.raises(ValueError, match="backend='kubernetes' is not one of local, gke, pathways, auto"):
        kinetic_task(backend="kubernetes")
    with pytest.raises(TypeError, match="capture_env_vars must be a list"):
        kinetic_task(capture_env_vars=[1])


def test_wildcards_never_capture_process_critical_variables(caplog):
    environ = {
        "PATH": "/bin",
        "HOME": "/root",
        "PYTHONPATH": "/x",
        "VIRTUAL_ENV": "/venv",
        "KERAS_BACKEND": "jax",
        "WANDB_API_KEY": "k",
        "WANDB_PROJECT": "p",
        "MY_SETTING": "1",
    }
    with caplog.at_level(logging.WARNING):
        got = capture_env(["*"], environ)
    assert got == {"WANDB_API_KEY": "k", "WANDB_PROJECT": "p", "MY_SETTING": "1"}
    assert "credential-looking variables WANDB_API_KEY" in caplog.text
    assert capture_env(["KERAS_BACKEND", "PATH"], environ) == {"KERAS_BACKEND": "jax", "PATH": "/bin"}


def test_unpicklable_argument_is_named(tmp_path):
    target = f"file://{tmp_path}/payload.pkl"
    with pytest.raises(PayloadError) as info:
        write_payload(
            FileStorage(), target, _plain, [], {"lock": threading.Lock()}, task_label="task 'train'"
        )
    assert not list(tmp_path.iterdir())  # no half-written payload, no temp file left
    message = str(info.value)
    assert "for task 'train'" in message
    assert "argument 'lock' (a _thread.lock) cannot be pickled" in message
    assert "create those inside the function" in message


def test_missing_bucket_and_connection(fake_gcs, monkeypatch):
    from kinetic_airflow.connections import KineticConfigError, storage_for
    from kinetic_airflow.job.storage import StorageError

    storage = storage_for("gs://no-such-bucket/kinetic")
    with pytest.raises(StorageError, match=r"bucket gs://no-such-bucket does not exist.*Create it"):
        storage.write_text("gs://no-such-bucket/kinetic/x", "1")
    with pytest.raises(KineticConfigError, match="GCP connection 'missing_conn' is not defined"):
        storage_for("gs://bucket/x", "missing_conn")


def test_bad_base_uri():
    from kinetic_airflow.job.storage import StorageError, open_storage

    with pytest.raises(StorageError, match="use gs://bucket/prefix or file:///absolute/path"):
        open_storage("s3://bucket/x")


def test_a_mistyped_kubernetes_connection_creates_nothing_and_says_so(tmp_path, monkeypatch, capfd, caplog):
    """The connection lookup fails before any job reaches a cluster: the task's error names the
    connection, and the log does not claim a job "may still be running"."""
    import kn_bad_conn

    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}")
    dr = kn_bad_conn.kn_bad_conn().test()
    log = "".join(capfd.readouterr()) + caplog.text
    assert dr.get_task_instance("train").state == "failed"
    assert "kubernetes_defualt" in log and "isn't defined" in log, log[-3000:]
    assert "may still be running" not in log, log[-3000:]
    assert "was not created: the same error stopped its creation" in log, log[-3000:]
