"""The Kinetic view's HTTP side, mounted by the plugin in the api-server at ``/kinetic``.

Pages (``/kinetic/jobs``, ``/kinetic/task/...``) are static HTML that Airflow's UI embeds
(``external_views``); they fetch JSON from ``/kinetic/api/...`` every few seconds, so
they stay live without a reload. Every route resolves the user with Airflow's own
``get_user`` (the UI's session cookie or a bearer token) and asks the configured auth
manager which DAGs that user may see: a user who may not see a DAG sees none of its
jobs, and a request without credentials gets 401.
"""

# No ``from __future__ import annotations``: FastAPI reads the local ``User`` alias at definition.
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import FileResponse

from kinetic_airflow.job.layout import STATE_KEY
from kinetic_airflow.job.states import JobStatus
from kinetic_airflow.ui.data import job_details, run_costs, task_rows
from kinetic_airflow.ui.metrics_view import sweep, task_metrics

__all__ = ["create_app"]

_STATIC = Path(__file__).resolve().parent / "static"
UPLOT_VERSION = "1.6.32"  # vendored from the npm registry: static/uplot/VERSION
_STATIC_FILES = {
    "kinetic.js": "text/javascript",
    "kinetic.css": "text/css",
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
}
# The view's state filter: the one vocabulary of job states (the jobs CLI's ``--state``).
_STATES = tuple(status.value for status in JobStatus)


def _user_dependency() -> Any:
    # Airflow start-up cost: its models load when used, not when the plugin is registered.
    from airflow.api_fastapi.core_api.security import get_user

    return get_user


def _visible_dag_ids(user: Any, session: Any, wanted: str | None) -> set[str]:
    """The DAGs with kinetic jobs that ``user`` may read (task instances included)."""
    # Airflow start-up cost: its models load when used, not when the plugin is registered.
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
    from airflow.models.task_state_store import TaskStateStoreModel as Store
    from sqlalchemy import select

    query = select(Store.dag_id).where(Store.key == STATE_KEY).distinct()
    if wanted is not None:
        query = query.where(Store.dag_id == wanted)
    manager = get_auth_manager()
    return {
        dag_id
        for dag_id in session.scalars(query)
        if manager.is_authorized_dag(
            method="GET",
            access_entity=DagAccessEntity.TASK_INSTANCE,
            details=DagDetails(id=dag_id),
            user=user,
        )
    }


def _map_index(text: str) -> int:
    """The UI substitutes ``{MAP_INDEX}`` with a number for a mapped instance and with a
    placeholder (not ``-1``) for an unmapped one."""
    try:
        return int(text)
    except ValueError:
        return -1


def _page(name: str) -> FileResponse:
    return FileResponse(_STATIC / name, media_type="text/html", headers={"Cache-Control": "no-store"})


def create_app() -> FastAPI:
    # Airflow start-up cost: its models load when used, not when the plugin is registered.
    from airflow.utils.session import create_session

    User = Annotated[Any, Depends(_user_dependency())]
    app = FastAPI(title="Kinetic jobs", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/jobs", include_in_schema=False)
    def jobs_page(user: User) -> FileResponse:
        return _page("jobs.html")

    @app.get("/task/{dag_id}/{run_id}/{task_id}/{map_index}", include_in_schema=False)
    def task_page(dag_id: str, run_id: str, task_id: str, map_index: str, user: User):
        return _page("task.html")

    @app.get("/sweep/{dag_id}/{task_id}", include_in_schema=False)
    def sweep_page(dag_id: str, task_id: str, user: User) -> FileResponse:
        return _page("sweep.html")

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str, user: User) -> FileResponse:
        media = _STATIC_FILES.get(name)
        if media is None:
            raise HTTPException(404, f"no static file {name!r}")
        path = _STATIC / ("uplot/" + name if name.startswith("uPlot") else name)
        # uPlot's files change only with its version (in the URL): cacheable; ours: not
        cache = "max-age=86400" if name.startswith("uPlot") else "no-store"
        return FileResponse(path, media_type=media, headers={"Cache-Control": cache})

    @app.get("/api/jobs")
    def list_jobs(
        user: User,
        dag_id: str | None = None,
        run_id: str | None = None,
        state: str | None = Query(None, description=f"one of {', '.join(_STATES)}"),
        limit: int = Query(500, ge=1, le=5000),
    ) -> dict[str, Any]:
        if state is not None and state not in _STATES:
            raise HTTPException(400, f"unknown state {state!r}: use one of {', '.join(_STATES)}")
        with create_session() as session:
            visible = _visible_dag_ids(user, session, dag_id)
            rows = task_rows(session, dag_ids=visible, dag_id=dag_id, run_id=run_id, limit=limit)
        if state is not None:  # one filter for every table: the costs are those of the rows shown
            rows = [r for r in rows if r["state"] == state]
        runs = run_costs(rows)
        return {"jobs": rows, "runs": runs, "dag_ids": sorted(visible), "states": list(_STATES)}

    @app.get("/api/task/{dag_id}/{run_id}/{task_id}/{map_index}")
    def task_jobs(dag_id: str, run_id: str, task_id: str, map_index: str, user: User):
        map_index = _map_index(map_index)

        with create_session() as session:
            if dag_id not in _visible_dag_ids(user, session, dag_id):
                # the same answer whether the DAG is hidden or has no kinetic job: no leak
                raise HTTPException(404, f"no kinetic job for {dag_id}/{run_id}/{task_id}[{map_index}]")
            details = job_details(session, dag_id, run_id, task_id, map_index)
        if details is None:
            raise HTTPException(404, f"no kinetic job for {dag_id}/{run_id}/{task_id}[{map_index}]")
        return details

    @app.get("/api/metrics/{dag_id}/{run_id}/{task_id}/{map_index}")
    def metrics_of_task(dag_id: str, run_id: str, task_id: str, map_index: str, user: User):
        """The metrics the task's job reported: the newest try's attempts, points per metric."""
        map_index = _map_index(map_index)
        with create_session() as session:
            found = None
            if dag_id in _visible_dag_ids(user, session, dag_id):
                found = task_metrics(session, dag_id, run_id, task_id, map_index)
        if found is None:
            raise HTTPException(404, f"no kinetic job for {dag_id}/{run_id}/{task_id}[{map_index}]")
        return found

    @app.get("/api/sweep/{dag_id}/{task_id}")
    def sweep_of_task(
        dag_id: str,
        task_id: str,
        user: User,
        run_id: str | None = Query(None, description="one DAG run; default: every run (grouped by run)"),
        limit: int = Query(2000, ge=1, le=10000),
    ) -> dict[str, Any]:
        """A mapped kinetic task's members: label, parameters, state, final/best metrics, chip-hours."""
        with create_session() as session:
            visible = _visible_dag_ids(user, session, dag_id)
            if dag_id not in visible:
                raise HTTPException(404, f"no kinetic job for {dag_id}/{task_id}")
            return sweep(session, visible, dag_id, task_id, run_id, limit)

    return app
