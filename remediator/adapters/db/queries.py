"""Read-side queries for the HTTP API: alert episodes, runs, a run's detail, pending approvals.
Cursor-paged."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import urllib.parse
from typing import Any

import sqlalchemy as sa

from remediator.adapters.db import database, tables

E = tables.alert_episodes
R = tables.runs
S = tables.steps
A = tables.audit_events
D = tables.deliveries
AP = tables.approvals


@dataclasses.dataclass(frozen=True, kw_only=True)
class Page:
    items: list[dict[str, Any]]
    next_cursor: str | None


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value else None


def episode_json(row: Any) -> dict[str, Any]:
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


def run_json(row: Any) -> dict[str, Any]:
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
    }


def step_json(row: Any) -> dict[str, Any]:
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


def event_json(row: Any) -> dict[str, Any]:
    return {
        "id": row.id,
        "at": _iso(row.at),
        "kind": row.kind,
        "actor": row.actor,
        "run_id": row.run_id,
        "step_id": row.step_id,
        "episode_id": row.episode_id,
        "from_status": row.from_status,
        "to_status": row.to_status,
        "reason": row.reason,
        "data": row.data,
        "prev_hash": row.prev_hash,
        "hash": row.hash,
        "key_id": row.key_id,
        "rows": row.rows,
    }


def paged(rows: list[Any], limit: int, render: Any) -> Page:
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(
        items=[render(row) for row in rows],
        next_cursor=str(rows[-1].id) if more and rows else None,
    )


class Queries:
    def __init__(self, db: database.Database) -> None:
        self.db = db

    async def episodes(self, *, limit: int, cursor: int | None, filters: dict[str, str]) -> Page:
        query = sa.select(E).order_by(E.c.id.desc()).limit(limit + 1)
        if cursor is not None:
            query = query.where(E.c.id < cursor)
        for key, column in (
            ("status", E.c.status),
            ("alertname", E.c.alertname),
            ("fingerprint", E.c.fingerprint),
        ):
            if key in filters:
                query = query.where(column == filters[key])
        async with self.db.read("query.episodes") as conn:
            rows = list(await conn.execute(query))
        return paged(rows, limit, episode_json)

    async def runs(self, *, limit: int, cursor: int | None, filters: dict[str, str]) -> Page:
        query = sa.select(R).order_by(R.c.id.desc()).limit(limit + 1)
        if cursor is not None:
            query = query.where(R.c.id < cursor)
        for key, column in (
            ("status", R.c.status),
            ("playbook", R.c.playbook),
            ("node", R.c.node),
            ("kind", R.c.kind),
        ):
            if key in filters:
                query = query.where(column == filters[key])
        if "episode" in filters:
            query = query.where(R.c.episode_id == int(filters["episode"]))
        async with self.db.read("query.runs") as conn:
            rows = list(await conn.execute(query))
        return paged(rows, limit, run_json)

    async def run_detail(self, run_id: int) -> dict[str, Any] | None:
        async with self.db.read("query.run") as conn:
            run = (await conn.execute(sa.select(R).where(R.c.id == run_id))).one_or_none()
            if run is None:
                return None
            steps = await conn.execute(
                sa.select(S).where(S.c.run_id == run_id).order_by(S.c.seq, S.c.id)
            )
            events = await conn.execute(sa.select(A).where(A.c.run_id == run_id).order_by(A.c.id))
            episode = None
            if run.episode_id is not None:
                found = (
                    await conn.execute(
                        sa.select(E, D.c.body)
                        .outerjoin(D, D.c.id == E.c.first_delivery_id)
                        .where(E.c.id == run.episode_id)
                    )
                ).one_or_none()
                episode = episode_json(found) if found else None
                if found is not None and episode is not None:
                    episode["alertmanagerURL"] = alertmanager_link(
                        _external_url(found.body), dict(found.labels)
                    )
            children = await conn.execute(
                sa.select(R.c.id, R.c.kind, R.c.status).where(R.c.parent_run_id == run_id)
            )
            step_rows = list(steps)
            approvals = await conn.execute(
                sa.select(AP)
                .where(AP.c.step_id.in_([row.id for row in step_rows]))
                .order_by(AP.c.id)
            )
            return {
                **run_json(run),
                "steps": [step_json(row) for row in step_rows],
                "approvals": [approval_json(row) for row in approvals],
                "links": run_links(run_id, episode, step_rows),
                "events": [event_json(row) for row in events],
                "alert": episode,
                "childRuns": [dict(row._mapping) for row in children],
            }


def approval_json(row: Any) -> dict[str, Any]:
    return {
        "stepId": row.step_id,
        "principal": row.principal,
        "decision": row.decision,
        "comment": row.comment,
        "at": _iso(row.at),
    }


def run_links(
    run_id: int, episode: dict[str, Any] | None, steps: list[Any]
) -> dict[str, list[str]]:
    """Where an auditor finds the raw alert deliveries and the artifacts of a run."""
    deliveries = []
    if episode is not None:
        ids = [episode.get("firstDeliveryId"), episode.get("resolvedDeliveryId")]
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


async def pending_approvals(db: database.Database) -> list[dict[str, Any]]:
    """Steps waiting for approval with their run, decisions so far and triggering alert."""
    query = (
        sa.select(S, R.c.playbook, R.c.node, R.c.gpu, R.c.kind, R.c.principal, R.c.updated_at)
        .join(R, R.c.id == S.c.run_id)
        .where(S.c.status == "waiting_approval")
        .order_by(S.c.id)
        .limit(500)
    )
    async with db.read("query.approvals") as conn:
        rows = list(await conn.execute(query))
        run_ids = [row.run_id for row in rows]
        episodes = {
            row.run_id: row
            for row in await conn.execute(
                sa.select(R.c.id.label("run_id"), E, D.c.body)
                .join(E, E.c.id == R.c.episode_id)
                .outerjoin(D, D.c.id == E.c.first_delivery_id)
                .where(R.c.id.in_(run_ids))
            )
        }
        decisions: dict[int, list[dict[str, Any]]] = {}
        for row in await conn.execute(
            sa.select(AP).where(AP.c.step_id.in_([row.id for row in rows])).order_by(AP.c.id)
        ):
            decisions.setdefault(row.step_id, []).append(approval_json(row))
    items = []
    for row in rows:
        alert = None
        found = episodes.get(row.run_id)
        if found is not None:
            alert = episode_json(found)
            alert["alertmanagerURL"] = alertmanager_link(
                _external_url(found.body), dict(found.labels)
            )
        items.append(
            {
                "run": {
                    "id": row.run_id,
                    "playbook": row.playbook,
                    "node": row.node,
                    "gpu": row.gpu,
                    "kind": row.kind,
                    "principal": row.principal,
                    "waitingSince": _iso(row.updated_at),
                },
                "step": step_json(row),
                "approvals": decisions.get(row.id, []),
                "alert": alert,
                "links": {
                    "run": f"/api/v1/runs/{row.run_id}",
                    "plan": f"/api/v1/runs/{row.run_id}/plan",
                    "page": f"/runbooks/runs/{row.run_id}",
                    "approve": f"/api/v1/runs/{row.run_id}/steps/{row.id}/approve",
                    "reject": f"/api/v1/runs/{row.run_id}/steps/{row.id}/reject",
                },
            }
        )
    return items
