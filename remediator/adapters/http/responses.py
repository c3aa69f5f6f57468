"""The API's answers: one typed shape per resource, every key camelCase (as Alertmanager's own
API names them), rendered here from what the store and the engine return.

Free-form payloads keep the keys they were written with: a step's ``params`` and ``output``,
a plan step's ``preview``, an event's ``data`` and sealed ``rows``, alert labels and
annotations, a delivery's raw ``body``. They are the playbooks', the actions' and
Alertmanager's data, not the API's names. The OpenAPI document takes its schemas from these
types (``components``).
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any, Required

from typing_extensions import TypedDict

from remediator.adapters.db import audit as db_audit
from remediator.adapters.db import queries
from remediator.domain import audit
from remediator.engine import operations, previewing


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value else None


class Episode(TypedDict):
    id: int
    fingerprint: str
    alertname: str
    status: str
    startsAt: str | None
    endsAt: str | None
    labels: dict[str, str]
    annotations: dict[str, str]
    generatorURL: str | None
    receivedAt: str | None
    resolvedAt: str | None
    handled: bool
    firstDeliveryId: int | None
    resolvedDeliveryId: int | None


class AlertOfRun(Episode):
    alertmanagerURL: str | None


class Run(TypedDict):
    id: int
    playbook: str
    kind: str
    status: str
    episodeId: int | None
    parentRunId: int | None
    node: str | None
    gpu: str | None
    dryRun: bool
    principal: str | None
    params: dict[str, Any]
    onResolve: str
    reason: str
    createdAt: str | None
    updatedAt: str | None
    finishedAt: str | None
    # A pending run that could not start: the lock it waits for (``node:<name>``,
    # ``gpu:<node>/<gpu>``) or ``slot:<playbook>:`` (a free slot of its playbook); else None.
    waitingFor: str | None


class Step(TypedDict):
    id: int
    key: str
    seq: int
    phase: str
    action: str
    params: dict[str, Any]
    status: str
    effect: str
    requiresApproval: bool
    approvalsRequired: int
    attempt: int
    maxAttempts: int
    timeoutSeconds: float
    onFailure: str
    undoOf: int | None
    dueAt: str | None
    leaseOwner: str | None
    leaseExpiresAt: str | None
    output: Any
    error: str | None
    startedAt: str | None
    finishedAt: str | None


class Event(TypedDict):
    """An audit event. ``prevHash`` and ``hash`` chain it to the one before (see
    ``remediator audit verify``); ``keyId`` names the HMAC key, ``rows`` the sealed rows'
    digests."""

    id: int
    at: str | None
    kind: str
    actor: str
    runId: int | None
    stepId: int | None
    episodeId: int | None
    fromStatus: str | None
    toStatus: str | None
    reason: str | None
    data: Any
    prevHash: str
    hash: str
    keyId: str | None
    rows: Any


class Approval(TypedDict):
    stepId: int
    principal: str
    decision: str
    comment: str | None
    at: str | None


class ChildRun(TypedDict):
    id: int
    kind: str
    status: str


class RunLinks(TypedDict):
    deliveries: list[str]
    artifacts: list[str]
    self: list[str]


class RunDetail(Run):
    steps: list[Step]
    approvals: list[Approval]
    links: RunLinks
    events: list[Event]
    alert: AlertOfRun | None
    childRuns: list[ChildRun]
    waitingBehind: int | None  # the run holding the node or GPU a pending run waits for


class WaitingRun(TypedDict):
    id: int
    playbook: str
    node: str | None
    gpu: str | None
    kind: str
    principal: str | None
    waitingSince: str | None


class ApprovalLinks(TypedDict):
    run: str
    plan: str
    page: str
    approve: str
    reject: str


class PendingApproval(TypedDict):
    run: WaitingRun
    step: Step
    approvals: list[Approval]
    alert: AlertOfRun | None
    links: ApprovalLinks


class Delivery(TypedDict):
    """A webhook delivery as it arrived: ``body`` is Alertmanager's payload, verbatim."""

    id: int
    receivedAt: str
    receiver: str
    status: str
    groupKey: str
    alertCount: int
    principal: str | None
    remote: str | None
    body: str


