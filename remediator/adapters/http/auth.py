"""Authentication and role checks.

A caller is identified, first match wins, by:
1. ``Authorization``: ``Bearer <token>`` or HTTP Basic with the token as password;
2. the user header of an authenticating reverse proxy, honoured only when the connection comes
   from one of ``trusted_proxies`` (the user gets the roles of the tokens-file entry of that
   name; unknown users get nothing);
3. the web page's signed session cookie (``session.py``) — accepted for safe methods, and for
   form posts only together with a valid CSRF token (the page's handlers check it).

Without a tokens file every caller is the loopback admin.

Signing out revokes the session and sign-in nonces are single use. Both records are kept in this
process until the cookie or nonce expires: with several replicas, a cookie signed out on one is
still accepted by the others until its expiry (keep the web page on one replica, or shorten
``session_ttl``). Wrong credentials are throttled per client address and per token name
(``Throttle``): behind a reverse proxy the address is the proxy's.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import ipaddress
import json
import logging
import secrets
import time
from collections.abc import Callable
from typing import Literal

from aiohttp import web

from remediator.domain import auth

TOKENS = web.AppKey("tokens", auth.TokenBook)
PRINCIPAL = web.RequestKey("principal", auth.Principal)
CSRF_CHECKED = web.RequestKey("csrf_checked", bool)

Via = Literal["header", "proxy", "cookie", "anonymous"]
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
NONCE_TTL = 600

logger = logging.getLogger("remediator.http.auth")


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
        self._revoked: dict[str, float] = {}  # session id -> its expiry
        self._used_nonces: dict[str, float] = {}  # sign-in nonce -> its expiry

    def _sign(self, payload: bytes) -> str:
        return hmac.new(self.secret, payload, hashlib.sha256).hexdigest()

    @staticmethod
    def _remember(seen: dict[str, float], key: str, expiry: float) -> None:
        now = time.time()
        for old in [k for k, until in seen.items() if until < now]:
            del seen[old]
        seen[key] = expiry

    def issue(self, name: str) -> str:
        payload = json.dumps(
            {"n": name, "s": secrets.token_hex(16), "e": int(time.time() + self.ttl)},
            separators=(",", ":"),
        ).encode()
        return base64.urlsafe_b64encode(payload).decode() + "." + self._sign(payload)

    def read(self, request: web.Request) -> tuple[str, str] | None:
        """``(name, session id)`` of a valid cookie that was not signed out, else ``None``."""
        found = self._decode(request.cookies.get(COOKIE, ""))
        if found is None or found[1] in self._revoked:
            return None
        return found[0], found[1]

    def revoke(self, request: web.Request) -> None:
        """Sign the request's session out: its cookie and CSRF token stop working."""
        found = self._decode(request.cookies.get(COOKIE, ""))
        if found is not None:
            self._remember(self._revoked, found[1], found[2])

    def issue_nonce(self) -> str:
        """A signed sign-in nonce, valid for ``NONCE_TTL`` seconds and for one sign-in post."""
        payload = f"{secrets.token_urlsafe(18)}.{int(time.time() + NONCE_TTL)}"
        return payload + "." + self._sign(f"nonce|{payload}".encode())

    def consume_nonce(self, nonce: str) -> bool:
        """Whether ``nonce`` is one of ours, unexpired and unused; it is used from now on."""
        payload, _, signature = nonce.rpartition(".")
        expected = self._sign(f"nonce|{payload}".encode()).encode()
        if not hmac.compare_digest(expected, signature.encode("utf-8", "replace")):
            return False
        expiry = payload.rpartition(".")[2]
        if not expiry.isdecimal() or int(expiry) < time.time() or nonce in self._used_nonces:
            return False
        self._remember(self._used_nonces, nonce, int(expiry))
        return True

    def _decode(self, value: str) -> tuple[str, str, int] | None:
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
        return str(data.get("n")), str(data.get("s")), data["e"]

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


class Throttle:
    """Failed sign-ins per key (client address, token name) in a sliding window: from the
    ``limit``-th failure within ``window`` seconds, attempts under that key are refused (429)
    until the oldest of those failures leaves the window. Every failure is counted and logged,
    never with the credentials."""

    def __init__(
        self,
        *,
        limit: int,
        window: float,
        on_failure: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window = window
        self.on_failure = on_failure
        self.clock = clock
        self._failures: dict[str, list[float]] = {}

    def _recent(self, key: str, now: float) -> list[float]:
        times = [t for t in self._failures.get(key, ()) if t > now - self.window]
        if times:
            self._failures[key] = times
        else:
            self._failures.pop(key, None)
        return times

    def check(self, request: web.Request, *keys: str) -> None:
        """Raise 429 (with ``Retry-After``) when any of ``keys`` is throttled."""
        now = self.clock()
        waits = [
            times[-self.limit] + self.window - now
            for key in keys
            if len(times := self._recent(key, now)) >= self.limit
        ]
        if waits:
            self._count("throttled", request, keys)
            raise web.HTTPTooManyRequests(
                text="too many failed sign-ins; try again later",
                headers={"Retry-After": str(max(1, int(max(waits) + 0.999)))},
            )

    def fail(self, reason: str, request: web.Request, *keys: str) -> None:
        now = self.clock()
        if len(self._failures) > 10_000:  # forget keys whose failures left the window
            for known in list(self._failures):
                self._recent(known, now)
        for key in keys:
            self._failures[key] = [*self._recent(key, now), now]
        self._count(reason, request, keys)

    def _count(self, reason: str, request: web.Request, keys: tuple[str, ...]) -> None:
        if self.on_failure is not None:
            self.on_failure(reason)
        logger.warning(
            "authentication failed: reason=%s %s path=%s",
            reason,
            " ".join(keys),
            request.path,
        )


THROTTLE = web.AppKey("auth_throttle", Throttle)


def address_key(request: web.Request) -> str:
    return f"address={request.remote or 'unknown'}"


def name_key(name: str) -> str:
    return f"name={json.dumps(name)[1:-1][:64]}"


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


def _throttled_authenticate(request: web.Request) -> auth.Principal | None:
    """``authenticate``, with wrong credentials in ``Authorization`` throttled by client
    address and token name. Valid credentials always pass: tokens are random secrets, so the
    throttle slows and records guessing, and nobody sharing an address with Alertmanager (a
    proxy) can lock its deliveries out by sending wrong tokens."""
    throttle = request.app.get(THROTTLE)
    if throttle is None or not request.headers.get("Authorization"):
        return authenticate(request)
    principal = authenticate(request)
    if principal is not None:
        return principal
    found = _credentials(request)
    keys = [address_key(request)]
    if found is not None and found[0]:
        keys.append(name_key(found[0]))
    throttle.check(request, *keys)
    throttle.fail("malformed" if found is None else "unknown_token", request, *keys)
    return None


def require(request: web.Request, permission: auth.Permission) -> auth.Principal:
    principal = _throttled_authenticate(request)
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
