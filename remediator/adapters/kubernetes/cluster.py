"""``KubeCluster``: the ``ports.cluster.Cluster`` implementation over kubernetes_asyncio."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.stream import WsApiClient

from remediator.adapters.kubernetes import config as config_mod
from remediator.adapters.kubernetes import convert, streams, transport
from remediator.ports import cluster as port

MERGE_PATCH = "application/merge-patch+json"
_PDB_CAUSE = re.compile(r"disruption budget (?P<name>[a-z0-9][-a-z0-9.]*)", re.IGNORECASE)


class KubeCluster:
    def __init__(
        self, settings: config_mod.KubernetesConfig, configuration: client.Configuration
    ) -> None:
        self.settings = settings
        self._configuration = configuration
        self._api = client.ApiClient(configuration=configuration)
        self._ws: WsApiClient | None = None
        # the generated API classes are typed loosely (bodies are models or dicts): use Any
        self._core: Any = client.CoreV1Api(self._api)
        self._policy: Any = client.PolicyV1Api(self._api)
        self._retrier = transport.Retrier(
            max_seconds=settings.retry_max_seconds, attempts=settings.retry_attempts
        )
        self._timeout = settings.request_timeout

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
        obj = await self._retrier.call(
            f"get node {name}",
            lambda: self._raw_json(self._core.read_node, name),
        )
        return convert.node(obj)

    async def list_nodes(self, label_selector: str = "") -> list[port.NodeInfo]:
        items = await self._list("list nodes", self._core.list_node, label_selector=label_selector)
        return [convert.node(i) for i in items]

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
        extra: dict[str, Any] = {}
        if unschedulable is not None:
            # strategic merge (the default for a dict body), as kubectl cordon does
            body["spec"] = {"unschedulable": True if unschedulable else None}
        else:
            extra["_content_type"] = MERGE_PATCH
        obj = await self._retrier.call(
            f"patch node {name}",
            lambda: self._raw_json(self._core.patch_node, name, body, **extra),
        )
        return convert.node(obj)

    async def replace_node_taints(
        self, name: str, taints: list[port.Taint], *, resource_version: str
    ) -> port.NodeInfo:
        body = {
            "metadata": {"resourceVersion": resource_version},
            "spec": {"taints": [t.as_dict() for t in taints]},
        }
        obj = await self._retrier.call(
            f"replace taints of node {name}",
            lambda: self._raw_json(self._core.patch_node, name, body, _content_type=MERGE_PATCH),
        )
        return convert.node(obj)

    # ---- pods -------------------------------------------------------------------------

    async def _raw_json(self, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """``fn``'s answer as plain JSON, never turned into the client's model objects: a list
        of a thousand nodes cost seconds of CPU as models (and again turned back into dicts),
        blocking the event loop. A non-2xx answer raises the client's ``ApiException``, as a
        call that builds models would."""
        response = await fn(*args, _request_timeout=self._timeout, _preload_content=False, **kwargs)
        try:
            data = await response.read()
        finally:
            response.release()
        if not 200 <= response.status <= 299:
            error = client.ApiException(status=response.status, reason=response.reason)
            error.body = data.decode("utf-8", "replace")
            error.headers = response.headers
            raise error
        found = json.loads(data)
        return found if isinstance(found, dict) else {}

    async def _list(self, what: str, fn: Any, **kwargs: Any) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page_kwargs = dict(kwargs)
            if token:
                page_kwargs["_continue"] = token

            async def fetch(page_kwargs: dict[str, Any] = page_kwargs) -> dict[str, Any]:
                return await self._raw_json(fn, **page_kwargs)

            page = await self._retrier.call(what, fetch)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    async def list_pods(
        self,
        *,
        namespace: str | None = None,
        field_selector: str = "",
        label_selector: str = "",
        page_size: int = 500,
    ) -> list[port.PodInfo]:
        kwargs: dict[str, Any] = {"limit": page_size}
        if field_selector:
            kwargs["field_selector"] = field_selector
        if label_selector:
            kwargs["label_selector"] = label_selector
        if namespace:
            items = await self._list(
                f"list pods in {namespace}",
                lambda **kw: self._core.list_namespaced_pod(namespace, **kw),
                **kwargs,
            )
        else:
            items = await self._list("list pods", self._core.list_pod_for_all_namespaces, **kwargs)
        return [convert.pod(i) for i in items]

    async def get_pod(self, namespace: str, name: str) -> port.PodInfo:
        obj = await self._retrier.call(
            f"get pod {namespace}/{name}",
            lambda: self._raw_json(self._core.read_namespaced_pod, name, namespace),
        )
        return convert.pod(obj)

    async def get_namespace(self, name: str) -> port.NamespaceInfo:
        obj = await self._retrier.call(
            f"get namespace {name}",
            lambda: self._raw_json(self._core.read_namespace, name),
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
                lambda: self._core.create_namespaced_pod_eviction(
                    name, namespace, body, _request_timeout=self._timeout
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
            lambda: self._raw_json(
                self._core.patch_namespaced_pod, name, namespace, body, _content_type=MERGE_PATCH
            ),
        )
        return convert.pod(obj)

    async def create_pod(self, namespace: str, manifest: Mapping[str, Any]) -> port.PodInfo:
        name = str(manifest["metadata"]["name"])
        try:
            obj = await self._retrier.call(
                f"create pod {namespace}/{name}",
                lambda: self._raw_json(self._core.create_namespaced_pod, namespace, dict(manifest)),
            )
        except port.Conflict:  # already there: a retried create that had landed
            return await self.get_pod(namespace, name)
        return convert.pod(obj)

    async def delete_pod(self, namespace: str, name: str) -> None:
        with contextlib.suppress(port.NotFound):
            await self._retrier.call(
                f"delete pod {namespace}/{name}",
                lambda: self._core.delete_namespaced_pod(
                    name, namespace, _request_timeout=self._timeout
                ),
            )

    async def list_pdbs(self, namespace: str | None = None) -> list[port.PdbInfo]:
        if namespace:
            items = await self._list(
                f"list poddisruptionbudgets in {namespace}",
                lambda **kw: self._policy.list_namespaced_pod_disruption_budget(namespace, **kw),
            )
        else:
            items = await self._list(
                "list poddisruptionbudgets",
                self._policy.list_pod_disruption_budget_for_all_namespaces,
            )
        return [convert.pdb(i) for i in items]

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
        name = f"{target.name}.{uuid.uuid4().hex[:16]}"
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
                lambda: self._core.create_namespaced_event(
                    namespace, body, _request_timeout=self._timeout
                ),
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
        core: Any = client.CoreV1Api(self._ws)
        kwargs: dict[str, Any] = {
            "command": list(argv),
            "stderr": True,
            "stdin": False,
            "stdout": True,
            "tty": False,
            "_preload_content": False,
        }
        if container:
            kwargs["container"] = container
        streaming = False

        async def connect() -> aiohttp.ClientWebSocketResponse:
            manager = await core.connect_get_namespaced_pod_exec(pod, namespace, **kwargs)
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
