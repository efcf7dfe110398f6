"""Operator extra links to a running job: its GKE console page and its logs in Cloud Logging.

The operator pushes plain URLs to XCom before it defers, so the links work while
the job runs (Airflow computes links of a deferred task from that XCom).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.models.taskinstancekey import TaskInstanceKey

__all__ = ["LINKS_XCOM_KEY", "KineticJobConsoleLink", "KineticJobLogsLink", "job_links"]

LINKS_XCOM_KEY = "kinetic_job_links"


def job_links(*, project: str | None, location: str, cluster: str, namespace: str, job_name: str) -> dict:
    """Console and Cloud Logging URLs of a GKE Job (public information, no secrets)."""
    suffix = f"?project={quote(project)}" if project else ""
    query = (
        'resource.type="k8s_container"\n'
        f'resource.labels.cluster_name="{cluster}"\n'
        f'resource.labels.namespace_name="{namespace}"\n'
        f'labels."k8s-pod/job-name"="{job_name}"'
    )
    return {
        "console": f"https://console.cloud.google.com/kubernetes/job/{location}/{cluster}/{namespace}/"
        f"{job_name}/details{suffix}",
        "logs": f"https://console.cloud.google.com/logs/query;query={quote(query, safe='')}{suffix}",
    }


class _KineticLink(BaseOperatorLink):
    field = ""

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        links = XCom.get_value(key=LINKS_XCOM_KEY, ti_key=ti_key) or {}
        return links.get(self.field, "") if isinstance(links, dict) else ""


class KineticJobConsoleLink(_KineticLink):
    name = "Kinetic Job (GKE console)"
    field = "console"


class KineticJobLogsLink(_KineticLink):
    name = "Kinetic Job logs (Cloud Logging)"
    field = "logs"
