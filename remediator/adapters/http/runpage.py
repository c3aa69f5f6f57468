"""``/runbooks/runs/{id}``: one run, its first screen the decision.

At the top: the alert (name, severity, node, GPU, links to its graph), the step waiting for a
decision with Approve / Reject and a comment, and what that step will do read from live state
(the pods it evicts with their owners, the disruption budgets and fleet guards that decide it,
what undo will do). Below: the timeline of steps with durations and rendered outputs, artifacts
with their sha256, the undo or original runs, and the run's audit events. A small script polls
the run and refreshes the live parts while it is active.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from typing import Any

from aiohttp import web

from remediator.adapters.http import api, console, operating, outputs, responses, runbooks
from remediator.domain import auth, errors
from remediator.engine import previewing

esc = console.esc
ACTIVE = ("pending", "running", "waiting_approval")
PLAN_TIMEOUT = 8.0
_RUN_JS = console.template("run.js")
_POLICY = {
    "undo": "When the alert resolves, steps not yet started are cancelled and the undo of "
    "every succeeded step runs, newest first.",
    "cancel": "When the alert resolves, steps not yet started are cancelled; what is done "
    "stays done.",
    "continue": "The run carries on to its end even if the alert resolves.",
}


def _alert(detail: dict[str, Any]) -> str:
    alert = detail.get("alert")
    if alert is None:
        origin = esc(detail["kind"])
        if detail["kind"] == "manual":
            origin = f"manual, started by {esc(detail['principal'] or '?')}"
        return f'<div class="card" id="alert"><h2>Origin</h2><p>{origin}</p>{_node(detail)}</div>'
    labels, notes = alert.get("labels") or {}, alert.get("annotations") or {}
    links = [console.link(alert.get("generatorURL"), "graph")]
    links.append(console.link(alert.get("alertmanagerURL"), "Alertmanager"))
    shown = " · ".join(link for link in links if link)
    summary = notes.get("summary") or notes.get("description") or ""
    return (
        f'<div class="card" id="alert"><h2>Alert <span id="alertname">{esc(alert["alertname"])}'
        f'</span> <span class="badge {esc(alert["status"])}">{esc(alert["status"])}</span></h2>'
        f'<dl class="facts"><dt>severity</dt><dd>{esc(labels.get("severity", "-"))}</dd>'
        f"<dt>fired</dt><dd>{console.when(alert.get('startsAt'))}</dd>"
        f"<dt>summary</dt><dd>{esc(summary) or '-'}</dd>"
        f"<dt>links</dt><dd>{shown or '-'}</dd></dl>{_node(detail)}</div>"
    )


def _node(detail: dict[str, Any]) -> str:
    node = detail["node"]
    fleet = f' <a href="/runbooks/fleet#node-{esc(node)}">fleet</a>' if node else ""
    return (
        f'<dl class="facts"><dt>node</dt><dd><strong id="run-node">{esc(node or "-")}</strong>'
        f"{fleet}</dd><dt>GPU</dt><dd>{esc(detail['gpu'] or '-')}</dd></dl>"
    )


def _waiting(detail: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for step in detail["steps"] if step["status"] == "waiting_approval"]


def _waits_to_start(detail: dict[str, Any]) -> list[str]:
    """Why a pending run has not started: what it waits for (``waitingFor``), if anything."""
    waiting = detail.get("waitingFor")
    if detail["status"] != "pending" or not waiting:
        return []
    kind, _, what = waiting.partition(":")
    if kind == "slot":
        why = (
            f"its playbook <strong>{esc(detail['playbook'])}</strong> already has as many "
            "active runs as its concurrency allows; it is tried again when one of them ends"
        )
    else:
        node, _, gpu = what.partition("/") if kind == "gpu" else (what, "", "")
        held = f"GPU <strong>{esc(gpu)}</strong> of node" if gpu else "node"
        runs = f"/runbooks/runs?{urllib.parse.urlencode({'node': node})}"
        holder = detail.get("waitingBehind")
        who = (
            f'<a href="/runbooks/runs/{int(holder)}">run {int(holder)}</a>'
            if holder is not None
            else "another run"
        )
        why = (
            f"{who} holds {held} <strong>{esc(node)}</strong> "
            f'(<a href="{esc(runs)}">its runs</a>); it is tried again when that run ends'
        )
    return [f'<p class="waiting-note"><span class="badge pending">waiting</span> {why}.</p>']


def _decision(detail: dict[str, Any], *, can_decide: bool, csrf: str, flash: str) -> str:
    waiting = _waiting(detail)
    parts = [flash]
    if not waiting:
        text = "Nothing waits for a decision."
        if detail["status"] in ACTIVE:
            text += " The run goes on by itself."
        parts.append(f'<p id="no-decision">{text}</p>')
    parts += _waits_to_start(detail)
    for step in detail["steps"]:
        held = (step.get("output") or {}).get("held")
        if step["status"] == "pending" and held:
            parts.append(
                f'<p class="held-note"><span class="badge held">held</span> step '
                f"<strong>{esc(step['key'])}</strong>: {esc(str(held))} (looked at again "
                f"{console.when(step['output'].get('held_until'))}; see the "
                '<a href="/runbooks/fleet">fleet</a>)</p>'
            )
    for step in waiting:
        given = [a for a in detail.get("approvals", []) if a["stepId"] == step["id"]]
        parts.append(
            f'<p class="next">Step <strong>{esc(step["key"])}</strong> ({esc(step["action"])}) '
            f'waits for approval: <span class="approvals">{len(given)} of '
            f"{step['approvalsRequired']} approvals</span>"
            + "".join(
                f"<br>{esc(a['principal'])} {esc(a['decision'])}: {esc(a['comment'])}"
                for a in given
            )
            + "</p>"
        )
        if not can_decide:
            parts.append('<p class="muted">You may not decide this step.</p>')
            continue
        action = f"/runbooks/runs/{detail['id']}/steps/{step['id']}"
        parts.append(
            f'<form class="decision" method="post" action="{action}/approve" '
            f'id="decide-{step["id"]}">'
            f'<input type="hidden" name="csrf" value="{csrf}">'
            "<label>Comment (required, kept in the audit trail)<br>"
            '<textarea name="comment" required maxlength="4000"></textarea></label><br>'
            '<button type="submit" class="approve">Approve</button>'
            f'<button type="submit" class="reject" formaction="{action}/reject">Reject</button>'
            "</form>"
        )
    return '<div class="card" id="decision" data-live><h2>Decision</h2>' + "".join(parts) + "</div>"


def _flash(detail: dict[str, Any], request: web.Request, principal: auth.Principal) -> str:
    step_text = request.query.get("decided", "")
    if not step_text.isdigit():
        return ""
    step = next((s for s in detail["steps"] if s["id"] == int(step_text)), None)
    mine = [
        a
        for a in detail.get("approvals", [])
        if step is not None and a["stepId"] == step["id"] and a["principal"] == principal.name
    ]
    if step is None or not mine:
        return ""
    decision = mine[-1]
    given = sum(1 for a in detail.get("approvals", []) if a["stepId"] == step["id"])
    verb = "approved" if decision["decision"] == "approved" else "rejected"
    then = {
        "waiting_approval": f"{given} of {step['approvalsRequired']} approvals: it waits for more.",
        "rejected": "The run ends without running it.",
        "pending": "The step runs as soon as the fleet guards let it.",
    }.get(step["status"], f"The step's status is now {step['status']}.")
    return (
        f'<div class="flash" id="flash" role="status">You {verb} step '
        f"<strong>{esc(step['key'])}</strong> {console.when(decision['at'])}: "
        f"“{esc(decision['comment'])}”. {esc(then)}</div>"
    )


def _upcoming(plan: previewing.RunPlan | None, detail: dict[str, Any]) -> str:
    if plan is None:
        if detail["status"] not in ACTIVE:
            return '<div id="next" data-live></div>'
        return (
            '<div id="next" data-live><p class="muted" id="plan">Live state could not be read '
            "in time.</p></div>"
        )
    parts = []
    for step in plan.steps:
        if step.get("status") not in ("pending", "waiting_approval"):
            continue
        guard = step.get("guard")
        verdict = ""
        if guard:
            kind = "ok" if guard["go"] else "blocks"
            verdict = (
                f'<p class="guard">fleet guards: <span class="badge {kind}">'
                f"{'go' if guard['go'] else 'hold'}</span> {esc(guard['reason'])}</p>"
            )
        would = (step.get("preview") or {}).get("would", "")
        parts.append(
            f'<section class="upcoming" id="plan-{esc(step["key"])}"><h3>{esc(step["key"])} · '
            f'{esc(step["action"])} <span class="badge {esc(step["status"])}">'
            f"{esc(step['status'])}</span></h3><p>{esc(would)}</p>{verdict}"
            + outputs.preview(step)
            + "</section>"
        )
    if not parts:
        return '<div id="next" data-live></div>'
    return (
        '<div id="next" data-live><div id="plan"><h2>What happens next</h2>'
        + "".join(parts)
        + "</div></div>"
    )


def _undo(detail: dict[str, Any], playbook: Any, registry: Any) -> str:
    policy = _POLICY.get(detail.get("onResolve") or "", "")
    undone = []
    for spec in playbook.steps if playbook is not None else []:
        undo = spec.undo_spec
        if undo is None:
            continue
        name = undo.action or spec.action
        meaning = ""
        if name in registry:
            meaning = registry.get(name).semantics.get("undo", "")
        undone.append(f"<li>{esc(spec.id)}: {esc(name)} undo {esc(meaning)}</li>")
    listed = f"<ul>{''.join(undone)}</ul>" if undone else "<p>No step declares an undo.</p>"
    return f'<div id="undo"><h2>What undo will do</h2><p>{esc(policy)}</p>{listed}</div>'


def _timeline(detail: dict[str, Any]) -> str:
    rows = []
    for step in detail["steps"]:
        approvals = ""
        if step["requiresApproval"]:
            given = [a for a in detail.get("approvals", []) if a["stepId"] == step["id"]]
            approvals = f"{len(given)} of {step['approvalsRequired']}: " + "; ".join(
                f"{esc(a['principal'])} {esc(a['decision'])}: {esc(a['comment'])}" for a in given
            )
        rows.append(
            f'<tr id="step-{step["id"]}"><td>{step["seq"]}</td><td>{esc(step["key"])}'
            f"{' (undo)' if step['phase'] == 'undo' else ''}</td><td>{esc(step['action'])}</td>"
            f'<td class="step-status"><span class="badge {esc(step["status"])}">'
            f"{esc(step['status'])}</span></td>"
            f"<td>{console.when(step['startedAt'])}</td>"
            f"<td>{console.between(step['startedAt'], step['finishedAt'])}</td>"
            f'<td class="step-progress wrap">{outputs.output(step)}</td><td>{approvals}</td></tr>'
        )
    return (
        '<div id="timeline" data-live><h2>Timeline</h2><table id="steps"><tr><th>#</th>'
        "<th>step</th><th>action</th><th>status</th><th>started</th><th>took</th>"
        "<th>output</th><th>approvals</th></tr>" + "".join(rows) + "</table></div>"
    )


def _links(detail: dict[str, Any], *, can_audit: bool) -> str:
    items = []
    if detail.get("parentRunId"):
        parent = detail["parentRunId"]
        items.append(f'<li>original run <a href="/runbooks/runs/{parent}">run {parent}</a></li>')
    for child in detail.get("childRuns", []):
        items.append(
            f'<li>{esc(child["kind"])} run <a class="child-run" href="/runbooks/runs/'
            f'{child["id"]}">run {child["id"]}</a> ({esc(child["status"])})</li>'
        )
    links = detail.get("links") or {}
    for href in links.get("artifacts", []):
        items.append(
            f'<li>artifact <a class="artifact-link" href="{esc(href)}">{esc(href)}</a></li>'
        )
    for href in links.get("deliveries", []):
        items.append(f'<li>alert delivery <a href="{esc(href)}">{esc(href)}</a></li>')
    if can_audit:
        audit = f"/runbooks/audit?run={detail['id']}"
        items.append(f'<li><a id="audit-link" href="{audit}">audit trail of this run</a></li>')
    return '<div id="links" data-live><h2>Related</h2><ul>' + "".join(items) + "</ul></div>"


def _events(detail: dict[str, Any]) -> str:
    rows = "".join(
        f'<tr class="event"><td>{console.when(e["at"])}</td><td>{esc(e["kind"])}</td>'
        f"<td>{esc(e['actor'])}</td><td>{esc(e['fromStatus'] or '')} → "
        f"{esc(e['toStatus'] or '')}</td><td>{esc(e['reason'] or '')}</td></tr>"
        for e in detail.get("events", [])
    )
    return (
        '<div id="events" data-live><h2>Audit events</h2><table><tr><th>when</th><th>kind</th>'
        f"<th>actor</th><th>status</th><th>reason</th></tr>{rows}</table></div>"
    )


async def _plan(request: web.Request, run_id: int) -> previewing.RunPlan | None:
    with contextlib.suppress(TimeoutError, errors.RemediatorError):
        return await asyncio.wait_for(
            request.app[operating.OPERATIONS].plan_run(run_id), PLAN_TIMEOUT
        )
    return None


async def run_page(request: web.Request) -> web.Response:
    principal, via = console.viewer(request)
    run_id = api.int_param(request, "run_id")
    found = await request.app[api.API].queries.run_detail(run_id)
    if found is None:
        raise errors.NotFound("run not found")
    detail: dict[str, Any] = dict(responses.run_detail(found))
    rules = request.app[runbooks.RUNBOOKS].rules
    playbook = rules.index.get(detail["playbook"])
    own_manual = detail["kind"] == "manual" and detail["principal"] == principal.name
    can_decide = principal.can(auth.Permission.OPERATE) and not own_manual
    plan = await _plan(request, run_id) if detail["status"] in ACTIVE else None
    dry = ' <span class="badge">dry run</span>' if detail["dryRun"] else ""
    body = (
        f'<div id="run" data-api="/api/v1/runs/{run_id}">'
        f"<h1>Run {run_id}: {esc(detail['playbook'])} "
        f'<span class="badge status {esc(detail["status"])}" id="run-status">'
        f"{esc(detail['status'])}</span>{dry}</h1>"
        f'<p class="muted">{esc(detail["kind"])} run · created {console.when(detail["createdAt"])}'
        f" · {esc(detail['reason'] or '')}</p>"
        '<div class="grid" id="first-screen">'
        + _alert(detail)
        + _decision(
            detail,
            can_decide=can_decide,
            csrf=console.csrf(request, principal, via),
            flash=_flash(detail, request, principal),
        )
        + "</div>"
        + _upcoming(plan, detail)
        + _undo(detail, playbook, rules.registry)
        + _timeline(detail)
        + _links(detail, can_audit=principal.can(auth.Permission.AUDIT))
        + _events(detail)
        + "</div>"
    )
    return console.page(
        f"Run {run_id}",
        body,
        who=console.who(request, principal, via),
        script=_RUN_JS,
        current="/runbooks/runs",
    )
