"""Kubernetes REST routes: discovery, and generic CRUD/list/watch/patch over the store."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from remediator.sim import cluster as cluster_mod
from remediator.sim import errors, mutations, patching, pods, resources, selectors, store, tables

Obj = dict[str, Any]
CLUSTER = web.AppKey("cluster", cluster_mod.Cluster)
WITH_STATUS = {
    "nodes",
    "pods",
    "poddisruptionbudgets.policy",
    "replicasets.apps",
    "statefulsets.apps",
    "daemonsets.apps",
    "deployments.apps",
    "namespaces",
}


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(body, separators=(",", ":")), status=status, content_type="application/json"
    )


@dataclasses.dataclass
class Target:
    res: resources.Resource
    namespace: str | None
    name: str | None
    sub: str | None
    watch: bool


def not_found_path() -> errors.ApiError:
    return errors.ApiError(404, "the server could not find the requested resource", details={})


def parse_target(path: str) -> Target | None:
    segs = [s for s in path.split("/") if s]
    if len(segs) >= 3 and segs[0] == "api":
        group, version, rest = "", segs[1], segs[2:]
    elif len(segs) >= 4 and segs[0] == "apis":
        group, version, rest = segs[1], segs[2], segs[3:]
    else:
        return None
    watch = bool(rest) and rest[0] == "watch"
    if watch:
        rest = rest[1:]
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        return None
    res = resources.find(group, version, rest[0])
    if res is None or (namespace is not None and not res.namespaced):
        return None
    return Target(
        res,
        namespace,
        rest[1] if len(rest) > 1 else None,
        rest[2] if len(rest) > 2 else None,
        watch,
    )


# ---- resources -------------------------------------------------------------------------


def _serve(obj: Obj, res: resources.Resource) -> Obj:
    """``obj`` with the resource's ``apiVersion`` (a new top level where it had another: the
    object may be the store's own)."""
    if obj.get("apiVersion") == res.api_version:
        return obj
    return {**obj, "apiVersion": res.api_version}


async def _body(request: web.Request) -> Any:
    try:
        return json.loads(await request.read() or b"{}")
    except ValueError as e:
        raise errors.ApiError(400, f"invalid JSON body: {e}") from e


def _dry_run(request: web.Request) -> bool:
    return "All" in request.query.getall("dryRun", [])


async def dispatch(request: web.Request) -> web.StreamResponse:
    target = parse_target(request.path)
    if target is None:
        raise not_found_path()
    cluster = request.app[CLUSTER]
    method = request.method
    resource = target.res.name + (f"/{target.sub}" if target.sub else "")
    cluster.requests[f"{_verb(request, target)} {resource}"] += 1
    if target.sub is not None:
        return await pods.subresource(
            request, cluster, target.res, target.namespace, target.name or "", target.sub
        )
    if target.name is None:
        if method == "GET":
            if target.watch or request.query.get("watch", "").lower() in ("true", "1"):
                return await watch(request, cluster, target)
            return list_objects(request, cluster, target)
        if method == "POST":
            return await create(request, cluster, target)
        raise errors.ApiError(
            405,
            f"the server does not allow this method on the requested resource ({method})",
            reason="MethodNotAllowed",
        )
    if target.watch:
        return await watch(request, cluster, target)
    return await item(request, cluster, target)


_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _verb(request: web.Request, target: Target) -> str:
    """The request's verb as the apiserver names it (``get``, ``list``, ``watch``, ...)."""
    method = request.method
    if target.sub in ("exec", "attach", "portforward"):
        return "create"  # a connect: GET (websocket) or POST (SPDY) alike
    if method == "GET":
        if target.watch or request.query.get("watch", "").lower() in ("true", "1"):
            return "watch"
        return "get" if target.name or target.sub else "list"
    if method == "DELETE" and not target.name:
        return "deletecollection"
    return _VERBS.get(method, method.lower())


