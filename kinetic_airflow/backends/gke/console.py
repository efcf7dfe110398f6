"""Google Cloud console and Cloud Logging URLs of a GKE job: public information, no secrets.

The GKE backend attaches them to its status; the operator pushes them to XCom, where the
task's extra links (``links``) read them.
"""

from __future__ import annotations

from urllib.parse import quote

__all__ = ["is_gke_cluster", "job_links"]


def is_gke_cluster(cluster: dict) -> bool:
    """A cluster named by project/location/name (GKE), not one reached by a Kubernetes connection."""
    return not cluster.get("kubernetes_conn_id") and bool(cluster.get("project") and cluster.get("name"))


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
