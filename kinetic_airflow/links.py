"""Operator extra links, right on every backend.

- "Kinetic job": the task instance's Kinetic tab in Airflow's UI (every backend; built from
  the task instance key alone, so it works before, while and after the job runs).
- "Kinetic Job (GKE console)" and "Kinetic Job logs (Cloud Logging)": only for a job on a
  GKE cluster. The operator pushes those plain URLs to XCom before it defers (Airflow
  computes links of a deferred task from that XCom); it pushes none for a local job or a
  cluster reached through a Kubernetes connection, which has no GKE console, so the UI
  shows no link there rather than one to a cluster that does not exist.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.models.taskinstancekey import TaskInstanceKey

__all__ = [
    "LINKS_XCOM_KEY",
    "TASK_TAB_ROUTE",
    "KineticJobConsoleLink",
    "KineticJobLogsLink",
    "KineticViewLink",
    "task_tab_url",
]

LINKS_XCOM_KEY = "kinetic_job_links"
# The task instance's Kinetic tab: the plugin registers it under this route, the links point at it.
TASK_TAB_ROUTE = "kinetic-job"


def task_tab_url(dag_id: str, run_id: str, task_id: str, map_index: int) -> str:
    """The task instance's Kinetic tab in Airflow 3's UI (relative to the UI's base path)."""
    base = _ui_base_path()
    parts = [quote(dag_id, safe=""), quote(run_id, safe=""), quote(task_id, safe="")]
    mapped = f"/mapped/{map_index}" if map_index is not None and map_index >= 0 else ""
    return f"{base}/dags/{parts[0]}/runs/{parts[1]}/tasks/{parts[2]}{mapped}/plugin/{TASK_TAB_ROUTE}"


def _ui_base_path() -> str:
    try:
        # Airflow start-up cost: loaded when called, not when this module is imported.
        from airflow.configuration import conf

        base_url = conf.get("api", "base_url", fallback="") or ""
    except Exception:
        base_url = ""
    return urlsplit(base_url).path.rstrip("/")


class _KineticLink(BaseOperatorLink):
    field = ""

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        # The worker that ran the task knows the links (JobDriver sets them): Airflow asks there
        # when the task ends, and a lookup of an XCom that was never pushed logs an error.
        links = getattr(operator, "kinetic_links", None)
        if links is None:
            # Airflow start-up cost: loaded when called, not when this module is imported.
            from airflow.sdk.execution_time.xcom import XCom

            links = XCom.get_value(key=LINKS_XCOM_KEY, ti_key=ti_key) or {}
        return links.get(self.field, "") if isinstance(links, dict) else ""


class KineticJobConsoleLink(_KineticLink):
    name = "Kinetic Job (GKE console)"
    field = "console"


class KineticJobLogsLink(_KineticLink):
    name = "Kinetic Job logs (Cloud Logging)"
    field = "logs"


class KineticViewLink(BaseOperatorLink):
    name = "Kinetic job"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        return task_tab_url(ti_key.dag_id, ti_key.run_id, ti_key.task_id, ti_key.map_index)
