"""GKE Job manifests, field by field against ACCELERATORS.md, and schema-valid (strict)."""

from __future__ import annotations

import kubernetes_validate
import pytest

from kinetic_airflow.accelerators import parse_accelerator
from kinetic_airflow.backends.gke.manifest import build_job_manifest
from kinetic_airflow.job.layout import JobIdentity

TPU = "cloud.google.com/gke-tpu-accelerator"
TOPO = "cloud.google.com/gke-tpu-topology"
GPU = "cloud.google.com/gke-accelerator"
SPOT = "cloud.google.com/gke-spot"

CASES = [
    # accelerator, node selectors, extended resources (limits == requests)
    ("tpu-v5litepod-1", {TPU: "tpu-v5-lite-podslice", TOPO: "1x1"}, {"google.com/tpu": "1"}),
    ("tpu-v5e-4", {TPU: "tpu-v5-lite-podslice", TOPO: "2x2"}, {"google.com/tpu": "4"}),
    ("tpu-v5litepod-2x4", {TPU: "tpu-v5-lite-podslice", TOPO: "2x4"}, {"google.com/tpu": "8"}),
    ("tpu-v6e-1", {TPU: "tpu-v6e-slice", TOPO: "1x1"}, {"google.com/tpu": "1"}),
    ("tpu-v6e-4", {TPU: "tpu-v6e-slice", TOPO: "2x2"}, {"google.com/tpu": "4"}),
    # One 8-chip ct6e-standard-8t host. Plain tpu-v6e-8 is two 4-chip hosts now, as in
    # keras-kinetic (issue 8), so it is not a single-pod Job; see the multi-host test below.
    ("tpu-v6e-8t", {TPU: "tpu-v6e-slice", TOPO: "2x4"}, {"google.com/tpu": "8"}),
    ("tpu-v5p-2x2x1", {TPU: "tpu-v5p-slice", TOPO: "2x2x1"}, {"google.com/tpu": "4"}),
    ("tpu-v4-4", {TPU: "tpu-v4-podslice", TOPO: "2x2x1"}, {"google.com/tpu": "4"}),
    ("tpu-v3-4", {TPU: "tpu-v3-device", TOPO: "2x2"}, {"google.com/tpu": "4"}),
    ("tpu7x-4", {TPU: "tpu7x", TOPO: "2x2x1"}, {"google.com/tpu": "4"}),
    ("gpu-l4", {GPU: "nvidia-l4"}, {"nvidia.com/gpu": "1"}),
    ("gpu-t4x2", {GPU: "nvidia-tesla-t4"}, {"nvidia.com/gpu": "2"}),
    ("gpu-a100x4", {GPU: "nvidia-tesla-a100"}, {"nvidia.com/gpu": "4"}),
    ("a100-80gbx2", {GPU: "nvidia-a100-80gb"}, {"nvidia.com/gpu": "2"}),
    ("gpu-h100x8", {GPU: "nvidia-h100-80gb"}, {"nvidia.com/gpu": "8"}),
    ("gpu-h200x8", {GPU: "nvidia-h200-141gb"}, {"nvidia.com/gpu": "8"}),
    ("tpu-v6e-8t:spot", {TPU: "tpu-v6e-slice", TOPO: "2x4", SPOT: "true"}, {"google.com/tpu": "8"}),
    ("gpu-l4:spot", {GPU: "nvidia-l4", SPOT: "true"}, {"nvidia.com/gpu": "1"}),
]


def _manifest(accelerator: str, **overrides):
    identity = JobIdentity("nightly", "scheduled__2026-01-01T00:00:00+00:00", "train", 2, 1)
    kwargs = {
        "name": f"kinetic-{identity.job_id}",
        "namespace": "ml",
        "labels": identity.labels(),
        "annotations": {"kinetic.airflow/task-instance": identity.ti_key},
        "spec": parse_accelerator(accelerator),
        "image": "us-docker.pkg.dev/p/r/runner:tpu",
        "job_uri": "gs://b/kinetic/jobs/" + identity.job_id,
        "active_deadline_seconds": 3600,
    }
    kwargs.update(overrides)
    return build_job_manifest(**kwargs), identity


@pytest.mark.parametrize(("accelerator", "selectors", "resources"), CASES)
def test_accelerator_fields(accelerator, selectors, resources):
    manifest, _ = _manifest(accelerator)
    kubernetes_validate.validate(manifest, "1.33", strict=True)
    pod = manifest["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["nodeSelector"] == selectors
    assert container["resources"] == {"limits": resources, "requests": resources}
    resource = next(iter(resources))
    tolerations = [{"key": resource, "operator": "Exists", "effect": "NoSchedule"}]
    if SPOT in selectors:
        tolerations.append({"key": SPOT, "operator": "Equal", "value": "true", "effect": "NoSchedule"})
    assert pod["tolerations"] == tolerations


def test_common_job_fields():
    manifest, identity = _manifest("cpu")
    kubernetes_validate.validate(manifest, "1.33", strict=True)
    spec = manifest["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert (
        manifest["metadata"]["name"] == f"kinetic-{identity.job_id}"
        and len(manifest["metadata"]["name"]) <= 63
    )
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 3600
    assert spec["ttlSecondsAfterFinished"] >= 3600
    assert pod["restartPolicy"] == "Never" and pod["serviceAccountName"] == "kinetic"
    assert "nodeSelector" not in pod and "tolerations" not in pod
    assert container["resources"] == {"requests": {"cpu": "1", "memory": "4Gi"}}
    assert container["name"] == "kinetic-worker"
    assert container["command"][1:] == [
        "-m",
        "kinetic_airflow.runner",
        "--job-uri",
        f"gs://b/kinetic/jobs/{identity.job_id}",
    ]
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    labels = spec["template"]["metadata"]["labels"]
    assert labels["app"] == "kinetic" and labels["job-id"] == identity.job_id
    assert labels["kinetic.airflow/dag-id"] == "nightly" and labels["kinetic.airflow/task-id"] == "train"
    assert labels["kinetic.airflow/map-index"] == "2" and labels["kinetic.airflow/try-number"] == "1"
    assert labels["kinetic.airflow/attempt"] == "1"


@pytest.mark.parametrize(("accelerator", "hosts"), [("tpu-v6e-16", 4), ("tpu-v6e-8", 2)])
def test_multi_host_tpu_needs_pathways(accelerator, hosts):
    from kinetic_airflow import KineticRunOperator

    with pytest.raises(ValueError, match=rf"spans {hosts} hosts.*use backend='pathways' or backend='auto'"):
        KineticRunOperator(task_id="t", python_callable=print, backend="gke", accelerator=accelerator)
