"""Issue 38 item 7: the emulator's default node pools carry GKE's real node labels for every
accelerator, machine type and TPU topology of the product's catalog, and ``doctor`` passes on
the emulator started as the README says (its defaults) for every accelerator kind.

The emulator owns its pool list (``cluster_emulator/gke_node_pools.json``) and imports nothing
of the product; this test is the product's side of that contract.
"""

from __future__ import annotations

import json
import re
import sys

import pytest
from cluster_emulator import ClusterEmulator
from cluster_emulator.nodes import default_node_pools

from kinetic_airflow.accelerators import (
    GPU_TYPES,
    LABEL_ACCELERATOR_COUNT,
    LABEL_GPU_ACCELERATOR,
    LABEL_SPOT,
    LABEL_TPU_ACCELERATOR,
    LABEL_TPU_TOPOLOGY,
    TPU_GENERATIONS,
    parse_accelerator,
)
from kinetic_airflow.backends.gke.doctor import OK, run_doctor

INSTANCE_TYPE = "node.kubernetes.io/instance-type"
HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _catalog_tpu_slices() -> set[tuple[str, str, str, str]]:
    """(label, topology, chips per node, machine type) of every slice the parser accepts: the
    listed shapes, and for 3D generations every AxBxC of multiples of 4 up to the GKE maximum."""
    out = set()
    for gen in TPU_GENERATIONS.values():
        for shape in (*gen.shapes, *gen.one_host_shapes):
            out.add((shape.gke_label, shape.topology, str(shape.chips_per_host), shape.machine_type))
        if gen.max_dims:
            top_a, top_b, top_c = gen.max_dims
            for a in range(4, top_a + 1, 4):
                for b in range(a, top_b + 1, 4):
                    for c in range(b, top_c + 1, 4):
                        if a * b * c <= 64:
                            continue
                        name = gen.name if gen.name.startswith("tpu") else f"tpu-{gen.name}"
                        spec = parse_accelerator(f"{name}-{a}x{b}x{c}")  # the parser agrees it exists
                        out.add((spec.gke_label, spec.topology, str(spec.chips_per_host), spec.machine_type))
    return out


def _pool_keys(spot: bool) -> tuple[set[tuple[str, ...]], set[tuple[str, ...]]]:
    tpus, gpus = set(), set()
    for pool in default_node_pools():
        labels = pool.labels
        assert "*" not in labels.values(), f"{pool.name} has a wildcard label: {labels}"
        if (labels.get(LABEL_SPOT) == "true") != spot:
            continue
        if LABEL_TPU_ACCELERATOR in labels:
            tpus.add(
                (
                    labels[LABEL_TPU_ACCELERATOR],
                    labels[LABEL_TPU_TOPOLOGY],
                    labels[LABEL_ACCELERATOR_COUNT],
                    labels[INSTANCE_TYPE],
                )
            )
        elif LABEL_GPU_ACCELERATOR in labels:
            gpus.add((labels[LABEL_GPU_ACCELERATOR], labels[LABEL_ACCELERATOR_COUNT], labels[INSTANCE_TYPE]))
    return tpus, gpus


@pytest.mark.parametrize("spot", [False, True], ids=["on-demand", "spot"])
def test_the_emulator_pool_file_covers_the_catalog(spot):
    tpus, gpus = _pool_keys(spot)
    assert _catalog_tpu_slices() <= tpus, sorted(_catalog_tpu_slices() - tpus)[:10]
    wanted_gpus = {
        (gpu.gke_label, str(count), machine)
        for gpu in GPU_TYPES.values()
        for count, machine in gpu.machine_types
    }
    assert wanted_gpus <= gpus, sorted(wanted_gpus - gpus)


def test_default_pool_names_make_distinct_valid_node_names():
    k8s = ClusterEmulator()
    try:
        k8s.start()
        names = [n["metadata"]["name"] for n in k8s.list_objects("nodes")]
    finally:
        k8s.stop()
    assert len(names) == len(set(names)) == len(default_node_pools())
    assert all(len(n) <= 63 for n in names)


def _every_accelerator_kind() -> list[str]:
    """Each TPU generation at its smallest and largest listed shape, its one-host -8t form and
    its largest 3D slice; each GPU type at its largest count; CPU; and Spot forms. (Every
    slice's pool is checked by the pool-file test above; this asks doctor about each kind.)"""
    out = ["cpu", "cpu:spot"]
    for gen in TPU_GENERATIONS.values():
        name = gen.name if gen.name.startswith("tpu") else f"tpu-{gen.name}"
        out += [f"{name}-{gen.shapes[0].topology}", f"{name}-{gen.shapes[-1].topology}"]
        out += [f"{name}-{shape.chips_per_host}t" for shape in gen.one_host_shapes]
        if gen.max_dims:
            out.append(f"{name}-{'x'.join(map(str, gen.max_dims))}")
        out.append(f"{name}-{gen.shapes[0].topology}:spot")
    for gpu in GPU_TYPES.values():
        out.append(f"gpu-{gpu.name}x{gpu.counts[-1]}")
    out.append("gpu-l4:spot")
    return out


