"""The operators' web page, rendered on the server (a little JavaScript polls for progress).

- ``/runbooks``: runs waiting for approval (with the triggering alert), manual runbooks, recent
  runs; ``/runbooks/runs/{id}``: one run, its plan, approve / reject, live step progress.
- Sign-in with a token (or HTTP Basic, or the trusted proxy's header) into a server-side
  session whose random id is the cookie: HttpOnly, SameSite=Strict, Secure over TLS (or as
  configured). Sign-in and sign-out are audit events.
- Signing out revokes the session on every replica; a sign-in nonce is good for one post.
- Every form post carries a CSRF token bound to the session; without it the post is refused
  (403). Who posts and their role are checked before the body is read (401, 403): auditors get
  no approve button, and a forged post of theirs is refused unread.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from remediator.adapters.db import queries
from remediator.adapters.http import (
    api,
    console,
    history,
    hygiene,
    operating,
    responses,
    runbooks,
    runpage,
)
from remediator.adapters.http import auth as http_auth
from remediator.domain import auth, errors

LOGIN_NONCE = "remediator_login"

esc = console.esc
_page = console.page
_viewer = console.viewer
_csrf = console.csrf
_who = console.who
_form = console.form
_link = console.link


# -- sign-in -------------------------------------------------------------------------------


def _login_page(
    request: web.Request, *, error: str = "", status: int = 200, name: str = ""
) -> web.Response:
    sessions = request.app[http_auth.SESSIONS]
    nonce = sessions.issue_nonce()
    shown = f'<p class="error" id="error" role="alert">{esc(error)}</p>' if error else ""
    body = f"""
<h1>Sign in</h1>{shown}
<form method="post" action="/runbooks/login" id="login">
<input type="hidden" name="csrf" value="{nonce}">
<p><label>Token <input name="token" type="password" autocomplete="current-password"
 required autofocus></label></p>
