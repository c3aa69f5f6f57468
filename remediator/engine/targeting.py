"""Confirming an alert's node candidates against the cluster (see ``domain.targeting``).

Cost per alert is a few single-object reads, never a fleet scan: ``get_node`` per candidate
host, one ``list_pods`` with ``fieldSelector=status.podIP=<ip>`` for an IP, one ``get_pod`` for
a pod name. Answers (found and not found alike) are cached for ``ttl`` seconds, so a burst of
alerts from one node (eight GPUs, several rules) asks once.

A cluster that cannot answer (``ClusterError.temporary`` after the adapter's own retries) is
not a refusal: ``TargetUnavailable`` propagates and the engine leaves the episode for a later
pass, failing it with that reason only once it has waited ``EngineSettings.targeting_wait``.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from remediator.domain import errors, targeting
from remediator.ports import cluster as port

_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class TargetUnavailable(errors.RemediatorError):
    """The cluster could not say whether a candidate is a Node; try again later."""

    code = "target_unavailable"


@dataclasses.dataclass
class NodeResolver:
    cluster: port.Cluster
    ttl: float = 30.0
    monotonic: Callable[[], float] = time.monotonic
    _cache: dict[tuple[str, ...], tuple[float, Any]] = dataclasses.field(default_factory=dict)

    async def choose(self, labels: dict[str, str], order: Sequence[str]) -> targeting.Choice:
        found = []
        for candidate in targeting.candidates(labels, order):
            finding = await self.find(candidate)
            found.append((candidate, finding))
            if finding.node:
                break
        return targeting.choose(order, found)

    async def find(self, candidate: targeting.Candidate) -> targeting.Finding:
        host = candidate.host
        if _is_name(host) and await self._node_exists(host):
            return targeting.Finding(node=host, detail="is a Node")
        ip = candidate.ip
        if ip is not None:
            return await self._by_ip(ip)
        if candidate.namespace and _is_name(host):
            return await self._by_pod(candidate.namespace, host)
        why = "is not a Node" if _is_name(host) else "is neither a Node name nor an IP"
        return targeting.Finding(node=None, detail=why)

    async def _node_exists(self, name: str) -> bool:
        async def read() -> bool:
            try:
                await self.cluster.get_node(name)
            except port.NotFound:
                return False
            return True

        exists: bool = await self._cached(("node", name), read)
        return exists

    async def _by_ip(self, ip: str) -> targeting.Finding:
        async def read() -> list[port.PodInfo]:
            return await self.cluster.list_pods(field_selector=f"status.podIP={ip}")

        pods: list[port.PodInfo] = await self._cached(("ip", ip), read)
        live = [p for p in pods if p.node_name and p.phase not in _TERMINAL_PHASES]
        nodes = sorted({p.node_name for p in live if p.node_name})
        if not nodes:
            return targeting.Finding(node=None, detail=f"no running pod has IP {ip}")
        if len(nodes) > 1:
            return targeting.Finding(
                node=None, detail=f"pods with IP {ip} run on several nodes ({', '.join(nodes)})"
            )
        names = ", ".join(sorted(p.key for p in live))
        return await self._confirmed(nodes[0], f"IP {ip} is pod {names} on node {nodes[0]}")

    async def _by_pod(self, namespace: str, name: str) -> targeting.Finding:
        async def read() -> port.PodInfo | None:
            try:
                return await self.cluster.get_pod(namespace, name)
            except port.NotFound:
                return None

        pod: port.PodInfo | None = await self._cached(("pod", namespace, name), read)
        if pod is None:
            return targeting.Finding(node=None, detail=f"is not a Node nor a pod in {namespace}")
        if not pod.node_name:
            return targeting.Finding(node=None, detail=f"is pod {pod.key}, not on a node yet")
        return await self._confirmed(pod.node_name, f"is pod {pod.key} on node {pod.node_name}")

    async def _confirmed(self, node: str, detail: str) -> targeting.Finding:
        if await self._node_exists(node):
            return targeting.Finding(node=node, detail=detail)
        return targeting.Finding(node=None, detail=f"{detail}, which is not a Node")

    async def _cached(self, key: tuple[str, ...], read: Callable[[], Awaitable[Any]]) -> Any:
        now = self.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            value = await read()
        except port.ClusterError as e:
            # Temporary or not (a Forbidden read needs RBAC fixed), the cluster did not say:
            # the episode waits, then fails with this reason.
            raise TargetUnavailable(f"cannot ask the cluster about {key[-1]}: {e}") from e
        if len(self._cache) > 4096:
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
        self._cache[key] = (now + self.ttl, value)
        return value


_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _is_name(value: str) -> bool:
    """A possible Node or pod name (DNS-1123 subdomain): anything else is never looked up."""
    return len(value) <= 253 and _NAME.fullmatch(value) is not None