@pytest.fixture(scope="module")
def readme_emulator(tmp_path_factory):
    """The emulator as the README starts it: its default pools, namespaces and service account."""
    k8s = ClusterEmulator(work_dir=tmp_path_factory.mktemp("emulator"))
    k8s.start()
    yield k8s, k8s.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")
    k8s.stop()


def test_doctor_passes_on_the_emulator_for_every_accelerator_kind(readme_emulator, monkeypatch, tmp_path):
    _, kubeconfig = readme_emulator
    conn = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}
    monkeypatch.setenv("AIRFLOW_CONN_KINETIC_EMULATOR", json.dumps(conn))
    monkeypatch.setenv("KINETIC_KUBERNETES_CONN_ID", "kinetic_emulator")
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    monkeypatch.setenv("KINETIC_CONTAINER_IMAGE", f"us-docker.pkg.dev/p/kn/kinetic:py{HERE}")
    failed = {}
    kinds = _every_accelerator_kind()
    for accelerator in kinds:
        report = run_doctor(accelerator)
        if not report.ok:
            failed[accelerator] = report.render()
            continue
        nodes = report.check("accelerator nodes")
        assert nodes.status == OK and re.match(r"\d+ node\(s\)", nodes.detail), report.render()
    assert not failed, "\n\n".join(failed.values())
    asked = {parse_accelerator(a).gke_label for a in kinds} - {None}
    catalog = {s.gke_label for g in TPU_GENERATIONS.values() for s in g.shapes} | {
        g.gke_label for g in GPU_TYPES.values()
    }
    assert asked == catalog  # every accelerator kind of the catalog was asked about


def test_a_stocked_out_pool_never_gets_its_node_until_capacity_is_back(tmp_path):
    """Capacity that never arrives (``NodePool.stockout``, ``ClusterEmulator.stock_out``): a pod
    only a stocked-out pool fits stays Unschedulable with the cluster-autoscaler's events for a
    failed scale-up (TriggeredScaleUp, FailedScaleUp, NotTriggerScaleUp "in backoff after failed
    scale-up"), and is scheduled once the pool can grow again."""
    import time

    import kubernetes
    from cluster_emulator import NodePool

    l4 = {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    pools = [
        NodePool("cpu", {}),
        NodePool("l4-spot", {**l4, "cloud.google.com/gke-spot": "true"}, stockout=True),
    ]
    with ClusterEmulator(node_pools=pools, work_dir=tmp_path) as emulator:
        core = kubernetes.client.CoreV1Api(emulator.api_client())
        pod = {
            "metadata": {"name": "wants-spot-l4"},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {**l4, "cloud.google.com/gke-spot": "true"},
                "containers": [
                    {"name": "c", "image": "python", "command": [sys.executable, "-c", "print(1)"]}
                ],
            },
        }
        core.create_namespaced_pod("default", pod)

        def events() -> dict[str, str]:
            listed = core.list_namespaced_event("default").items
            return {e.reason: e.message for e in listed if e.involved_object.name == "wants-spot-l4"}

        deadline = time.monotonic() + 60
        while "NotTriggerScaleUp" not in events() and time.monotonic() < deadline:
            time.sleep(0.2)
        seen = events()
        assert "TriggeredScaleUp" in seen, seen
        assert seen["FailedScaleUp"] == (
            "Node scale up in zones us-central1-a associated with this pod failed: GCE out of resources. "
            "Pod is at risk of not being scheduled."
        )
        assert seen["NotTriggerScaleUp"] == "pod didn't trigger scale-up: 1 in backoff after failed scale-up"
        status = core.read_namespaced_pod("wants-spot-l4", "default").status
        assert status.phase == "Pending"
        (scheduled,) = [c for c in status.conditions if c.type == "PodScheduled"]
        assert scheduled.reason == "Unschedulable" and "1 Insufficient" in scheduled.message

        with pytest.raises(ValueError, match="no node pool matches 'l4-spto'"):
            emulator.stock_out("l4-spto")
        # over HTTP as in Python (the README's fault table): stocked out again, then back
        from cluster_emulator.emulator import EmulatorAdminClient

        admin = EmulatorAdminClient(emulator.url)
        assert admin.stock_out("l4-spot") == ["l4-spot"]
        assert emulator.stock_out("l4-*", stocked=False) == ["l4-spot"]
        deadline = time.monotonic() + 60
        while not core.read_namespaced_pod("wants-spot-l4", "default").spec.node_name:
            assert time.monotonic() < deadline, "the pod was not scheduled once capacity was back"
            time.sleep(0.2)
        assert "l4-spot" in core.read_namespaced_pod("wants-spot-l4", "default").spec.node_name


def test_the_pool_file_can_stock_out_one_provisioning_model_of_a_pool():
    from cluster_emulator.nodes import _stockout

    assert _stockout({"stockout": True}, spot=False) and _stockout({"stockout": True}, spot=True)
    assert _stockout({"stockout": "spot"}, spot=True) and not _stockout({"stockout": "spot"}, spot=False)
    assert not _stockout({}, spot=True)
    assert not any(pool.stockout for pool in default_node_pools())  # the defaults: capacity arrives
