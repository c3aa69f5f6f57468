"""The console's history: ``/runbooks/runs`` (every run, filtered and paged) and
``/runbooks/audit`` (audit events, for auditors), each with export links carrying the same
filters to the auditors' API (CSV and JSON Lines, with the chain's hashes).

Filters by status, playbook, node, alert name, principal and time (UTC), answered by the
auditors' indexed queries; pages are keyset pages, newest first. A filter that cannot be used
(a time that is not one) is named on the page and left out; the form keeps what was typed.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from remediator.adapters.db import audit as db_audit
from remediator.adapters.http import audit as http_audit
from remediator.adapters.http import console, hygiene, responses
from remediator.domain import auth, errors, runs

esc = console.esc
PAGE_SIZE = 50
STATUSES = ("", *(status.value for status in runs.RunStatus))
# The page's filter names and the API's: status is the run's outcome, alert its alert name,
# from and to the time range. Every page filter is a plain string: a browser's form sends the
# empty ones too, and a value that is not a time is named on the page and left out.
RUN_FIELDS = {
    "status": "outcome",
    "playbook": "playbook",
    "node": "node",
    "alert": "alertname",
    "principal": "principal",
    "from": "since",
    "to": "until",
}
EVENT_FIELDS = {**RUN_FIELDS, "kind": "kind"}
TIMES = ("from", "to")
_LOCAL = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?$")


def _utc(value: str) -> str:
    """A browser's ``datetime-local`` value (no offset) is read as UTC."""
    if _LOCAL.fullmatch(value):
        return value + (":00" if value.count(":") == 1 else "") + "Z"
    return value


def read_filters(
    request: web.Request, fields: dict[str, str]
) -> tuple[dict[str, str], dict[str, str], db_audit.Filters, list[str]]:
    """The page's filters as given, the usable ones under the API's names, the query's
    filters, and what was left out and why."""
    given = {name: request.query.get(name, "").strip() for name in fields}
    given = {name: value for name, value in given.items() if value}
    api: dict[str, str] = {}
    values: dict[str, Any] = {}
    problems = []
    for name, value in given.items():
        key = fields[name]
        if name in TIMES:
            try:
                values[key] = http_audit.parse_time(name, _utc(value))
            except errors.ValidationFailed:
                problems.append(f"{name} {value[:40]!r} is not a time (e.g. 2026-12-01T03:00)")
                continue
            value = _utc(value)
        else:
            values[key] = value
        api[key] = value
    if "run" in request.query:  # from a run page's link: an id, or refused as the API does
        run = hygiene.parse_id(request.query["run"])
        if run is None:
            raise errors.ValidationFailed(
                "run must be a run id", fields=[{"field": "run", "message": "not an id"}]
            )
        given["run"] = api["run"] = str(run)
        values["run"] = run
    return given, api, db_audit.Filters(**values), problems


def _cursor(request: web.Request, problems: list[str]) -> int | None:
    text = request.query.get("before", "")
    if not text:
        return None
    cursor = hygiene.parse_id(text)
    if cursor is None:
        problems.append("before is not a run or event id: showing the newest")
    return cursor


def _input(name: str, label: str, value: str, kind: str = "text") -> str:
    step = ' step="1"' if kind == "datetime-local" else ""
    shown = value.removesuffix("Z") if kind == "datetime-local" else value
    return (
        f'<label>{esc(label)} <input name="{name}" type="{kind}"{step} value="{esc(shown)}">'
        "</label>"
    )


def _form(action: str, given: dict[str, str], *, events: bool) -> str:
    options = "".join(
        f'<option value="{s}"{" selected" if given.get("status", "") == s else ""}>'
        f"{s or 'any'}</option>"
        for s in STATUSES
    )
    fields = [
        f'<label>status <select name="status">{options}</select></label>',
        _input("playbook", "playbook", given.get("playbook", "")),
        _input("node", "node", given.get("node", "")),
        _input("alert", "alert name", given.get("alert", "")),
        _input("principal", "principal", given.get("principal", "")),
        _input("from", "from (UTC)", given.get("from", ""), "datetime-local"),
        _input("to", "to (UTC)", given.get("to", ""), "datetime-local"),
    ]
    if events:
        fields.append(_input("kind", "event kind", given.get("kind", "")))
    if "run" in given:
        fields.append(f'<label>run <input name="run" value="{esc(given["run"])}" readonly></label>')
    return (
        f'<form class="filters" method="get" action="{action}" id="filters">'
        + "".join(fields)
        + f'<button type="submit">Filter</button> <a href="{action}">clear</a></form>'
    )


