"""The Kubernetes adapter: ``ports.cluster.Cluster`` over kubernetes_asyncio.

``connect(KubernetesConfig(...))`` builds a ``KubeCluster`` from in-cluster credentials, a
kubeconfig (path and context) or an explicit URL and token. This package is the only place that
imports kubernetes_asyncio (an import-linter contract).
"""

from __future__ import annotations

from remediator.adapters.kubernetes.cluster import KubeCluster
from remediator.adapters.kubernetes.config import KubernetesConfig, client_configuration

__all__ = ["KubeCluster", "KubernetesConfig", "connect"]


async def connect(config: KubernetesConfig) -> KubeCluster:
    """A ready client; nothing is requested from the API server until the first call."""
    return KubeCluster(config, await client_configuration(config))
