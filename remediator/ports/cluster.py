"""The Kubernetes cluster as the actions see it (implemented by ``adapters.kubernetes``).

Only the adapter knows kubernetes_asyncio; actions speak in these plain records, so they are
tested against the simulator through the real client and, in unit tests, against fakes of this
port.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExecResult:
    stdout: bytes
    stderr: bytes
    exit_code: int | None
    status: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeInfo:
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    taints: list[dict[str, Any]]
    unschedulable: bool
    resource_version: str


class Cluster(Protocol):
    async def get_node(self, name: str) -> NodeInfo: ...

    async def list_nodes(self, label_selector: str = "") -> list[NodeInfo]: ...

    async def exec(
        self, *, namespace: str, pod: str, container: str | None, argv: list[str], timeout: float
    ) -> ExecResult: ...

    async def close(self) -> None: ...
