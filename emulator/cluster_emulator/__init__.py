"""Local Kubernetes cluster emulator for tests: a real HTTP API server that runs pods as processes.

It speaks enough of the Kubernetes API for the official ``kubernetes`` client,
``kubernetes_asyncio``, Airflow's ``KubernetesHook``/``AsyncKubernetesHook``
and ``kubectl get``: discovery, namespaces, Pods (status, logs), Jobs,
Events, LeaderWorkerSets, selectors, watch, patch and cascading delete. Each
pod's container ``command`` + ``args`` really run as local subprocesses with
the container ``env``, so a submitted Job really executes. Faults (preemption,
OOM kills, image pull errors, node scale-up delays, API errors, dropped
watches) can be injected from Python or over ``/_emulator`` HTTP.

Entry points:

* :class:`ClusterEmulator` - in-process (background thread), context manager.
* ``python -m cluster_emulator --port 0 --kubeconfig PATH`` - separate process.
* :mod:`cluster_emulator.fixtures` - pytest fixtures ``k8s_cluster`` etc.
"""

from __future__ import annotations

from ._wait import wait_until
from .emulator import ClusterEmulator, EmulatorAdminClient
from .faults import RequestLog, RequestRecord
from .kubeconfig import kubeconfig_dict, write_kubeconfig
from .nodes import NodePool, Taint, default_node_pools
from .validation import K8S_VERSION, lws_schema_path

__all__ = [
    "K8S_VERSION",
    "ClusterEmulator",
    "EmulatorAdminClient",
    "NodePool",
    "RequestLog",
    "RequestRecord",
    "Taint",
    "default_node_pools",
    "kubeconfig_dict",
    "lws_schema_path",
    "wait_until",
    "write_kubeconfig",
]
