"""The benchmarks' stopwatch outside the process: a watch on the simulator's nodes that notes
when each node is first seen cordoned (``spec.unschedulable``), the first Kubernetes effect of
the benchmark playbook."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable

import aiohttp

from bench import world


class NodeWatch:
    def __init__(self) -> None:
        self.cordoned: dict[str, float] = {}  # node -> time.monotonic() first seen cordoned
        self.changed = asyncio.Event()
        self.ready = asyncio.Event()

    def _see(self, event: dict[str, object]) -> None:
        obj = event.get("object")
        if not isinstance(obj, dict) or event.get("type") not in ("ADDED", "MODIFIED"):
            return
        name = obj.get("metadata", {}).get("name")
        if obj.get("spec", {}).get("unschedulable") and name not in self.cordoned:
            self.cordoned[name] = time.monotonic()
            self.changed.set()

    async def wait_for(self, nodes: set[str], timeout: float) -> None:
        """Until every node of ``nodes`` was seen cordoned, or ``timeout`` seconds."""
        await self._until(lambda: nodes <= self.cordoned.keys(), timeout)

    async def wait_for_one_more(self, known: Iterable[str], timeout: float) -> None:
        """Until a node not in ``known`` was seen cordoned, or ``timeout`` seconds."""
        known = set(known)
        await self._until(lambda: not self.cordoned.keys() <= known, timeout)

    async def _until(self, done: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 1.0))


async def _follow(session: aiohttp.ClientSession, sim: world.Sim, seen: NodeWatch) -> None:
    async with session.get(f"{sim.url}/api/v1/nodes", headers=sim.headers) as answer:
        listed = await answer.json()
    for node in listed["items"]:
        seen._see({"type": "ADDED", "object": node})
    version = listed["metadata"]["resourceVersion"]
    query = {"watch": "true", "resourceVersion": version}
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with session.get(
        f"{sim.url}/api/v1/nodes", params=query, headers=sim.headers, timeout=timeout
    ) as answer:
        seen.ready.set()
        async for line in answer.content:
            if line.strip():
                seen._see(json.loads(line))


@contextlib.asynccontextmanager
async def nodes(sim: world.Sim) -> AsyncIterator[NodeWatch]:
    """Watch the simulator's nodes for the ``async with`` block."""
    seen = NodeWatch()
    connector = aiohttp.TCPConnector(ssl=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        task = asyncio.create_task(_follow(session, sim, seen))
        try:
            await asyncio.wait_for(seen.ready.wait(), 120)
            yield seen
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                await task
