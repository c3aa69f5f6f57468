"""The one app key through which API handlers and console pages reach the use cases
(``engine.operations.Operations``); ``responses`` renders what they return."""

from __future__ import annotations

from aiohttp import web

from remediator.engine import operations

OPERATIONS = web.AppKey("operations", operations.Operations)
