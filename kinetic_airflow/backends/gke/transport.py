"""HTTP to a Kubernetes API server without loading the Kubernetes client library.

Why: every deferred GKE task builds one connection in a fresh process, and what it costs there is
paid once per task. The provider hooks' modules (``KubernetesHook``, ``GKEKubernetesHook``, which
load ``kubernetes_asyncio`` too) cost seconds; the maintained clients alone still cost more than
this module, measured side by side (``bench/kube_client_bench.py``: from a GKE task process's
imports to three answered requests, the kubernetes client adds 0.34-0.65 s and lightkube 0.44-0.51 s
over this module on the shared 2-core machine, more than the 0.3 s per task the project allows
for the choice; ``bench/race_bench.py --transports handwritten kubernetes`` runs whole tasks). The
backend never uses a client's model objects (it asks for raw JSON), only an authenticated
connection pool, which is what ``ApiServer`` is: an address, TLS settings, a proxy, a fresh
``Authorization`` header, and one urllib3 pool (its retries are urllib3's ``Retry``, chosen per
request by ``client.KubeApi``).

Where the credentials come from is unchanged, and so is who decides it:

* GKE (a GCP connection): the connection's credentials as the google provider reads them
  (``GoogleBaseHook.get_credentials``: key file, ADC, impersonation), a bearer token refreshed
  when it expires, the cluster CA from the job reference (none for the DNS endpoint, whose
  certificate is publicly trusted) - what ``GKEClusterConnection`` does;
* a ``kubernetes_conn_id`` whose kubeconfig (``kube_config_path`` or ``kube_config``) has a user
  with a static token, a token file or a client certificate, and a cluster with a server and a
  CA (or ``insecure-skip-tls-verify``): read here, with the kubeconfig rules the Kubernetes
  client applies (relative paths from the file's folder, ``*-data`` fields base64);
* anything else - exec plugins (``gke-gcloud-auth-plugin``), auth providers, in-cluster or the
  default kubeconfig, several options at once: the cncf provider's ``KubernetesHook``
  builds its client configuration as before (paying the import), and its address, TLS files,
  proxy and ``Authorization`` header (refreshed by the client's own hook) are used the same way.

Proxies, on every path, as the Kubernetes python client and Google's clients choose them: a
kubeconfig's ``proxy-url`` or the hook's configured proxy (with its ``no_proxy`` and
``proxy_headers``), else ``HTTPS_PROXY`` / ``HTTP_PROXY`` (by the server's scheme, either case)
unless ``NO_PROXY`` names the server (hosts, domains, CIDR ranges, ``*``: the rules
of ``requests.utils.should_bypass_proxies``). Credentials in a proxy URL are sent as a
``Proxy-Authorization`` header and kept out of the server's ``repr`` and of anything logged. The
aiohttp log streams (``logstream.py``) use the same proxy.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import shutil
import socket
import ssl
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit, urlunsplit

import urllib3
import yaml

from kinetic_airflow.backends.gke.api_warnings import log_api_warnings
from kinetic_airflow.options import parse_bool

__all__ = ["ApiServer", "from_client_configuration", "from_google_credentials", "from_kubernetes_connection"]

# What the cncf provider's client sets (``configure_tcp_keepalive``): a dead peer under a long
# watch is noticed, and a NAT keeps the mapping.
_KEEPALIVE = [
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 120),
    (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 30),
    (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 6),
]


@dataclass
class ApiServer:
    """One API server as one identity sees it: address, TLS, ``Authorization``, a connection pool."""

    host: str  # scheme://address[:port], no trailing slash
    authorization: Callable[[], str | None]  # the header's value now (may refresh a token: blocking)
    ca_file: str | None = None
    ca_data: str | None = None  # PEM
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    tls_server_name: str | None = None
    # scheme://host:port of the proxy to reach ``host`` through (None: direct); never credentials,
    # which are in ``proxy_headers`` (``Proxy-Authorization``): neither is shown by ``repr``.
    proxy: str | None = field(default=None, repr=False)
    proxy_headers: dict[str, str] | None = field(default=None, repr=False)
    built_by: str = "kinetic"  # "kinetic", or the hook whose client configuration it comes from
    _tls: ssl.SSLContext | bool | None = field(default=None, repr=False)
    _pool: urllib3.PoolManager | None = field(default=None, repr=False)
    _pool_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def url(self, path: str, query: dict[str, Any] | None = None) -> str:
        pairs = [(k, v) for k, v in (query or {}).items() if v is not None]
        return self.host + path + (("?" + urlencode(pairs)) if pairs else "")

    def headers(self, accept: str = "application/json") -> dict[str, str]:
        headers = {"Accept": accept}
        token = self.authorization()
        if token:
            headers["Authorization"] = token
        return headers

    def ssl_context(self) -> ssl.SSLContext | bool:
        """TLS for this server (False over plain HTTP): what the pool and the aiohttp log streams use.

        Made once (loading the CAs is the costly part) and shared: a context only configures the
        connections wrapped with it. Two threads making it at once both succeed; one is kept."""
        if self._tls is None:
            self._tls = self._new_ssl_context()
        return self._tls

    def _new_ssl_context(self) -> ssl.SSLContext | bool:
        if not self.host.startswith("https"):
            return False
        context = ssl.create_default_context(cafile=self.ca_file or None, cadata=self.ca_data or None)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file or None)
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def pool(self) -> urllib3.PoolManager:
        """One pool per server, built on first use. Built outside the lock (nothing but memory is
        touched under a lock: ``tests/test_lock_discipline.py``); a pool built twice by two
        threads at once is dropped before it opened a connection."""
        if self._pool is not None:
            return self._pool
        built = self._new_pool()
        with self._pool_lock:
            if self._pool is None:
                self._pool = built
            return self._pool

    def _new_pool(self) -> urllib3.PoolManager:
        options: dict[str, Any] = {
            "num_pools": 4,
            "maxsize": 16,  # the triggerer's threads share one client per cluster
            "retries": False,  # per request: KubeApi passes the Retry it wants
            "socket_options": urllib3.connection.HTTPConnection.default_socket_options + _KEEPALIVE,
        }
        context = self.ssl_context()
        if context is not False:
            options["ssl_context"] = context
            if not self.verify:
                options.update(cert_reqs=ssl.CERT_NONE, assert_hostname=False)
            elif self.tls_server_name:
                options["server_hostname"] = self.tls_server_name
        if self.proxy:
            return urllib3.ProxyManager(self.proxy, proxy_headers=self.proxy_headers, **options)
        return urllib3.PoolManager(**options)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        timeout: float | tuple[float | None, float | None] | None = 30,
        retries: urllib3.util.Retry | bool = False,
        preload_content: bool = False,
    ) -> urllib3.BaseHTTPResponse:
        """The response, whatever its status: unread, or read whole with ``preload_content`` (then a
        connection lost while reading the body is retried like one lost before the headers);
        ``retries``: urllib3's ``Retry`` for this request (False: one attempt)."""
        if isinstance(timeout, tuple):
            limit = urllib3.Timeout(connect=timeout[0], read=timeout[1])
        else:
            limit = urllib3.Timeout(total=timeout)
        headers = self.headers()
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        response = self.pool().request(
            method,
            self.url(path, query),
            body=data,
            headers=headers,
            timeout=limit,
            retries=retries,
            preload_content=preload_content,
        )
        log_api_warnings(response.headers)  # e.g. a deprecated API version (api_warnings.py)
        return response


