"""``pods/{name}/portforward`` over a WebSocket (``v4.channel.k8s.io``), reached with the official
client's ``kubernetes.stream.portforward``, as ``kinetic-airflow jobs debug`` uses it."""

from __future__ import annotations

import socket
import struct

import pytest
import websocket
from cluster_emulator import wait_until
from emu_helpers import NS, api_error, pod_manifest, read_log, wait_pod
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.stream import portforward

# A pod process that listens on 127.0.0.1 (a port the system picks), prints it, and answers each
# connection's bytes in upper case until the connection closes.
ECHO = """
import socket, threading
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
def serve(conn):
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data.upper())
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


@pytest.fixture
def core(k8s_api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(k8s_api_client)


def _echo_pod(core: client.CoreV1Api, name: str) -> int:
    core.create_namespaced_pod(NS, pod_manifest(name, ECHO))
    wait_pod(core, name, "Running")
    return int(wait_until(lambda: read_log(core, name).strip(), timeout=30, message="the pod's port"))


def _exchange(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(65536)
        assert chunk, "the forwarded connection closed early"
        got += chunk
    return got


def test_the_official_client_reaches_a_port_of_the_pod_process(core: client.CoreV1Api) -> None:
    port = _echo_pod(core, "echo")
    forward = portforward(core.connect_get_namespaced_pod_portforward, "echo", NS, ports=str(port))
    sock = forward.socket(port)
    sock.setblocking(True)
    assert _exchange(sock, b"hello pod") == b"HELLO POD"
    big = bytes(range(97, 123)) * 20000  # 520 kB: many frames each way
    assert _exchange(sock, big) == big.upper()
    sock.close()
    assert forward.error(port) is None
    # a second connection (a debugger that attaches again): a new WebSocket, as a new one needs
    again = portforward(core.connect_get_namespaced_pod_portforward, "echo", NS, ports=str(port))
    sock = again.socket(port)
    sock.setblocking(True)
    assert _exchange(sock, b"again") == b"AGAIN"
    sock.close()
    core.delete_namespaced_pod("echo", NS, grace_period_seconds=0)


def test_the_channel_protocol_on_the_wire(core: client.CoreV1Api, k8s_cluster) -> None:
    """What handleWebSocketStreams writes first: each port, little-endian, on its data and error channel."""
    port = _echo_pod(core, "wire")
    url = (
        k8s_cluster.url.replace("http", "ws", 1)
        + f"/api/v1/namespaces/{NS}/pods/wire/portforward?ports={port}"
    )
    ws = websocket.create_connection(url, subprotocols=["v4.channel.k8s.io"], timeout=30)
    assert ws.getsubprotocol() == "v4.channel.k8s.io"
    head = struct.pack("<H", port)
    assert ws.recv() == b"\x00" + head and ws.recv() == b"\x01" + head
    ws.send_binary(b"\x00ping")
    assert ws.recv() == b"\x00PING"
    ws.close()
    core.delete_namespaced_pod("wire", NS, grace_period_seconds=0)


def test_nothing_listening_is_reported_on_the_error_channel(core: client.CoreV1Api) -> None:
    port = _echo_pod(core, "quiet")
    probe = socket.create_server(("127.0.0.1", 0))
    unused = probe.getsockname()[1]
    probe.close()
    forward = portforward(core.connect_get_namespaced_pod_portforward, "quiet", NS, ports=f"{port},{unused}")
    sock = forward.socket(unused)
    sock.setblocking(True)
    assert sock.recv(10) == b""  # closed: the pod's port could not be dialled
    assert f"error forwarding port {unused} to pod quiet" in forward.error(unused)
    ok = forward.socket(port)  # the other port of the same request still works
    ok.setblocking(True)
    assert _exchange(ok, b"still") == b"STILL"
    ok.close()
    core.delete_namespaced_pod("quiet", NS, grace_period_seconds=0)


def test_bad_requests_name_the_problem(core: client.CoreV1Api, k8s_cluster) -> None:
    base = k8s_cluster.url.replace("http", "ws", 1) + f"/api/v1/namespaces/{NS}/pods"
    with pytest.raises(websocket.WebSocketBadStatusException) as missing:
        websocket.create_connection(f"{base}/no-such-pod/portforward?ports=80", timeout=30)
    assert missing.value.status_code == 404
    # a pod no node was found for (the emulator leaves it Pending)
    unschedulable = pod_manifest("nowhere", nodeSelector={"kubernetes.io/hostname": "no-such-node"})
    core.create_namespaced_pod(NS, unschedulable)
    with pytest.raises(websocket.WebSocketBadStatusException) as no_host:
        websocket.create_connection(f"{base}/nowhere/portforward?ports=80", timeout=30)
    assert no_host.value.status_code == 400
    assert b"pod nowhere does not have a host assigned" in (no_host.value.resp_body or b"")
    port = _echo_pod(core, "asked")
    with pytest.raises(websocket.WebSocketBadStatusException) as no_ports:
        websocket.create_connection(f"{base}/asked/portforward", timeout=30)
    assert no_ports.value.status_code == 400 and b'query parameter \\"ports\\" is required' in (
        no_ports.value.resp_body or b""
    )
    with pytest.raises(websocket.WebSocketBadStatusException) as spdy_only:
        websocket.create_connection(
            f"{base}/asked/portforward?ports={port}", subprotocols=["SPDY/3.1+portforward.k8s.io"], timeout=30
        )
    assert b"requested protocol(s) are not supported" in (spdy_only.value.resp_body or b"")
    with pytest.raises(ApiException) as plain:  # no upgrade at all
        core.api_client.call_api(
            f"/api/v1/namespaces/{NS}/pods/asked/portforward", "GET", query_params=[("ports", str(port))]
        )
    assert plain.value.status == 400 and "Upgrade request required" in api_error(plain.value)["message"]
    core.delete_namespaced_pod("asked", NS, grace_period_seconds=0)
    core.delete_namespaced_pod("nowhere", NS, grace_period_seconds=0)
