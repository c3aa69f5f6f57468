"""The GPU nodes, listed once and then watched, as a Kubernetes informer keeps them.

One paged list, then a watch from the list's resourceVersion (with bookmarks): every event
updates the cached nodes and the ``GpuFleet`` the guards count, so a label change reaches the
guards as it happens and nothing lists the fleet again (listing 5,800 nodes every 10 s cost
~150 ms of CPU each time, on the loop every alert waits on). A watch that ends (its
``timeoutSeconds``, an API server restart, a dropped connection) resumes from the last
resourceVersion seen; ``410 Expired`` (that version left the server's history) lists again.
Failures back off from 1 s to 30 s; meanwhile the cache is what was last seen, as a
client-go informer's is.

The cache also answers ``get_node`` for a GPU node: the actions write with a
resourceVersion precondition, so a copy a few milliseconds old costs at worst a 409 and a
fresh read (the adapter forgets a node whose write conflicted), and the node's own writes
are put in the cache as they are answered (read-your-writes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from remediator.adapters.kubernetes import convert
from remediator.ports import cluster as port

logger = logging.getLogger("remediator.adapters.kubernetes")

Obj = dict[str, Any]
#: How long one watch request lasts before it is made again (the API server's default
#: ``--min-request-timeout`` is 1,800 s; client-go picks 5 to 10 min).
WATCH_SECONDS = 300
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 30.0

Lister = Callable[[], Awaitable[tuple[list[port.NodeInfo], str]]]
"""Every matching node and the list's resourceVersion."""
Watcher = Callable[[str], AsyncIterator[Obj]]
"""The watch events from a resourceVersion (``{"type": ..., "object": ...}``), until the
server ends the watch."""


class Expired(Exception):
    """The watch's resourceVersion is no longer in the server's history: list again."""


def newer(candidate: str, current: str) -> bool:
    """Is ``candidate`` a later resourceVersion than ``current``? Versions are opaque to
    clients, but every API server built on etcd hands out its revision, an integer; anything
    else is taken as newer (the later answer wins)."""
    try:
        return int(candidate) >= int(current)
    except ValueError:
        return True


class NodeInformer:
    def __init__(self, *, selector: str, lister: Lister, watcher: Watcher) -> None:
        self.selector = selector
        self._lister = lister
        self._watcher = watcher
        self._nodes: dict[str, port.NodeInfo] = {}
        self.fleet = port.GpuFleet()
        self.synced = False
        self.failing = False  # the last list or watch failed; the cache is what was last seen
        self._attempted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def ready(self) -> bool:
        """Start watching (once); wait for the first list to succeed or fail. True once the
        nodes were ever listed."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="gpu-node-watch")
        await self._attempted.wait()
        return self.synced

    def get(self, name: str) -> port.NodeInfo | None:
        return self._nodes.get(name) if self.synced else None

    def nodes(self) -> list[port.NodeInfo] | None:
        """Every cached node, while the cache is current (listed, and neither the list nor
        the watch failing since); ``None`` otherwise."""
        return list(self._nodes.values()) if self.synced and not self.failing else None

    def observe(self, node: port.NodeInfo) -> None:
        """A node as the API server just answered it (a read or a write of ours): kept if it
        is a GPU node newer than the cached copy."""
        if not self.synced:
            return
        if not port.selector_matches(self.selector, node.labels):
            self._drop(node.name)
            return
        cached = self._nodes.get(node.name)
        if cached is None or newer(node.resource_version, cached.resource_version):
            self._keep(node)

    def forget(self, name: str) -> None:
        """The cached copy is known stale (a write conflicted): the next read goes to the
        API server, until the watch brings the node again."""
        self._nodes.pop(name, None)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ---- the loop ---------------------------------------------------------------------

    async def _run(self) -> None:
        version: str | None = None
        failures = 0
        loop = asyncio.get_running_loop()
        while True:
            try:
                if version is None:
                    version = await self._list()
                started = loop.time()
                version = await self._watch(version)
                failures = 0
                if loop.time() - started < FIRST_BACKOFF:
                    await asyncio.sleep(FIRST_BACKOFF)  # a server ending watches at once
            except Expired:
                version = None
            except Exception as e:  # anything: the cache stays, the loop tries again
                self._attempted.set()
                self.failing = True
                failures += 1
                delay = min(FIRST_BACKOFF * 2 ** (failures - 1), MAX_BACKOFF)
                log = logger.warning if failures == 1 else logger.debug
                log(
                    "GPU node watch failed (%s); the nodes last seen stay in use (none: the "
                    "percentage budget is not applied); again in %.0f s",
                    e,
                    delay,
                )
                await asyncio.sleep(delay)

    async def _list(self) -> str:
        nodes, version = await self._lister()
        self._nodes = {node.name: node for node in nodes}
        self.fleet.replace({node.name: node.labels for node in nodes})
        self.synced = True
        self.failing = False
        self._attempted.set()
        return version

    async def _watch(self, version: str) -> str:
        """Apply events until the server ends the watch; the last resourceVersion seen."""
        async for event in self._watcher(version):
            self.failing = False  # the watch answers again
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Expired(obj.get("message", "resource version expired"))
                raise port.ClusterError(f"node watch: {obj.get('message') or obj}")
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if kind in ("ADDED", "MODIFIED"):
                node = convert.node(obj)
                cached = self._nodes.get(node.name)
                if cached is None or newer(node.resource_version, cached.resource_version):
                    self._keep(node)
            elif kind == "DELETED":
                self._drop(str((obj.get("metadata") or {}).get("name") or ""))
            # BOOKMARK: only its resourceVersion
        self.failing = False  # ended as watches do (its timeoutSeconds)
        return version

    def _keep(self, node: port.NodeInfo) -> None:
        self._nodes[node.name] = node
        self.fleet.put(node.name, node.labels)

    def _drop(self, name: str) -> None:
        self._nodes.pop(name, None)
        self.fleet.remove(name)