_PROXY_VARIABLES = ("https_proxy", "http_proxy", "all_proxy", "no_proxy")


def _environment_proxy(host: str) -> str | None:
    """The proxy the environment names for ``host`` (``HTTPS_PROXY`` for https://, ``HTTP_PROXY``
    for http://, ``ALL_PROXY``; upper or lower case), None when there is none or ``NO_PROXY``
    names the host: what ``requests`` (Google's clients) decides for the same URL."""
    if not any(os.environ.get(name) or os.environ.get(name.upper()) for name in _PROXY_VARIABLES[:3]):
        return None  # the common case, without loading requests
    # Start-up cost: requests (it comes with Airflow; its rules are the ones the Kubernetes python
    # client applies) loads only when a proxy is configured.
    from requests.utils import get_environ_proxies, select_proxy

    return select_proxy(host, get_environ_proxies(host)) or None


def _configured_proxy(host: str, proxy: str | None, no_proxy: str | None) -> str | None:
    """A client configuration's proxy for ``host`` unless its ``no_proxy`` names the host (as the
    Kubernetes python client's ``RESTClientObject`` decides)."""
    if not proxy:
        return None
    # Start-up cost: requests loads only when a proxy is configured.
    from requests.utils import should_bypass_proxies

    return None if should_bypass_proxies(host, no_proxy=no_proxy or "") else proxy


