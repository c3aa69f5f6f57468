"""``pods/exec`` over websockets (channel.k8s.io protocols) and SPDY/3.1 (old kubectl).

Websocket frames are ``<channel byte><payload>``: 0 stdin, 1 stdout, 2 stderr, 3 error/status,
4 resize. With ``v4``/``v5.channel.k8s.io`` channel 3 carries a JSON ``metav1.Status``; with
the older protocols it carries the error text only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp
from aiohttp import web

from remediator.sim import cluster as cluster_mod
from remediator.sim import commands, errors, faults, kubelet, spdy

PROTOCOLS = (
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
)
STATUS_PROTOCOLS = {"v5.channel.k8s.io", "v4.channel.k8s.io"}
ERROR_CHANNEL = 3


def prepare(
    cluster: cluster_mod.Cluster, request: web.Request, ns: str, name: str
) -> tuple[commands.Context, list[str]]:
    """Validate like the apiserver does before upgrading; return the exec context and argv."""
    pod = cluster.store.get("pods", ns, name)
    if pod is None:
        raise errors.not_found("pods", name)
    containers = [c["name"] for c in pod["spec"].get("containers", [])]
    container = request.query.get("container")
    if not container:
        if len(containers) != 1:
            raise errors.ApiError(
                400,
                f"a container name must be specified for pod {name}, "
                f"choose one of: [{' '.join(containers)}]",
            )
        container = containers[0]
    if container not in containers:
        raise errors.ApiError(400, f"container {container} is not valid for pod {name}")
    if not pod["spec"].get("nodeName"):
        raise errors.ApiError(400, f"pod {name} does not have a host assigned")
    if pod.get("status", {}).get("phase") != "Running":
        raise errors.ApiError(
            400, f'unable to upgrade connection: container not found ("{container}")'
        )
    argv = request.query.getall("command", [])
    if not argv:
        raise errors.ApiError(400, "you must specify at least 1 command")
    node = pod["spec"]["nodeName"]
    root = None if commands.is_driver_pod(pod) else commands.host_root_mount(pod, container)
    host = cluster.hosts.get(node) if commands.is_driver_pod(pod) else None
    if root is not None and driver_on_host(cluster, node):
        host = cluster.hosts.get(node)
    files = cluster.files.setdefault(pod["metadata"]["uid"], {})
    ctx = commands.Context(
        pod=pod,
        container=container,
        host=host,
        files=files,
        bug_report_seconds=cluster.scaled(cluster.settings.bug_report_seconds),
        mutations=cluster.mutations,
        host_files=(lambda path: kubelet.host_file(cluster, node, path)) if host else None,
        host_root=root,
    )
    return ctx, argv


def driver_on_host(cluster: cluster_mod.Cluster, node: str) -> bool:
    obj = cluster.store.get("nodes", "", node)
    labels = (obj or {}).get("metadata", {}).get("labels") or {}
    return labels.get(commands.DRIVER_DEPLOY_LABEL) == commands.PRE_INSTALLED


async def handle(
    request: web.Request, cluster: cluster_mod.Cluster, ns: str, name: str
) -> web.StreamResponse:
    ctx, argv = prepare(cluster, request, ns, name)
    record = cluster_mod.ExecRecord(
        namespace=ns,
        pod=name,
        node=ctx.pod["spec"]["nodeName"],
        container=ctx.container,
        argv=argv,
        transport="",
    )
    upgrade = request.headers.get("Upgrade", "").lower()
    if upgrade == "websocket":
        cluster.exec_log.append(record)
        return await handle_websocket(request, ctx, record)
    if upgrade.startswith("spdy/3"):
        cluster.exec_log.append(record)
        return await spdy.handle(request, ctx, record)
    raise errors.ApiError(400, "Upgrade request required", reason="BadRequest")


async def handle_websocket(
    request: web.Request, ctx: commands.Context, record: cluster_mod.ExecRecord
) -> web.StreamResponse:
    argv = record.argv
    ws = web.WebSocketResponse(protocols=PROTOCOLS, autoping=True)
    await ws.prepare(request)
    protocol = ws.ws_protocol or "v4.channel.k8s.io"
    record.transport = f"websocket:{protocol}"
    if faults.should_drop_websocket(request):
        record.dropped = "before"
        await ws.close(code=aiohttp.WSCloseCode.INTERNAL_ERROR, message=b"dropped")
        return ws

    async def emit(channel: int, data: bytes) -> None:
        if not ws.closed:
            await ws.send_bytes(bytes([channel]) + data)

    async def run() -> int:
        return await commands.run(ctx, argv, emit)

    task = asyncio.ensure_future(run())
    reader = asyncio.ensure_future(_drain(ws))
    done, _ = await asyncio.wait({task, reader}, return_when=asyncio.FIRST_COMPLETED)
    if task not in done:  # the client went away first
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return ws
    rc = record.exit_code = task.result()
    if faults.should_drop_websocket_after(request):
        # The command ran (its effect is in place, its output sent) but the client never
        # learns how it ended: the stream closes where the exit status would come.
        record.dropped = "after"
        await ws.close(code=aiohttp.WSCloseCode.INTERNAL_ERROR, message=b"dropped")
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        return ws
    if protocol in STATUS_PROTOCOLS:
        await emit(ERROR_CHANNEL, json.dumps(commands.status_for(argv, rc)).encode())
    elif rc != 0:
        await emit(ERROR_CHANNEL, commands.status_for(argv, rc)["message"].encode())
    await ws.close()
    reader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reader
    return ws


async def _drain(ws: web.WebSocketResponse) -> None:
    async for _ in ws:
        pass  # stdin, resize and the v5 close signal are accepted and ignored
