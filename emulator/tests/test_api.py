"""API surface: discovery, selectors, watch, patch, errors, events, pagination, kubernetes_asyncio."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from typing import Any

import pytest
import yaml
from cluster_emulator import ClusterEmulator
from cluster_emulator.resources import PODS
from cluster_emulator.selectors import parse_field_selector, parse_label_selector
from cluster_emulator.store import Store
from emu_helpers import NS, api_error, job_manifest, pod_manifest, read_log, wait_job, wait_pod
from kubernetes import client, watch
from kubernetes.client.rest import ApiException


def _get(url: str, headers: dict[str, str] | None = None) -> Any:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_version_and_discovery(k8s_cluster: ClusterEmulator, k8s_api_client: client.ApiClient) -> None:
    info = client.VersionApi(k8s_api_client).get_code()
    for field in (
        "major",
        "minor",
        "git_version",
        "git_commit",
        "git_tree_state",
        "build_date",
        "go_version",
        "compiler",
        "platform",
        "emulation_major",
        "emulation_minor",
        "min_compatibility_major",
        "min_compatibility_minor",
    ):
        assert getattr(info, field), field
    assert client.CoreApi(k8s_api_client).get_api_versions().versions == ["v1"]
    groups = {g.name: g for g in client.ApisApi(k8s_api_client).get_api_versions().groups}
    assert groups["batch"].preferred_version.group_version == "batch/v1"
    assert "leaderworkerset.x-k8s.io" in groups
    core_resources = {r.name: r for r in client.CoreV1Api(k8s_api_client).get_api_resources().resources}
    assert core_resources["pods"].namespaced and "watch" in core_resources["pods"].verbs
    assert "pods/log" in core_resources and "pods/status" in core_resources
    assert not core_resources["namespaces"].namespaced
    batch_resources = {r.name for r in client.BatchV1Api(k8s_api_client).get_api_resources().resources}
    assert {"jobs", "jobs/status"} <= batch_resources
    lws = _get(f"{k8s_cluster.url}/apis/leaderworkerset.x-k8s.io/v1")
    assert lws["resources"][0]["name"] == "leaderworkersets" and lws["resources"][0]["shortNames"] == ["lws"]
    assert _get(f"{k8s_cluster.url}/apis/batch")["preferredVersion"]["version"] == "v1"
    names = {ns.metadata.name for ns in client.CoreV1Api(k8s_api_client).list_namespace().items}
    assert {"default", "kube-system"} <= names


def test_label_and_field_selectors(k8s_api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s_api_client)
    for name, labels in (
        ("p-a", {"app": "a", "tier": "web"}),
        ("p-b", {"app": "b", "tier": "db"}),
        ("p-c", {"app": "c"}),
    ):
        core.create_namespaced_pod(NS, pod_manifest(name, "pass", labels))

    def names(**kwargs: Any) -> set[str]:
        return {p.metadata.name for p in core.list_namespaced_pod(NS, **kwargs).items}

    assert names(label_selector="app=a") == {"p-a"}
    assert names(label_selector="app==a") == {"p-a"}
    assert names(label_selector="app!=a") == {"p-b", "p-c"}
    assert names(label_selector="app in (a, b)") == {"p-a", "p-b"}
    assert names(label_selector="app notin (a,b)") == {"p-c"}
    assert names(label_selector="tier") == {"p-a", "p-b"}
    assert names(label_selector="!tier") == {"p-c"}
    assert names(label_selector="app in (a,b),tier=db") == {"p-b"}
    assert names(field_selector="metadata.name=p-c") == {"p-c"}
    assert names(field_selector="metadata.name!=p-c") == {"p-a", "p-b"}
    for name in ("p-a", "p-b", "p-c"):
        wait_pod(core, name, "Succeeded")
    assert names(field_selector="status.phase=Succeeded") == {"p-a", "p-b", "p-c"}
    assert names(field_selector="status.phase=Running") == set()
    all_ns = {p.metadata.name for p in core.list_pod_for_all_namespaces(label_selector="tier=web").items}
    assert all_ns == {"p-a"}
    with pytest.raises(ApiException) as info:
        core.list_namespaced_pod(NS, label_selector="app in (a")
    assert info.value.status == 400


def test_selector_parsing_units() -> None:
    sel = parse_label_selector("a=1,b!=2,c in (x,y),d notin (z),e,!f")
    assert sel.matches({"a": "1", "c": "x", "e": ""})
    assert not sel.matches({"a": "1", "c": "x", "e": "", "f": "1"})
    assert not sel.matches({"a": "1", "b": "2", "c": "x", "e": ""})
    fields = parse_field_selector("involvedObject.name=p,type!=Normal")
    assert fields.matches({"involvedObject": {"name": "p"}, "type": "Warning"})
    assert not fields.matches({"involvedObject": {"name": "p"}, "type": "Normal"})


def test_watch_replays_added_modified_deleted(k8s_api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s_api_client)
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    core.create_namespaced_pod(NS, pod_manifest("watched", "pass", {"w": "1"}))
    wait_pod(core, "watched", "Succeeded")
    core.delete_namespaced_pod("watched", NS, grace_period_seconds=0)
    seen: list[tuple[str, str]] = []
    for event in watch.Watch().stream(
        core.list_namespaced_pod, NS, label_selector="w=1", resource_version=rv, timeout_seconds=1
    ):
        seen.append((event["type"], event["object"].status.phase))
    types = [t for t, _ in seen]
    assert types[0] == "ADDED" and types[-1] == "DELETED" and "MODIFIED" in types
    assert ("MODIFIED", "Succeeded") in seen
    rvs = [int(e) for e in _rv_sequence(k8s_api_client, rv)]
    assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs)


def _rv_sequence(api: client.ApiClient, rv: str) -> list[str]:
    core = client.CoreV1Api(api)
    return [
        e["object"].metadata.resource_version
        for e in watch.Watch().stream(core.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=1)
    ]


def test_live_watch_streams_events(k8s_api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s_api_client)
    events: list[str] = []
    started = threading.Event()
    w = watch.Watch()

    def run() -> None:
        started.set()
        for event in w.stream(core.list_namespaced_pod, NS, label_selector="live=yes", timeout_seconds=20):
            events.append(event["type"])
            if event["type"] == "DELETED":
                w.stop()

    thread = threading.Thread(target=run)
    thread.start()
    started.wait()
    core.create_namespaced_pod(NS, pod_manifest("live", "import time; time.sleep(0.2)", {"live": "yes"}))
    wait_pod(core, "live", "Succeeded")
    core.delete_namespaced_pod("live", NS)
    thread.join(20)
    assert not thread.is_alive()
    assert events[0] == "ADDED" and events[-1] == "DELETED" and events.count("MODIFIED") >= 2


def test_watch_bookmarks_initial_events_and_timeout(
    k8s_cluster: ClusterEmulator, k8s_api_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(k8s_api_client)
    core.create_namespaced_pod(NS, pod_manifest("bm", "pass"))
    url = (
        f"{k8s_cluster.url}/api/v1/namespaces/{NS}/pods?watch=true&allowWatchBookmarks=true"
        "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=1"
    )
    with urllib.request.urlopen(url, timeout=10) as resp:  # ends by itself after timeoutSeconds
        lines = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
    assert lines[0]["type"] == "ADDED" and lines[0]["object"]["metadata"]["name"] == "bm"
    bookmark = next(e for e in lines if e["type"] == "BOOKMARK")
    assert bookmark["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"
    assert bookmark["object"]["kind"] == "Pod"


def test_store_reports_too_old_resource_version() -> None:
    store = Store(history_size=3)
    for i in range(5):
        store.create(PODS, {"kind": "Pod", "metadata": {"name": f"p{i}", "namespace": "x", "uid": str(i)}})
    assert store.oldest_replayable_rv() > 1
    assert [
        e.obj["metadata"]["name"] for e in store.history_since(store.oldest_replayable_rv(), PODS, "x")
    ] == ["p2", "p3", "p4"]


def test_patch_put_and_conflicts(k8s_api_client: client.ApiClient) -> None:
    batch = client.BatchV1Api(k8s_api_client)
    batch.create_namespaced_job(NS, job_manifest("patchme", "pass", suspend=True))
    merged = batch.patch_namespaced_job("patchme", NS, {"metadata": {"labels": {"extra": "yes"}}})
    assert merged.metadata.labels["extra"] == "yes" and merged.metadata.labels["app"] == "emulator-test"
    patched = batch.patch_namespaced_job(
        "patchme", NS, [{"op": "add", "path": "/metadata/annotations", "value": {"note": "json-patch"}}]
    )
    assert patched.metadata.annotations == {"note": "json-patch"}
    stale = batch.read_namespaced_job("patchme", NS)
    batch.patch_namespaced_job("patchme", NS, {"metadata": {"labels": {"bump": "1"}}})
    stale.metadata.labels["other"] = "x"
    with pytest.raises(ApiException) as info:
        batch.replace_namespaced_job("patchme", NS, stale)
    assert info.value.status == 409 and api_error(info.value)["reason"] == "Conflict"
    fresh = batch.read_namespaced_job("patchme", NS)
    fresh.metadata.labels["other"] = "x"
    replaced = batch.replace_namespaced_job("patchme", NS, fresh)
    assert int(replaced.metadata.resource_version) > int(fresh.metadata.resource_version)
    batch.patch_namespaced_job("patchme", NS, {"spec": {"suspend": False}})
    new_containers = [{"name": "main", "image": "other:1", "command": ["true"]}]
    with pytest.raises(ApiException) as info:  # the template is immutable once the job is not suspended
        batch.patch_namespaced_job(
            "patchme", NS, {"spec": {"template": {"spec": {"containers": new_containers}}}}
        )
    assert info.value.status == 422 and "field is immutable" in api_error(info.value)["message"]


def test_not_found_status_body(k8s_api_client: client.ApiClient) -> None:
    with pytest.raises(ApiException) as info:
        client.CoreV1Api(k8s_api_client).read_namespaced_pod("missing", NS)
    body = api_error(info.value)
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "missing" not found',
        "reason": "NotFound",
        "details": {"name": "missing", "kind": "pods"},
        "code": 404,
    }
    with pytest.raises(ApiException) as info:
        client.CoreV1Api(k8s_api_client).create_namespaced_pod("nope", pod_manifest("x"))
    assert info.value.status == 404 and api_error(info.value)["message"] == 'namespaces "nope" not found'


def test_events_by_involved_object(k8s_api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s_api_client)
    core.create_namespaced_pod(NS, pod_manifest("evented", "pass"))
    wait_pod(core, "evented", "Succeeded")
    events = core.list_namespaced_event(NS, field_selector="involvedObject.name=evented").items
    reasons = {e.reason for e in events}
    assert {"Scheduled", "Pulled", "Created", "Started"} <= reasons
    scheduled = next(e for e in events if e.reason == "Scheduled")
    assert scheduled.involved_object.kind == "Pod" and scheduled.source.component == "default-scheduler"
    assert all(e.involved_object.name == "evented" for e in events)


def test_pagination_with_limit_and_continue(k8s_api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s_api_client)
    for i in range(5):
        core.create_namespaced_pod(NS, pod_manifest(f"page-{i}", "pass", {"page": "y"}))
    first = core.list_namespaced_pod(NS, label_selector="page=y", limit=2)
    assert len(first.items) == 2 and first.metadata._continue and first.metadata.remaining_item_count == 3
    names = [p.metadata.name for p in first.items]
    token = first.metadata._continue
    while token:
        page = core.list_namespaced_pod(NS, label_selector="page=y", limit=2, _continue=token)
        names += [p.metadata.name for p in page.items]
        token = page.metadata._continue
    assert names == [f"page-{i}" for i in range(5)]


def test_generate_name_and_dry_run(k8s_api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s_api_client)
    manifest = pod_manifest("", "pass")
    del manifest["metadata"]["name"]
    manifest["metadata"]["generateName"] = "gen-"
    pod = core.create_namespaced_pod(NS, manifest)
    assert pod.metadata.name.startswith("gen-") and len(pod.metadata.name) == 9
    dry = core.create_namespaced_pod(NS, pod_manifest("dry", "pass"), dry_run="All")
    assert dry.metadata.name == "dry"
    with pytest.raises(ApiException):
        core.read_namespaced_pod("dry", NS)


def test_kubernetes_asyncio_client(k8s_kubeconfig) -> None:
    from kubernetes_asyncio import client as aclient
    from kubernetes_asyncio import config as aconfig
    from kubernetes_asyncio import watch as awatch

    async def scenario() -> tuple[list[str], str, str]:
        api = await aconfig.new_client_from_config(config_file=str(k8s_kubeconfig))
        async with api:
            batch = aclient.BatchV1Api(api)
            core = aclient.CoreV1Api(api)
            await batch.create_namespaced_job(NS, job_manifest("async-job", "print('from async')"))
            seen: list[str] = []
            w = awatch.Watch()
            async for event in w.stream(
                batch.list_namespaced_job, NS, field_selector="metadata.name=async-job", timeout_seconds=20
            ):
                seen.append(event["type"])
                conditions = event["object"].status.conditions or []
                if any(c.type == "Complete" and c.status == "True" for c in conditions):
                    w.stop()
            pods = await core.list_namespaced_pod(NS, label_selector="job-name=async-job")
            name = pods.items[0].metadata.name
            resp = await core.read_namespaced_pod_log(name, NS, _preload_content=False)
            text = (await resp.read()).decode()
            version = await aclient.VersionApi(api).get_code()
            return seen, text, version.git_version

    seen, text, version = asyncio.run(scenario())
    assert seen[0] == "ADDED"  # then MODIFIED events, unless the job already finished
    assert text == "from async\n"
    assert version.startswith("v1.")


def test_airflow_kubernetes_hooks(k8s_kubeconfig) -> None:
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook, KubernetesHook

    hook = KubernetesHook(conn_id=None, kubernetes_conn_id=None, config_file=str(k8s_kubeconfig))
    job = client.V1Job(
        metadata=client.V1ObjectMeta(name="hooked", namespace=NS),
        spec=client.V1JobSpec(
            backoff_limit=0,
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    containers=[
                        client.V1Container(name="main", image="img:1", command=[*_py(), "print('hook')"])
                    ],
                )
            ),
        ),
    )
    hook.create_job(job)
    done = hook.wait_until_job_complete("hooked", NS, job_poll_interval=0.1)
    assert not hook.is_job_failed(done)
    pod = hook.core_v1_client.list_namespaced_pod(NS, label_selector="job-name=hooked").items[0]

    # The async hook takes the kubeconfig as a dict (it ignores config_file).
    config = yaml.safe_load(k8s_kubeconfig.read_text())
    async_hook = AsyncKubernetesHook(conn_id=None, kubernetes_conn_id=None, config_dict=config)

    async def read() -> tuple[list[str], Any, Any]:
        logs = await async_hook.read_logs(pod.metadata.name, NS)
        status = await async_hook.get_job_status("hooked", NS)
        events = await async_hook.get_pod_events(pod.metadata.name, NS)
        return logs, status, events

    logs, status, events = asyncio.run(read())
    assert any(line.endswith("hook") for line in logs)
    assert any(c.type == "Complete" for c in status.status.conditions)
    assert {e.reason for e in events.items} >= {"Scheduled", "Started"}


def _py() -> list[str]:
    import sys

    return [sys.executable, "-c"]


def test_kubectl_style_table(k8s_cluster: ClusterEmulator, k8s_api_client: client.ApiClient) -> None:
    batch = client.BatchV1Api(k8s_api_client)
    batch.create_namespaced_job(NS, job_manifest("tabled", "pass"))
    wait_job(batch, "tabled", "Complete")
    table = _get(
        f"{k8s_cluster.url}/api/v1/namespaces/{NS}/pods",
        {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"},
    )
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"][:5]] == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
    ]
    assert table["rows"][0]["cells"][2] == "Completed"
    core = client.CoreV1Api(k8s_api_client)
    pod = core.list_namespaced_pod(NS, label_selector="job-name=tabled").items[0]
    assert read_log(core, pod.metadata.name) == ""
