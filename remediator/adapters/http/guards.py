"""Circuit breaker endpoints: ``GET /api/v1/breaker`` and ``POST /api/v1/breaker/reset``."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from remediator.adapters.http import auth as http_auth
from remediator.adapters.http import responses, runbooks
from remediator.domain import auth


@dataclasses.dataclass(frozen=True)
class GuardDeps:
    status: Callable[[], Awaitable[dict[str, Any]]]
    reset: Callable[..., Awaitable[dict[str, Any]]]


GUARDS = web.AppKey("guards", GuardDeps)


async def get_breaker(request: web.Request) -> web.Response:
    http_auth.require(request, auth.Permission.READ)
    return web.json_response(await _breaker(request))


async def reset_breaker(request: web.Request) -> web.Response:
    principal = http_auth.require(request, auth.Permission.OPERATE)
    body: runbooks.CommentBody = await runbooks.read_json(request, runbooks.CommentBody)
    await request.app[GUARDS].reset(principal=principal.name, comment=body.comment)
    return web.json_response(await _breaker(request))


async def _breaker(request: web.Request) -> responses.BreakerStatus:
    state = await request.app[GUARDS].status()
    return responses.breaker(state, state.get("disrupted_nodes", ()))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/v1/breaker", get_breaker)
    app.router.add_post("/api/v1/breaker/reset", reset_breaker)