def _proxy_parts(proxy: str | None, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """``proxy`` / ``proxy_headers`` of an ``ApiServer``: a proxy URL's credentials become a
    ``Proxy-Authorization`` header (neither urllib3 nor a log line should see them in a URL)."""
    if not proxy:
        return {"proxy": None, "proxy_headers": None}
    if "://" not in proxy:
        proxy = "http://" + proxy  # a bare host:port, as curl and requests read it
    parts = urlsplit(proxy)
    merged = dict(headers or {})
    if parts.username is not None:
        basic = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        merged.update(urllib3.util.make_headers(proxy_basic_auth=basic))
        netloc = parts.hostname or ""
        if ":" in netloc:  # IPv6
            netloc = f"[{netloc}]"
        if parts.port:
            netloc += f":{parts.port}"
        proxy = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return {"proxy": proxy.rstrip("/"), "proxy_headers": merged or None}


def _static(value: str | None) -> Callable[[], str | None]:
    return lambda: value


class _GoogleToken:
    """A bearer token from Google credentials, refreshed when it has expired (as the google
    provider's ``GKEClusterConnection`` does). No lock: two threads that find it expired at
    once both refresh it, which costs a token request, never a wrong header."""

    def __init__(self, credentials: Any) -> None:
        self.credentials = credentials

    def __call__(self) -> str:
        if self.credentials.token is None or self.credentials.expired:
            # Start-up cost: google-auth's transport loads only when a GKE token is minted.
            import google.auth.transport.requests

            self.credentials.refresh(google.auth.transport.requests.Request())
        return f"Bearer {self.credentials.token}"


def from_google_credentials(host: str, ca_base64: str | None, credentials: Any) -> ApiServer:
    """A GKE control plane reached as a Google identity; ``ca_base64`` None: a publicly trusted
    certificate (the DNS endpoint)."""
    ca = base64.b64decode(ca_base64).decode() if ca_base64 else None
    token = _GoogleToken(credentials)
    token()  # minted now, in the thread that builds the client: its first users find it valid
    host = host.rstrip("/")
    return ApiServer(host=host, authorization=token, ca_data=ca, **_proxy_parts(_environment_proxy(host)))


class _TokenFile:
    """``tokenFile``: re-read when it changes (a projected service-account token rotates)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.seen: tuple[float, str] | None = None

    def __call__(self) -> str:
        mtime = os.stat(self.path).st_mtime
        if self.seen is None or self.seen[0] != mtime:
            self.seen = (mtime, Path(self.path).read_text().strip())
        return f"Bearer {self.seen[1]}"


_NATIVE_USER_FIELDS = {
    "token",
    "tokenFile",
    "client-certificate",
    "client-certificate-data",
    "client-key",
    "client-key-data",
}
_NATIVE_CLUSTER_FIELDS = {
    "server",
    "certificate-authority",
    "certificate-authority-data",
    "insecure-skip-tls-verify",
    "tls-server-name",
    "proxy-url",
    "extensions",
}


def _named(items: Any, name: str) -> dict[str, Any] | None:
    for item in items or []:
        if isinstance(item, dict) and item.get("name") == name:
            return item
    return None


class _Files:
    """Where a kubeconfig's client certificate and key data are written: ``ssl`` loads them from
    files only. A folder private to this process (mode 0700), removed when it exits."""

    folder: str | None = None

    @classmethod
    def write(cls, data_base64: str, suffix: str) -> str:
        if cls.folder is None:
            cls.folder = tempfile.mkdtemp(prefix="kinetic-kube-")
            atexit.register(shutil.rmtree, cls.folder, True)
        fd, path = tempfile.mkstemp(dir=cls.folder, suffix=suffix)
        with os.fdopen(fd, "wb") as fh:
            fh.write(base64.b64decode(data_base64))
        return path


def _path(value: Any, base: Path | None) -> str:
    """A path in a kubeconfig: a relative one is read from the kubeconfig's folder."""
    path = Path(str(value)).expanduser()
    return str(base / path if not path.is_absolute() and base is not None else path)


def _file_or_data(section: dict[str, Any], key: str, base: Path | None, suffix: str) -> str | None:
    """A kubeconfig ``<key>`` (a path) or ``<key>-data`` (base64, written to a private file)."""
    if section.get(f"{key}-data"):
        return _Files.write(str(section[f"{key}-data"]), suffix)
    return _path(section[key], base) if section.get(key) else None


def from_kubeconfig(
    config: dict[str, Any], context_name: str | None, base: Path | None, *, verify: bool = True
) -> ApiServer | None:
    """The server and user of ``context_name`` (or the current context) of a kubeconfig, or None
    when it needs more than this module reads (exec plugins, auth providers, proxies...)."""
    if not isinstance(config, dict):
        return None
    name = context_name or config.get("current-context")
    context = (_named(config.get("contexts"), str(name)) or {}).get("context") if name else None
    if not isinstance(context, dict):
        return None
    cluster = (_named(config.get("clusters"), str(context.get("cluster"))) or {}).get("cluster")
    user = (_named(config.get("users"), str(context.get("user"))) or {}).get("user") or {}
    if not isinstance(cluster, dict) or not isinstance(user, dict) or not cluster.get("server"):
        return None
    if set(cluster) - _NATIVE_CLUSTER_FIELDS or set(user) - _NATIVE_USER_FIELDS:
        return None
    if not str(cluster.get("proxy-url") or "http").startswith("http"):
        return None  # a SOCKS proxy: the provider's client says what it makes of it
    if user.get("token"):
        authorization: Callable[[], str | None] = _static(f"Bearer {user['token']}")
    elif user.get("tokenFile"):
        authorization = _TokenFile(_path(user["tokenFile"], base))
    else:
        authorization = _static(None)
    ca_data = cluster.get("certificate-authority-data")
    host = str(cluster["server"]).rstrip("/")
    # A kubeconfig's proxy-url is this cluster's proxy, whatever the environment says (as kubectl).
    proxy = str(cluster["proxy-url"]) if cluster.get("proxy-url") else _environment_proxy(host)
    return ApiServer(
        host=host,
        authorization=authorization,
        ca_data=base64.b64decode(str(ca_data)).decode() if ca_data else None,
        ca_file=None if ca_data else _file_or_data(cluster, "certificate-authority", base, ".crt"),
        cert_file=_file_or_data(user, "client-certificate", base, ".crt"),
        key_file=_file_or_data(user, "client-key", base, ".key"),
        verify=verify and not cluster.get("insecure-skip-tls-verify"),
        tls_server_name=str(cluster["tls-server-name"]) if cluster.get("tls-server-name") else None,
        **_proxy_parts(proxy),
    )


def _extra(extras: dict[str, Any], name: str) -> Any:
    """A kubernetes connection's extra field, with or without its old ``extra__kubernetes__`` prefix
    (the cncf provider reads both)."""
    if name in extras:
        return extras[name] or None
    return extras.get(f"extra__kubernetes__{name}") or None


def _truthy(value: Any) -> bool:
    return parse_bool(value) is True


def from_kubernetes_connection(extras: dict[str, Any]) -> ApiServer | None:
    """A kubernetes connection's server when its kubeconfig is one this module reads; None means
    "let the cncf provider's KubernetesHook build it" (every other form, and every error)."""
    path, inline = _extra(extras, "kube_config_path"), _extra(extras, "kube_config")
    if _extra(extras, "in_cluster") or bool(path) == bool(inline):
        return None
    try:
        if path:
            source = Path(str(path)).expanduser()
            config, base = yaml.safe_load(source.read_text()), source.parent
        else:
            config = inline if isinstance(inline, dict) else yaml.safe_load(str(inline))
            base = None
    except (OSError, yaml.YAMLError):
        return None  # the hook reports it, in its own words
    verify = not _truthy(_extra(extras, "disable_verify_ssl"))
    return from_kubeconfig(config, _extra(extras, "cluster_context"), base, verify=verify)


def from_client_configuration(configuration: Any, built_by: str) -> ApiServer:
    """The server a Kubernetes client ``Configuration`` describes; its ``Authorization`` header is
    read through the configuration each time, so the client's own token refresh keeps working."""

    def authorization() -> str | None:
        for setting in configuration.auth_settings().values():  # may refresh the token (blocking)
            if setting.get("in") == "header" and str(setting.get("key")).lower() == "authorization":
                return str(setting.get("value") or "") or None
        return None

    host = str(configuration.host).rstrip("/")
    # The client configuration's proxy (a kubeconfig's proxy-url, or HTTPS_PROXY / HTTP_PROXY as the
    # client read them), its no_proxy and proxy_headers, as the client's own REST layer uses them.
    proxy = _configured_proxy(host, configuration.proxy, getattr(configuration, "no_proxy", None))
    headers = getattr(configuration, "proxy_headers", None) if proxy else None
    return ApiServer(
        host=host,
        authorization=authorization,
        ca_file=configuration.ssl_ca_cert or None,
        cert_file=configuration.cert_file or None,
        key_file=configuration.key_file or None,
        verify=bool(configuration.verify_ssl),
        tls_server_name=getattr(configuration, "tls_server_name", None) or None,
        built_by=built_by,
        **_proxy_parts(proxy, dict(headers) if headers else None),
    )
