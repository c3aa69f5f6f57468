"""Operations: the typed use cases the HTTP API and the console call (and, through the API,
the CLI), between them and the engine's state.

``fleet_status`` joins what the cluster lists (GPU nodes, their labels, taints and cordons)
with what the store records (runs, disruptions, held steps, power caps, the breaker); without
a cluster, or when listing fails, the store's view is shown alone and the failure named.
``reset_breaker`` closes the breaker with the principal and comment in the audit trail and
wakes the engine so held steps are looked at again at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from remediator.domain import errors, fleet, guards
from remediator.engine import guarding
from remediator.ports import cluster, store
from remediator.ports import fleet as fleet_port


@dataclasses.dataclass(frozen=True, kw_only=True)
class Operations:
    store: store.Store
    records: fleet_port.FleetRecords
    cluster: Callable[[], cluster.Cluster | None]  # connected at start-up: asked each time
    guards: guards.GuardConfig
    wake: Callable[[], None] = lambda: None

    async def fleet_status(self) -> fleet.FleetStatus:
        listed, failure = await self._nodes()
        records = await self.records.fleet_records()
        return fleet.assemble(listed, records, config=self.guards, cluster_error=failure)

    async def _nodes(self) -> tuple[list[fleet.ClusterNode] | None, str | None]:
        found = self.cluster()
        if found is None:
            return None, None
        try:
            nodes = await found.list_nodes(found.gpu_node_selector)
        except errors.RemediatorError as e:
            return None, f"cannot list GPU nodes: {e}"
        return [
            fleet.ClusterNode(
                name=node.name,
                labels=dict(node.labels),
                taints=tuple(taint.key for taint in node.taints),
                unschedulable=node.unschedulable,
                ready=node.ready,
            )
            for node in nodes
        ], None

    async def reset_breaker(self, *, principal: str, comment: str) -> dict[str, Any]:
        state = await self.store.run(
            "breaker.reset",
            lambda tx: guarding.reset_breaker(tx, principal=principal, comment=comment),
        )
        self.wake()
        return dict(state)
