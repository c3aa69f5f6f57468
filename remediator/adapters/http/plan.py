"""``POST /api/v1/plan`` (an Alertmanager payload in, what would happen out; a payload intake
would refuse is refused the same way) and
``GET /api/v1/runs/{id}/plan`` (what a run's remaining steps will do). Nothing is changed."""

from __future__ import annotations

import pydantic
from aiohttp import web

from remediator.adapters.http import auth as http_auth
from remediator.adapters.http import hygiene, operating, responses
from remediator.domain import alerts, auth, errors

# Each alert is planned with its guards' verdict read from the database and every step
# previewed: a few milliseconds each, so a body within max_body_bytes (thousands of alerts)
# kept a reader's request busy for tens of seconds. Alertmanager groups hold a handful.
MAX_ALERTS = 20


async def post_plan(request: web.Request) -> web.Response:
    http_auth.require(request, auth.Permission.READ)
    hygiene.require_type(request, hygiene.JSON)
    limit = request.app.get(hygiene.LIMITS, hygiene.Limits()).max_body_bytes
    body = await hygiene.read_body(request, limit=limit)
    try:
        payload = alerts.parse_payload(body)
    except pydantic.ValidationError as e:
        raise errors.ValidationFailed(
            "not an Alertmanager webhook payload (version 4)", fields=alerts.validation_fields(e)
        ) from None
    if len(payload.alerts) > MAX_ALERTS:
        message = f"at most {MAX_ALERTS} alerts per plan, got {len(payload.alerts)}"
        raise errors.ValidationFailed(
            f"{message}: plan the payload in parts",
            fields=[{"field": "alerts", "message": message}],
        )
    problems = alerts.check_limits(payload)
    if problems:  # intake would refuse it: nothing would happen
        raise errors.ValidationFailed(
            "intake would refuse this payload: values in it can never be stored", fields=problems
        )
    planned = await request.app[operating.OPERATIONS].plan_payload(payload)
    return web.json_response({"alerts": [responses.alert_plan(alert) for alert in planned]})


async def get_run_plan(request: web.Request) -> web.Response:
    http_auth.require(request, auth.Permission.READ)
    run_id = hygiene.parse_id(request.match_info["run_id"])
    if run_id is None:
        raise errors.NotFound("run not found")
    plan = await request.app[operating.OPERATIONS].plan_run(run_id)
    if plan is None:
        raise errors.NotFound("run not found")
    return web.json_response(responses.run_plan(plan))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/api/v1/plan", post_plan)
    app.router.add_get("/api/v1/runs/{run_id}/plan", get_run_plan)
