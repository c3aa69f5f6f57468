"""What a request must look like before any handler acts on it, and how bodies are read.

- Without a tokens file every caller is the loopback admin, so only loopback names are served
  (``localhost``, ``127.0.0.1``, ``[::1]``, any port; 421 otherwise): a page on a domain that
  re-resolves to 127.0.0.1 (DNS rebinding) reaches nothing. With a tokens file, any Host.
- A state-changing request (POST, PUT, PATCH, DELETE) with an ``Origin`` that is not the
  server's own (the Host it came to, or ``external_url``), or with ``Sec-Fetch-Site:
  cross-site``, is refused (403): another site's page never acts with a browser's credentials.
  Machine clients such as Alertmanager send no Origin.
- Compressed request bodies (``Content-Encoding``) are refused unread (415): nothing is inflated.
- A query parameter with a NUL character is refused (400) on every backend: Postgres cannot
  compare text with one.
- Handlers read bodies only after authentication, through ``read_json`` / ``read_form``: the
  content type first (415; JSON only as ``application/json``, which a cross-site form or a
  preflight-free fetch cannot send), then at most a limit (413) within ``body_read_timeout``
  (408). A connection whose body was not read to its end is closed after the answer; a
  compressed or stalled body is cut off at once instead of being drained.
- The ``Server`` header names no versions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
import re
import urllib.parse
from collections.abc import Iterable
from typing import Any

import multidict
from aiohttp import web

from remediator.adapters.http import auth as http_auth
from remediator.adapters.http import errors as http_errors
from remediator.domain import errors

JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
SMALL_BODY = 64 * 1024  # forms and operators' JSON: comments, runbook parameters
MAX_DEPTH = 32
MAX_ID = 2**63 - 1
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK = frozenset({"localhost", "127.0.0.1", "[::1]"})
_ID = re.compile(r"[0-9]{1,19}")
_HOST = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(?P<port>[0-9]{1,5}))?")
_ORIGIN = re.compile(r"(?P<scheme>https?)://" + _HOST.pattern, re.IGNORECASE)
_DEFAULT_PORTS = {"http": "80", "https": "443"}


@dataclasses.dataclass(frozen=True)
class Limits:
    body_read_timeout: float = 30.0
    max_body_bytes: int = 1024 * 1024
    external_url: str | None = None


LIMITS = web.AppKey("hygiene_limits", Limits)
HANG_UP = web.RequestKey("hang_up", bool)


def refuse_unknown_query(request: web.Request, allowed: Iterable[str]) -> None:
    """400 naming each query parameter not in ``allowed``."""
    unknown = sorted(set(request.query) - set(allowed))
    if unknown:
        raise errors.ValidationFailed(
            f"unknown query parameters: {', '.join(unknown)}",
            fields=[{"field": name, "message": "unknown parameter"} for name in unknown],
        )


def parse_limit(text: str, *, most: int) -> int:
    """A page size: an integer from 1 to ``most`` (400 naming ``limit`` otherwise)."""
    limit = parse_id(text)
    if limit is None or not 1 <= limit <= most:
        raise errors.ValidationFailed(
            f"limit must be an integer from 1 to {most}",
            fields=[{"field": "limit", "message": f"not an integer from 1 to {most}"}],
        )
    return limit


def parse_id(text: str | None) -> int | None:
    """An id or cursor: ASCII decimal within 63 bits (what every database column holds)."""
    if text is None or not _ID.fullmatch(text):
        return None
    value = int(text)
    return value if value <= MAX_ID else None


def _host_port(text: str, scheme: str) -> tuple[str, str] | None:
    found = _HOST.fullmatch(text)
    if found is None:
        return None
    return found["host"].lower(), found["port"] or _DEFAULT_PORTS[scheme]


def _origin_key(origin: str) -> tuple[str, str, str] | None:
    """``(scheme, host, port)`` of an Origin header, or of a URL (its path left out)."""
    found = _ORIGIN.fullmatch("/".join(origin.strip().split("/", 3)[:3]))
    if found is None:
        return None
    scheme = found["scheme"].lower()
    return scheme, found["host"].lower(), found["port"] or _DEFAULT_PORTS[scheme]


def same_origin(request: web.Request, origin: str, external_url: str | None) -> bool:
    """Whether ``origin`` is the server's: the origin of ``external_url``, or the host and
    port the request was sent to. The scheme is not compared: behind a TLS-terminating proxy
    the browser's is https and ours http, and no one else can answer on our host and port."""
    presented = _origin_key(origin)
    if presented is None:
        return False
    if external_url is not None and presented == _origin_key(external_url):
        return True
    scheme, host, port = presented
    return _host_port(request.headers.get("Host", ""), scheme) == (host, port)


def _loopback_host(request: web.Request) -> bool:
    return _loopback_name(request.headers.get("Host", ""))


@functools.lru_cache(maxsize=64)
def _loopback_name(host: str) -> bool:
    found = _HOST.fullmatch(host)
    return found is not None and found["host"].lower() in LOOPBACK


_NO_LIMITS = Limits()


