"""Read and operate endpoints: alert episodes, runs, a run's detail, approve and reject."""

from __future__ import annotations

import dataclasses
from typing import Any

from aiohttp import web

from remediator.adapters.db import queries
from remediator.adapters.http import auth as http_auth
from remediator.adapters.http import hygiene, operating, responses, runbooks
from remediator.domain import auth, errors


@dataclasses.dataclass(frozen=True)
class ApiDeps:
    queries: queries.Queries


API = web.AppKey("api", ApiDeps)

_ALERT_FILTERS = ("status", "alertname", "fingerprint")
_RUN_FILTERS = ("status", "playbook", "node", "kind", "episode")


MAX_LIMIT = 500


def paging(request: web.Request) -> tuple[int, int | None]:
    """``limit`` (1-500, default 50) and ``cursor`` (an id: ASCII decimal within 63 bits)."""
    limit = hygiene.parse_limit(request.query.get("limit", "50"), most=MAX_LIMIT)
    cursor_text = request.query.get("cursor")
    cursor = hygiene.parse_id(cursor_text) if cursor_text is not None else None
    if cursor_text is not None and cursor is None:
        raise errors.ValidationFailed(
            "cursor must be the nextCursor of a previous page",
            fields=[{"field": "cursor", "message": "not an id"}],
        )
    return limit, cursor


def _filters(request: web.Request, allowed: tuple[str, ...]) -> dict[str, str]:
    hygiene.refuse_unknown_query(request, (*allowed, "limit", "cursor"))
    return {key: request.query[key] for key in allowed if key in request.query}


def _page_json(page: queries.Page, render: Any) -> web.Response:
    return web.json_response(responses.page(page, render))


async def list_alerts(request: web.Request) -> web.Response:
    http_auth.require(request, auth.Permission.READ)
    limit, cursor = paging(request)
    page = await request.app[API].queries.episodes(
        limit=limit, cursor=cursor, filters=_filters(request, _ALERT_FILTERS)
    )
    return _page_json(page, responses.episode)


async def list_runs(request: web.Request) -> web.Response:
    http_auth.require(request, auth.Permission.READ)
    limit, cursor = paging(request)
    filters = _filters(request, _RUN_FILTERS)
    if "episode" in filters and hygiene.parse_id(filters["episode"]) is None:
        raise errors.ValidationFailed(
            "episode must be an integer id",
            fields=[{"field": "episode", "message": "not an id"}],
        )
    page = await request.app[API].queries.runs(limit=limit, cursor=cursor, filters=filters)
    return _page_json(page, responses.run)


def int_param(request: web.Request, name: str) -> int:
    """An id in the path: not found unless ASCII decimal within 63 bits."""
    value = hygiene.parse_id(request.match_info[name])
    if value is None:
        raise errors.NotFound(f"{name} {request.match_info[name][:40]!r} not found")
    return value


async def get_run(request: web.Request) -> web.Response:
    http_auth.require(request, auth.Permission.READ)
    detail = await request.app[API].queries.run_detail(int_param(request, "run_id"))
    if detail is None:
        raise errors.NotFound("run not found")
    return web.json_response(responses.run_detail(detail))


async def _decision(request: web.Request, *, approve: bool) -> web.Response:
    principal = http_auth.require(request, auth.Permission.OPERATE)
    run_id = int_param(request, "run_id")
    step_id = int_param(request, "step_id")
    body: runbooks.CommentBody = await runbooks.read_json(request, runbooks.CommentBody)
    decided = await request.app[operating.OPERATIONS].decide(
        run_id=run_id,
        step_id=step_id,
        principal=principal.name,
        approve=approve,
        comment=body.comment,
    )
    return web.json_response(responses.decision(decided))


async def approve_step(request: web.Request) -> web.Response:
    return await _decision(request, approve=True)


async def reject_step(request: web.Request) -> web.Response:
    return await _decision(request, approve=False)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/v1/alerts", list_alerts)
    app.router.add_get("/api/v1/runs", list_runs)
    app.router.add_get("/api/v1/runs/{run_id}", get_run)
    app.router.add_post("/api/v1/runs/{run_id}/steps/{step_id}/approve", approve_step)
    app.router.add_post("/api/v1/runs/{run_id}/steps/{step_id}/reject", reject_step)
