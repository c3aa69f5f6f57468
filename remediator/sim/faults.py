"""Fault injection on the Kubernetes API: latency, 429 with Retry-After, 500/503, dropped exec.

Rules are switched at runtime through ``PUT /sim/v1/faults`` and can be scoped by path prefix
and HTTP method. The admin endpoints themselves are never faulted. Errors are injected before
the request is handled (nothing was changed); an exec stream can be dropped before its command
runs (``drop_websocket_rate``) or after it ran, before its exit status is sent
(``drop_websocket_after_rate``: the effect is in place and the client cannot know it).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import pydantic
from aiohttp import web

from remediator.sim import errors


class Rule(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    path_prefix: str = "/"
    methods: list[str] = []
    """HTTP methods the rule applies to (empty: all)."""
    latency_ms: int = 0
    rate_429: float = pydantic.Field(0.0, ge=0, le=1)
    retry_after_seconds: int = 1
    rate_500: float = pydantic.Field(0.0, ge=0, le=1)
    rate_503: float = pydantic.Field(0.0, ge=0, le=1)
    drop_websocket_rate: float = pydantic.Field(0.0, ge=0, le=1)
    """Exec streams closed before their command runs."""
    drop_websocket_after_rate: float = pydantic.Field(0.0, ge=0, le=1)
    """Exec streams closed after their command ran, without its exit status."""

    def applies(self, request: web.Request) -> bool:
        if not request.path.startswith(self.path_prefix):
            return False
        return not self.methods or request.method.upper() in {m.upper() for m in self.methods}


class Faults(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    rules: list[Rule] = []
    seed: int | None = None


class State:
    def __init__(self) -> None:
        self.config = Faults()
        self.rng = random.Random()


FAULTS = web.AppKey("faults", State)


def configure(app: web.Application, config: Faults) -> None:
    app[FAULTS].config = config
    app[FAULTS].rng = random.Random(config.seed)


def current(app: web.Application) -> Faults:
    return app[FAULTS].config


def _rng(app: web.Application) -> random.Random:
    return app[FAULTS].rng


def should_drop_websocket(request: web.Request) -> bool:
    rng = _rng(request.app)
    return any(
        r.drop_websocket_rate and r.applies(request) and rng.random() < r.drop_websocket_rate
        for r in current(request.app).rules
    )


def should_drop_websocket_after(request: web.Request) -> bool:
    rng = _rng(request.app)
    return any(
        r.drop_websocket_after_rate
        and r.applies(request)
        and rng.random() < r.drop_websocket_after_rate
        for r in current(request.app).rules
    )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path.startswith("/sim/"):
        return await handler(request)
    rng = _rng(request.app)
    for rule in current(request.app).rules:
        if not rule.applies(request):
            continue
        if rule.latency_ms:
            await asyncio.sleep(rule.latency_ms / 1000)
        if rule.rate_429 and rng.random() < rule.rate_429:
            raise errors.ApiError(
                429,
                "Too many requests, please try again later.",
                details={"retryAfterSeconds": rule.retry_after_seconds},
                headers={"Retry-After": str(rule.retry_after_seconds)},
            )
        if rule.rate_500 and rng.random() < rule.rate_500:
            raise errors.ApiError(
                500,
                "Internal error occurred: injected fault",
                details={"causes": [{"message": "injected fault"}]},
            )
        if rule.rate_503 and rng.random() < rule.rate_503:
            raise errors.ApiError(
                503,
                "The server is currently unable to handle the request",
                headers={"Retry-After": "1"},
            )
    return await handler(request)
