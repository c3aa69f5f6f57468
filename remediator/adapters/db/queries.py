"""Read-side queries for the HTTP API: alert episodes, runs, a run's detail. Cursor-paged."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import sqlalchemy as sa

from remediator.adapters.db import database, tables

E = tables.alert_episodes
R = tables.runs
S = tables.steps
A = tables.audit_events
D = tables.deliveries


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
    }


def _page(rows: list[Any], limit: int, render: Any) -> Page:
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
        return _page(rows, limit, episode_json)

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
        return _page(rows, limit, run_json)

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
                    await conn.execute(sa.select(E).where(E.c.id == run.episode_id))
                ).one_or_none()
                episode = episode_json(found) if found else None
            children = await conn.execute(
                sa.select(R.c.id, R.c.kind, R.c.status).where(R.c.parent_run_id == run_id)
            )
            return {
                **run_json(run),
                "steps": [step_json(row) for row in steps],
                "events": [event_json(row) for row in events],
                "alert": episode,
                "childRuns": [dict(row._mapping) for row in children],
            }

    async def counts(self) -> dict[str, int]:
        async with self.db.read("query.counts") as conn:
            rows = await conn.execute(sa.select(R.c.status, sa.func.count()).group_by(R.c.status))
            return {row[0]: int(row[1]) for row in rows}
