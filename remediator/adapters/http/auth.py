"""Authentication and role checks.

A caller is identified, first match wins, by:
1. ``Authorization``: ``Bearer <token>`` or HTTP Basic with the token as password;
2. the user header of an authenticating reverse proxy, honoured only when the connection comes
   from one of ``trusted_proxies`` (the user gets the roles of the tokens-file entry of that
   name; unknown users get nothing);
3. the web page's session cookie — accepted for safe methods, and for form posts only together
   with a valid CSRF token (the page's handlers check it).

Without a tokens file every caller is the loopback admin.

Sessions, used sign-in nonces and failed sign-ins are kept in the database every replica
shares (``ports.sessions``). ``middleware`` looks the request's session up before the handler
runs (one read by primary key, nothing cached), so a session signed out on one replica is
refused by every replica from the next request on. Wrong credentials are throttled per client
address and per token name (``Throttle``): behind a reverse proxy the address is the proxy's.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import hashlib
import hmac
import ipaddress
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

from aiohttp import web

from remediator.domain import auth, errors, sessions
from remediator.ports import sessions as sessions_port

TOKENS = web.AppKey("tokens", auth.TokenBook)
PRINCIPAL = web.RequestKey("principal", auth.Principal)
CSRF_CHECKED = web.RequestKey("csrf_checked", bool)
SESSION = web.RequestKey("web_session", sessions.WebSession)

Via = Literal["header", "proxy", "cookie", "anonymous"]
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
NONCE_TTL = 600
MAX_COOKIE = 200

logger = logging.getLogger("remediator.http.auth")
Clock = Callable[[], dt.datetime]


@dataclasses.dataclass(frozen=True)
class ProxyTrust:
    networks: tuple[Network, ...]
    header: str


PROXY = web.AppKey("proxy_trust", ProxyTrust)
COOKIE = "remediator_session"


class Sessions:
    """Server-side web sessions: the cookie holds a random id, the database its SHA-256, the
    principal and the expiry. Roles are not stored: they are looked up on every request, so
    removing a token from the tokens file ends its sessions (reason ``revoked``). Sign-in
    nonces are signed with ``secret`` and recorded in the database when posted, so each is
    good for one post on any replica."""

    def __init__(
        self,
        store: sessions_port.SessionStore,
        secret: bytes | None,
        *,
        ttl: float,
        secure: bool | None,
        clock: Clock,
    ) -> None:
        self.store = store
        self.secret = secret or secrets.token_bytes(32)
        self.ttl = ttl
        self.secure = secure
        self.clock = clock

    def _sign(self, payload: bytes) -> str:
        return hmac.new(self.secret, payload, hashlib.sha256).hexdigest()

    async def start(self, principal: str, request: web.Request) -> str:
        """Start a session for ``principal``; the cookie value to hand out."""
        cookie = secrets.token_urlsafe(32)
        now = self.clock()
        await self.store.start(
            sessions.WebSession(
                key=sessions.key_of(cookie),
                principal=principal,
                remote=(request.remote or "")[:200] or None,
                created_at=now,
                expires_at=now + dt.timedelta(seconds=self.ttl),
            )
        )
        return cookie

    async def resolve(self, request: web.Request) -> sessions.WebSession | None:
        """The live session of the request's cookie, read from the database."""
        cookie = request.cookies.get(COOKIE, "")
        if not cookie or len(cookie) > MAX_COOKIE:
            return None
        found = await self.store.find(sessions.key_of(cookie))
        return found if found is not None and found.live(self.clock()) else None

    @staticmethod
    def read(request: web.Request) -> sessions.WebSession | None:
        """The session ``middleware`` found for this request, if any."""
        return request.get(SESSION)

    async def revoke(
        self, request: web.Request, reason: sessions.EndReason = sessions.EndReason.LOGOUT
    ) -> None:
        """End the request's session on every replica: its cookie and CSRF token stop
        working."""
        found = self.read(request)
        if found is not None:
            await self.store.end(found.key, reason=reason)
            request.pop(SESSION, None)

    def issue_nonce(self) -> str:
        """A signed sign-in nonce, valid for ``NONCE_TTL`` seconds and for one sign-in post."""
        expiry = int(self.clock().timestamp() + NONCE_TTL)
        payload = f"{secrets.token_urlsafe(18)}.{expiry}"
        return payload + "." + self._sign(f"nonce|{payload}".encode())

    async def consume_nonce(self, nonce: str) -> bool:
        """Whether ``nonce`` is one of ours, unexpired and unused; it is used from now on."""
        payload, _, signature = nonce.rpartition(".")
        expected = self._sign(f"nonce|{payload}".encode()).encode()
        if not hmac.compare_digest(expected, signature.encode("utf-8", "replace")):
            return False
        expiry = payload.rpartition(".")[2]
        if not expiry.isdecimal() or len(expiry) > 12:
            return False
        expires_at = dt.datetime.fromtimestamp(int(expiry), dt.UTC)
        if expires_at < self.clock():
            return False
        return await self.store.use_nonce(sessions.key_of(nonce), expires_at=expires_at)

    def csrf_token(self, request: web.Request, principal: auth.Principal, via: str) -> str:
        """The CSRF token forms must carry: derived from the session's cookie (so every
        replica computes it, and it dies with the session), or bound to the identity when the
        browser authenticates otherwise (Basic, proxy)."""
        found = self.read(request) if via == "cookie" else None
        if found is not None:
            cookie = request.cookies.get(COOKIE, "").encode()
            return hmac.new(cookie, b"csrf", hashlib.sha256).hexdigest()
        return self._sign(f"csrf|{via}|{principal.name}".encode())

    def check_csrf(
        self, request: web.Request, principal: auth.Principal, via: str, token: str
    ) -> bool:
        expected = self.csrf_token(request, principal, via).encode()
        return hmac.compare_digest(expected, token.encode("utf-8", "replace"))

    def cookie_secure(self, request: web.Request) -> bool:
        return request.secure if self.secure is None else self.secure


