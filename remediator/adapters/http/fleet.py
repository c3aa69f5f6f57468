"""The fleet: ``GET /api/v1/fleet`` (JSON, camelCase) and the console's ``/runbooks/fleet``.

Both come from ``Operations.fleet_status``: every GPU node with its state as remediator sees it
(healthy, held, draining, faulty, cordoned by run N, capped GPUs), the disruption budget used
and allowed per pool, the breaker (an admin resets it from the page with a comment) and the
steps the guards hold with their reason. The page refreshes itself every few seconds.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import json
from typing import Any

import pydantic
from aiohttp import web

from remediator.adapters.http import auth as http_auth
from remediator.adapters.http import console, hygiene, operating
from remediator.domain import auth, errors, fleet
from remediator.engine import operations

esc = console.esc
REFRESH_SECONDS = 5
_FLEET_JS = console.template("live.js")


class CappedGpu(pydantic.BaseModel):
    uuid: str
    run: int
    limit: float | None = pydantic.Field(description="watts set by remediator")
    previous: float | None = pydantic.Field(description="watts before the cap")


class Node(pydantic.BaseModel):
    name: str
    pool: str | None
    state: str = pydantic.Field(description="|".join(fleet.STATES))
    detail: str
    runs: list[int] = pydantic.Field(description="runs active on it or holding it disrupted")
    cappedGpus: list[CappedGpu]
    labels: dict[str, str]
    cordoned: bool
    ready: bool | None
    knownToCluster: bool = pydantic.Field(description="false: only the store names it")


class Budget(pydantic.BaseModel):
    pool: str | None = pydantic.Field(description="null: the whole fleet (no pool_label)")
    used: int
    allowed: int
    nodes: list[str]


class Breaker(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    open: bool
    reason: str | None = None
    openedAt: str | None = None
    resetAt: str | None = None
    resetBy: str | None = None
    resetComment: str | None = None


class Held(pydantic.BaseModel):
    run: int
    step: str
    action: str
    node: str | None
    reason: str
    kind: str
    until: str | None


class Line(pydantic.BaseModel):
    waitingFor: str = pydantic.Field(
        description="budget:<pool> (budget: the whole fleet's), breaker:"
    )
    what: str
    steps: int = pydantic.Field(description="held steps waiting in this line")
    first: Held = pydantic.Field(description="the next to go (oldest first)")


class Fleet(pydantic.BaseModel):
    """The fleet as remediator sees it."""

    nodes: list[Node] = pydantic.Field(
        description="every GPU node, or those in ?state=, by name; a page of them with ?limit="
    )
    nodesTotal: int = pydantic.Field(description="the nodes in ?state= (every node without)")
    nextCursor: str | None = pydantic.Field(
        description="the cursor of the next page of nodes (null: this page is the last)"
    )
    budgets: list[Budget]
    breaker: Breaker
    held: list[Held] = pydantic.Field(
        description=f"held steps with the guard's reason: the first {fleet.HELD_SHOWN} "
        "waiting in line, the first of each line and every step held on its own (a change "
        "window, a cooldown)"
    )
    heldTotal: int = pydantic.Field(description="every held step, those not in held too")
    lines: list[Line] = pydantic.Field(
        description="held steps waiting in line for the budget or the breaker, by line"
    )
    truncated: list[str] = pydantic.Field(
        description="kinds of records cut at the store's read limit (the oldest are shown)"
    )
    clusterError: str | None = pydantic.Field(
        description="why the cluster's nodes are missing (null: listed, or no cluster)"
    )


def _held_json(h: fleet.HeldStep) -> Held:
    return Held.model_validate(h, from_attributes=True)  # (not ``detailed``)


@dataclasses.dataclass(frozen=True)
class NodePage:
    """Which nodes of the fleet to list: those in ``state``, by name, after ``cursor`` (a
    node's name), at most ``limit`` (None: every one)."""

    state: str | None = None
    limit: int | None = None
    cursor: str | None = None


def fleet_json(status: fleet.FleetStatus, page: NodePage) -> dict[str, Any]:
    breaker = status.breaker
    # (``fleet.assemble`` lists the nodes by name: a cursor is where its name would stand)
    chosen = [node for node in status.nodes if page.state is None or node.state == page.state]
    start = 0 if page.cursor is None else bisect.bisect_right([n.name for n in chosen], page.cursor)
    end = len(chosen) if page.limit is None else min(len(chosen), start + page.limit)
    document = Fleet(
        nodes=[
            Node(
                name=node.name,
                pool=node.pool,
                state=node.state,
                detail=node.detail,
                runs=list(node.runs),
                cappedGpus=[
                    CappedGpu(uuid=g.uuid, run=g.run, limit=g.limit, previous=g.previous)
                    for g in node.capped_gpus
                ],
                labels=dict(node.labels),
                cordoned=node.cordoned,
                ready=node.ready,
                knownToCluster=node.known_to_cluster,
            )
            for node in chosen[start:end]
        ],
        nodesTotal=len(chosen),
        nextCursor=chosen[end - 1].name if end < len(chosen) else None,
        budgets=[
            Budget(pool=b.pool, used=b.used, allowed=b.allowed, nodes=list(b.nodes))
            for b in status.budgets
        ],
        breaker=Breaker(
            open=bool(breaker.get("open")),
            reason=breaker.get("reason"),
            openedAt=breaker.get("opened_at"),
            resetAt=breaker.get("reset_at"),
            resetBy=breaker.get("reset_by"),
            resetComment=breaker.get("reset_comment"),
        ),
        held=[_held_json(h) for h in status.held if h.detailed],
        heldTotal=status.held_total,
        lines=[
            Line(
                waitingFor=line.waiting_for,
                what=line.what,
                steps=line.steps,
                first=_held_json(line.first),
            )
            for line in status.lines
        ],
        truncated=list(status.truncated),
        clusterError=status.cluster_error,
    )
    return document.model_dump(mode="json")


def _node_page(request: web.Request) -> NodePage:
    """``?state=`` (one of ``fleet.STATES``), ``?limit=`` (1-``fleet.MAX_NODES_LIMIT``) and
    ``?cursor=`` (the ``nextCursor`` of the page before: a node's name); any other parameter
    refused."""
    hygiene.refuse_unknown_query(request, ("state", "limit", "cursor"))
    query = request.query
    state = query.get("state")
    if state is not None and state not in fleet.STATES:
        message = f"state must be one of {', '.join(fleet.STATES)}"
        raise errors.ValidationFailed(message, fields=[{"field": "state", "message": message}])
    text = query.get("limit")
    limit = None if text is None else hygiene.parse_limit(text, most=fleet.MAX_NODES_LIMIT)
    cursor = query.get("cursor")
    if cursor is not None:
        operations.check_node_name(cursor, field="cursor")
    return NodePage(state=state, limit=limit, cursor=cursor)


async def get_fleet(request: web.Request) -> web.Response:
    http_auth.require(request, auth.Permission.READ)
    page = _node_page(request)
    status = await request.app[operating.OPERATIONS].fleet_status()
    # 5,000 nodes are 3 MB of JSON: written on a thread, the loop sharing the CPU meanwhile.
    text = await asyncio.to_thread(lambda: json.dumps(fleet_json(status, page)))
    return web.Response(text=text, content_type="application/json")


# -- the page ------------------------------------------------------------------------------


def _runs(ids: tuple[int, ...]) -> str:
    return ", ".join(f'<a href="/runbooks/runs/{i}">run {i}</a>' for i in ids)


#: Node rows a page of the console shows, the most urgent first (a 5,000-node table every
#: 5 s was 1.7 MB of HTML and most of the page's 0.1 s on the loop).
PAGE_ROWS = 200
_URGENCY = {state: rank for rank, state in enumerate(fleet.STATES)}


def _nodes_table(status: fleet.FleetStatus, *, state: str | None, page: int) -> str:
    if not status.nodes:
        return '<p id="no-nodes">No GPU node is known (no cluster configured, no runs yet).</p>'
    chosen = [node for node in status.nodes if state is None or node.state == state]
    chosen.sort(key=lambda node: (_URGENCY.get(node.state, len(_URGENCY)), node.name))
    pages = max(1, -(-len(chosen) // PAGE_ROWS))
    page = min(page, pages)
    shown = chosen[(page - 1) * PAGE_ROWS : page * PAGE_ROWS]
    rows = []
    for node in shown:
        caps = "<br>".join(
            f"<code>{esc(g.uuid)}</code> {_w(g.previous)} → {_w(g.limit)}" for g in node.capped_gpus
        )
        ready = ' <span class="badge failed">not ready</span>' if node.ready is False else ""
        gpu_labels = ", ".join(
            f"{esc(k)}={esc(v)}" for k, v in sorted(node.labels.items()) if _shown_label(k)
        )
        rows.append(
            f'<tr class="node" id="node-{esc(node.name)}" data-state="{esc(node.state)}">'
            f"<td><strong>{esc(node.name)}</strong>{ready}"
            f"{'' if node.known_to_cluster else ' <span class=muted>(not listed)</span>'}</td>"
            f"<td>{esc(node.pool or '')}</td>"
            f'<td><span class="badge {esc(node.state)}">{esc(node.state)}</span> '
            f"{esc(node.detail)}</td><td>{_runs(node.runs)}</td><td>{caps}</td>"
            f'<td class="muted wrap">{gpu_labels}</td></tr>'
        )
    of = f"{state} " if state else ""
    where = f"state={state}&amp;" if state else ""
    links = []
    if page > 1:
        links.append(f'<a href="?{where}page={page - 1}" id="previous-page">previous</a>')
    if page < pages:
        links.append(f'<a href="?{where}page={page + 1}" id="next-page">next</a>')
    counted = (
        f'<p class="muted" id="nodes-shown">{len(chosen):,} {of}nodes'
        + (
            f", {(page - 1) * PAGE_ROWS + 1}-{(page - 1) * PAGE_ROWS + len(shown)} shown "
            f"(page {page} of {pages}, the most urgent first) · {' · '.join(links)}"
            if pages > 1
            else ""
        )
        + "</p>"
    )
    if not shown:
        return counted
    return (
        counted + '<table id="nodes"><tr><th>node</th><th>pool</th><th>state</th><th>runs</th>'
        "<th>capped GPUs</th><th>labels</th></tr>" + "".join(rows) + "</table>"
    )


#: Labels worth a glance at 3 a.m.: the GPU model, health marks and driver upgrades.
SHOWN_LABELS = ("gpu.product", "gpu-status", "gpu-watch", "driver-upgrade", "remediator.io/")


def _shown_label(key: str) -> bool:
    return any(part in key for part in SHOWN_LABELS)


def _w(value: float | None) -> str:
    return "?" if value is None else f"{value:g} W"


def _budgets(status: fleet.FleetStatus) -> str:
    rows = "".join(
        f'<tr class="budget"><td>{esc(b.pool or "whole fleet")}</td><td>{b.used} of {b.allowed}'
        f' <progress max="{max(b.allowed, 1)}" value="{b.used}"></progress></td>'
        f"<td>{esc(', '.join(b.nodes))}</td></tr>"
        for b in status.budgets
    )
    return (
        '<table id="budgets"><tr><th>pool</th><th>nodes disrupted / allowed</th>'
        f"<th>disrupted nodes</th></tr>{rows}</table>"
    )


def _breaker(status: fleet.FleetStatus, *, can_reset: bool, csrf: str) -> str:
    state = status.breaker
    if state.get("open"):
        text = (
            f'<span class="badge open">open</span> since {console.when(state.get("opened_at"))}: '
            f"{esc(str(state.get('reason') or ''))}. Disruptive steps are held until it is reset."
        )
    else:
        text = '<span class="badge ok">closed</span>'
        if state.get("reset_at"):
            text += (
                f" · reset {console.when(state.get('reset_at'))} by "
                f"{esc(str(state.get('reset_by')))}: {esc(str(state.get('reset_comment') or ''))}"
            )
    form = ""
    if can_reset and state.get("open"):
        form = (
            '<form method="post" action="/runbooks/breaker/reset" id="breaker-reset" '
            f'class="decision"><input type="hidden" name="csrf" value="{csrf}">'
            "<label>Why it is safe to go on (kept in the audit trail)<br>"
            '<textarea name="comment" required maxlength="4000"></textarea></label><br>'
            '<button type="submit" class="approve">Reset the breaker</button></form>'
        )
    return f'<p id="breaker">Circuit breaker: {text}</p>{form}'


def _held(status: fleet.FleetStatus) -> str:
    if not status.held_total:
        return '<p id="no-held">No step is held.</p>'
    lines = "".join(
        f'<li class="line">{line.steps:,} step{"s" if line.steps != 1 else ""} wait for '
        f"{esc(line.what)}, oldest first; next: {_runs((line.first.run,))} step "
        f"{esc(line.first.step)} on {esc(line.first.node or '')}</li>"
        for line in status.lines
    )
    listed = [h for h in status.held if h.detailed][: fleet.HELD_SHOWN]
    rows = "".join(
        f'<tr class="held"><td>{_runs((h.run,))}</td><td>{esc(h.step)}</td><td>{esc(h.action)}'
        f"</td><td>{esc(h.node or '')}</td><td>{esc(h.reason)}</td>"
        f"<td>{console.when(h.until)}</td></tr>"
        for h in listed
    )
    more = status.held_total - len(listed)
    return (
        (f'<ul id="held-lines">{lines}</ul>' if lines else "")
        + '<table id="held"><tr><th>run</th><th>step</th><th>action</th><th>node</th>'
        f"<th>reason</th><th>rechecked by</th></tr>{rows}</table>"
        + (
            f'<p class="muted" id="held-more">{len(listed)} of {status.held_total:,} held steps '
            'shown, the oldest (<a href="?state=held">every node with a held step</a>).</p>'
            if more > 0
            else ""
        )
    )


def _view(request: web.Request) -> tuple[str | None, int, list[str]]:
    """The page's ``state`` and ``page``; what is wrong with them is shown, not refused (a
    bookmarked link outlives its page)."""
    problems = []
    state = request.query.get("state")
    if state is not None and state not in fleet.STATES:
        problems.append(f"state must be one of {', '.join(fleet.STATES)}: showing every node")
        state = None
    text = request.query.get("page", "1")
    page = hygiene.parse_id(text)
    if page is None or page < 1:
        problems.append("page must be a positive integer: showing the first")
        page = 1
    return state, page, problems


async def fleet_page(request: web.Request) -> web.Response:
    principal, via = console.viewer(request)
    state, page, problems = _view(request)
    status = await request.app[operating.OPERATIONS].fleet_status()
    counts: dict[str, int] = {}
    for node in status.nodes:
        counts[node.state] = counts.get(node.state, 0) + 1
    summary = " · ".join(
        f'<a href="?state={s}" class="state-filter">{counts[s]:,} {s}</a>'
        for s in fleet.STATES
        if s in counts
    )
    if state is not None:
        summary += ' · <a href="?" id="all-nodes">all nodes</a>'
    problem = "".join(f'<p class="error query-problem">{esc(p)}</p>' for p in problems)
    if status.cluster_error:
        problem += f'<p class="error" id="cluster-error">{esc(status.cluster_error)}</p>'
    if status.truncated:
        problem += (
            f'<p class="error" id="truncated">More {esc(", ".join(status.truncated))} than '
            "the view reads: the oldest are shown.</p>"
        )
    flash = ""
    if request.query.get("reset") == "1":
        flash = '<div class="flash" id="flash" role="status">The breaker is closed.</div>'
    can_reset = principal.can(auth.Permission.ADMIN)
    body = (
        f'<div id="fleet" data-live data-refresh="{REFRESH_SECONDS}"><h1>Fleet</h1>{flash}'
        f'<p class="muted">{len(status.nodes)} GPU nodes{": " + summary if summary else ""}'
        f" · as of {console.when(console.now().isoformat())}, refreshed every "
        f'{REFRESH_SECONDS} s · <a href="/api/v1/fleet">JSON</a></p>{problem}'
        + _breaker(status, can_reset=can_reset, csrf=console.csrf(request, principal, via))
        + "<h2>Disruption budget</h2>"
        + _budgets(status)
        + "<h2>Held steps</h2>"
        + _held(status)
        + "<h2>Nodes</h2>"
        + _nodes_table(status, state=state, page=page)
        + "</div>"
    )
    return console.page(
        "Fleet",
        body,
        who=console.who(request, principal, via),
        script=_FLEET_JS,
        current="/runbooks/fleet",
    )


async def reset_breaker(request: web.Request) -> web.Response:
    form, principal = await console.form(request, auth.Permission.ADMIN)
    comment = str(form.get("comment", "")).strip()
    if not comment or len(comment) > 4000:
        return console.error_page(
            "a comment (at most 4000 characters) is required", status=400, back="/runbooks/fleet"
        )
    try:
        await request.app[operating.OPERATIONS].reset_breaker(
            principal=principal.name, comment=comment
        )
    except errors.RemediatorError as e:
        return console.error_page(str(e), status=409, back="/runbooks/fleet")
    raise web.HTTPSeeOther("/runbooks/fleet?reset=1")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/v1/fleet", get_fleet)
    app.router.add_get("/runbooks/fleet", fleet_page)
    app.router.add_post("/runbooks/breaker/reset", reset_breaker)
