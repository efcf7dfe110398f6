"""Cluster DNS names of pods / headless Services handed to pod processes as 127.0.0.1."""

from __future__ import annotations

import pytest
from cluster_emulator.dns import resolves, rewrite
from cluster_emulator.kubelet import expand_vars, expand_vars_spans
from emu_helpers import NS, pod_manifest, read_log, wait_pod
from kubernetes import client

HEADLESS = {("default", "trainer"), ("other", "peers")}


@pytest.mark.parametrize(
    ("name", "namespace", "expected"),
    [
        ("trainer-0.trainer", "default", True),  # <host>.<svc>, own namespace
        ("trainer-0.trainer", "other", False),
        ("trainer-0.trainer.default", "other", True),
        ("trainer-0.trainer.default.svc", "other", True),
        ("Trainer-0.trainer.default.svc.cluster.local.", "other", True),
        ("trainer.default", "other", True),  # the service itself
        ("trainer.default.svc.cluster.local", "other", True),
        ("peers.other", "default", True),
        ("trainer-0.nosvc", "default", False),
        ("trainer-0.trainer.nons", "default", False),
        ("a.b.trainer.default.svc", "default", False),
        ("1.2.3.4", "default", False),
        ("example.com", "default", False),
    ],
)
def test_resolves(name: str, namespace: str, expected: bool) -> None:
    assert resolves(name, namespace, HEADLESS) is expected


def test_rewrite_keeps_everything_but_the_names() -> None:
    text = "trainer-0.trainer,trainer-0-1.trainer:8476 http://trainer.default.svc:80/x example.com trainer"
    expected = "127.0.0.1,127.0.0.1:8476 http://127.0.0.1:80/x example.com trainer"
    assert rewrite(text, "default", HEADLESS) == expected
    assert rewrite("x.trainer-0.trainer", "default", HEADLESS) == "x.trainer-0.trainer"  # longer name
    assert rewrite("trainer-0.trainer.default.svc.cluster.local.", "default", HEADLESS) == "127.0.0.1"
    assert rewrite("trainer-0.trainer", "default", set()) == "trainer-0.trainer"


def test_rewrite_only_inside_spans() -> None:
    mapping = {"ADDR": "trainer-0.trainer"}
    text, spans = expand_vars_spans("--a=$(ADDR):1 --b=trainer-0.trainer $$(ADDR)", mapping)
    assert text == "--a=trainer-0.trainer:1 --b=trainer-0.trainer $(ADDR)"
    assert rewrite(text, "default", HEADLESS, only=spans) == "--a=127.0.0.1:1 --b=trainer-0.trainer $(ADDR)"
    # A name only partly produced by expansion still counts.
    text, spans = expand_vars_spans("$(HOST).trainer", {"HOST": "trainer-0"})
    assert rewrite(text, "default", HEADLESS, only=spans) == "127.0.0.1"
    assert expand_vars("$(MISSING) $(ADDR)", {"ADDR": "x"}) == "$(MISSING) x"


def test_pod_env_names_under_a_headless_service(k8s_api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s_api_client)
    core.create_namespaced_service(
        NS, {"metadata": {"name": "peers"}, "spec": {"clusterIP": "None", "selector": {"app": "peer"}}}
    )
    core.create_namespaced_service(
        NS, {"metadata": {"name": "vip"}, "spec": {"selector": {"app": "peer"}, "ports": [{"port": 80}]}}
    )
    code = (
        "import os, sys\n"
        "for k in ('PEER', 'FQDN', 'VIP', 'API', 'CM'):\n"
        "    print(k, os.environ[k])\n"
        "print('ARGV', sys.argv[1:])\n"
    )
    core.create_namespaced_config_map(NS, {"metadata": {"name": "cfg"}, "data": {"addr": "peer-0.peers:99"}})
    pod = pod_manifest("peer-0", code, labels={"app": "peer"}, hostname="peer-0", subdomain="peers")
    main = pod["spec"]["containers"][0]
    main["args"] = ["$(PEER)", "peer-0.peers"]
    main["env"] = [
        {"name": "PEER", "value": "peer-0.peers:1234"},
        {"name": "HOSTNAME_PART", "value": "peer-0"},
        {"name": "FQDN", "value": "$(HOSTNAME_PART).peers.default.svc.cluster.local"},
        {"name": "VIP", "value": "vip.default.svc"},  # not headless: left alone
        {"name": "API", "value": "$(KUBERNETES_SERVICE_HOST)"},
        {"name": "CM", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "addr"}}},
    ]
    core.create_namespaced_pod(NS, pod)
    wait_pod(core, "peer-0", "Succeeded")
    assert read_log(core, "peer-0").splitlines() == [
        "PEER 127.0.0.1:1234",
        "FQDN 127.0.0.1",
        "VIP vip.default.svc",
        "API 127.0.0.1",
        "CM 127.0.0.1:99",
        "ARGV ['127.0.0.1:1234', 'peer-0.peers']",  # literal args are not rewritten
    ]
