"""race_bench's ``--transports kubernetes``: the GKE backend's kubeconfig connections built by the
kubernetes python client instead of ``backends/gke/transport.py``'s own kubeconfig reader.

Put on PYTHONPATH of every Airflow process, this module (loaded by ``site`` at start-up) swaps
``transport.from_kubernetes_connection`` for one that loads the kubeconfig with
``kubernetes.config.load_kube_config`` into a ``kubernetes.client.Configuration`` and serves it
through ``transport.from_client_configuration``: each process that reaches the cluster then pays
what adopting the client costs (importing ``kubernetes.client`` and its kubeconfig loader, building
its configuration), while requests still go through one urllib3 pool, as the client's own
``RESTClientObject`` sends them. The product is unchanged; only a benchmark loads this.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys

_TARGET = "kinetic_airflow.backends.gke.transport"


def _patch(module) -> None:
    def from_kubernetes_connection(extras):
        path = extras.get("kube_config_path")
        if not path:
            return None
        import kubernetes.client
        import kubernetes.config.kube_config as kube_config

        configuration = kubernetes.client.Configuration()
        kube_config.load_kube_config(
            config_file=str(path),
            context=extras.get("cluster_context"),
            client_configuration=configuration,
            persist_config=False,
        )
        # Seen in the task logs: proof that the run used the client (race_bench counts the lines).
        logging.getLogger(__name__).warning("race_bench: connection built by the kubernetes client")
        return module.from_client_configuration(configuration, built_by="kubernetes")

    module.from_kubernetes_connection = from_kubernetes_connection


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchOnImport())
