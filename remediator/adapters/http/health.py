"""``/healthz`` (the process answers), ``/readyz`` (database writable, playbooks loaded, engine
passes not failing for a while), ``/metrics`` (Prometheus text format).

The engine is stalled, so not ready, once ``STALLED_PASSES`` passes in a row have failed or the
first of the failing passes ended ``STALLED_FOR`` ago (whichever comes first: the count for
quick failures at the poll interval, the time for slow ones that wait on timeouts). One pass
that completes makes it ready again. A single failure is reported but keeps it ready: the next
pass at the poll interval usually succeeds.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any

import prometheus_client
from aiohttp import web

from remediator.adapters import metrics as metrics_mod
from remediator.adapters.db import database
from remediator.adapters.metrics import Metrics
from remediator.domain import errors


@dataclasses.dataclass(frozen=True)
class HealthDeps:
    db: database.Database
    rules: Any
    metrics: Metrics
    clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)


HEALTH = web.AppKey("health", HealthDeps)
STALLED_PASSES = 5
STALLED_FOR = dt.timedelta(seconds=60)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    deps = request.app[HEALTH]
    checks: dict[str, str] = {}
    try:
        await deps.db.ping()
        checks["database"] = "ok"
    except errors.StoreUnavailable as e:
        checks["database"] = str(e)
    checks["playbooks"] = f"{len(deps.rules.index)} loaded" if deps.rules.loaded else "not loaded"
    stalled, checks["engine"] = _engine_check(deps.metrics.failing, now=deps.clock())
    ready = checks["database"] == "ok" and deps.rules.loaded and not stalled
    return web.json_response(
        {"status": "ready" if ready else "not ready", "checks": checks},
        status=200 if ready else 503,
    )


def _engine_check(failing: metrics_mod.FailingPasses, *, now: dt.datetime) -> tuple[bool, str]:
    """Whether the engine is stalled, and what to say about it."""
    if not failing.count or failing.since is None:
        return False, "ok"
    stalled = failing.count >= STALLED_PASSES or now - failing.since >= STALLED_FOR
    return stalled, (
        f"{'stalled' if stalled else 'failing'}: {failing.count} pass(es) in a row failed since "
        f"{failing.since.isoformat()} (last: {failing.last_error}); see the log"
    )


async def metrics(request: web.Request) -> web.Response:
    deps = request.app[HEALTH]
    try:
        state = await metrics_mod.read_state(deps.db, now=deps.clock())
    except errors.StoreUnavailable:
        deps.metrics.state_errors.inc()  # keep the last values; the counter tells
    else:
        deps.metrics.set_state(state)
    body = deps.metrics.render()
    return web.Response(body=body, headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
