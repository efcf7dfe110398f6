"""The job-lifecycle scenarios of ``test_lifecycle_components.py`` on CeleryExecutor.

The lifecycle guarantees depend on how the executor reports the end of a task
process. LocalExecutor reports it from the scheduler's own worker processes the
moment one exits; CeleryExecutor hands each task to a worker through the broker
(a private Redis here, ``components/redis_server.py``), the worker's pool process
runs Airflow's supervisor, and the scheduler learns of the end only when it next
reads the Celery task's state from the result backend (the metadata DB). A lost
Celery worker reports nothing at all: only the heartbeat timeout tells.

So the same scenario bodies run here, imported (not copied) with the same
assertions, on one stack per module: PostgreSQL, Redis, the api-server,
scheduler, dag-processor, triggerer and two Celery workers (``kn-worker-1``,
``kn-worker-2``, 4 pool processes each). Covered: the executor-event race (one
run each of 20 zero-second and 20 just-deferred jobs), clearing a running and a
deferred task, the task process killed before its payload was shipped, and a Celery
worker killed while its task waits for the job (``Stack.crash_worker_of``: the new
try, on either worker, reattaches). The backfill reprocess and the recreated run are
not repeated here: which code a new run ships is decided in the task, the same under
any executor, and the LocalExecutor module covers it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import test_lifecycle_components as scenarios
from components.stack import started

# The scenarios, collected here as tests of this module (its own `stack` fixture).
from test_lifecycle_components import (  # noqa: F401
    Stack,
    test_clearing_a_live_task_stops_its_job_and_runs_a_new_one,
    test_task_killed_after_payload_upload_reattaches,
    test_task_killed_between_job_creation_and_payload_upload_still_succeeds_once,
)

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    root: Path = tmp_path_factory.mktemp("lifecycle-celery")
    with started(Stack(root, executor="CeleryExecutor")) as celery_stack:
        yield celery_stack


@pytest.mark.parametrize(
    ("dag_id", "task_id", "runs"),
    [("kn_race_local", "zero_local", 1), ("kn_race_deferred", "short_local", 1)],
)
def test_short_jobs_never_fail_under_the_scheduler(
    stack: Stack, dag_id: str, task_id: str, runs: int
) -> None:
    """One run per DAG (the LocalExecutor module runs more, and the GKE backend too: the backend
    does not change how the executor reports the task's end)."""
    scenarios.test_short_jobs_never_fail_under_the_scheduler(stack, dag_id, task_id, runs)
