"""Pod-specific API behaviour: graceful deletion, eviction, exec/log and status subresources."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from remediator.sim import disruption, errors, mutations, resources

if TYPE_CHECKING:
    from remediator.sim import cluster as cluster_mod

Obj = dict[str, Any]


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(body, separators=(",", ":")), status=status, content_type="application/json"
    )


def prepare_new_pod(pod: Obj) -> None:
    spec = pod.setdefault("spec", {})
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", "default-scheduler")
    pod["status"] = {"phase": "Pending", "qosClass": "BestEffort"}


def check_preconditions(obj: Obj, options: Obj, res: resources.Resource) -> None:
    pre = options.get("preconditions") or {}
    meta = obj["metadata"]
    name = meta["name"]
    if pre.get("uid") and pre["uid"] != meta.get("uid"):
        raise errors.ApiError(
            409,
            f"Precondition failed: UID in precondition: {pre['uid']}, UID in object "
            f"meta: {meta.get('uid')}",
            reason="Conflict",
            details={"name": name, "kind": res.name},
        )
    if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
        raise errors.ApiError(
            409,
            f"Precondition failed: ResourceVersion in precondition: "
            f"{pre['resourceVersion']}, ResourceVersion in object meta: "
            f"{meta.get('resourceVersion')}",
            reason="Conflict",
            details={"name": name, "kind": res.name},
        )


def delete_pod(
    cluster: cluster_mod.Cluster,
    ns: str,
    name: str,
    options: Obj,
    *,
    dry_run: bool,
    kind: str = mutations.DELETION,
    source: str = "",
) -> Obj:
    """Graceful deletion: set deletionTimestamp; the controller loop removes it later.

    Logged as a mutation of ``kind`` (an eviction or a deletion) unless ``dry_run``.
    """
    st = cluster.store
    pod = st.must_get("pods", ns, name)
    check_preconditions(pod, options, resources.by_store_key("pods"))
    grace = options.get("gracePeriodSeconds")
    if grace is None:
        default = cluster.settings.default_grace_seconds
        grace = (
            default if default is not None else pod["spec"].get("terminationGracePeriodSeconds", 30)
        )
    grace = int(grace) if int(grace) >= 0 else 1  # the apiserver turns negative into 1
    if dry_run:
        return pod
    terminating = bool(pod["metadata"].get("deletionTimestamp"))
    obj = _delete_pod(cluster, pod, grace)
    cluster.mutations.record(
        kind,
        f"{ns}/{name}",
        pod["metadata"]["uid"],
        before="terminating" if terminating else "present",
        after="terminating" if st.get("pods", ns, name) is not None else "deleted",
        source=source,
    )
    return obj


def _delete_pod(cluster: cluster_mod.Cluster, pod: Obj, grace: int) -> Obj:
    st = cluster.store
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    if pod["metadata"].get("deletionTimestamp"):
        return pod
    unscheduled = not pod["spec"].get("nodeName")
    terminal = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
    if grace == 0 or unscheduled or terminal:
        return st.delete("pods", ns, name)
    obj = st.set_deletion("pods", ns, name, grace)
    cluster.wake.set()
    return obj


async def evict(
    request: web.Request, cluster: cluster_mod.Cluster, ns: str, name: str
) -> web.Response:
    raw = await request.read()
    try:
        body = json.loads(raw or b"{}")
    except ValueError as e:
        raise errors.ApiError(400, f"invalid JSON body: {e}") from e
    body_name = (body.get("metadata") or {}).get("name")
    if body_name and body_name != name:
        raise errors.ApiError(
            400, "name in URL does not match name in Eviction object", reason="BadRequest"
        )
    pod = cluster.store.get("pods", ns, name)
    if pod is None:
        raise errors.not_found("pods", name)
    options = body.get("deleteOptions") or {}
    check_preconditions(pod, options, resources.by_store_key("pods"))
    disruption.check_eviction(cluster, pod)
    dry_run = "All" in request.query.getall("dryRun", []) or "All" in (options.get("dryRun") or [])
    delete_pod(
        cluster,
        ns,
        name,
        options,
        dry_run=dry_run,
        kind=mutations.EVICTION,
        source=f"{request.method} {request.path}",
    )
    return _json(
        {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201},
        201,
    )


async def subresource(
    request: web.Request,
    cluster: cluster_mod.Cluster,
    res: resources.Resource,
    ns: str | None,
    name: str,
    sub: str,
) -> web.StreamResponse:
    from remediator.sim import api
    from remediator.sim import exec as exec_mod

    namespace = ns or ""
    if res.store_key == "pods" and sub == "eviction" and request.method == "POST":
        return await evict(request, cluster, namespace, name)
    if res.store_key == "pods" and sub == "exec" and request.method in ("GET", "POST"):
        return await exec_mod.handle(request, cluster, namespace, name)
    if res.store_key == "pods" and sub == "log" and request.method == "GET":
        cluster.store.must_get("pods", namespace, name)
        return web.Response(text="", content_type="text/plain")
    if sub == "status" and res.store_key in api.WITH_STATUS:
        if request.method == "GET":
            obj = cluster.store.must_get(res.store_key, namespace, name)
            return _json(api._serve(obj, res))
        dry_run = "All" in request.query.getall("dryRun", [])
        if request.method == "PUT":
            body = await api._body(request)
            obj = api.update(cluster, res, namespace, name, body, status=True, dry_run=dry_run)
            return _json(api._serve(obj, res))
        if request.method == "PATCH":
            patch = await api._body(request)
            obj = api.apply_patch(
                cluster,
                res,
                namespace,
                name,
                patch,
                request.headers.get("Content-Type", ""),
                status=True,
                dry_run=dry_run,
            )
            return _json(api._serve(obj, res))
    raise api.not_found_path()
