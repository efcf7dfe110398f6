"""The JobSet of one multislice attempt: N TPU slices, one Indexed Job per slice, one pod per host.

Multislice training (several identical slices joined over the data-center network) runs on
GKE as a JobSet (jobset.x-k8s.io/v1alpha2) with one replicated job whose replicas are the
slices, and ``alpha.jobset.sigs.k8s.io/exclusive-topology: cloud.google.com/gke-nodepool`` so
that every child Job (slice) gets a node pool of its own: on GKE a multi-host TPU node pool is
one slice. Google's multislice guide and xpk's templates use this shape.

The pods are the ones a LeaderWorkerSet gets (``manifest.pod_template``); what differs:

* ``restartPolicy: Never`` and ``backoffLimit: 0`` on each Job, ``failurePolicy.maxRestarts:
  0`` on the JobSet: our attempt model decides restarts. A failed host fails the attempt; a
  preempted or lost slice is a new attempt (a new JobSet) of the whole group, as a preempted
  host of a LeaderWorkerSet is (``pathways``). JobSet's own restart would re-run every slice
  inside the same attempt, silently.
* ``MEGASCALE_*``: libtpu's multislice settings, set explicitly (GKE's webhook may inject
  them, ACCELERATORS.md section 4 is unsure): the coordinator is slice 0 host 0 through the
  JobSet's headless Service, the slice id comes from the ``jobset.sigs.k8s.io/job-index``
  label by ``fieldRef``.
* ``KINETIC_SLICE_INDEX`` / ``KINETIC_HOSTS_PER_SLICE``: the runner makes the global host
  index ``slice * hosts_per_slice + JOB_COMPLETION_INDEX`` from them (``job.multihost``), so
  result records, heartbeats and ``initialize_jax()`` see one group of ``slices * hosts``.

Names: ``kinetic-ms-<job_id>`` (46 characters at most); its child Jobs ``<jobset>-s-<slice>``,
their pods ``<job>-<host>-xxxxx`` and hostnames ``<job>-<host>`` stay within 63 characters
(``check_jobset_names``; the JobSet webhook refuses longer ones, the emulator's too).
"""

from __future__ import annotations

from typing import Any

from kinetic_airflow.accelerators import AcceleratorSpec
from kinetic_airflow.backends.gke.lws_manifest import coordinator_port
from kinetic_airflow.backends.gke.manifest import object_metadata, pod_template
from kinetic_airflow.capacity import Placement
from kinetic_airflow.job.layout import LABEL_VALUE_MAX, MAX_JOB_ID, NameTooLongError

__all__ = [
    "JOBSET_API_VERSION",
    "JOBSET_GROUP",
    "JOBSET_NAME_LABEL",
    "JOBSET_PLURAL",
    "JOB_INDEX_LABEL",
    "MEGASCALE_PORT",
    "MULTISLICE_APP",
    "REPLICATED_JOB",
    "build_jobset_manifest",
    "check_jobset_names",
    "jobset_name",
]

JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_API_VERSION = "v1alpha2"
JOBSET_PLURAL = "jobsets"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
MULTISLICE_PREFIX = "kinetic-ms-"
MULTISLICE_APP = "kinetic-multislice"
REPLICATED_JOB = "s"  # short: every child Job and pod name carries it
MEGASCALE_PORT = 8081  # libtpu's default (KubeRay's TPU webhook sets the same)
EXCLUSIVE_TOPOLOGY = {"alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}


def jobset_name(job_id: str) -> str:
    return f"{MULTISLICE_PREFIX}{job_id}"


def _child_job(job_id: str, slice_index: int) -> str:
    return f"{jobset_name(job_id)}-{REPLICATED_JOB}-{slice_index}"


def derived_jobset_names(job_id: str, slices: int, hosts: int) -> dict[str, str]:
    """The longest names the JobSet and Job controllers derive (the last slice's last host)."""
    job = _child_job(job_id, slices - 1)
    return {
        "JobSet name / headless Service / jobset-name label": jobset_name(job_id),
        "child Job name / job-name label": job,
        "pod hostname": f"{job}-{hosts - 1}",
        "pod name (generateName + 5)": f"{job}-{hosts - 1}-xxxxx",
    }


def check_jobset_names(job_id: str, slices: int, hosts: int) -> None:
    """Raise ``NameTooLongError`` naming each derived name over 63 characters."""
    too_long = {
        what: name
        for what, name in derived_jobset_names(job_id, slices, hosts).items()
        if len(name) > LABEL_VALUE_MAX
    }
    if too_long:
        listed = "; ".join(f"{what} {name!r} ({len(name)} characters)" for what, name in too_long.items())
        raise NameTooLongError(
            f"job id {job_id!r} with {slices} slices of {hosts} hosts gives Kubernetes names over "
            f"{LABEL_VALUE_MAX} characters: {listed}. Job ids are at most {MAX_JOB_ID} characters."
        )


def _field(path: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}


def multislice_env(jobset: str, job_id: str, slices: int, hosts: int) -> list[dict[str, Any]]:
    """What every host needs for multislice JAX: kinetic's group and libtpu's MEGASCALE_*."""
    leader = f"{jobset}-{REPLICATED_JOB}-0-0.{jobset}"  # slice 0 host 0, via the headless Service
    coordinator = f"{leader}:{coordinator_port(job_id)}"
    return [
        {"name": "KINETIC_NUM_HOSTS", "value": str(slices * hosts)},
        {"name": "KINETIC_NUM_SLICES", "value": str(slices)},
        {"name": "KINETIC_HOSTS_PER_SLICE", "value": str(hosts)},
        {"name": "KINETIC_SLICE_INDEX", **_field(f"metadata.labels['{JOB_INDEX_LABEL}']")},
        {"name": "KINETIC_COORDINATOR_ADDRESS", "value": coordinator},
        {"name": "JAX_COORDINATOR_ADDRESS", "value": coordinator},
        {"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": leader},
        {"name": "MEGASCALE_NUM_SLICES", "value": str(slices)},
        {"name": "MEGASCALE_SLICE_ID", **_field(f"metadata.labels['{JOB_INDEX_LABEL}']")},
        {"name": "MEGASCALE_PORT", "value": str(MEGASCALE_PORT)},
        {"name": "KINETIC_POD_UID", **_field("metadata.uid")},
    ]


def build_jobset_manifest(
    *,
    name: str,
    namespace: str,
    labels: dict[str, str],
    annotations: dict[str, str],
    spec: AcceleratorSpec,
    slices: int,
    placement: Placement | None = None,
    api_version: str = JOBSET_API_VERSION,
    **pod: Any,
) -> dict[str, Any]:
    """``pod``: the rest of ``pod_template``'s arguments (image, job_uri, env, extras ...);
    ``api_version``: the JobSet version the cluster serves (discovery.py)."""
    job_id = labels["job-id"]
    hosts = spec.hosts
    ours = {**labels, "app": MULTISLICE_APP}
    template = pod_template(
        labels=ours,
        annotations=annotations,
        spec=spec,
        job_id=job_id,
        extra_env=multislice_env(name, job_id, slices, hosts),
        restart_policy="Never",
        placement=placement,
        **pod,
    )
    job_spec = {
        "completionMode": "Indexed",
        "completions": hosts,
        "parallelism": hosts,
        "backoffLimit": 0,
        "template": template,
    }
    return {
        "apiVersion": f"{JOBSET_GROUP}/{api_version}",
        "kind": "JobSet",
        "metadata": object_metadata(name, namespace, ours, {**annotations, **EXCLUSIVE_TOPOLOGY}, placement),
        "spec": {
            "failurePolicy": {"maxRestarts": 0},
            "replicatedJobs": [
                {
                    "name": REPLICATED_JOB,
                    "replicas": slices,
                    "template": {
                        "metadata": {"labels": ours, "annotations": dict(EXCLUSIVE_TOPOLOGY)},
                        "spec": job_spec,
                    },
                }
            ],
        },
    }
