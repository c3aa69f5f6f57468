"""Circuit breaker endpoints: ``GET /api/v1/breaker`` and ``POST /api/v1/breaker/reset``."""

from __future__ import annotations

from aiohttp import web

from remediator.adapters.http import auth as http_auth
from remediator.adapters.http import operating, responses, runbooks
from remediator.domain import auth


async def get_breaker(request: web.Request) -> web.Response:
    http_auth.require(request, auth.Permission.READ)
    status = await request.app[operating.OPERATIONS].breaker_status()
    return web.json_response(responses.breaker(status))


async def reset_breaker(request: web.Request) -> web.Response:
    principal = http_auth.require(request, auth.Permission.OPERATE)
    body: runbooks.CommentBody = await runbooks.read_json(request, runbooks.CommentBody)
    status = await request.app[operating.OPERATIONS].reset_breaker(
        principal=principal.name, comment=body.comment
    )
    return web.json_response(responses.breaker(status))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/v1/breaker", get_breaker)
    app.router.add_post("/api/v1/breaker/reset", reset_breaker)
