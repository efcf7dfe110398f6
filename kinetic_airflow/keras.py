"""``kinetic_airflow.keras.MetricsCallback``: a Keras callback that reports training logs.

Each epoch's logs (``loss``, ``val_loss``, metrics) go to ``kinetic_airflow.report`` with
``step`` = the epoch number (1-based); with ``every_n_batches=N`` every Nth batch's logs are
reported too, as ``batch_<name>`` with ``step`` = the batch count since training began.

Keras is imported when the callback is first used, not when this module is imported (the job's
runner imports the package without Keras). Use it inside a kinetic task::

    from kinetic_airflow.keras import MetricsCallback
    model.fit(x, y, epochs=10, callbacks=[MetricsCallback()])
"""

from __future__ import annotations

from typing import Any

from kinetic_airflow.job.metrics import report

__all__ = ["MetricsCallback"]  # noqa: F822 (resolved by __getattr__, importing Keras)

_class: Any = None


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


def __getattr__(name: str) -> Any:
    if name == "MetricsCallback":
        return _callback_class()
    raise AttributeError(f"module 'kinetic_airflow.keras' has no attribute {name!r}")
