"""The parts every real-components scenario module runs on: PostgreSQL, the cluster emulator,
job storage on local disk, and (once ``start`` has made it) one Airflow deployment; with
``executor="CeleryExecutor"`` also a private Redis, the Celery workers' broker."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from components.airflow_services import AirflowServices
from components.dag_runs import kill_leftover_jobs
from components.emulator_process import EmulatorProcess
from components.postgres import PostgresServer
from components.redis_server import RedisServer

__all__ = ["ComponentStack", "started"]


class ComponentStack:
    """Subclasses copy their DAGs into ``self.dags`` and start ``self.airflow`` in ``start``."""

    def __init__(self, root: Path, executor: str = "LocalExecutor") -> None:
        self.root = root
        self.executor = executor
        self.dags = root / "dags"
        self.dags.mkdir()
        self.kinetic_root = root / "kinetic"
        self.pg = PostgresServer()  # in the system temp dir: the postgres user must reach it
        self.emulator = EmulatorProcess(root / "emulator")
        self.redis = RedisServer() if executor == "CeleryExecutor" else None
        self.airflow: AirflowServices | None = None

    def executor_options(self) -> dict[str, Any]:
        """``AirflowServices`` keyword arguments for the stack's executor; starts Redis for Celery."""
        if self.redis is None:
            return {"executor": self.executor}
        self.redis.start()
        return {"executor": self.executor, "celery_broker_url": self.redis.url}

    def stop(self) -> None:
        if self.airflow is not None:
            self.airflow.stop()
        kill_leftover_jobs(self.kinetic_root)
        self.emulator.stop()
        if self.redis is not None:
            self.redis.stop()
        self.pg.stop()

    @property
    def api(self) -> AirflowServices:
        assert self.airflow is not None
        return self.airflow


@contextmanager
def started(stack: ComponentStack) -> Iterator[ComponentStack]:
    """``stack`` started for the ``with`` body and stopped after it, however it ends (fixtures)."""
    try:
        stack.start()  # type: ignore[attr-defined]
        yield stack
    finally:
        stack.stop()
