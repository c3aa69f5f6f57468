"""What every console page shares: the layout and its navigation, who is signed in, the CSRF
token of forms, links from alert payloads and humanised times.

Every page is rendered on the server; its script (if any) runs under a per-response nonce in
the Content-Security-Policy, so nothing an alert carries can run in an operator's browser.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import html
import importlib.resources
import secrets
import string
import urllib.parse
from typing import Any

from aiohttp import web

from remediator.adapters.http import auth as http_auth
from remediator.adapters.http import hygiene
from remediator.domain import auth

_TEMPLATES = importlib.resources.files("remediator.adapters.http").joinpath("templates")
_LAYOUT = string.Template(_TEMPLATES.joinpath("layout.html").read_text(encoding="utf-8"))

esc = html.escape
# The time pages are rendered at: the server's clock, read once per request by ``viewer``.
_NOW: contextvars.ContextVar[dt.datetime | None] = contextvars.ContextVar("now", default=None)
# Whether the signed-in principal may read the audit trail (the navigation links it only then).
_AUDITOR: contextvars.ContextVar[bool] = contextvars.ContextVar("auditor", default=False)

NAV = (
    ("/runbooks", "Approvals"),
    ("/runbooks/fleet", "Fleet"),
    ("/runbooks/runs", "Runs"),
    ("/runbooks/audit", "Audit"),
)


def template(name: str) -> str:
    return _TEMPLATES.joinpath(name).read_text(encoding="utf-8")


def page(
    title: str,
    body: str,
    *,
    who: str = "",
    status: int = 200,
    script: str = "",
    current: str = "",
) -> web.Response:
    nonce = secrets.token_urlsafe(16)
    if script:
        body += f'\n<script nonce="{nonce}">{script}</script>'
    nav = ""
    if who:
        nav = "".join(
            f'<a href="{href}"{" aria-current=page" if href == current else ""}>{text}</a>'
            for href, text in NAV
            if href != "/runbooks/audit" or _AUDITOR.get()
        )
    text = _LAYOUT.substitute(title=esc(title), who=who, nav=nav, body=body)
    policy = (
        f"default-src 'self'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; "
        "frame-ancestors 'none'; form-action 'self'"
    )
    return web.Response(
        text=text,
        content_type="text/html",
        status=status,
        headers={"Content-Security-Policy": policy, "X-Content-Type-Options": "nosniff"},
    )


def viewer(
    request: web.Request, permission: auth.Permission = auth.Permission.READ
) -> tuple[auth.Principal, str]:
    principal, via = http_auth.identify(request)
    if principal is None:
        raise web.HTTPSeeOther("/runbooks/login")
    if not principal.can(permission):
        raise web.HTTPForbidden(text=f"{principal.name} may not {permission.value}")
    _NOW.set(request.app[http_auth.SESSIONS].clock())
    _AUDITOR.set(principal.can(auth.Permission.AUDIT))
    return principal, via


def csrf(request: web.Request, principal: auth.Principal, via: str) -> str:
    return request.app[http_auth.SESSIONS].csrf_token(request, principal, via)


def who(request: web.Request, principal: auth.Principal, via: str) -> str:
    roles = ", ".join(sorted(role.value for role in principal.roles))
    logout = ""
    if via == "cookie":
        logout = (
            '<form method="post" action="/runbooks/logout" class="inline">'
            f'<input type="hidden" name="csrf" value="{csrf(request, principal, via)}">'
            '<button type="submit">Sign out</button></form>'
        )
    return f'<span class="who" id="who">{esc(principal.name)} ({esc(roles)}) {logout}</span>'


async def form(request: web.Request, permission: auth.Permission) -> tuple[Any, auth.Principal]:
    """The posted form and its principal: who it is and their role are checked before the body
    is read, its CSRF token after."""
    principal, via = http_auth.identify(request)
    if principal is None:
        raise web.HTTPUnauthorized(text="sign in first")
    if not principal.can(permission):
        raise web.HTTPForbidden(text=f"{principal.name} may not {permission.value}")
    posted = await hygiene.read_form(request)
    token = posted.get("csrf")
    if not isinstance(token, str) or not request.app[http_auth.SESSIONS].check_csrf(
        request, principal, via, token
    ):
        raise web.HTTPForbidden(text="missing or invalid CSRF token")
    request[http_auth.CSRF_CHECKED] = True
    return posted, http_auth.require(request, permission)


def link(url: str | None, text: str) -> str | None:
    """A link to an http(s) URL from an alert; anything else (``javascript:``, ``data:``) is
    never made a link, since alert payloads come from whoever can reach Alertmanager."""
    if not url or urllib.parse.urlsplit(url).scheme.lower() not in ("http", "https"):
        return None
    return f'<a href="{esc(url)}" rel="noreferrer">{text}</a>'


def now() -> dt.datetime:
    return _NOW.get() or dt.datetime.now(dt.UTC)


def parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def ago(seconds: float) -> str:
    """``seconds`` in the past (or future, when negative) in words an operator reads at once."""
    future = seconds < 0
    seconds = abs(seconds)
    if seconds < 10:
        return "just now"
    if seconds < 60:
        text = f"{int(seconds)} s"
    elif seconds < 3600:
        text = f"{int(seconds // 60)} min"
    elif seconds < 86400:
        text = f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    else:
        text = f"{int(seconds // 86400)} d"
    return f"in {text}" if future else f"{text} ago"


def duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def when(value: str | None, *, at: dt.datetime | None = None) -> str:
    """A ``<time>`` saying how long ago, with the exact time on hover."""
    parsed = parse_time(value)
    if parsed is None:
        return ""
    exact = parsed.isoformat(timespec="seconds")
    words = ago(((at or now()) - parsed).total_seconds())
    return f'<time datetime="{esc(exact)}" title="{esc(exact)}">{esc(words)}</time>'


def between(start: str | None, end: str | None) -> str:
    first, last = parse_time(start), parse_time(end)
    if first is None:
        return ""
    return duration(((last or now()) - first).total_seconds()) + ("" if last else " so far")


def query_string(values: dict[str, str], **changes: str | None) -> str:
    merged = {**values, **changes}
    return urllib.parse.urlencode({k: v for k, v in merged.items() if v})


def error_page(message: str, *, status: int, back: str = "") -> web.Response:
    again = f' <a href="{esc(back)}">Back</a>' if back else ""
    return page("Refused", f'<p class="error" id="error">{esc(message)}{again}</p>', status=status)
