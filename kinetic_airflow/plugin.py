"""Airflow plugin: the listener that stops jobs of task instances users mark by hand, the
triggerer's warm-up (``kinetic_airflow.warmup``), and the Kinetic view (a "Kinetic jobs" page in
the navigation and a "Kinetic" task-instance tab).

The view's app is built on its first request: this module is imported by every Airflow
process (workers, scheduler, triggerer), which need none of it.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from kinetic_airflow import listener, warmup
from kinetic_airflow.links import TASK_TAB_ROUTE

__all__ = ["JOBS_PAGE_ROUTE", "TASK_TAB_ROUTE", "URL_PREFIX", "KineticPlugin"]

URL_PREFIX = "/kinetic"
JOBS_PAGE_ROUTE = "kinetic-jobs"


class _LazyApp:
    """An ASGI app that builds the Kinetic view's FastAPI app when the api-server first calls it."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            # Start-up cost: the app is built only in the API server, not wherever plugins load.
            from kinetic_airflow.ui.app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class KineticPlugin(AirflowPlugin):
    name = "kinetic"
    listeners = [listener, warmup]
    fastapi_apps = [{"app": _LazyApp(), "url_prefix": URL_PREFIX, "name": "Kinetic jobs"}]
    external_views = [
        {
            "name": "Kinetic jobs",
            "href": f"{URL_PREFIX}/jobs",
            "destination": "nav",
            "url_route": JOBS_PAGE_ROUTE,
            "category": "browse",
        },
        {
            "name": "Kinetic",
            "href": f"{URL_PREFIX}/task/{{DAG_ID}}/{{RUN_ID}}/{{TASK_ID}}/{{MAP_INDEX}}",
            "destination": "task_instance",
            "url_route": TASK_TAB_ROUTE,
        },
    ]