def _continue_token(key: str, rv: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"rv": rv, "start": key}).encode()).decode()


def list_objects(
    request: web.Request, cluster: cluster_mod.Cluster, target: Target
) -> web.Response:
    res = target.res
    labels = selectors.parse_label_selector(request.query.get("labelSelector"))
    fields = selectors.parse_field_selector(request.query.get("fieldSelector"), res.store_key)
    node = next((f.value for f in fields if f.field == "spec.nodeName" and f.equal), None)
    if res.store_key == "pods" and node is not None:
        candidates = cluster.store.iter_pods_on_node(node, target.namespace)
    else:
        candidates = cluster.store.iter(res.store_key, target.namespace)
    items = [
        o
        for o in candidates
        if selectors.matches_labels(labels, o["metadata"].get("labels"))
        and selectors.matches_fields(fields, o, res.store_key)
    ]
    meta: Obj = {"resourceVersion": cluster.store.resource_version}
    start = request.query.get("continue")
    if start:
        try:
            token = json.loads(base64.urlsafe_b64decode(start.encode()))
            after = str(token["start"])
        except (ValueError, KeyError, TypeError) as e:
            raise errors.ApiError(400, "continue key is not valid") from e
        meta["resourceVersion"] = token.get("rv", meta["resourceVersion"])
        items = [o for o in items if _key(o) > after]
    limit = int(request.query.get("limit") or 0)
    if limit > 0 and len(items) > limit:
        meta["continue"] = _continue_token(_key(items[limit - 1]), meta["resourceVersion"])
        meta["remainingItemCount"] = len(items) - limit
        items = items[:limit]
    # Serialized right here, before anything can change the store: a shallow copy without
    # kind and apiVersion is enough (no JSON round trip of every object, then another dump).
    out = [{k: v for k, v in obj.items() if k not in _LIST_DROPS} for obj in items]
    version = tables.requested_version(request)
    if version is not None:
        include = request.query.get("includeObject", "Metadata")
        return json_response(tables.table(version, res, out, meta, include))
    return json_response(
        {"kind": f"{res.kind}List", "apiVersion": res.api_version, "metadata": meta, "items": out}
    )


_LIST_DROPS = frozenset({"kind", "apiVersion"})


def _key(obj: Obj) -> str:
    return f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"


async def watch(
    request: web.Request, cluster: cluster_mod.Cluster, target: Target
) -> web.StreamResponse:
    res = target.res
    labels = selectors.parse_label_selector(request.query.get("labelSelector"))
    fields = selectors.parse_field_selector(request.query.get("fieldSelector"), res.store_key)
    if target.name:
        fields.append(selectors.FieldRequirement("metadata.name", True, target.name))
    timeout = float(request.query.get("timeoutSeconds") or 1800)
    response = web.StreamResponse(
        headers={"Content-Type": "application/json", "Cache-Control": "no-cache, private"}
    )
    await response.prepare(request)

    def visible(obj: Obj | None) -> bool:
        return (
            obj is not None
            and selectors.matches_labels(labels, obj["metadata"].get("labels"))
            and selectors.matches_fields(fields, obj, res.store_key)
        )

    table_version = tables.requested_version(request)

    def encode(kind: str, obj: Obj) -> bytes:
        body = obj if kind == "ERROR" else _serve(obj, res)
        if table_version is not None and kind != "ERROR":
            meta = {"resourceVersion": obj["metadata"]["resourceVersion"]}
            include = request.query.get("includeObject", "Metadata")
            body = tables.table(table_version, res, [body], meta, include)
        return json.dumps({"type": kind, "object": body}, separators=(",", ":")).encode() + b"\n"

    async def send(kind: str, obj: Obj) -> None:
        await response.write(encode(kind, obj))

    async def send_change(kind: str, change: store.Change) -> None:
        if table_version is not None:
            await send(kind, change.obj)
            return
        # the same line for every plain watch of this resource: encoded by the first one
        key = f"{kind} {res.api_version}"
        line = change.lines.get(key)
        if line is None:
            line = change.lines[key] = encode(kind, change.obj)
        await response.write(line)

    try:
        watcher = cluster.store.watch(
            res.store_key, target.namespace, request.query.get("resourceVersion")
        )
    except errors.ApiError as e:
        await send("ERROR", e.body)
        return response
    try:
        await _pump(request, watcher, visible, send_change, timeout)
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
    except ConnectionResetError:
        pass
    finally:
        watcher.close()
    return response


