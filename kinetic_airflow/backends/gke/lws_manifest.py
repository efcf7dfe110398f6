"""The LeaderWorkerSet of one multi-host attempt: one group, one pod per TPU host.

Names and labels follow kinetic's PathwaysBackend (``keras-pathways-{job_id}``,
``app=kinetic-pathways``, ``job-id``, ``job-name``) so kinetic's own tools find these
jobs; the task-instance labels are kinetic-airflow's, as on Jobs.

Two choices differ from kinetic on purpose:

* ``restartPolicy: None`` instead of ``RecreateGroupOnPodRestart``. LWS pods must have
  ``restartPolicy: Always``, so a host whose process ends is restarted whatever the group
  policy says. With ``RecreateGroupOnPodRestart`` every such restart deletes and recreates
  the whole group: the pods (and their logs) of the failing host go, and every host runs
  the function again in the same attempt, silently. With ``None`` only the ended
  container restarts in place; the runner sees it already ran in this attempt and waits
  without running anything, the pods and their ``previous`` logs stay, and the watcher
  reports the failed host and deletes the group. A lost or preempted host is a new
  attempt (a new LeaderWorkerSet), decided by the watcher, never by LWS.
* No ``MEGASCALE_*`` variables. They configure multislice (several slices over DCN):
  ``MEGASCALE_NUM_SLICES`` counts slices, not hosts (kinetic sets it to the host count), and
  a coordinator address makes libtpu set up a multislice job. One LeaderWorkerSet group is
  one slice; its hosts find each other through ``TPU_WORKER_HOSTNAMES`` and
  ``TPU_WORKER_ID``, which the LWS pod webhook sets on TPU containers (kinetic sets
  ``TPU_WORKER_ID`` itself, which stops the webhook from adding the hostnames).
"""

from __future__ import annotations

import hashlib
from typing import Any

from kinetic_airflow.accelerators import AcceleratorSpec
from kinetic_airflow.backends.gke.manifest import object_metadata, pod_template
from kinetic_airflow.capacity import Placement
from kinetic_airflow.job.layout import LWS_PREFIX

__all__ = ["LWS_GROUP", "LWS_PLURAL", "build_lws_manifest", "coordinator_port", "lws_name"]

LWS_GROUP = "leaderworkerset.x-k8s.io"
LWS_PLURAL = "leaderworkersets"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
# Place a group's pods on one node pool: on GKE a multi-host TPU node pool is one slice.
EXCLUSIVE_TOPOLOGY = {"leaderworkerset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}


def lws_name(job_id: str) -> str:
    """kinetic's name; ``layout.derived_names`` holds it (and its StatefulSets) to 63 characters."""
    return f"{LWS_PREFIX}{job_id}"


def coordinator_port(job_id: str) -> int:
    """The JAX coordinator's port on the leader, fixed per attempt.

    Any port works on a cluster (every pod has its own address); deriving it from the job
    id keeps two attempts (or two jobs) on one machine — the emulator — from colliding, and
    the range stays below Linux's ephemeral ports (32768 and up), which any local client or
    server bound to port 0 may hold.
    """
    return 12000 + int(hashlib.sha256(job_id.encode()).hexdigest()[:8], 16) % 20000


def multi_host_env(job_id: str, hosts: int) -> list[dict[str, Any]]:
    """What every host needs for multi-controller JAX, from the LWS variables."""
    coordinator = f"$(LWS_LEADER_ADDRESS):{coordinator_port(job_id)}"
    return [
        {"name": "KINETIC_NUM_HOSTS", "value": str(hosts)},
        {"name": "KINETIC_HOST_INDEX", "value": "$(LWS_WORKER_INDEX)"},
        {"name": "KINETIC_COORDINATOR_ADDRESS", "value": coordinator},
        # jax.distributed.initialize() takes the coordinator from here; the process count and
        # index it finds itself on a TPU slice (TPU_WORKER_HOSTNAMES / TPU_WORKER_ID)
        {"name": "JAX_COORDINATOR_ADDRESS", "value": coordinator},
        {
            "name": "KINETIC_POD_UID",
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}},
        },
    ]


def build_lws_manifest(
    *,
    name: str,
    namespace: str,
    labels: dict[str, str],
    annotations: dict[str, str],
    spec: AcceleratorSpec,
    api_version: str,
    placement: Placement | None = None,
    **pod: Any,
) -> dict[str, Any]:
    """``pod``: the rest of ``pod_template``'s arguments (image, job_uri, env, extras ...)."""
    job_id = labels["job-id"]
    template = pod_template(
        labels={**labels, "app": "kinetic-pathways", "job-name": name},
        annotations=annotations,
        spec=spec,
        job_id=job_id,
        extra_env=multi_host_env(job_id, spec.hosts),
        restart_policy="Always",  # the only policy LWS (a StatefulSet) accepts; see above
        placement=placement,
        **pod,
    )
    return {
        "apiVersion": f"{LWS_GROUP}/{api_version}",
        "kind": "LeaderWorkerSet",
        "metadata": object_metadata(
            name,
            namespace,
            {**labels, "app": "kinetic-pathways"},
            {**annotations, **EXCLUSIVE_TOPOLOGY},
            placement,
        ),
        "spec": {
            "replicas": 1,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": spec.hosts,
                "restartPolicy": "None",
                "workerTemplate": template,
            },
        },
    }
