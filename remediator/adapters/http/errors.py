"""Error bodies: ``{"error": {"code", "message", "fields"?}}``; never a traceback."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import http_exceptions, web

from remediator.domain import errors

logger = logging.getLogger("remediator.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    fields: list[dict[str, str]] | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body: dict[str, Any] = {"code": code, "message": message}
    if fields:
        body["fields"] = fields
    return web.json_response({"error": body}, status=status, headers=headers)


class Refused(Exception):
    """A request refused at the door, with its own status and code (413, 415, 408, ...)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


# Client input that could not be decoded or parsed where no handler expected it: a 400, never
# a 500 (Alertmanager retries a 5xx forever). Logged with its traceback all the same.
CLIENT_INPUT_ERRORS = (
    ValueError,
    RecursionError,
    OverflowError,
    http_exceptions.HttpProcessingError,
)

_STATUS = {
    errors.ValidationFailed: 400,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.Forbidden: 403,
}


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = e.reason.lower().replace(" ", "_")
        return error_response(e.status, code, e.text or e.reason, headers=_keep(e))
    except Refused as e:
        return error_response(e.status, e.code, e.message)
    except errors.StoreUnavailable as e:
        logger.warning("%s %s: %s", request.method, request.path, e)
        retry_after = str(request.app.get(RETRY_AFTER, 5))
        message = "the database is unavailable; try again later"
        return error_response(503, e.code, message, headers={"Retry-After": retry_after})
    except errors.RemediatorError as e:
        for cls, status in _STATUS.items():
            if isinstance(e, cls):
                fields = e.fields if isinstance(e, errors.ValidationFailed) else None
                return error_response(status, e.code, str(e), fields=fields)
        logger.exception("unmapped error")
        return error_response(500, "internal", "internal error")
    except CLIENT_INPUT_ERRORS:
        logger.warning("undecodable input on %s %s", request.method, request.path, exc_info=True)
        return error_response(400, "bad_request", "the request could not be decoded")
    except Exception:
        logger.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal", "internal error")


def _keep(error: web.HTTPException) -> dict[str, str]:
    return {
        key: value
        for key, value in error.headers.items()
        if key in ("WWW-Authenticate", "Allow", "Retry-After")
    }


RETRY_AFTER = web.AppKey("retry_after", int)
