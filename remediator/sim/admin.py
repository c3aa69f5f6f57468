"""Admin endpoints under ``/sim/v1``: GPU state, node flags, settings, faults, state, reset, the
mutation log, the exec sessions, the API requests served, and out-of-band node reboots and
driver upgrades."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pydantic
from aiohttp import web

from remediator.sim import api, errors, faults, fleet, mutations, nvidia, reboots, upgrades

GPU_FIELDS = {f.name for f in dataclasses.fields(nvidia.Gpu)} - {"index"}


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(body, indent=1), status=status, content_type="application/json"
    )


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.read() or b"{}")
    except ValueError as e:
        raise errors.ApiError(400, f"invalid JSON body: {e}") from e
    if not isinstance(body, dict):
        raise errors.ApiError(400, "the request body must be an object")
    return body


def _gpu(request: web.Request) -> nvidia.Gpu:
    cluster = request.app[api.CLUSTER]
    node = request.match_info["node"]
    try:
        index = int(request.match_info["index"])
    except ValueError as e:
        raise errors.ApiError(400, "GPU index must be an integer") from e
    gpu = cluster.gpu(node, index)
    if gpu is None:
        raise errors.ApiError(404, f"GPU {index} not found on node {node}")
    return gpu


async def list_gpus(request: web.Request) -> web.Response:
    cluster = request.app[api.CLUSTER]
    host = cluster.hosts.get(request.match_info["node"])
    if host is None:
        raise errors.ApiError(404, f"node {request.match_info['node']} has no GPUs")
    return _json(
        {
            "driver_version": host.driver_version,
            "bug_report_hangs": host.bug_report_hangs,
            "gpus": [dataclasses.asdict(g) for g in host.gpus],
        }
    )


async def get_gpu(request: web.Request) -> web.Response:
    return _json(dataclasses.asdict(_gpu(request)))


async def patch_gpu(request: web.Request) -> web.Response:
    gpu = _gpu(request)
    body = await _body(request)
    unknown = set(body) - GPU_FIELDS
    if unknown:
        raise errors.ApiError(422, f"unknown GPU fields: {sorted(unknown)}", reason="Invalid")
    values = {}
    for key, value in body.items():
        current = getattr(gpu, key)
        if isinstance(current, list) and not (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        ):
            raise errors.ApiError(422, f"{key} must be a list of strings", reason="Invalid")
        if isinstance(current, bool) and not isinstance(value, bool):
            raise errors.ApiError(422, f"{key} must be a boolean", reason="Invalid")
        if isinstance(current, (int, float)) and not isinstance(current, bool):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise errors.ApiError(422, f"{key} must be a number", reason="Invalid")
            value = type(current)(value)
        values[key] = value
    if "power_limit" in values:
        request.app[api.CLUSTER].mutations.record(
            mutations.POWER_LIMIT,
            request.match_info["node"],
            gpu.uuid,
            before=gpu.power_limit,
            after=values["power_limit"],
            source="admin",
        )
    for key, value in values.items():
        setattr(gpu, key, value)
    return _json(dataclasses.asdict(gpu))


async def patch_node(request: web.Request) -> web.Response:
    cluster = request.app[api.CLUSTER]
    host = cluster.hosts.get(request.match_info["node"])
    if host is None:
        raise errors.ApiError(404, f"node {request.match_info['node']} has no GPUs")
    body = await _body(request)
    if "bug_report_hangs" in body:
        host.bug_report_hangs = bool(body["bug_report_hangs"])
    return _json({"bug_report_hangs": host.bug_report_hangs})


async def reboot_node(request: web.Request) -> web.Response:
    """Reboot a node out of band (what a reboot hook would do, through a BMC say)."""
    node = request.match_info["node"]
    if not reboots.start(request.app[api.CLUSTER], node):
        raise errors.ApiError(404, f"node {node} not found")
    return _json({"node": node, "rebooting": True}, 202)


async def reboot_hook(request: web.Request) -> web.Response:
    """A reboot hook receiver: ``{"node": ...}`` in the body (what remediator's hook sends)."""
    body = await _body(request)
    node = body.get("node")
    if not isinstance(node, str) or not reboots.start(request.app[api.CLUSTER], node):
        raise errors.ApiError(404, f"node {node} not found")
    return _json({"node": node, "rebooting": True}, 202)


async def get_driver_policy(request: web.Request) -> web.Response:
    return _json(upgrades.describe(request.app[api.CLUSTER]))


async def put_driver_policy(request: web.Request) -> web.Response:
    """The ClusterPolicy's driver version (``version``) and the nodes whose upgrade fails."""
    cluster = request.app[api.CLUSTER]
    body = await _body(request)
    version, failing = body.get("version"), body.get("failing", [])
    if version is not None and not isinstance(version, str):
        raise errors.ApiError(422, "version must be a string or null", reason="Invalid")
    if not isinstance(failing, list) or not all(isinstance(n, str) for n in failing):
        raise errors.ApiError(422, "failing must be a list of node names", reason="Invalid")
    upgrades.policy(cluster).version = version
    upgrades.policy(cluster).failing = set(failing)
    return _json(upgrades.describe(cluster))


async def driver_upgrade_hook(request: web.Request) -> web.Response:
    """A driver upgrade hook receiver: ``{"node", "target_version"}`` (what remediator sends)."""
    body = await _body(request)
    node, version = body.get("node"), body.get("target_version")
    if not isinstance(version, str | None):
        raise errors.ApiError(422, "target_version must be a string", reason="Invalid")
    if not isinstance(node, str) or not upgrades.request(request.app[api.CLUSTER], node, version):
        raise errors.ApiError(404, f"node {node} not found")
    return _json({"node": node, "upgrading": True}, 202)


async def get_settings(request: web.Request) -> web.Response:
    return _json(request.app[api.CLUSTER].settings.model_dump())


async def patch_settings(request: web.Request) -> web.Response:
    cluster = request.app[api.CLUSTER]
    body = await _body(request)
    try:
        cluster.settings = fleet.Settings.model_validate({**cluster.settings.model_dump(), **body})
    except pydantic.ValidationError as e:
        raise errors.ApiError(422, str(e), reason="Invalid") from e
    cluster.wake.set()
    return _json(cluster.settings.model_dump())


async def get_faults(request: web.Request) -> web.Response:
    return _json(faults.current(request.app).model_dump())


async def put_faults(request: web.Request) -> web.Response:
    body = await _body(request)
    if "rules" not in body and body:
        body = {"rules": [body]}
    try:
        config = faults.Faults.model_validate(body)
    except pydantic.ValidationError as e:
        raise errors.ApiError(422, str(e), reason="Invalid") from e
    faults.configure(request.app, config)
    return _json(config.model_dump())


async def state(request: web.Request) -> web.Response:
    cluster = request.app[api.CLUSTER]
    st = cluster.store
    return _json(
        {
            "resourceVersion": st.resource_version,
            "epoch": cluster.mutations.epoch,
            "boot": cluster.mutations.boot,
            "settings": cluster.settings.model_dump(),
            "nodes": st.list("nodes"),
            "pods": st.list("pods"),
            "poddisruptionbudgets": st.list("poddisruptionbudgets.policy"),
            "gpus": {
                node: [dataclasses.asdict(g) for g in host.gpus]
                for node, host in cluster.hosts.items()
            },
            "files": {
                uid: {path: len(data) for path, data in files.items()}
                for uid, files in cluster.files.items()
            },
        }
    )


async def get_mutations(request: web.Request) -> web.Response:
    """The mutation log (``?since=SEQ``: only later entries) and the effects applied twice."""
    log = request.app[api.CLUSTER].mutations
    try:
        since = int(request.query.get("since", "0"))
    except ValueError as e:
        raise errors.ApiError(400, "since must be an integer") from e
    entries = [e.json() for e in log.since(since)]
    repeats = mutations.repeated(e.json() for e in log.entries)
    return _json(
        {
            "epoch": log.epoch,
            "boot": log.boot,
            "entries": entries,
            "repeated": [[first["seq"], second["seq"]] for first, second in repeats],
        }
    )


async def get_execs(request: web.Request) -> web.Response:
    """Every exec session since the start (or the last reset), oldest first."""
    return _json([dataclasses.asdict(r) for r in request.app[api.CLUSTER].exec_log])


async def get_requests(request: web.Request) -> web.Response:
    """Kubernetes API requests served since the start (or the last reset), by verb and
    resource (``{"list pods": 3, "create pods/exec": 5000}``)."""
    return _json(dict(sorted(request.app[api.CLUSTER].requests.items())))


async def reset(request: web.Request) -> web.Response:
    cluster = request.app[api.CLUSTER]
    cluster.reset()
    faults.configure(request.app, faults.Faults())
    return _json({"status": "reset", "resourceVersion": cluster.store.resource_version})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/sim/v1/state", state)
    app.router.add_post("/sim/v1/reset", reset)
    app.router.add_get("/sim/v1/mutations", get_mutations)
    app.router.add_get("/sim/v1/execs", get_execs)
    app.router.add_get("/sim/v1/requests", get_requests)
    app.router.add_get("/sim/v1/faults", get_faults)
    app.router.add_put("/sim/v1/faults", put_faults)
    app.router.add_get("/sim/v1/settings", get_settings)
    app.router.add_patch("/sim/v1/settings", patch_settings)
    app.router.add_get("/sim/v1/nodes/{node}/gpus", list_gpus)
    app.router.add_patch("/sim/v1/nodes/{node}", patch_node)
    app.router.add_post("/sim/v1/nodes/{node}/reboot", reboot_node)
    app.router.add_post("/sim/v1/reboots", reboot_hook)
    app.router.add_get("/sim/v1/driver-policy", get_driver_policy)
    app.router.add_put("/sim/v1/driver-policy", put_driver_policy)
    app.router.add_post("/sim/v1/driver-upgrades", driver_upgrade_hook)
    app.router.add_get("/sim/v1/nodes/{node}/gpus/{index}", get_gpu)
    app.router.add_patch("/sim/v1/nodes/{node}/gpus/{index}", patch_gpu)