def _refusal(request: web.Request) -> web.Response | None:
    app = request.app
    if app.get(http_auth.TOKENS) is None and not _loopback_host(request):
        return http_errors.error_response(
            421,
            "misdirected_request",
            "without a tokens file only localhost, 127.0.0.1 and [::1] are served",
        )
    headers = request.headers
    if request.method in STATE_CHANGING:
        limits = app.get(LIMITS, _NO_LIMITS)
        origin = headers.get("Origin")
        cross_site = headers.get("Sec-Fetch-Site", "").lower() == "cross-site"
        foreign = origin is not None and not same_origin(request, origin, limits.external_url)
        if cross_site or foreign:
            return http_errors.error_response(
                403, "cross_origin", "cross-origin requests may not change anything"
            )
    if request.query_string and any(
        "\x00" in key or "\x00" in value for key, value in request.query.items()
    ):
        return http_errors.error_response(  # Postgres cannot compare text with NUL in it
            400, "invalid", "query parameters may not contain NUL characters"
        )
    encoding = headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity") and request.body_exists:
        request[HANG_UP] = True
        return http_errors.error_response(
            415, "unsupported_media_type", "compressed request bodies are not accepted"
        )
    return None


async def _close_if_unread(request: web.Request, response: web.StreamResponse) -> None:
    """A connection whose body was not read to its end is not kept alive. aiohttp drains the
    rest for at most a few seconds (so the client reads its answer instead of a reset); a
    compressed or stalled body is not drained but cut off at once: draining would inflate it,
    or wait for it."""
    if request.content.is_eof():
        return
    response.force_close()
    if request.get(HANG_UP):
        await response.prepare(request)
        await response.write_eof()
        request.protocol.force_close()


@web.middleware
async def middleware(request: web.Request, handler: http_errors.Handler) -> web.StreamResponse:
    refused = _refusal(request)
    if refused is not None:
        await _close_if_unread(request, refused)
        return refused
    try:
        response = await handler(request)
    except web.HTTPException as e:  # a redirect; the error middleware answers the rest
        await _close_if_unread(request, e)
        raise
    await _close_if_unread(request, response)
    return response


async def name_server(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = "remediator"


def require_type(request: web.Request, expected: str) -> None:
    if request.content_type != expected:
        raise http_errors.Refused(
            415,
            "unsupported_media_type",
            f"expected Content-Type {expected}, got {request.content_type or 'none'}",
        )


async def read_body(request: web.Request, *, limit: int) -> bytes:
    """The whole body: at most ``limit`` bytes (413), within ``body_read_timeout`` (408)."""
    length = request.content_length
    if length is not None and length > limit:
        raise _too_large(limit)
    content = request.content
    if content.is_eof():  # the whole body has arrived (the usual case): nothing to wait for
        body = content.read_nowait(-1)
        if len(body) > limit:
            raise _too_large(limit)
        return body
    chunks: list[bytes] = []
    size = 0
    timeout = request.app.get(LIMITS, _NO_LIMITS).body_read_timeout
    try:
        async with asyncio.timeout(timeout):
            while chunk := await content.read(65536):
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                chunks.append(chunk)
    except TimeoutError:
        request[HANG_UP] = True
        raise http_errors.Refused(
            408, "timeout", f"the body did not arrive within {timeout:g} s"
        ) from None
    return b"".join(chunks)


def _too_large(limit: int) -> http_errors.Refused:
    return http_errors.Refused(413, "too_large", f"body above {limit} bytes")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} out of range")
    return value


def _int64(text: str) -> int:
    if len(text) > 20:
        raise ValueError("integer out of range")
    value = int(text)
    if not -MAX_ID - 1 <= value <= MAX_ID:
        raise ValueError("integer out of range")
    return value


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack += [(child, depth + 1) for child in item.values()]
        elif isinstance(item, list):
            stack += [(child, depth + 1) for child in item]
    return deepest


def parse_json(body: bytes) -> Any:
    """Strict JSON: UTF-8, integers within 64 bits, finite numbers, nesting at most
    ``MAX_DEPTH``; anything else is ``ValueError``."""
    try:
        value = json.loads(
            body.decode("utf-8"),
            parse_int=_int64,
            parse_float=_finite,
            parse_constant=_refuse_constant,
        )
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if _depth(value) > MAX_DEPTH:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH}")
    return value


async def read_json(request: web.Request, *, limit: int = SMALL_BODY) -> Any:
    """The parsed JSON body (``Content-Type: application/json`` only)."""
    require_type(request, JSON)
    body = await read_body(request, limit=limit)
    try:
        return parse_json(body)
    except ValueError as e:
        raise http_errors.Refused(400, "invalid", f"body must be JSON: {e}") from None


async def read_form(request: web.Request) -> multidict.MultiDict[str]:
    """A URL-encoded form (the web page's forms; multipart is refused with 415)."""
    require_type(request, FORM)
    body = await read_body(request, limit=SMALL_BODY)
    try:
        pairs = urllib.parse.parse_qsl(
            body.decode("utf-8"), keep_blank_values=True, max_num_fields=200, errors="strict"
        )
    except ValueError:
        raise http_errors.Refused(400, "invalid", "the form is not UTF-8 form data") from None
    return multidict.MultiDict(pairs)