def _pager(action: str, given: dict[str, str], next_cursor: str | None, cursor: int | None) -> str:
    links = []
    if cursor is not None:
        links.append(f'<a href="{action}?{esc(console.query_string(given))}">newest</a>')
    if next_cursor is not None:
        query = console.query_string(given, before=next_cursor)
        links.append(f'<a id="older" href="{action}?{esc(query)}">older →</a>')
    return f'<p class="pager">{" ".join(links)}</p>'


def _problems(problems: list[str]) -> str:
    if not problems:
        return ""
    return '<p class="error" id="filter-error">' + esc("; ".join(problems)) + "</p>"


def _exports(api: dict[str, str]) -> str:
    csv = console.query_string(api, format="csv")
    jsonl = console.query_string(api, format="jsonl")
    return (
        '<p id="exports">Export the matching audit events with their hashes: '
        f'<a id="export-csv" href="/api/v1/audit/export?{esc(csv)}">CSV</a> · '
        f'<a id="export-jsonl" href="/api/v1/audit/export?{esc(jsonl)}">JSON Lines</a> · '
        '<a href="/api/v1/audit/verify">verify the chain</a></p>'
    )


async def runs_page(request: web.Request) -> web.Response:
    principal, via = console.viewer(request)
    given, api, filters, problems = read_filters(request, RUN_FIELDS)
    cursor = _cursor(request, problems)
    page = await request.app[http_audit.AUDIT].queries.runs(filters, limit=PAGE_SIZE, cursor=cursor)
    items, next_cursor = map(responses.run, page.items), page.next_cursor
    rows = "".join(
        f'<tr class="run"><td><a href="/runbooks/runs/{r["id"]}">run {r["id"]}</a></td>'
        f"<td>{esc(r['playbook'])}</td><td>{esc(r['kind'])}</td><td>{esc(r['node'] or '')}</td>"
        f'<td><span class="badge {esc(r["status"])}">{esc(r["status"])}</span></td>'
        f"<td>{esc(r['principal'] or '')}</td><td>{console.when(r['createdAt'])}</td>"
        f"<td>{console.between(r['createdAt'], r['finishedAt'])}</td></tr>"
        for r in items
    )
    error = _problems(problems)
    exports = _exports(api) if principal.can(auth.Permission.AUDIT) else ""
    body = (
        "<h1>Runs</h1>"
        + _form("/runbooks/runs", given, events=False)
        + error
        + exports
        + '<table id="runs"><tr><th>run</th><th>playbook</th><th>kind</th><th>node</th>'
        "<th>status</th><th>principal</th><th>created</th><th>took</th></tr>"
        + (rows or '<tr><td colspan="8">No run matches.</td></tr>')
        + "</table>"
        + _pager("/runbooks/runs", given, next_cursor, cursor)
    )
    return console.page(
        "Runs",
        body,
        who=console.who(request, principal, via),
        current="/runbooks/runs",
    )


async def audit_page(request: web.Request) -> web.Response:
    principal, via = console.viewer(request, auth.Permission.AUDIT)
    given, api, filters, problems = read_filters(request, EVENT_FIELDS)
    cursor = _cursor(request, problems)
    page = await request.app[http_audit.AUDIT].queries.events(
        filters, limit=PAGE_SIZE, cursor=cursor
    )
    items, next_cursor = map(responses.event_row, page.items), page.next_cursor
    rows = "".join(
        f'<tr class="event"><td>{e["id"]}</td><td>{console.when(e["at"])}</td>'
        f"<td>{esc(e['kind'])}</td><td>{esc(e['actor'])}</td><td>"
        + (f'<a href="/runbooks/runs/{e["runId"]}">run {e["runId"]}</a>' if e["runId"] else "")
        + f"</td><td>{esc(e['fromStatus'] or '')} → {esc(e['toStatus'] or '')}</td>"
        f"<td>{esc(e['reason'] or '')}</td></tr>"
        for e in items
    )
    error = _problems(problems)
    body = (
        "<h1>Audit trail</h1>"
        + _form("/runbooks/audit", given, events=True)
        + error
        + _exports(api)
        + '<table id="audit-events"><tr><th>#</th><th>when</th><th>kind</th><th>actor</th>'
        "<th>run</th><th>status</th><th>reason</th></tr>"
        + (rows or '<tr><td colspan="7">No event matches.</td></tr>')
        + "</table>"
        + _pager("/runbooks/audit", given, next_cursor, cursor)
    )
    return console.page(
        "Audit",
        body,
        who=console.who(request, principal, via),
        current="/runbooks/audit",
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/runbooks/runs", runs_page)
    app.router.add_get("/runbooks/audit", audit_page)
