"""Read-side queries for the HTTP API: alert episodes, runs, a run's detail, pending approvals.
Cursor-paged. They return rows; the HTTP adapter renders them (``http.responses``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import sqlalchemy as sa

from remediator.adapters.db import database, tables

E = tables.alert_episodes
R = tables.runs
S = tables.steps
A = tables.audit_events
D = tables.deliveries
AP = tables.approvals
L = tables.locks


@dataclasses.dataclass(frozen=True, kw_only=True)
class Page:
    items: list[Any]  # rows, newest first
    next_cursor: str | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunDetail:
    """A run's row with its steps, approvals, audit events, child runs and the alert episode
    that started it (with its first delivery's ``body``)."""

    run: Any
    steps: list[Any]
    approvals: list[Any]
    events: list[Any]
    episode: Any | None
    children: list[Any]
    waiting_behind: int | None = None  # the run holding the lock a pending run waits for


@dataclasses.dataclass(frozen=True, kw_only=True)
class Waiting:
    """A step waiting for approval (with its run's columns), the decisions so far and the
    alert episode of its run (with its first delivery's ``body``)."""

    step: Any
    decisions: list[Any]
    episode: Any | None


def event_record(row: Any) -> dict[str, Any]:
    """An audit event with the store's field names: what the hash chain covers."""
    return {
        "id": row.id,
        "at": row.at.isoformat() if row.at else None,
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


def paged(rows: list[Any], limit: int) -> Page:
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(
        items=rows,
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
        return paged(rows, limit)

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
        return paged(rows, limit)

    async def run_detail(self, run_id: int) -> RunDetail | None:
        async with self.db.read("query.run") as conn:
            run = (await conn.execute(sa.select(R).where(R.c.id == run_id))).one_or_none()
            if run is None:
                return None
            steps = list(
                await conn.execute(
                    sa.select(S).where(S.c.run_id == run_id).order_by(S.c.seq, S.c.id)
                )
            )
            events = await conn.execute(sa.select(A).where(A.c.run_id == run_id).order_by(A.c.id))
            episode = None
            if run.episode_id is not None:
                episode = (
                    await conn.execute(
                        sa.select(E, D.c.body)
                        .outerjoin(D, D.c.id == E.c.first_delivery_id)
                        .where(E.c.id == run.episode_id)
                    )
                ).one_or_none()
            children = await conn.execute(
                sa.select(R.c.id, R.c.kind, R.c.status).where(R.c.parent_run_id == run_id)
            )
            approvals = await conn.execute(
                sa.select(AP).where(AP.c.step_id.in_([row.id for row in steps])).order_by(AP.c.id)
            )
            behind = None
            # (a node's or a GPU's lock has a holder; a playbook's slots do not name one)
            waiting = run.status == "pending" and run.waiting_for
            if waiting and not run.waiting_for.startswith("slot:"):
                holder = sa.select(L.c.run_id).where(L.c.key == run.waiting_for)
                behind = (await conn.execute(holder)).scalar_one_or_none()
            return RunDetail(
                run=run,
                steps=steps,
                approvals=list(approvals),
                events=list(events),
                episode=episode,
                children=list(children),
                waiting_behind=behind,
            )


#: How many steps waiting for approval are listed (the oldest); the rest are counted.
APPROVALS_SHOWN = 500
#: The steps waiting for approval, oldest first, read on their index (every step ever stored
#: was walked at each refresh of the console: 0.14 s after a million alerts).
PENDING_APPROVALS = (
    sa.select(S, R.c.playbook, R.c.node, R.c.gpu, R.c.kind, R.c.principal, R.c.updated_at)
    .join(R, R.c.id == S.c.run_id)
    .where(S.c.status == tables.STEP_WAITING_APPROVAL)
    .order_by(S.c.id)
    .limit(APPROVALS_SHOWN)
)
_APPROVALS_TOTAL = (
    sa.select(sa.func.count()).select_from(S).where(S.c.status == tables.STEP_WAITING_APPROVAL)
)


@dataclasses.dataclass(frozen=True)
class Approvals:
    waiting: list[Waiting]  # the oldest ``APPROVALS_SHOWN``
    total: int  # every step waiting for approval


async def pending_approvals(db: database.Database) -> Approvals:
    """Steps waiting for approval with their run, decisions so far and triggering alert, the
    oldest ``APPROVALS_SHOWN``, and how many wait in all."""
    async with db.read("query.approvals") as conn:
        rows = list(await conn.execute(PENDING_APPROVALS))
        total = len(rows)
        if total >= APPROVALS_SHOWN:
            total = (await conn.execute(_APPROVALS_TOTAL)).scalar_one()
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
        decisions: dict[int, list[Any]] = {}
        for row in await conn.execute(
            sa.select(AP).where(AP.c.step_id.in_([row.id for row in rows])).order_by(AP.c.id)
        ):
            decisions.setdefault(row.step_id, []).append(row)
    waiting = [
        Waiting(step=row, decisions=decisions.get(row.id, []), episode=episodes.get(row.run_id))
        for row in rows
    ]
    return Approvals(waiting=waiting, total=total)
