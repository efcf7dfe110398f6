"""pod_override=: the merge rules field by field, removal with "#key", named-list merge, refusals
naming the field, [kinetic] pod_override; and end to end on the cluster emulator (strict schema
check, a Secret-backed env var reaching the function, LeaderWorkerSet pods)."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import sys

import cloudpickle
import pytest
from helpers import on_storage, ti_states, xcom
from ops_support import cluster, gke_env, k8s

from kinetic_airflow.accelerators import parse_accelerator
from kinetic_airflow.backends.gke.lws_manifest import build_lws_manifest
from kinetic_airflow.backends.gke.manifest import build_job_manifest
from kinetic_airflow.backends.gke.pod_override import (
    PodOverrideError,
    apply_to_manifest,
    combined_override,
    normalize_pod_override,
)

__all__ = ["cluster", "gke_env"]  # fixtures

cloudpickle.register_pickle_by_value(sys.modules[__name__])

LABELS = {"app": "kinetic", "job-id": "j-1", "kinetic.airflow/ti": "abc"}
SECRET = "s3cr3t-db-password"


def job(accelerator: str = "cpu", override=None) -> dict:
    manifest = build_job_manifest(
        name="kinetic-j-1",
        namespace="default",
        labels=dict(LABELS),
        annotations={"kinetic.airflow/job-uri": "gs://b/jobs/j-1"},
        spec=parse_accelerator(accelerator),
        image="runner:1",
        job_uri="gs://b/jobs/j-1",
    )
    return apply_to_manifest(manifest, normalize_pod_override(override))


def pod(manifest: dict) -> dict:
    return manifest["spec"]["template"]


def worker(manifest: dict) -> dict:
    return next(c for c in pod(manifest)["spec"]["containers"] if c["name"] == "kinetic-worker")


def env(manifest: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in worker(manifest)["env"]}


def refused(override, accelerator: str = "cpu") -> str:
    with pytest.raises(PodOverrideError) as info:
        job(accelerator, override)
    return str(info.value)


# The fields cncf-kubernetes users expect ------------------------------------------------------
def test_resources_merge_into_the_generated_ones():
    base = job("gpu-l4")
    assert worker(base)["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    resources = {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"cpu": "8", "memory": "32Gi"}}
    merged = job("gpu-l4", worker_with(resources=resources))
    assert worker(merged)["resources"] == {
        "limits": {"nvidia.com/gpu": "1", "cpu": "8", "memory": "32Gi"},
        "requests": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "16Gi"},
    }
    cpu = job(
        "cpu", {"spec": {"containers": [{"name": "base", "resources": {"requests": {"memory": "16Gi"}}}]}}
    )
    assert worker(cpu)["resources"]["requests"] == {"cpu": "1", "memory": "16Gi"}  # "base" = kinetic's


def test_labels_annotations_tolerations_affinity_pull_secrets():
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a", "b"]}]}]}}}  # fmt: skip
    toleration = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    merged = job(
        "tpu-v6e-8t",
        {
            "metadata": {"labels": {"team": "vision"}, "annotations": {"example.com/owner": "ml"}},
            "spec": {
                "tolerations": [toleration],
                "affinity": affinity,
                "imagePullSecrets": [{"name": "regcred"}],
            },
        },
    )
    meta, spec = pod(merged)["metadata"], pod(merged)["spec"]
    assert meta["labels"] == {**LABELS, "team": "vision"}
    assert meta["annotations"]["example.com/owner"] == "ml"
    assert meta["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"  # kept
    assert spec["tolerations"][-1] == toleration
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["affinity"] == affinity and spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "2x4"  # untouched


def test_volumes_pvcs_and_secret_env_merge_by_name():
    merged = job(
        "cpu",
        {
            "spec": {
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "imagenet", "readOnly": True}},
                    {"name": "scratch", "emptyDir": {"sizeLimit": "10Gi"}},
                ],
                "containers": [
                    {
                        "name": "kinetic-worker",
                        "volumeMounts": [
                            {"name": "data", "mountPath": "/data"},
                            {"name": "scratch", "mountPath": "/s"},
                        ],
                        "env": [
                            {
                                "name": "DB_PASSWORD",
                                "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}},
                            },
                            {
                                "name": "KERAS_BACKEND",
                                "value": "torch",
                            },  # an existing name: replaced in place
                        ],
                    }
                ],
            }
        },
    )
    spec = pod(merged)["spec"]
    assert [v["name"] for v in spec["volumes"]] == ["data", "scratch"]
    assert worker(merged)["volumeMounts"][0] == {"name": "data", "mountPath": "/data"}
    values = env(merged)
    assert values["DB_PASSWORD"] == {"secretKeyRef": {"name": "db", "key": "pw"}}
    assert values["KERAS_BACKEND"] == "torch" and values["KINETIC_JOB_ID"] == "j-1"
    names = [e["name"] for e in worker(merged)["env"]]
    assert names.count("KERAS_BACKEND") == 1 and names[-1] == "DB_PASSWORD"
    assert worker(merged)["command"][-2:] == ["--job-uri", "gs://b/jobs/j-1"]  # the runner, untouched


def test_a_sidecar_container_is_added_by_name():
    sidecar = {"name": "proxy", "image": "gcr.io/cloud-sql-connectors/cloud-sql-proxy:2", "args": ["db"]}
    merged = job("cpu", {"spec": {"containers": [sidecar]}})
    assert [c["name"] for c in pod(merged)["spec"]["containers"]] == ["kinetic-worker", "proxy"]


def test_hash_key_removes_generated_defaults():
    merged = job(
        "tpu-v6e-8t",
        {
            "metadata": {"annotations": {"#cluster-autoscaler.kubernetes.io/safe-to-evict": None}},
            "spec": {
                "#nodeSelector": None,
                "nodeSelector": {"pool": "mine"},  # removed, then set: replaced
                "#tolerations": None,
                "tolerations": [{"key": "pool", "operator": "Exists"}],
                "containers": [{"name": "kinetic-worker", "env": [{"name": "#JAX_PLATFORMS"}]}],
            },
        },
    )
    meta, spec = pod(merged)["metadata"], pod(merged)["spec"]
    assert "cluster-autoscaler.kubernetes.io/safe-to-evict" not in meta["annotations"]
    assert spec["nodeSelector"] == {"pool": "mine"}
    assert spec["tolerations"] == [{"key": "pool", "operator": "Exists"}]
    assert "JAX_PLATFORMS" not in env(merged) and "KERAS_BACKEND" in env(merged)
    removed = job("cpu", {"spec": {"#serviceAccountName": None}})
    assert "serviceAccountName" not in pod(removed)["spec"]


def test_a_v1pod_works_like_a_dict():
    from kubernetes import client as k

    v1pod = k.V1Pod(
        metadata=k.V1ObjectMeta(labels={"team": "nlp"}),
        spec=k.V1PodSpec(
            containers=[
                k.V1Container(
                    name="kinetic-worker",
                    resources=k.V1ResourceRequirements(requests={"memory": "8Gi"}),
                    env=[
                        k.V1EnvVar(
                            name="TOKEN",
                            value_from=k.V1EnvVarSource(
                                secret_key_ref=k.V1SecretKeySelector(name="hf", key="token")
                            ),
                        )
                    ],
                )
            ],
            image_pull_secrets=[k.V1LocalObjectReference(name="regcred")],
        ),
    )
    merged = job("cpu", v1pod)
    assert pod(merged)["metadata"]["labels"]["team"] == "nlp"
    assert pod(merged)["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert worker(merged)["resources"]["requests"]["memory"] == "8Gi"
    assert env(merged)["TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}


def test_leaderworkerset_pods_get_the_override():
    spec = parse_accelerator("tpu-v6e-16")
    lws = build_lws_manifest(
        name="keras-pathways-j-1", namespace="default", labels=dict(LABELS), annotations={}, spec=spec,
        image="runner:1", job_uri="gs://b/jobs/j-1", api_version="v1",
    )  # fmt: skip
    override = normalize_pod_override(
        {"metadata": {"labels": {"team": "pathways"}}, "spec": {"imagePullSecrets": [{"name": "regcred"}]}}
    )
    merged = apply_to_manifest(copy.deepcopy(lws), override)
    template = merged["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert template["metadata"]["labels"]["team"] == "pathways"
    assert template["metadata"]["labels"]["app"] == "kinetic-pathways"
    assert template["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert template["spec"]["restartPolicy"] == "Always"
    assert "restartPolicy: must stay" not in json.dumps(merged)


def test_deployment_default_then_the_task_override(monkeypatch):
    default = {"metadata": {"labels": {"org": "ml"}}, "spec": {"imagePullSecrets": [{"name": "regcred"}]}}
    task = {"metadata": {"labels": {"team": "vision"}}, "spec": {"#imagePullSecrets": None}}
    both = combined_override(json.dumps(default), task)
    merged = job("cpu", both)
    assert (
        pod(merged)["metadata"]["labels"]["org"] == "ml"
        and pod(merged)["metadata"]["labels"]["team"] == "vision"
    )
    assert "imagePullSecrets" not in pod(merged)["spec"]  # the task removed what the default added
    monkeypatch.setenv("AIRFLOW__KINETIC__POD_OVERRIDE", "{not json")
    from kinetic_airflow.operators import KineticRunOperator

    with pytest.raises(PodOverrideError, match=r"\[kinetic\] pod_override is not valid JSON"):
        KineticRunOperator(
            task_id="t", python_callable=print, pod_override={"metadata": {"labels": {"a": "b"}}}
        )


# Refusals, each naming the field and the fix --------------------------------------------------
def worker_with(**fields) -> dict:
    """An override of kinetic's container only."""
    return {"spec": {"containers": [{"name": "kinetic-worker", **fields}]}}


