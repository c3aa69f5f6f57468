"""The Kubernetes adapter: ``ports.cluster.Cluster`` over kubernetes_asyncio.

``connect(KubernetesConfig(...))`` builds a ``KubeCluster`` from in-cluster credentials, a
kubeconfig (path and context) or an explicit URL and token; ``connect_lease`` a Lease for leader
election. This package is the only place that imports kubernetes_asyncio (an import-linter
contract), and only when a cluster is configured: ``KubernetesConfig`` is plain settings and the
client is imported by ``connect`` and ``connect_lease``, through ``library``, which leaves out
its generated API and model classes (~0.6 s and ~37 MB to import, and never used here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from remediator.adapters.kubernetes.config import KubernetesConfig

if TYPE_CHECKING:
    from remediator.adapters.kubernetes.cluster import KubeCluster
    from remediator.adapters.kubernetes.leases import KubeLease

__all__ = ["KubeCluster", "KubernetesConfig", "connect", "connect_lease"]


async def connect(config: KubernetesConfig) -> KubeCluster:
    """A ready client; nothing is requested from the API server until the first call."""
    from remediator.adapters.kubernetes import cluster, credentials

    return cluster.KubeCluster(config, await credentials.client_configuration(config))


async def connect_lease(
    config: KubernetesConfig, *, name: str, namespace: str | None = None
) -> KubeLease:
    """A ``coordination.k8s.io/v1`` Lease with its own API client (closed by ``close``)."""
    from remediator.adapters.kubernetes import leases

    return await leases.connect(config, name=name, namespace=namespace)


def __getattr__(name: str) -> Any:
    # ``KubeCluster`` stays importable from here, loading kubernetes_asyncio on first use.
    if name == "KubeCluster":
        from remediator.adapters.kubernetes import cluster

        return cluster.KubeCluster
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
