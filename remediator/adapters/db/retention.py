"""Retention: raw webhook bodies are deleted, expired alert episodes reduced or deleted (see
``domain.retention``); runs, steps and the audit log are kept. Work is done in batches, one
write transaction each, so intake is never held up for long."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from remediator.adapters.db import database, tables
from remediator.domain import alerts, runs
from remediator.domain import retention as retention_mod


async def delete_old_deliveries(
    db: database.Database, *, older_than: dt.datetime, batch: int = 5000
) -> int:
    deleted = 0
    while True:
        async with db.write("retention") as conn:
            ids = (
                sa.select(tables.deliveries.c.id)
                .where(tables.deliveries.c.received_at < older_than)
                .limit(batch)
            )
            result = await conn.execute(
                sa.delete(tables.deliveries).where(tables.deliveries.c.id.in_(ids))
            )
        deleted += result.rowcount or 0
        if not result.rowcount or result.rowcount < batch:
            return deleted


async def prune_alert_episodes(
    db: database.Database, *, ended_before: dt.datetime, batch: int = 1000
) -> retention_mod.Pruned:
    """Delete expired episodes no run refers to; reduce the rest (see ``domain.retention``).

    Expired: resolved, the resolution handled, resolved before ``ended_before``, and no run of
    it still active."""
    E, R = tables.alert_episodes, tables.runs
    resolved = alerts.AlertStatus.RESOLVED.value
    expired = sa.and_(
        E.c.status == resolved,
        E.c.handled_status == resolved,
        E.c.resolved_at < ended_before,
        ~sa.exists().where(
            R.c.episode_id == E.c.id, R.c.status.in_([s.value for s in runs.RUN_ACTIVE])
        ),
    )
    deleted = 0
    while True:
        async with db.write("retention") as conn:
            referenced = sa.exists().where(R.c.episode_id == E.c.id)
            ids = sa.select(E.c.id).where(expired, ~referenced).limit(batch)
            result = await conn.execute(sa.delete(E).where(E.c.id.in_(ids)))
        deleted += result.rowcount or 0
        if not result.rowcount or result.rowcount < batch:
            break
    reduced = 0
    not_reduced = sa.or_(E.c.first_delivery_id.is_not(None), E.c.generator_url != "")
    while True:
        async with db.write("retention") as conn:
            rows = (
                await conn.execute(
                    sa.select(E.c.id, E.c.labels)
                    .where(expired, not_reduced)
                    .order_by(E.c.id)
                    .limit(batch)
                )
            ).all()
            if rows:
                await conn.execute(_REDUCE, [_reduced(row.id, row.labels) for row in rows])
        reduced += len(rows)
        if len(rows) < batch:
            return retention_mod.Pruned(reduced=reduced, deleted=deleted)


_REDUCE = (
    sa.update(tables.alert_episodes)
    .where(tables.alert_episodes.c.id == sa.bindparam("episode_id"))
    .values(
        labels=sa.bindparam("kept_labels", type_=tables.JSONType),
        annotations=sa.bindparam("no_annotations", type_=tables.JSONType),
        generator_url="",
        first_delivery_id=None,
        resolved_delivery_id=None,
    )
)


def _reduced(episode_id: int, labels: dict[str, str]) -> dict[str, object]:
    return {
        "episode_id": episode_id,
        "kept_labels": retention_mod.reduce_labels(labels),
        "no_annotations": {},
    }