<p><label>Name (optional: the token's name in the tokens file, any case)
 <input name="name" autocomplete="username" value="{esc(name)}"></label></p>
<p><button type="submit">Sign in</button></p>
</form>"""
    response = _page("Sign in", body, status=status)
    response.set_cookie(
        LOGIN_NONCE,
        nonce,
        max_age=http_auth.NONCE_TTL,
        httponly=True,
        samesite="Strict",
        secure=sessions.cookie_secure(request),
        path="/runbooks",
    )
    return response


async def login_form(request: web.Request) -> web.Response:
    return _login_page(request)


async def login(request: web.Request) -> web.Response:
    """Sign in. The nonce is used up by the first post that carries it; failures are throttled
    per client address (checked before the body is read) and per token name."""
    throttle = request.app.get(http_auth.THROTTLE)
    keys = [http_auth.address_key(request)]
    if throttle is not None:
        await throttle.check(request, *keys)
    nonce = request.cookies.get(LOGIN_NONCE, "")
    if not nonce:  # before the body is read: no sign-in form was fetched
        raise web.HTTPForbidden(text="missing or invalid CSRF token")
    form = await hygiene.read_form(request)
    sessions = request.app[http_auth.SESSIONS]
    if form.get("csrf") != nonce or not await sessions.consume_nonce(nonce):
        raise web.HTTPForbidden(text="missing or invalid CSRF token")
    book = request.app.get(http_auth.TOKENS)
    token, name = str(form.get("token", "")), str(form.get("name", "")).strip() or None
    if name is not None:
        keys.append(http_auth.name_key(name))
    if throttle is not None:
        await throttle.check(request, *keys)
    principal, error = _sign_in_as(book, token, name)
    if principal is None:
        if throttle is not None:
            await throttle.fail("unknown_token", request, *keys)
        return _login_page(request, error=error, status=401, name=name or "")
    response = web.HTTPSeeOther("/runbooks")
    response.set_cookie(
        http_auth.COOKIE,
        await sessions.start(principal.name, request),
        max_age=int(sessions.ttl),
        httponly=True,
        samesite="Strict",
        secure=sessions.cookie_secure(request),
        path="/",
    )
    response.del_cookie(LOGIN_NONCE, path="/runbooks")
    raise response


def _sign_in_as(
    book: auth.TokenBook | None, token: str, name: str | None
) -> tuple[auth.Principal | None, str]:
    """The token's owner; a name, when given, must be the owner's (in any case)."""
    owner = book.authenticate(token) if book is not None and token else None
    if owner is None:
        return None, "Unknown token: check it and try again."
    if name is not None and name.casefold() != owner.name.casefold():
        return None, (
            f"That token is not {name}'s. Leave Name empty to sign in as the token's owner, "
            "or give the name the tokens file has for it."
        )
    return owner, ""


async def logout(request: web.Request) -> web.Response:
    await _form(request, auth.Permission.READ)
    await request.app[http_auth.SESSIONS].revoke(request)
    response = web.HTTPSeeOther("/runbooks/login")
    response.del_cookie(http_auth.COOKIE, path="/")
    raise response


# -- pages ---------------------------------------------------------------------------------


def _alert_cell(alert: dict[str, Any] | None) -> str:
    if alert is None:
        return "manual"
    links = [
        link
        for link in (
            _link(alert.get("generatorURL"), "graph"),
            _link(alert.get("alertmanagerURL"), "Alertmanager"),
        )
        if link is not None
    ]
    return f"{esc(alert['alertname'])} ({esc(alert['status'])}) " + " · ".join(links)


def _approvals_table(items: list[dict[str, Any]]) -> str:
    if not items:
        return '<p id="no-approvals">Nothing is waiting for approval.</p>'
    rows = []
    for item in items:
        run, step = item["run"], item["step"]
        rows.append(
            f'<tr class="pending-approval"><td><a href="/runbooks/runs/{run["id"]}">run '
            f"{run['id']}</a></td><td>{esc(run['playbook'])}</td><td>{esc(run['node'] or '')}"
            f"</td><td>{esc(step['key'])} ({esc(step['action'])})</td>"
            f"<td>{len(item['approvals'])} / {step['approvalsRequired']}</td>"
            f"<td>{_alert_cell(item['alert'])}</td><td>{console.when(run['waitingSince'])}</td></tr>"
        )
    return (
        '<table id="approvals"><tr><th>run</th><th>playbook</th><th>node</th><th>step</th>'
        "<th>approvals</th><th>alert</th><th>waiting since</th></tr>" + "".join(rows) + "</table>"
    )


def _runbooks_section(request: web.Request, principal: auth.Principal, csrf: str) -> str:
    parts = []
    for playbook in runbooks.manual_playbooks(request.app[runbooks.RUNBOOKS].rules):
        inputs = "".join(
            f'<label>{esc(name)} <input name="param.{esc(name)}" '
            f'placeholder="{esc(spec.type.value)}"></label> '
            for name, spec in playbook.parameters.items()
            if name != "node"  # the node field fills it
        )
        form = ""
        if principal.can(auth.Permission.OPERATE):
            form = (
                f'<form method="post" action="/runbooks/{esc(playbook.name)}/trigger">'
                f'<input type="hidden" name="csrf" value="{csrf}">'
                f'<label>node <input name="node"></label> {inputs}'
                '<button type="submit">Start</button></form>'
            )
        parts.append(
            f"<li><strong>{esc(playbook.name)}</strong> {esc(playbook.description)}{form}</li>"
        )
    return '<ul id="runbooks">' + "".join(parts) + "</ul>" if parts else "<p>None.</p>"


async def index(request: web.Request) -> web.Response:
    principal, via = _viewer(request)
    csrf = _csrf(request, principal, via)
    found = await queries.pending_approvals(request.app[runbooks.RUNBOOKS].db)
    items = [dict(responses.pending_approval(item)) for item in found.waiting]
    recent = await request.app[api.API].queries.runs(limit=20, cursor=None, filters={})
    runs = "".join(
        f'<tr><td><a href="/runbooks/runs/{run["id"]}">{run["id"]}</a></td>'
        f"<td>{esc(run['playbook'])}</td><td>{esc(run['node'] or '')}</td>"
        f'<td class="status">{esc(run["status"])}</td>'
        f"<td>{console.when(run['createdAt'])}</td></tr>"
        for run in map(responses.run, recent.items)
    )
    body = (
        "<h2>Waiting for approval</h2>"
        + _approvals_table(items)
        + (
            f'<p class="muted" id="approvals-more">The oldest {len(items)} of {found.total:,} '
            "steps waiting for approval are shown.</p>"
            if found.total > len(items)
            else ""
        )
        + "<h2>Manual runbooks</h2>"
        + _runbooks_section(request, principal, csrf)
        + '<h2>Recent runs</h2><table id="recent"><tr><th>run</th><th>playbook</th>'
        + f"<th>node</th><th>status</th><th>created</th></tr>{runs}</table>"
        + '<p><a href="/runbooks/runs">All runs, with filters</a></p>'
    )
    return _page("Runbooks", body, who=_who(request, principal, via), current="/runbooks")


# -- form posts ----------------------------------------------------------------------------


def _error_page(error: errors.RemediatorError, *, back: str = "") -> web.Response:
    status = {
        errors.NotFound: 404,
        errors.Conflict: 409,
        errors.Forbidden: 403,
        errors.ValidationFailed: 400,
    }.get(type(error), 500)
    return console.error_page(str(error), status=status, back=back)


async def _decide(request: web.Request, *, approve: bool) -> web.Response:
    form, principal = await _form(request, auth.Permission.OPERATE)
    run_id = api.int_param(request, "run_id")
    step_id = api.int_param(request, "step_id")
    comment = str(form.get("comment", "")).strip()
    if not comment:
        return _error_page(
            errors.ValidationFailed("a comment is required"), back=f"/runbooks/runs/{run_id}"
        )
    try:
        await request.app[operating.OPERATIONS].decide(
            run_id=run_id,
            step_id=step_id,
            principal=principal.name,
            approve=approve,
            comment=comment,
        )
    except errors.RemediatorError as e:
        return _error_page(e, back=f"/runbooks/runs/{run_id}")
    raise web.HTTPSeeOther(f"/runbooks/runs/{run_id}?decided={step_id}")


async def approve(request: web.Request) -> web.Response:
    return await _decide(request, approve=True)


async def reject(request: web.Request) -> web.Response:
    return await _decide(request, approve=False)


async def trigger(request: web.Request) -> web.Response:
    form, principal = await _form(request, auth.Permission.OPERATE)
    params: dict[str, Any] = {}
    name = request.match_info["playbook"]
    playbook = request.app[runbooks.RUNBOOKS].rules.index.get(name)
    specs = playbook.parameters if playbook is not None else {}
    for key, value in form.items():
        if key.startswith("param.") and isinstance(value, str) and value != "":
            spec = specs.get(key[6:])
            params[key[6:]] = _typed(value, spec.type.value if spec else "string")
    node = str(form.get("node", "")).strip() or None
    try:
        started = await request.app[operating.OPERATIONS].trigger(
            playbook=name, node=node, params=params, principal=principal.name
        )
    except errors.RemediatorError as e:
        return _error_page(e)
    raise web.HTTPSeeOther(f"/runbooks/runs/{started.run_id}")


def _typed(value: str, kind: str) -> Any:
    if kind == "integer" and re.fullmatch(r"-?[0-9]{1,18}", value):
        return int(value)
    if kind == "boolean" and value in ("true", "false"):
        return value == "true"
    return value


async def root(request: web.Request) -> web.Response:
    """``/`` is the console."""
    raise web.HTTPSeeOther("/runbooks")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", root)
    app.router.add_get("/runbooks", index)
    app.router.add_get("/runbooks/login", login_form)
    app.router.add_post("/runbooks/login", login)
    app.router.add_post("/runbooks/logout", logout)
    app.router.add_get("/runbooks/runs/{run_id}", runpage.run_page)
    app.router.add_post("/runbooks/runs/{run_id}/steps/{step_id}/approve", approve)
    app.router.add_post("/runbooks/runs/{run_id}/steps/{step_id}/reject", reject)
    app.router.add_post("/runbooks/{playbook}/trigger", trigger)
    history.add_routes(app)
