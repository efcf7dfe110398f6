"""DAGs that tests/test_ui_components.py follows from Airflow's UI (api-server + the Kinetic view).

``kn_ui_sweep`` is a small nightly sweep on the local backend: two mapped training
jobs asking for a TPU slice (the local backend runs them on this machine's CPU, and the
view bills no chips for them), one that fails, one that fails with a long exception name,
one whose payload cannot be built (it fails while packaging), and one that runs until
the test releases it (``KN_UI_RELEASE`` appears), so the view has a running, a
finished and failed kinetic tasks at once. ``kn_ui_gke`` runs on the cluster
emulator, whose scheduling the test delays so the job waits for a node first.
``kn_ui_secret`` belongs to a DAG one test user may not see. ``kn_ui_fail`` raises an
exception class of this file, from a helper, on each of its two tries, and imports a module
the job does not have.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.sdk import dag, task

START = pendulum.datetime(2026, 1, 1, tz="UTC")


@task.kinetic(accelerator="tpu-v6e-8", backend="local")
def train(lr: float, epochs: int) -> dict:
    time.sleep(1.0)
    return {"lr": lr, "epochs": epochs, "loss": round(1.0 / (1 + lr * 100), 4)}


@task.kinetic(accelerator="gpu-l4", backend="local", retries=0)
def broken() -> None:
    raise ValueError("loss diverged at step 3")


class TrainingDivergedBecauseTheLearningRateWasFarTooHighForThisModelAndDataset(Exception):
    """A long exception name: the jobs table must keep its links column on screen."""


@task.kinetic(backend="local", retries=0)
def diverges_badly() -> None:
    raise TrainingDivergedBecauseTheLearningRateWasFarTooHighForThisModelAndDataset("lr=10")


_LOCK = threading.Lock()  # a global the next function uses: no payload can carry it


@task.kinetic(backend="local", retries=0)
def packs_a_lock() -> str:
    with _LOCK:
        return "never"


@task.kinetic(backend="local")
def slow() -> str:
    release = Path(os.environ["KN_UI_RELEASE"])
    print("slow: waiting for the test to release me", flush=True)
    while not release.exists():
        time.sleep(0.2)
    return "released"


@dag(schedule=None, start_date=START, catchup=False, tags=["kinetic-ui-test"])
def kn_ui_sweep():
    train.partial(epochs=2).expand(lr=[0.01, 0.1])
    broken()
    diverges_badly()
    packs_a_lock()
    slow()


@task.kinetic(backend="gke", accelerator="gpu-l4")
def after_scale_up() -> str:
    print("running after the scale-up", flush=True)
    return "scaled"


@dag(schedule=None, start_date=START, catchup=False, tags=["kinetic-ui-test"])
def kn_ui_gke():
    after_scale_up()


@task.kinetic(backend="local")
def secret_sauce() -> int:
    return 42


@dag(schedule=None, start_date=START, catchup=False, tags=["kinetic-ui-test"])
def kn_ui_secret():
    secret_sauce()


class TrainingDiverged(RuntimeError):
    """A DAG file's own exception: Airflow imports this file as ``unusual_prefix_<sha1>_kn_ui``."""


def check_loss(loss: float) -> None:
    if loss > 10:
        raise TrainingDiverged(f"loss {loss:g} at step 7")  # KN-UI-RAISE


@task.kinetic(backend="local", retries=1, retry_delay=timedelta(seconds=1))
def diverges() -> None:
    # Longer than [kinetic] wait_before_defer (5 s): each try defers, so the triggerer fires an event.
    print("diverges: training", flush=True)
    time.sleep(7)
    check_loss(1e9)


@task.kinetic(backend="local", retries=0)
def needs_missing() -> None:
    import kn_ui_not_installed  # noqa: F401  # KN-UI-IMPORT


@dag(schedule=None, start_date=START, catchup=False, tags=["kinetic-ui-test"])
def kn_ui_fail():
    diverges()
    needs_missing()


@task.kinetic(backend="local", retries=0)
def fit(lr: float) -> float:
    """A tiny Keras model on CPU, reporting each epoch with kinetic's callback. It stops after
    epochs 3 and 6 until the test lets it go on (``KN_UI_RELEASE.keras3`` / ``.keras6``), so the
    test sees the curve grow while the job runs."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras
    import numpy as np

    from kinetic_airflow.keras import MetricsCallback

    release = os.environ["KN_UI_RELEASE"]

    class Gate(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            gate = Path(f"{release}.keras{epoch + 1}")
            if epoch + 1 in (3, 6):
                print(f"fit: waiting for {gate.name}", flush=True)
                while not gate.exists():
                    time.sleep(0.2)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1)).astype("float32")) + 0.1
    layers = [keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
    model = keras.Sequential(layers)
    model.compile(optimizer=keras.optimizers.SGD(lr), loss="mse")
    # kinetic's callback first: an epoch's point is reported before the gate holds the job
    history = model.fit(x, y, epochs=10, batch_size=64, verbose=0, callbacks=[MetricsCallback(), Gate()])
    return float(history.history["loss"][-1])


@dag(schedule=None, start_date=START, catchup=False, tags=["kinetic-ui-test"])
def kn_ui_keras():
    fit.expand(lr=[0.001, 0.003, 0.01, 0.03])


kn_ui_sweep()
kn_ui_keras()
kn_ui_gke()
kn_ui_secret()
kn_ui_fail()
