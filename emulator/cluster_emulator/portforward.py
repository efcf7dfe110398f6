"""The ``pods/{name}/portforward`` subresource over a WebSocket (``v4.channel.k8s.io``).

What a real cluster does, and where. The kubelet's side is read at the Kubernetes release v1.36.2
(the newest release whose sources could be read here; the emulator reports 1.37, whose release was
not readable): since v1.36 it is the published staging module k8s.io/cri-streaming (tag v0.36.2 =
Kubernetes v1.36.2), the same code as the kubelet's ``pkg/cri/streaming/portforward/websocket.go``
of v1.35 (k8s.io/kubelet tag kubernetes-1.35.0) but for imports:

* the API server finds the pod and refuses one without a node: ``PortForwardLocation`` in
  kubernetes/kubernetes ``pkg/registry/core/pod/strategy.go`` ("pod NAME does not have a host
  assigned", 400), then proxies the upgraded connection to the kubelet (read at master commit
  25d732c; not re-read at a release tag, kubernetes/kubernetes could not be fetched here);
* the kubelet's ``NewV4Options`` (k8s.io/cri-streaming v0.36.2
  ``pkg/streaming/portforward/websocket.go``) reads the ``ports`` query parameter (repeatable,
  comma separated, each 1-65535; "query parameter "ports" is required" / "... cannot be empty"
  otherwise) and ``handleWebSocketStreams`` (same file) opens two channels per port, in order:
  data ``2i`` (read-write) and error ``2i+1`` (write only). Before anything else it writes the
  port, as an unsigned 16-bit little-endian number, on both channels of each port. Every
  WebSocket message is one binary frame whose first byte is the channel (``wsstream.Conn``,
  k8s.io/apimachinery tag kubernetes-1.35.7 ``pkg/util/httpstream/wsstream/conn.go``; from v1.36
  in k8s.io/streaming, whose tags could not be read here, apimachinery keeping a wrapper); the
  sub-protocols served are ``v4.channel.k8s.io`` (binary), its base64 form and none at all
  (treated as binary);
* each port's forwarder dials the port inside the pod's network namespace and copies both ways;
  when that fails, the message ``error forwarding port P to pod NAME, uid UID: ...`` goes to the
  port's error channel and both channels close (``websocketStreamHandler.portForward``).

Here a pod is a set of local processes sharing the machine's network (podIP 127.0.0.1), so the
forwarder dials ``127.0.0.1:PORT``: what the pod listens on, or anything else on this machine
listening there (README: what is not modelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Any

from aiohttp import WSMsgType, web

from . import errors
from .resources import PODS

__all__ = ["SERVED_PROTOCOLS", "serve_portforward"]

SERVED_PROTOCOLS = ("v4.channel.k8s.io",)


def _ports(request: web.Request) -> list[int]:
    """The ``ports`` query parameter as ``NewV4Options`` reads it, with its error messages."""
    values = request.query.getall("ports", [])
    if not values:
        raise errors.bad_request('query parameter "ports" is required')
    ports: list[int] = []
    for value in values:
        if not value:
            raise errors.bad_request('query parameter "ports" cannot be empty')
        for part in value.split(","):
            try:
                port = int(part)
                if not 0 <= port < 65536:
                    raise ValueError
            except ValueError:
                raise errors.bad_request(f'unable to parse "{value}" as a port') from None
            if port < 1:
                raise errors.bad_request(f'port "{value}" must be > 0')
            ports.append(port)
    return ports


def _requested_protocols(request: web.Request) -> list[str]:
    header = request.headers.get("Sec-WebSocket-Protocol", "")
    return [p.strip() for p in header.split(",") if p.strip()]


async def serve_portforward(
    cluster: Any, request: web.Request, namespace: str, name: str
) -> web.StreamResponse:
    """Upgrade to a WebSocket and forward each requested port to ``127.0.0.1:port``."""
    pod = cluster.get(PODS, namespace, name)  # 404 pods "NAME" not found
    if not (pod.get("spec") or {}).get("nodeName"):
        raise errors.bad_request(f"pod {name} does not have a host assigned")
    if request.headers.get("Upgrade", "").lower() != "websocket":
        # The API server also speaks SPDY here (kubectl's default before 1.31); not modelled.
        raise errors.bad_request(
            "Upgrade request required: the emulator forwards ports over WebSocket only "
            f"({', '.join(SERVED_PROTOCOLS)}), not SPDY"
        )
    ports = _ports(request)
    asked = _requested_protocols(request)
    if asked and not set(asked) & set(SERVED_PROTOCOLS):
        raise errors.bad_request(
            f"requested protocol(s) are not supported: {asked}; supports {list(SERVED_PROTOCOLS)}"
        )
    ws = web.WebSocketResponse(protocols=SERVED_PROTOCOLS, autoping=True)
    await ws.prepare(request)
    uid = pod["metadata"].get("uid", "")
    phase = (pod.get("status") or {}).get("phase")
    send_lock = asyncio.Lock()

    async def send(channel: int, data: bytes) -> None:
        async with send_lock:
            if not ws.closed:
                await ws.send_bytes(bytes((channel,)) + data)

    for index, port in enumerate(ports):
        head = struct.pack("<H", port)
        await send(2 * index, head)
        await send(2 * index + 1, head)

    # Each port's connection to the pod, once dialled (None: it failed); what the client sends
    # before then waits for it rather than being dropped.
    loop = asyncio.get_running_loop()
    dialled: dict[int, asyncio.Future[asyncio.StreamWriter | None]] = {
        index: loop.create_future() for index in range(len(ports))
    }
    pumps: list[asyncio.Future[None]] = []

    async def forward(index: int, port: int) -> None:
        try:
            if phase != "Running":
                raise ConnectionRefusedError(f"pod is {phase or 'not running'}")
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as exc:
            dialled[index].set_result(None)
            message = f"error forwarding port {port} to pod {name}, uid {uid}: {exc}"
            await send(2 * index + 1, message.encode())
            return
        dialled[index].set_result(writer)
        try:
            while data := await reader.read(65536):
                await send(2 * index, data)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    for index, port in enumerate(ports):
        pumps.append(asyncio.ensure_future(forward(index, port)))

    async def from_client() -> None:
        async for msg in ws:
            if msg.type != WSMsgType.BINARY or not msg.data:
                continue
            channel, data = msg.data[0], msg.data[1:]
            if channel % 2 or channel // 2 not in dialled or not data:  # error channels are the server's
                continue
            writer = await dialled[channel // 2]
            if writer is not None and not writer.is_closing():
                writer.write(data)
                with contextlib.suppress(ConnectionError, OSError):
                    await writer.drain()
        for future in dialled.values():  # the client hung up: so does each port
            if future.done() and future.result() is not None:
                future.result().close()

    reading = asyncio.ensure_future(from_client())
    try:
        await asyncio.gather(*pumps)  # every port's connection ended (or never opened)
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reading
        await ws.close()
    return ws