class ChainReport(TypedDict):
    ok: bool
    checked: int
    firstBrokenId: int | None
    reason: str
    headId: int | None
    anchors: int
    rows: int
    unsealedRows: int
    deliveries: int


class BreakerStatus(TypedDict):
    """The circuit breaker and the nodes the disruption budget counts now."""

    open: bool
    reason: str | None
    openedAt: str | None
    resetAt: str | None
    resetBy: str | None
    resetComment: str | None
    disruptedNodes: list[str]


class Decision(TypedDict):
    """A step after a decision: its status and the approvals it needs."""

    runId: int
    stepId: int
    status: str
    approvalsRequired: int


class Started(TypedDict):
    """A manual run and the principal who started it."""

    runId: int
    playbook: str
    node: str | None
    principal: str


class StartedMany(TypedDict):
    """One run per GPU node the selector matched."""

    selector: str
    runs: list[Started]


class RunPage(TypedDict):
    items: list[Run]
    nextCursor: str | None


class EpisodePage(TypedDict):
    items: list[Episode]
    nextCursor: str | None


class EventPage(TypedDict):
    items: list[Event]
    nextCursor: str | None


class Approvals(TypedDict):
    items: list[PendingApproval]  # the oldest 500
    total: int  # every step waiting for approval


class Guard(TypedDict):
    go: bool
    reason: str


class PlanStep(TypedDict, total=False):
    """A step as a plan shows it: ``preview`` is what its action says it would do (the
    action's own keys); ``guard`` the guards' verdict on a disruptive step."""

    key: Required[str]
    action: Required[str]
    status: str
    params: dict[str, Any]
    enabled: bool
    requiresApproval: bool
    disruptive: bool
    error: str
    preview: Any
    guard: Guard


class PlannedRun(TypedDict):
    playbook: str
    node: str | None
    gpu: str | None
    dryRun: bool
    onResolve: str
    status: str
    reason: str
    steps: list[PlanStep]


class AlertPlan(TypedDict):
    alert: dict[str, Any]
    resolved: bool
    note: str
    deduplicated: str
    playbooks: list[PlannedRun]


class Plan(TypedDict):
    alerts: list[AlertPlan]


class RunPlan(TypedDict):
    run: int
    playbook: str
    node: str | None
    steps: list[PlanStep]


# Audit events: the store's (and the hash chain's) field names and the API's.
EVENT_NAMES = audit.EXPORT_NAMES


def episode(row: Any) -> Episode:
    return {
        "id": row.id,
        "fingerprint": row.fingerprint,
        "alertname": row.alertname,
        "status": row.status,
        "startsAt": _iso(row.starts_at),
        "endsAt": _iso(row.ends_at),
        "labels": row.labels,
        "annotations": row.annotations,
        "generatorURL": row.generator_url,
        "receivedAt": _iso(row.created_at),
        "resolvedAt": _iso(row.resolved_at),
        "handled": row.handled_status == row.status,
        "firstDeliveryId": row.first_delivery_id,
        "resolvedDeliveryId": row.resolved_delivery_id,
    }


def alert_of_run(row: Any) -> AlertOfRun:
    """The episode with an Alertmanager link (``row`` also holds its first delivery's body)."""
    found = episode(row)
    link = alertmanager_link(_external_url(row.body), dict(row.labels))
    return {**found, "alertmanagerURL": link}


def run(row: Any) -> Run:
    return {
        "id": row.id,
        "playbook": row.playbook,
        "kind": row.kind,
        "status": row.status,
        "episodeId": row.episode_id,
        "parentRunId": row.parent_run_id,
        "node": row.node,
        "gpu": row.gpu,
        "dryRun": row.dry_run,
        "principal": row.principal,
        "params": row.params,
        "onResolve": row.on_resolve,
        "reason": row.reason,
        "createdAt": _iso(row.created_at),
        "updatedAt": _iso(row.updated_at),
        "finishedAt": _iso(row.finished_at),
        "waitingFor": row.waiting_for if row.status == "pending" else None,
    }


