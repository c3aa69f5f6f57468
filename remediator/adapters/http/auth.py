"""Authentication and role checks.

A caller is identified, first match wins, by:
1. ``Authorization``: ``Bearer <token>`` or HTTP Basic with the token as password;
2. the user header of an authenticating reverse proxy, honoured only when the connection comes
   from one of ``trusted_proxies`` (the user gets the roles of the tokens-file entry of that
   name; unknown users get nothing);
3. the web page's signed session cookie (``session.py``) — accepted for safe methods, and for
   form posts only together with a valid CSRF token (the page's handlers check it).

Without a tokens file every caller is the loopback admin.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import ipaddress
import json
import secrets
import time
from typing import Literal

from aiohttp import web

from remediator.domain import auth

TOKENS = web.AppKey("tokens", auth.TokenBook)
PRINCIPAL = web.RequestKey("principal", auth.Principal)
CSRF_CHECKED = web.RequestKey("csrf_checked", bool)

Via = Literal["header", "proxy", "cookie", "anonymous"]
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclasses.dataclass(frozen=True)
class ProxyTrust:
    networks: tuple[Network, ...]
    header: str


PROXY = web.AppKey("proxy_trust", ProxyTrust)
COOKIE = "remediator_session"


class Sessions:
    """Signed, expiring session cookies (name, session id, expiry; HMAC-SHA256) and the CSRF
    tokens bound to them. Roles are not in the cookie: they are looked up on every request, so
    removing a token from the tokens file ends its sessions."""

    def __init__(self, secret: bytes | None, *, ttl: float, secure: bool | None) -> None:
        self.secret = secret or secrets.token_bytes(32)
        self.ttl = ttl
        self.secure = secure

    def _sign(self, payload: bytes) -> str:
        return hmac.new(self.secret, payload, hashlib.sha256).hexdigest()

    def issue(self, name: str) -> str:
        payload = json.dumps(
            {"n": name, "s": secrets.token_hex(16), "e": int(time.time() + self.ttl)},
            separators=(",", ":"),
        ).encode()
        return base64.urlsafe_b64encode(payload).decode() + "." + self._sign(payload)

    def read(self, request: web.Request) -> tuple[str, str] | None:
        """``(name, session id)`` of a valid cookie, else ``None``."""
        value = request.cookies.get(COOKIE, "")
        encoded, _, signature = value.partition(".")
        try:
            payload = base64.urlsafe_b64decode(encoded.encode())
            data = json.loads(payload)
        except (binascii.Error, ValueError):
            return None
        valid = hmac.compare_digest(
            self._sign(payload).encode(), signature.encode("utf-8", "replace")
        )
        if not valid or not isinstance(data, dict):
            return None
        if not isinstance(data.get("e"), int) or data["e"] < time.time():
            return None
        return str(data.get("n")), str(data.get("s"))

    def csrf_token(self, request: web.Request, principal: auth.Principal, via: str) -> str:
        """The CSRF token forms must carry: bound to the session, or to the identity when the
        browser authenticates otherwise (Basic, proxy)."""
        found = self.read(request) if via == "cookie" else None
        subject = f"session|{found[1]}" if found else f"{via}|{principal.name}"
        return self._sign(f"csrf|{subject}".encode())

    def check_csrf(
        self, request: web.Request, principal: auth.Principal, via: str, token: str
    ) -> bool:
        expected = self.csrf_token(request, principal, via).encode()
        return hmac.compare_digest(expected, token.encode("utf-8", "replace"))

    def cookie_secure(self, request: web.Request) -> bool:
        return request.secure if self.secure is None else self.secure


SESSIONS = web.AppKey("sessions", Sessions)


def _credentials(request: web.Request) -> tuple[str | None, str] | None:
    header = request.headers.get("Authorization", "")
    try:
        header.encode("utf-8")  # bytes that were not UTF-8 arrive as lone surrogates
    except UnicodeEncodeError:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return None, value.strip()
    if scheme.lower() == "basic" and value.strip():
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, ValueError):  # not base64 (or not ASCII), or not UTF-8
            return None
        name, sep, secret = decoded.partition(":")
        return (name or None, secret) if sep else None
    return None


def principal_named(book: auth.TokenBook, name: str) -> auth.Principal | None:
    """The principal of the tokens-file entry called ``name`` (proxy users, sessions)."""
    for _, principal in book._entries:
        if principal.name == name:
            return principal
    return None


def _from_proxy(request: web.Request, book: auth.TokenBook) -> auth.Principal | None:
    trust = request.app.get(PROXY)
    if trust is None or request.remote is None:
        return None
    user = request.headers.get(trust.header, "").strip()
    if not user:
        return None
    try:
        address = ipaddress.ip_address(request.remote)
    except ValueError:
        return None
    if not any(address in network for network in trust.networks):
        return None
    return principal_named(book, user)


def identify(request: web.Request) -> tuple[auth.Principal | None, Via]:
    """Who is calling and how they proved it (the cookie is not yet checked against CSRF)."""
    book = request.app.get(TOKENS)
    if book is None:
        return auth.ANONYMOUS_ADMIN, "anonymous"
    if request.headers.get("Authorization"):
        found = _credentials(request)
        if found is None:
            return None, "header"
        name, secret = found
        return book.authenticate(secret, name=name), "header"
    proxied = _from_proxy(request, book)
    if proxied is not None:
        return proxied, "proxy"
    sessions = request.app.get(SESSIONS)
    found = sessions.read(request) if sessions is not None else None
    if found is not None:
        return principal_named(book, found[0]), "cookie"
    return None, "anonymous"


def authenticate(request: web.Request) -> auth.Principal | None:
    principal, via = identify(request)
    if via == "cookie" and request.method not in SAFE_METHODS and not request.get(CSRF_CHECKED):
        return None
    return principal


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


__all__ = ["TOKENS", "authenticate", "identify", "require"]
