"""Authentication (Bearer token or HTTP Basic with the token as password) and role checks."""

from __future__ import annotations

import base64
import binascii

from aiohttp import web

from remediator.domain import auth

TOKENS = web.AppKey("tokens", auth.TokenBook)
PRINCIPAL = web.RequestKey("principal", auth.Principal)


def _credentials(request: web.Request) -> tuple[str | None, str] | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return None, value.strip()
    if scheme.lower() == "basic" and value.strip():
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        name, sep, secret = decoded.partition(":")
        return (name or None, secret) if sep else None
    return None


def authenticate(request: web.Request) -> auth.Principal | None:
    """The caller, or ``None``. Without a tokens file every caller is the loopback admin."""
    book = request.app.get(TOKENS)
    if book is None:
        return auth.ANONYMOUS_ADMIN
    found = _credentials(request)
    if found is None:
        return None
    name, secret = found
    return book.authenticate(secret, name=name)


def require(request: web.Request, permission: auth.Permission) -> auth.Principal:
    principal = authenticate(request)
    if principal is None:
        raise web.HTTPUnauthorized(
            text="missing or invalid credentials",
            headers={"WWW-Authenticate": 'Bearer realm="remediator"'},
        )
    if not principal.can(permission):
        raise web.HTTPForbidden(text=f"{principal.name} may not {permission.value}")
    request[PRINCIPAL] = principal
    return principal


__all__ = ["TOKENS", "authenticate", "require"]