SESSIONS = web.AppKey("sessions", Sessions)
FAILURES_SEEN = web.RequestKey("auth_failures_seen", dict)
FAILED_KEYS = web.RequestKey("auth_failed_keys", tuple)


class Throttle:
    """Failed sign-ins per key (client address, token name) in a sliding window, counted in
    the database every replica shares: from the ``limit``-th failure within ``window`` seconds,
    attempts under that key are refused (429) until the oldest of those failures leaves the
    window. Every failure is counted and logged, never with the credentials."""

    def __init__(
        self,
        store: sessions_port.SessionStore,
        *,
        limit: int,
        window: float,
        clock: Clock,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.limit = limit
        self.window = window
        self.on_failure = on_failure
        self.clock = clock

    async def recent(self, keys: Sequence[str]) -> dict[str, list[dt.datetime]]:
        since = self.clock() - dt.timedelta(seconds=self.window)
        return await self.store.failures(keys, since=since)

    def refuse(
        self, request: web.Request, keys: Sequence[str], recent: dict[str, list[dt.datetime]]
    ) -> None:
        """Raise 429 (with ``Retry-After``) when any of ``keys`` is throttled."""
        now = self.clock()
        waits = [
            wait
            for key in keys
            if (
                wait := sessions.throttle_wait(
                    recent.get(key, ()), limit=self.limit, window=self.window, now=now
                )
            )
            is not None
        ]
        if waits:
            self.count("throttled", request, keys)
            raise web.HTTPTooManyRequests(
                text="too many failed sign-ins; try again later",
                headers={"Retry-After": str(max(1, int(max(waits) + 0.999)))},
            )

    async def check(self, request: web.Request, *keys: str) -> None:
        self.refuse(request, keys, await self.recent(keys))

    async def fail(self, reason: str, request: web.Request, *keys: str) -> None:
        self.count(reason, request, keys)
        await self.store.add_failure(keys)

    def count(self, reason: str, request: web.Request, keys: Sequence[str]) -> None:
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


IDENTIFIED = web.RequestKey("identified", tuple)


def identify(request: web.Request) -> tuple[auth.Principal | None, Via]:
    """Who is calling and how they proved it (the cookie is not yet checked against CSRF).
    Credentials in ``Authorization`` are checked once per request (``middleware`` asks too)."""
    if not request.headers.get("Authorization"):
        return _identify(request)
    known = request.get(IDENTIFIED)
    if known is None:
        known = request[IDENTIFIED] = _identify(request)
    return known


def _identify(request: web.Request) -> tuple[auth.Principal | None, Via]:
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
    session = Sessions.read(request)
    if session is not None:
        return principal_named(book, session.principal), "cookie"
    return None, "anonymous"


def authenticate(request: web.Request) -> auth.Principal | None:
    principal, via = identify(request)
    if via == "cookie" and request.method not in SAFE_METHODS and not request.get(CSRF_CHECKED):
        return None
    return principal


def _failure_keys(request: web.Request) -> tuple[tuple[str, ...], str]:
    """The throttle keys of wrong credentials in ``Authorization``, and the failure reason."""
    found = _credentials(request)
    keys = [address_key(request)]
    if found is not None and found[0]:
        keys.append(name_key(found[0]))
    return tuple(keys), "malformed" if found is None else "unknown_token"


def _throttled_authenticate(request: web.Request) -> auth.Principal | None:
    """``authenticate``, with wrong credentials in ``Authorization`` throttled by client
    address and token name (``middleware`` read their recent failures and records this one).
    Valid credentials always pass: tokens are random secrets, so the throttle slows and
    records guessing, and nobody sharing an address with Alertmanager (a proxy) can lock its
    deliveries out by sending wrong tokens."""
    throttle = request.app.get(THROTTLE)
    principal = authenticate(request)
    if principal is not None or throttle is None or not request.headers.get("Authorization"):
        return principal
    keys, reason = _failure_keys(request)
    throttle.refuse(request, keys, request.get(FAILURES_SEEN) or {})
    if FAILED_KEYS not in request:
        throttle.count(reason, request, keys)
        request[FAILED_KEYS] = keys
    return None


@web.middleware
async def middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Read what authentication needs from the database before the handler runs (the
    cookie's session; the recent failures of wrong credentials), and record a failed
    sign-in the handler saw once it has answered."""
    book, sessions_ = request.app.get(TOKENS), request.app.get(SESSIONS)
    if book is None:
        return await handler(request)
    if sessions_ is not None and not request.headers.get("Authorization"):
        await _resolve_session(request, book, sessions_)
    throttle = request.app.get(THROTTLE)
    wrong = request.headers.get("Authorization") and identify(request)[0] is None
    if throttle is not None and wrong:
        request[FAILURES_SEEN] = await throttle.recent(_failure_keys(request)[0])
    try:
        return await handler(request)
    finally:
        keys = request.get(FAILED_KEYS)
        if throttle is not None and keys:
            try:
                await throttle.store.add_failure(keys)
            except errors.StoreUnavailable as e:
                logger.warning("failed sign-in not recorded: %s", e)


async def _resolve_session(request: web.Request, book: auth.TokenBook, sessions_: Sessions) -> None:
    found = await sessions_.resolve(request)
    if found is None:
        return
    request[SESSION] = found
    if principal_named(book, found.principal) is None:  # its token left the tokens file
        await sessions_.revoke(request, sessions.EndReason.REVOKED)


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


__all__ = ["TOKENS", "authenticate", "identify", "middleware", "require"]
