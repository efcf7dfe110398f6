"""Keras callbacks for kinetic jobs: ``MetricsCallback`` reports training logs;
``CheckpointOnStop`` saves the model and ends training when the job is asked to stop.

Each epoch's logs (``loss``, ``val_loss``, metrics) go to ``kinetic_airflow.report`` with
``step`` = the epoch number (1-based); with ``every_n_batches=N`` every Nth batch's logs are
reported too, as ``batch_<name>`` with ``step`` = the batch count since training began.

Keras is imported when the callback is first used, not when this module is imported (the job's
runner imports the package without Keras). Use it inside a kinetic task::

    from kinetic_airflow.keras import CheckpointOnStop, MetricsCallback
    model.fit(x, y, epochs=10, callbacks=[MetricsCallback(), CheckpointOnStop()])
"""

from __future__ import annotations

import os
from typing import Any

from kinetic_airflow.job.metrics import report
from kinetic_airflow.job.stop import stop_requested

__all__ = ["CheckpointOnStop", "MetricsCallback"]  # noqa: F822 (resolved by __getattr__, importing Keras)

_class: Any = None
_stop_class: Any = None


def _callback_class() -> Any:
    global _class
    if _class is not None:
        return _class
    import keras  # the job's own Keras (and its backend: KERAS_BACKEND)

    class MetricsCallback(keras.callbacks.Callback):
        """Reports each epoch's logs (and every ``every_n_batches``'s) via kinetic_airflow.report."""

        def __init__(self, every_n_batches: int | None = None, prefix: str = "") -> None:
            super().__init__()
            if every_n_batches is not None and (not isinstance(every_n_batches, int) or every_n_batches < 1):
                raise ValueError(f"every_n_batches={every_n_batches!r}: a whole number, 1 or more, or None")
            self.every_n_batches = every_n_batches
            self.prefix = prefix
            self._batches = 0
            if every_n_batches is None:
                # Keras dispatches batch callbacks asynchronously only while no callback overrides
                # the batch hooks (CallbackList._configure_async_dispatch reads ``_is_default``);
                # an epoch-only callback keeps the base class's hook, so training never waits on it.
                self.on_train_batch_end = keras.callbacks.Callback.on_train_batch_end.__get__(self)

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self._batches += 1
            if self.every_n_batches and self._batches % self.every_n_batches == 0 and logs:
                report(step=self._batches, **{f"{self.prefix}batch_{k}": v for k, v in logs.items()})

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            if logs:
                report(step=epoch + 1, **{f"{self.prefix}{k}": v for k, v in logs.items()})

    _class = MetricsCallback
    return _class


def _stop_callback_class() -> Any:
    global _stop_class
    if _stop_class is not None:
        return _stop_class
    import keras  # the job's own Keras, when first used (the runner imports this package without it)

    class CheckpointOnStop(keras.callbacks.Callback):
        """When the job is asked to stop (``kinetic_airflow.stop_requested()``): at the end of the
        batch under way, save the model to ``filepath`` and set ``model.stop_training``, so
        ``fit`` returns within the job's ``stop_grace_seconds``.

        ``filepath`` defaults to ``$KINETIC_OUTPUT_DIR/stopped.keras`` (the task instance's output
        directory, the same across retries: the next try can resume from it). Checked at the
        batch's end, between two steps, so the saved weights are those of a whole step.
        """

        def __init__(self, filepath: str | None = None) -> None:
            super().__init__()
            self.filepath = filepath
            self.saved_to: str | None = None

        def _path(self) -> str:
            if self.filepath:
                return self.filepath
            folder = os.environ.get("KINETIC_OUTPUT_DIR")
            if not folder:
                raise RuntimeError(
                    "CheckpointOnStop has no filepath and KINETIC_OUTPUT_DIR is not set (not in a "
                    "kinetic job); pass CheckpointOnStop(filepath='.../model.keras')"
                )
            return os.path.join(folder, "stopped.keras")

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            if self.saved_to is None and stop_requested():
                self.saved_to = self._path()
                self.model.save(self.saved_to)
                print(f"[kinetic] stop requested: saved the model to {self.saved_to}", flush=True)
                self.model.stop_training = True

    _stop_class = CheckpointOnStop
    return _stop_class


def __getattr__(name: str) -> Any:
    if name == "MetricsCallback":
        return _callback_class()
    if name == "CheckpointOnStop":
        return _stop_callback_class()
    raise AttributeError(f"module 'kinetic_airflow.keras' has no attribute {name!r}")