def step(row: Any) -> Step:
    return {
        "id": row.id,
        "key": row.key,
        "seq": row.seq,
        "phase": row.phase,
        "action": row.action,
        "params": row.params,
        "status": row.status,
        "effect": row.effect,
        "requiresApproval": row.requires_approval,
        "approvalsRequired": row.approvals_required,
        "attempt": row.attempt,
        "maxAttempts": row.max_attempts,
        "timeoutSeconds": row.timeout_seconds,
        "onFailure": row.on_failure,
        "undoOf": row.undo_of,
        "dueAt": _iso(row.due_at),
        "leaseOwner": row.lease_owner,
        "leaseExpiresAt": _iso(row.lease_expires_at),
        "output": row.output,
        "error": row.error,
        "startedAt": _iso(row.started_at),
        "finishedAt": _iso(row.finished_at),
    }


def event(record: Mapping[str, Any]) -> Event:
    """An audit event from the store's record (``queries.event_record``)."""
    return {  # type: ignore[return-value]
        api: record[name] for name, api in EVENT_NAMES.items()
    }


def page(found: queries.Page, render: Any) -> dict[str, Any]:
    """A keyset page: its items rendered, and the cursor of the next page."""
    return {"items": [render(row) for row in found.items], "nextCursor": found.next_cursor}


def event_row(row: Any) -> Event:
    return event(queries.event_record(row))


def approval(row: Any) -> Approval:
    return {
        "stepId": row.step_id,
        "principal": row.principal,
        "decision": row.decision,
        "comment": row.comment,
        "at": _iso(row.at),
    }


def run_detail(found: queries.RunDetail) -> RunDetail:
    alert = alert_of_run(found.episode) if found.episode is not None else None
    return {
        **run(found.run),
        "steps": [step(row) for row in found.steps],
        "approvals": [approval(row) for row in found.approvals],
        "links": run_links(found.run.id, alert, found.steps),
        "events": [event_row(row) for row in found.events],
        "alert": alert,
        "childRuns": [
            {"id": row.id, "kind": row.kind, "status": row.status} for row in found.children
        ],
        "waitingBehind": found.waiting_behind,
    }


def run_links(run_id: int, alert: Mapping[str, Any] | None, steps: Iterable[Any]) -> RunLinks:
    """Where an auditor finds the raw alert deliveries and the artifacts of a run."""
    deliveries = []
    if alert is not None:
        ids = [alert.get("firstDeliveryId"), alert.get("resolvedDeliveryId")]
        deliveries = [f"/api/v1/deliveries/{value}" for value in ids if value is not None]
    artifacts = [
        f"/api/v1/artifacts/{urllib.parse.quote(row.output['path'])}"
        for row in steps
        if isinstance(row.output, dict)
        and isinstance(row.output.get("path"), str)
        and "sha256" in row.output
    ]
    return {"deliveries": deliveries, "artifacts": artifacts, "self": [f"/api/v1/runs/{run_id}"]}


def alertmanager_link(external_url: str, labels: dict[str, str]) -> str | None:
    """The Alertmanager UI filtered to this alert, or ``None`` without an external URL."""
    if not external_url.startswith(("http://", "https://")):
        return None
    matchers = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    query = urllib.parse.urlencode({"silenced": "false", "filter": "{" + matchers + "}"})
    return f"{external_url.rstrip('/')}/#/alerts?{query}"


def _external_url(body: str | None) -> str:
    if not body:
        return ""
    try:
        value = json.loads(body).get("externalURL", "")
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


