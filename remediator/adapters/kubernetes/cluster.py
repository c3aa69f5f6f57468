"""``KubeCluster``: the ``ports.cluster.Cluster`` implementation over kubernetes_asyncio.

Requests go through the client's ``ApiClient`` (its configuration, credentials, TLS and
session; exec through ``kubernetes_asyncio.stream``'s websocket client) with the paths written
here, not through the generated ``CoreV1Api`` and ``PolicyV1Api``: those classes and the models
they name are ~37 MB that the adapter never needs (``library``), and every answer is read as
plain JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, TypeVar

import aiohttp

from remediator.adapters.kubernetes import config as config_mod
from remediator.adapters.kubernetes import convert, informer, library, streams, transport
from remediator.adapters.kubernetes.library import Configuration, WsApiClient
from remediator.ports import cluster as port

T = TypeVar("T")
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
NODES = "/api/v1/nodes"
NODE = "/api/v1/nodes/{name}"
PODS = "/api/v1/pods"
NAMESPACED_PODS = "/api/v1/namespaces/{namespace}/pods"
POD = "/api/v1/namespaces/{namespace}/pods/{name}"
EVICTION = "/api/v1/namespaces/{namespace}/pods/{name}/eviction"
EXEC = "/api/v1/namespaces/{namespace}/pods/{name}/exec"
NAMESPACE = "/api/v1/namespaces/{name}"
EVENTS = "/api/v1/namespaces/{namespace}/events"
PDBS = "/apis/policy/v1/poddisruptionbudgets"
NAMESPACED_PDBS = "/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
_PDB_CAUSE = re.compile(r"disruption budget (?P<name>[a-z0-9][-a-z0-9.]*)", re.IGNORECASE)


#: Items per page of a list (kubectl's ``--chunk-size`` default).
PAGE = 500
#: Nodes per page of the GPU node informer's list. A page is parsed whole before its nodes are
#: made records, and what a record does not keep (status, images, conditions) is freed among
#: what it keeps: with 500-node pages a 5,000-node fleet left the server 19 MB larger, with
#: 100-node pages 11 MB (the API server answers 50 requests instead of 10, once).
NODE_PAGE = 100


class KubeCluster:
    def __init__(self, settings: config_mod.KubernetesConfig, configuration: Configuration) -> None:
        self.settings = settings
        self._configuration = configuration
        self._api = library.api_client(configuration)
        self.page_size = PAGE
        self.node_page_size = NODE_PAGE
        self._ws: WsApiClient | None = None
        self._retrier = transport.Retrier(
            max_seconds=settings.retry_max_seconds, attempts=settings.retry_attempts
        )
        self._timeout = settings.request_timeout
        self._informer: informer.NodeInformer | None = None

    # ---- configuration ----------------------------------------------------------------

    @property
    def gpu_node_selector(self) -> str:
        return self.settings.gpu_node_selector

    @property
    def driver_namespace(self) -> str:
        return self.settings.driver_namespace

    @property
    def driver_selector(self) -> str:
        return self.settings.driver_selector

    @property
    def driver_container(self) -> str:
        return self.settings.driver_container

    def is_gpu_node(self, node: port.NodeInfo) -> bool:
        return port.selector_matches(self.settings.gpu_node_selector, node.labels)

    # ---- nodes ------------------------------------------------------------------------

    async def get_node(self, name: str) -> port.NodeInfo:
        """A GPU node from the watch's cache once ``gpu_fleet`` started it (see ``informer``:
        every write carries a resourceVersion precondition); any other from the API server."""
        if self._informer is not None and (cached := self._informer.get(name)) is not None:
            return cached
        obj = await self._retrier.call(
            f"get node {name}",
            lambda: self._json("GET", NODE, {"name": name}),
        )
        return self._seen(convert.node(obj))

    async def list_nodes(self, label_selector: str = "") -> list[port.NodeInfo]:
        nodes, _ = await self._list(
            "list nodes", NODES, convert.node, label_selector=label_selector
        )
        return nodes

    async def gpu_nodes(self) -> list[port.NodeInfo]:
        """The watch's copies once it has listed the nodes and while it is not failing (a
        fleet view refreshed every few seconds listed 5,000 nodes each time: 0.15 s of the
        loop); a list from the API server otherwise, whose failure the caller shows."""
        if self._informer is not None and (nodes := self._informer.nodes()) is not None:
            return nodes
        return await self.list_nodes(self.settings.gpu_node_selector)

    async def gpu_fleet(self) -> port.GpuFleet | None:
        if self._informer is None:
            selector = self.settings.gpu_node_selector
            self._informer = informer.NodeInformer(
                selector=selector,
                lister=lambda: self._list(
                    "list GPU nodes",
                    NODES,
                    convert.node,
                    label_selector=selector,
                    limit=self.node_page_size,
                ),
                watcher=lambda version: self._watch(NODES, version, label_selector=selector),
            )
        return self._informer.fleet if await self._informer.ready() else None

    def _watch(
        self, path: str, version: str, *, label_selector: str = ""
    ) -> AsyncIterator[dict[str, Any]]:
        query: list[tuple[str, Any]] = [
            ("resourceVersion", version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", informer.WATCH_SECONDS),
        ]
        if label_selector:
            query.append(("labelSelector", label_selector))
        timeout = aiohttp.ClientTimeout(
            sock_connect=self._timeout, sock_read=informer.WATCH_SECONDS + self._timeout
        )
        return library.watch(self._api, path, query=query, timeout=timeout)

    def _seen(self, node: port.NodeInfo) -> port.NodeInfo:
        if self._informer is not None:
            self._informer.observe(node)
        return node

    @contextlib.contextmanager
    def _writing(self, name: str) -> Iterator[None]:
        """Around a write to node ``name``: a conflict shows the cached copy is stale."""
        try:
            yield
        except port.Conflict:
            if self._informer is not None:
                self._informer.forget(name)
            raise

    async def patch_node(
        self,
        name: str,
        *,
        unschedulable: bool | None = None,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> port.NodeInfo:
        meta: dict[str, Any] = {}
        if labels is not None:
            meta["labels"] = dict(labels)
        if annotations is not None:
            meta["annotations"] = dict(annotations)
        if resource_version:
            meta["resourceVersion"] = resource_version
        body: dict[str, Any] = {"metadata": meta} if meta else {}
        patch = MERGE_PATCH
        if unschedulable is not None:
            # strategic merge, as kubectl cordon does
            body["spec"] = {"unschedulable": True if unschedulable else None}
            patch = STRATEGIC_MERGE_PATCH
        with self._writing(name):
            obj = await self._retrier.call(
                f"patch node {name}",
                lambda: self._json("PATCH", NODE, {"name": name}, body=body, content_type=patch),
            )
        return self._seen(convert.node(obj))

    async def replace_node_taints(
        self, name: str, taints: list[port.Taint], *, resource_version: str
    ) -> port.NodeInfo:
        body = {
            "metadata": {"resourceVersion": resource_version},
            "spec": {"taints": [t.as_dict() for t in taints]},
        }
        with self._writing(name):
            obj = await self._retrier.call(
                f"replace taints of node {name}",
                lambda: self._json(
                    "PATCH", NODE, {"name": name}, body=body, content_type=MERGE_PATCH
                ),
            )
        return self._seen(convert.node(obj))

    # ---- pods -------------------------------------------------------------------------

    async def _json(
        self,
        method: str,
        path: str,
        params: Mapping[str, str],
        *,
        query: library.Query = (),
        body: Any = None,
        content_type: str = library.JSON,
    ) -> dict[str, Any]:
        """The answer as plain JSON, never turned into the client's model objects: a list of a
        thousand nodes cost seconds of CPU as models (and again turned back into dicts),
        blocking the event loop. A non-2xx answer raises the client's ``ApiException``."""
        return await library.call_json(
            self._api,
            method,
            path,
            params=params,
            query=query,
            body=body,
            content_type=content_type,
            timeout=self._timeout,
        )

    async def _list(
        self,
        what: str,
        path: str,
        item: Callable[[dict[str, Any]], T],
        params: Mapping[str, str] | None = None,
        *,
        field_selector: str = "",
        label_selector: str = "",
        limit: int | None = None,
    ) -> tuple[list[T], str]:
        """Every item, in pages of ``limit`` (else ``page_size``, as kubectl lists), and the
        list's resourceVersion: one answer for a 5,000-node fleet was a quarter of a second of
        JSON on the event loop, every webhook and step waiting behind it; between pages the
        loop serves them. Each page is made into ``item``s as it arrives, so no more than one
        page of raw JSON objects is held: all 5,800 nodes of a fleet, parsed, kept the
        server's memory 50 MB higher after the first list."""
        items: list[T] = []
        token: str | None = None
        while True:
            query: list[tuple[str, Any]] = [("continue", token)] if token else []
            if field_selector:
                query.append(("fieldSelector", field_selector))
            if label_selector:
                query.append(("labelSelector", label_selector))
            query.append(("limit", limit or self.page_size))

            async def fetch(query: list[tuple[str, Any]] = query) -> dict[str, Any]:
                return await self._json("GET", path, params or {}, query=query)

            page = await self._retrier.call(what, fetch)
            items.extend(item(obj) for obj in page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return items, str(meta.get("resourceVersion") or "")

    async def list_pods(
        self,
        *,
        namespace: str | None = None,
        field_selector: str = "",
        label_selector: str = "",
        page_size: int = PAGE,
    ) -> list[port.PodInfo]:
        if namespace:
            pods, _ = await self._list(
                f"list pods in {namespace}",
                NAMESPACED_PODS,
                convert.pod,
                {"namespace": namespace},
                field_selector=field_selector,
                label_selector=label_selector,
                limit=page_size,
            )
        else:
            pods, _ = await self._list(
                "list pods",
                PODS,
                convert.pod,
                field_selector=field_selector,
                label_selector=label_selector,
                limit=page_size,
            )
        return pods

    async def get_pod(self, namespace: str, name: str) -> port.PodInfo:
        obj = await self._retrier.call(
            f"get pod {namespace}/{name}",
            lambda: self._json("GET", POD, {"namespace": namespace, "name": name}),
        )
        return convert.pod(obj)

    async def get_namespace(self, name: str) -> port.NamespaceInfo:
        obj = await self._retrier.call(
            f"get namespace {name}",
            lambda: self._json("GET", NAMESPACE, {"name": name}),
        )
        return convert.namespace(obj)

    async def evict_pod(
        self, namespace: str, name: str, *, grace_period_seconds: int | None = None
    ) -> port.EvictionResult:
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if grace_period_seconds is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_period_seconds}

        def retryable(e: BaseException) -> bool:
            if transport.is_pdb_refusal(e) or transport.is_multiple_budgets(e):
                return False
            return transport.is_transient(e)

        try:
            await self._retrier.call(
                f"evict pod {namespace}/{name}",
                lambda: self._json(
                    "POST", EVICTION, {"namespace": namespace, "name": name}, body=body
                ),
                retryable=retryable,
            )
        except port.NotFound as e:
            return port.EvictionResult(outcome=port.EvictionOutcome.GONE, message=str(e))
        except port.TooManyRequests as e:
            cause = e.__cause__
            if cause is None or not transport.is_pdb_refusal(cause):
                raise
            return _blocked(cause, e)
        except port.Unavailable as e:
            if e.__cause__ is None or not transport.is_multiple_budgets(e.__cause__):
                raise
            return port.EvictionResult(
                outcome=port.EvictionOutcome.ERROR, message=str(e), status=500
            )
        return port.EvictionResult(outcome=port.EvictionOutcome.EVICTED)

    async def annotate_pod(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> port.PodInfo:
        body = {"metadata": {"annotations": dict(annotations)}}
        obj = await self._retrier.call(
            f"annotate pod {namespace}/{name}",
            lambda: self._json(
                "PATCH",
                POD,
                {"namespace": namespace, "name": name},
                body=body,
                content_type=MERGE_PATCH,
            ),
        )
        return convert.pod(obj)

    async def create_pod(self, namespace: str, manifest: Mapping[str, Any]) -> port.PodInfo:
        name = str(manifest["metadata"]["name"])
        try:
            obj = await self._retrier.call(
                f"create pod {namespace}/{name}",
                lambda: self._json(
                    "POST", NAMESPACED_PODS, {"namespace": namespace}, body=dict(manifest)
                ),
            )
        except port.Conflict:  # already there: a retried create that had landed
            return await self.get_pod(namespace, name)
        return convert.pod(obj)

    async def delete_pod(self, namespace: str, name: str) -> None:
        with contextlib.suppress(port.NotFound):
            await self._retrier.call(
                f"delete pod {namespace}/{name}",
                lambda: self._json("DELETE", POD, {"namespace": namespace, "name": name}),
            )

    async def list_pdbs(self, namespace: str | None = None) -> list[port.PdbInfo]:
        if namespace:
            pdbs, _ = await self._list(
                f"list poddisruptionbudgets in {namespace}",
                NAMESPACED_PDBS,
                convert.pdb,
                {"namespace": namespace},
            )
        else:
            pdbs, _ = await self._list("list poddisruptionbudgets", PDBS, convert.pdb)
        return pdbs

    async def find_driver_pod(
        self, node: str, *, namespace: str | None = None, selector: str | None = None
    ) -> port.PodInfo | None:
        pods = await self.list_pods(
            namespace=namespace or self.settings.driver_namespace,
            label_selector=selector or self.settings.driver_selector,
            field_selector=f"spec.nodeName={node}",
        )
        running = [p for p in pods if p.phase == "Running" and p.deletion_timestamp is None]
        return running[0] if running else None

    # ---- events -----------------------------------------------------------------------

    async def create_event(
        self, *, target: port.ObjectRef, reason: str, message: str, type: str = "Normal"
    ) -> str:
        namespace = target.namespace or self.settings.event_namespace
        # client-go names events this way; uuid4 (a urandom read) was 4% of a storm's CPU
        name = f"{target.name}.{time.time_ns():x}"
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        involved: dict[str, Any] = {
            "apiVersion": target.api_version,
            "kind": target.kind,
            "name": target.name,
        }
        if target.namespace:
            involved["namespace"] = target.namespace
        if target.uid:
            involved["uid"] = target.uid
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": type,
            "source": {"component": self.settings.remediator_name},
            "reportingComponent": self.settings.remediator_name,
            "reportingInstance": self.settings.remediator_name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        # a retried create that had already landed answers 409: same name, same event
        with contextlib.suppress(port.Conflict):
            await self._retrier.call(
                f"create event on {target.kind.lower()} {target.name}",
                lambda: self._json("POST", EVENTS, {"namespace": namespace}, body=body),
            )
        return name

    # ---- exec -------------------------------------------------------------------------

    async def exec(
        self,
        *,
        namespace: str,
        pod: str,
        container: str | None,
        argv: list[str],
        timeout: float,
        idempotent: bool = False,
    ) -> port.ExecResult:
        if not argv:
            raise ValueError("exec needs a non-empty argv")
        what = f"exec {argv[0]} in {namespace}/{pod}"
        if self._ws is None:
            self._ws = WsApiClient(configuration=self._configuration)
        api = self._ws
        # the websocket client sends each word of ``command`` as its own parameter
        query: list[tuple[str, Any]] = [("command", list(argv))]
        if container:
            query.append(("container", container))
        query += [("stderr", True), ("stdin", False), ("stdout", True), ("tty", False)]
        streaming = False

        async def connect() -> aiohttp.ClientWebSocketResponse:
            manager = await library.call(
                api,
                "GET",
                EXEC,
                params={"namespace": namespace, "name": pod},
                query=query,
                accept="*/*",
            )
            ws: aiohttp.ClientWebSocketResponse = await manager
            return ws

        async def once() -> port.ExecResult:
            nonlocal streaming
            streaming = False
            ws = await self._retrier.call(what, connect)
            streaming = True
            try:
                return await streams.read_frames(ws, what)
            finally:
                await ws.close()

        def interrupted(e: BaseException) -> bool:
            return idempotent and isinstance(e, port.ExecInterrupted)

        try:
            async with asyncio.timeout(timeout):
                return await self._retrier.call(what, once, retryable=interrupted)
        except TimeoutError as e:
            if not streaming:  # never reached the container: nothing can be running
                raise port.Unavailable(f"{what}: no connection within {timeout:g}s") from e
            raise port.ExecTimedOut(f"{what}: no result after {timeout:g}s") from e

    async def close(self) -> None:
        if self._informer is not None:
            await self._informer.close()
        await self._api.close()
        if self._ws is not None:
            await self._ws.close()


def _blocked(cause: BaseException, error: port.ClusterError) -> port.EvictionResult:
    body = transport.body_of(cause)
    causes = (body.get("details") or {}).get("causes") or []
    details = [str(c.get("message", "")) for c in causes if isinstance(c, dict)]
    pdb = None
    for text in details:
        match = _PDB_CAUSE.search(text)
        if match:
            pdb = match["name"]
            break
    message = str(body.get("message") or error)
    if details:
        message = f"{message} ({'; '.join(d for d in details if d)})"
    return port.EvictionResult(
        outcome=port.EvictionOutcome.BLOCKED,
        message=message,
        pdb=pdb,
        status=429,
        retry_after=error.retry_after,
    )
