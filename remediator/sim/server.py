"""The simulator's aiohttp application: middlewares, routes and the controller task."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from remediator.sim import admin, api, controllers, discovery, disruption, errors, faults, persist
from remediator.sim import cluster as cluster_mod
from remediator.sim import fleet as fleet_mod

log = logging.getLogger(__name__)
TOKEN = web.AppKey("token", str)
ANONYMOUS = web.AppKey("anonymous", bool)
"""Requests without credentials are served (kubectl sends none over plain HTTP)."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _status_response(error: errors.ApiError) -> web.Response:
    return web.Response(
        text=json.dumps(error.body),
        status=error.code,
        content_type="application/json",
        headers=error.headers,
    )


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except errors.ApiError as e:
        return _status_response(e)
    except web.HTTPNotFound:
        return _status_response(api.not_found_path())
    except web.HTTPMethodNotAllowed:
        return _status_response(
            errors.ApiError(
                405,
                f"the server does not allow this method on the requested resource "
                f"({request.method})",
                reason="MethodNotAllowed",
            )
        )
    except web.HTTPException:
        raise
    except Exception:
        log.exception("internal error serving %s %s", request.method, request.path)
        return _status_response(errors.ApiError(500, "Internal error occurred"))


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    expected = "Bearer " + request.app[TOKEN]
    given = request.headers.get("Authorization")
    if given is None and request.app[ANONYMOUS]:
        return await handler(request)
    if not hmac.compare_digest((given or "").encode(), expected.encode()):
        raise errors.ApiError(401, "Unauthorized")
    return await handler(request)


def create_app(
    fleet: fleet_mod.Fleet,
    *,
    token: str,
    time_scale: float | None = None,
    state: dict[str, Any] | None = None,
    restore: persist.Restore = "all",
    anonymous: bool = False,
) -> web.Application:
    """Build the simulator for ``fleet``; every request needs ``Authorization: Bearer token``
    (``anonymous``: or no ``Authorization`` header at all; a wrong token is still refused).

    ``state`` (from ``persist.load``) restores a previous simulator's cluster instead of
    seeding the fleet (``restore="gpus"``: only its GPUs, see ``persist``); ``time_scale``
    still wins over the saved settings.
    """
    if time_scale is not None:
        fleet = fleet.model_copy(
            update={"settings": fleet.settings.model_copy(update={"time_scale": time_scale})}
        )
    app = web.Application(middlewares=[error_middleware, auth_middleware, faults.middleware])
    cluster = cluster_mod.Cluster(fleet)
    if state is not None:
        persist.restore(cluster, state, restore)
        if time_scale is not None:
            cluster.settings = cluster.settings.model_copy(update={"time_scale": time_scale})
    disruption.install(cluster)
    app[api.CLUSTER] = cluster
    app[TOKEN] = token
    app[ANONYMOUS] = anonymous
    app[faults.FAULTS] = faults.State()
    admin.add_routes(app)
    router = app.router
    router.add_get("/version", discovery.version)
    router.add_get("/version/", discovery.version)
    router.add_get("/openapi/v2", discovery.openapi_v2)
    router.add_get("/healthz", discovery.healthz)
    router.add_get("/livez", discovery.healthz)
    router.add_get("/readyz", discovery.healthz)
    for slash in ("", "/"):  # clients ask for both /api/v1 and /api/v1/
        router.add_get("/api" + slash, discovery.core_versions)
        router.add_get("/apis" + slash, discovery.group_list)
        router.add_get("/api/{version}" + slash, discovery.resource_list)
        router.add_get("/apis/{group}" + slash, discovery.group)
        router.add_get("/apis/{group}/{version}" + slash, discovery.resource_list)
    router.add_route("*", "/api/{tail:.+}", api.dispatch)
    router.add_route("*", "/apis/{tail:.+}", api.dispatch)
    app.cleanup_ctx.append(_run_controllers)
    return app


async def _run_controllers(app: web.Application) -> AsyncIterator[None]:
    loop = controllers.Controllers(app[api.CLUSTER])
    task = asyncio.create_task(loop.run(), name="sim-controllers")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