def _translate(change: store.Change, visible: Callable[[Obj | None], bool]) -> str | None:
    """The event type a selector-filtered watch sees for ``change`` (None: nothing)."""
    now_visible, was_visible = visible(change.obj), visible(change.old)
    if change.type == "MODIFIED" and now_visible and not was_visible:
        return "ADDED"
    if change.type == "MODIFIED" and was_visible and not now_visible:
        return "DELETED"
    return change.type if now_visible else None


async def _pump(
    request: web.Request,
    watcher: store.Watcher,
    visible: Callable[[Obj | None], bool],
    send: Callable[[str, store.Change], Awaitable[None]],
    timeout: float,
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (remaining := deadline - loop.time()) > 0:
        transport = request.transport
        if transport is None or transport.is_closing():
            return  # the client went away
        try:
            change = await asyncio.wait_for(watcher.queue.get(), min(remaining, 0.2))
        except TimeoutError:
            continue
        kind = _translate(change, visible)
        if kind is not None:
            await send(kind, change)


async def create(
    request: web.Request, cluster: cluster_mod.Cluster, target: Target
) -> web.Response:
    res = target.res
    body = await _body(request)
    if not isinstance(body, dict):
        raise errors.ApiError(400, "the request body must be an object")
    meta = body.setdefault("metadata", {})
    if res.namespaced:
        if meta.get("namespace") and target.namespace and meta["namespace"] != target.namespace:
            raise errors.ApiError(
                400,
                "the namespace of the provided object does not match "
                "the namespace sent on the request",
            )
        if target.namespace is None:
            raise errors.ApiError(405, "create requires a namespace", reason="MethodNotAllowed")
        meta["namespace"] = target.namespace
        if cluster.store.by_name("namespaces", "", target.namespace) is None:
            raise errors.not_found("namespaces", target.namespace)
    body["apiVersion"] = res.api_version
    body["kind"] = res.kind
    if res.store_key == "pods":
        pods.prepare_new_pod(body)
    if _dry_run(request):
        return json_response(body, 201)
    created = cluster.store.create(res.store_key, body, shared=True)
    return json_response(_serve(created, res), 201)


async def item(request: web.Request, cluster: cluster_mod.Cluster, target: Target) -> web.Response:
    res, name = target.res, target.name or ""
    ns = target.namespace or ""
    method = request.method
    if method == "GET":
        obj = _serve(cluster.store.must_by_name(res.store_key, ns, name), res)
        version = tables.requested_version(request)
        if version is not None:
            include = request.query.get("includeObject", "Metadata")
            meta = {"resourceVersion": obj["metadata"]["resourceVersion"]}
            return json_response(tables.table(version, res, [obj], meta, include))
        return json_response(obj)
    if method == "PUT":
        body = await _body(request)
        before = cluster.store.by_name(res.store_key, ns, name)
        dry_run = _dry_run(request)
        obj = update(cluster, res, ns, name, body, status=False, dry_run=dry_run)
        _log_write(cluster, request, res, before, obj, mutations.Named(), dry_run=dry_run)
        return json_response(_serve(obj, res))
    if method == "PATCH":
        patch = await _body(request)
        ctype = request.headers.get("Content-Type", "")
        before = cluster.store.by_name(res.store_key, ns, name)
        dry_run = _dry_run(request)
        obj = apply_patch(cluster, res, ns, name, patch, ctype, status=False, dry_run=dry_run)
        named = mutations.named_in_patch(patch)
        _log_write(cluster, request, res, before, obj, named, dry_run=dry_run)
        return json_response(_serve(obj, res))
    if method == "DELETE":
        raw = await request.read()
        options = json.loads(raw) if raw else {}
        if "gracePeriodSeconds" in request.query:
            options["gracePeriodSeconds"] = int(request.query["gracePeriodSeconds"])
        if res.store_key == "pods":
            return json_response(
                _serve(
                    pods.delete_pod(
                        cluster,
                        ns,
                        name,
                        options,
                        dry_run=_dry_run(request),
                        source=f"{method} {request.path}",
                    ),
                    res,
                )
            )
        obj = cluster.store.must_get(res.store_key, ns, name)
        pods.check_preconditions(obj, options, res)
        if not _dry_run(request):
            obj = cluster.store.delete(res.store_key, ns, name)
        return json_response(_serve(obj, res))
    raise errors.ApiError(
        405,
        f"the server does not allow this method on the requested resource ({method})",
        reason="MethodNotAllowed",
    )


def _log_write(
    cluster: cluster_mod.Cluster,
    request: web.Request,
    res: resources.Resource,
    before: Obj | None,
    after: Obj,
    named: mutations.Named,
    *,
    dry_run: bool,
) -> None:
    if res.store_key != "nodes" or before is None or dry_run:
        return
    source = f"{request.method} {request.path}"
    mutations.record_node_write(cluster.mutations, before, after, named, source=source)


def update(
    cluster: cluster_mod.Cluster,
    res: resources.Resource,
    ns: str,
    name: str,
    body: Any,
    *,
    status: bool,
    dry_run: bool,
) -> Obj:
    """Replace the object with ``body``: the object as stored, the store's own (to answer
    with, not to change)."""
    if not isinstance(body, dict):
        raise errors.ApiError(400, "the request body must be an object")
    meta = body.setdefault("metadata", {})
    if meta.get("name") and meta["name"] != name:
        raise errors.ApiError(
            400,
            f"the name of the object ({meta['name']}) does not match the name on the URL ({name})",
        )
    meta["name"] = name
    if res.namespaced:
        meta["namespace"] = ns
    old = cluster.store.must_by_name(res.store_key, ns, name)
    if res.store_key in WITH_STATUS:
        if status:
            body = {
                **old,
                "status": body.get("status", {}),
                "metadata": {**old["metadata"], "resourceVersion": meta.get("resourceVersion")},
            }
        elif "status" in old:
            body["status"] = old["status"]
        else:
            body.pop("status", None)
    if dry_run:
        rv = body["metadata"].get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise errors.conflict(res.name, name, group=res.group)
        return {**body, "kind": old["kind"]}
    # (every caller only answers with it, and logs what changed)
    return cluster.store.update(res.store_key, body, shared=True)


def apply_patch(
    cluster: cluster_mod.Cluster,
    res: resources.Resource,
    ns: str,
    name: str,
    patch: Any,
    ctype: str,
    *,
    status: bool,
    dry_run: bool,
) -> Obj:
    stored = cluster.store.must_by_name(res.store_key, ns, name)
    current_rv = stored["metadata"]["resourceVersion"]
    meta = {key: value for key, value in stored["metadata"].items() if key != "resourceVersion"}
    result = patching.apply_patch({**stored, "metadata": meta}, patch, ctype)
    result.setdefault("metadata", {})
    wanted = result["metadata"].get("resourceVersion")
    if wanted and wanted != current_rv:
        raise errors.conflict(res.name, name, group=res.group)
    result["metadata"]["resourceVersion"] = current_rv
    return update(cluster, res, ns, name, result, status=status, dry_run=dry_run)


def now() -> str:
    return store.timestamp()