def pending_approval(found: queries.Waiting) -> PendingApproval:
    row = found.step
    run_id = row.run_id
    return {
        "run": {
            "id": run_id,
            "playbook": row.playbook,
            "node": row.node,
            "gpu": row.gpu,
            "kind": row.kind,
            "principal": row.principal,
            "waitingSince": _iso(row.updated_at),
        },
        "step": step(row),
        "approvals": [approval(decision) for decision in found.decisions],
        "alert": alert_of_run(found.episode) if found.episode is not None else None,
        "links": {
            "run": f"/api/v1/runs/{run_id}",
            "plan": f"/api/v1/runs/{run_id}/plan",
            "page": f"/runbooks/runs/{run_id}",
            "approve": f"/api/v1/runs/{run_id}/steps/{row.id}/approve",
            "reject": f"/api/v1/runs/{run_id}/steps/{row.id}/reject",
        },
    }


def delivery(row: Any) -> Delivery:
    return {
        "id": row.id,
        "receivedAt": row.received_at.isoformat(),
        "receiver": row.receiver,
        "status": row.status,
        "groupKey": row.group_key,
        "alertCount": row.alert_count,
        "principal": row.principal,
        "remote": row.remote,
        "body": row.body,
    }


def chain_report(report: db_audit.ChainReport) -> ChainReport:
    return {
        "ok": report.ok,
        "checked": report.checked,
        "firstBrokenId": report.first_broken_id,
        "reason": report.reason,
        "headId": report.head_id,
        "anchors": report.anchors,
        "rows": report.rows,
        "unsealedRows": report.unsealed,
        "deliveries": report.deliveries,
    }


def breaker(status: operations.BreakerStatus) -> BreakerStatus:
    return {
        "open": status.open,
        "reason": status.reason,
        "openedAt": status.opened_at,
        "resetAt": status.reset_at,
        "resetBy": status.reset_by,
        "resetComment": status.reset_comment,
        "disruptedNodes": list(status.disrupted_nodes),
    }


def decision(found: operations.Decision) -> Decision:
    return {
        "runId": found.run_id,
        "stepId": found.step_id,
        "status": found.status.value,
        "approvalsRequired": found.approvals_required,
    }


def started(found: operations.Triggered) -> Started:
    return {
        "runId": found.run_id,
        "playbook": found.playbook,
        "node": found.node,
        "principal": found.principal,
    }


def started_many(found: operations.Selected) -> StartedMany:
    return {"selector": found.selector, "runs": [started(run) for run in found.runs]}


_PLAN_STEP_NAMES = {"requires_approval": "requiresApproval"}


def plan_step(preview: Mapping[str, Any]) -> PlanStep:
    """A step of a plan (``previewing.Previewer.preview_step``); its ``preview`` as given."""
    return {_PLAN_STEP_NAMES.get(key, key): value for key, value in preview.items()}  # type: ignore[return-value]


def planned_run(found: previewing.PlannedRun) -> PlannedRun:
    return {
        "playbook": found.playbook,
        "node": found.node,
        "gpu": found.gpu,
        "dryRun": found.dry_run,
        "onResolve": found.on_resolve.value,
        "status": found.status,
        "reason": found.reason,
        "steps": [plan_step(s) for s in found.steps],
    }


def alert_plan(found: previewing.AlertPlan) -> AlertPlan:
    return {
        "alert": found.alert,
        "resolved": found.resolved,
        "note": found.note,
        "deduplicated": found.deduplicated,
        "playbooks": [planned_run(p) for p in found.playbooks],
    }


def run_plan(found: previewing.RunPlan) -> RunPlan:
    return {
        "run": found.run,
        "playbook": found.playbook,
        "node": found.node,
        "steps": [plan_step(s) for s in found.steps],
    }


# The answers the OpenAPI document names (``components.schemas``), with the types they use.
SCHEMAS: tuple[type[Any], ...] = (
    RunPage,
    EpisodePage,
    EventPage,
    RunDetail,
    Approvals,
    Delivery,
    ChainReport,
    BreakerStatus,
    Plan,
    RunPlan,
    Decision,
    Started,
    StartedMany,
)