def requests(**values) -> dict:
    return worker_with(resources={"requests": values})


REFUSALS = [
    (
        worker_with(resoures={}),
        "spec.containers[kinetic-worker].resoures is not a field of Container; did you mean 'resources'?",
    ),
    (
        {"spec": {"image_pull_secrets": [{"name": "x"}]}},
        "spec.image_pull_secrets is not a field of PodSpec; Kubernetes JSON writes it 'imagePullSecrets'",
    ),
    (requests(memory="16 GB"), "resources.requests.memory: '16 GB' is not a Kubernetes quantity"),
    (
        requests(memory=16),
        "spec.containers[kinetic-worker].resources.requests.memory must be a string (quote it",
    ),
    (
        worker_with(resources={"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}),
        "resources.requests.cpu (4) exceeds its limit (2)",
    ),
    (
        worker_with(volumeMounts=[{"name": "d", "mountPath": "/d"}]),
        "volumeMounts[d]: there is no volume of that name in spec.volumes",
    ),
    ({"spec": {"volumes": [{"name": "d"}]}}, "spec.volumes[d] needs exactly one source"),
    (
        {"spec": {"containers": [{"name": "#kinetic-worker"}]}},
        "kinetic's container 'kinetic-worker' was removed",
    ),
    (worker_with(command=["bash"]), "spec.containers[kinetic-worker].command cannot be overridden"),
    (worker_with(image="other:1"), "use container_image= or [kinetic] container_image"),
    ({"spec": {"restartPolicy": "OnFailure"}}, "spec.restartPolicy must stay 'Never'"),
    ({"metadata": {"labels": {"app": "mine"}}}, "metadata.labels.app is kinetic's own label"),
    ({"metadata": {"labels": {"team": "a b"}}}, "metadata.labels.team: 'a b' is not a valid label value"),
    (
        worker_with(env=[{"name": "API_TOKEN", "value": "abc"}]),
        "env API_TOKEN has a literal value, but it looks like a credential",
    ),
    (
        worker_with(env=[{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s"}}}]),
        "env[X].valueFrom.secretKeyRef needs a 'name' and a 'key'",
    ),
    ({"spec": {"containers": [{"image": "x"}]}}, "spec.containers[0] needs a 'name'"),
    (
        {"spec": {"tolerations": [{"key": "k", "operator": "Is"}]}},
        "operator 'Is' must be 'Equal' or 'Exists'",
    ),
    ({"kind": "Job", "spec": {}}, "kind 'Job' is not a Pod"),
    ({"template": {}}, "'template' is not part of a pod"),
    ("not a pod", "pod_override is not valid JSON"),
    (["a list"], "pod_override must be a dict in Kubernetes' JSON shape"),
]


@pytest.mark.parametrize(("override", "message"), REFUSALS)
def test_invalid_overrides_are_refused_naming_the_field(override, message):
    assert message in refused(override)


def test_refused_at_dag_import():
    """The operator (and so @task.kinetic) refuses it when the DAG file is parsed."""
    from kinetic_airflow.operators import KineticRunOperator

    with pytest.raises(
        PodOverrideError, match=r"resources\.limits\.memory: 'lots' is not a Kubernetes quantity"
    ):
        KineticRunOperator(
            task_id="t",
            python_callable=print,
            pod_override=worker_with(resources={"limits": {"memory": "lots"}}),
        )


# On the emulator ------------------------------------------------------------------------------
def _secret(emulator) -> None:
    from kubernetes.client import V1ObjectMeta, V1Secret
    from kubernetes.client.exceptions import ApiException

    _, core = k8s(emulator)
    body = V1Secret(
        metadata=V1ObjectMeta(name="db-creds"), data={"password": base64.b64encode(SECRET.encode()).decode()}
    )
    try:
        core.create_namespaced_secret("default", body)
    except ApiException as exc:
        if exc.status != 409:
            raise


@on_storage("gs")  # the override is the pod's
def test_override_on_the_emulator_secret_env_reaches_the_function(gke_env, base_uri):
    emulator, _, _ = gke_env
    _secret(emulator)
    import kn_ops

    dr = kn_ops.DAGS["kn_ops_override_gke"].test()
    assert ti_states(dr) == {"with_secret": "success", "without_defaults": "success"}
    assert xcom(dr, "with_secret") == {
        "secret_sha256": hashlib.sha256(SECRET.encode()).hexdigest(),
        "mode": "override",
    }
    assert xcom(dr, "without_defaults") == {"jax_platforms": None, "keras": "jax"}

    batch, _ = k8s(emulator)
    import hashlib as h

    run = h.sha256(dr.run_id.encode()).hexdigest()[:16]
    (made,) = batch.list_namespaced_job(
        "default", label_selector=f"kinetic.airflow/task-id=with-secret,kinetic.airflow/run-id={run}"
    ).items
    template = made.spec.template
    assert template.metadata.labels["team"] == "vision" and template.metadata.labels["app"] == "kinetic"
    assert template.metadata.annotations["example.com/owner"] == "ml-platform"
    container = template.spec.containers[0]
    assert container.resources.requests == {"cpu": "500m", "memory": "2Gi"}
    assert container.resources.limits == {"cpu": "2", "memory": "8Gi"}
    assert (
        container.volume_mounts[0].mount_path == "/scratch" and template.spec.volumes[0].empty_dir is not None
    )
    assert template.spec.image_pull_secrets[0].name == "regcred"
    assert template.spec.tolerations[-1].key == "dedicated"
    terms = template.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    assert terms.node_selector_terms[0].match_expressions[0].key == "kubernetes.io/os"
    (bare,) = batch.list_namespaced_job(
        "default", label_selector=f"kinetic.airflow/task-id=without-defaults,kinetic.airflow/run-id={run}"
    ).items
    assert "cluster-autoscaler.kubernetes.io/safe-to-evict" not in (
        bare.spec.template.metadata.annotations or {}
    )

    # the secret itself is nowhere in what Airflow stores: the record has only the reference
    from kinetic_airflow.job.storage import open_storage

    job_id = made.metadata.labels["job-id"]
    record = open_storage(base_uri).read_text(f"{base_uri}/jobs/{job_id}/job.json")
    assert '"secretKeyRef": {"key": "password", "name": "db-creds"}' in record and SECRET not in record


@on_storage("gs")
def test_override_on_leaderworkerset_hosts(gke_env, base_uri):
    import kn_ops

    dr = kn_ops.DAGS["kn_ops_override_pathways"].test()
    assert ti_states(dr) == {"host_mode": "success"}
    assert xcom(dr, "host_mode") == {"mode": "lws", "host": "0"}
