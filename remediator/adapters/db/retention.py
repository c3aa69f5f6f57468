"""Retention: raw webhook bodies are deleted, expired alert episodes reduced or deleted (see
``domain.retention``); runs, steps and the audit log are kept.

Work is done in small batches, one short write transaction each, granted SQLite's writer only
when nothing else waits for it (``background``): a first pass over a long history (a million
expired episodes, a few minutes of writes) made every webhook commit and engine pass behind
it wait for a whole batch (intake p99 226 ms, a burst's cordons a third as fast). On Postgres
a batch starts in a quiet moment of the process, and while the process is busy each is
followed by a pause four times its length (``Database.write_sync``). Each batch goes on from
where the last one stopped (by id), so a pass reads each row once."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import sqlalchemy as sa

from remediator.adapters.db import database, tables
from remediator.domain import alerts, runs
from remediator.domain import retention as retention_mod

Page = tuple[int, int | None]  # rows changed, the id to go on after (None: the last page)
Batch = Callable[[int], Callable[[sa.Connection], Page]]


async def delete_old_deliveries(
    db: database.Database, *, older_than: dt.datetime, batch: int = 1000
) -> int:
    """Delete deliveries received before ``older_than``; on SQLite never the newest one.

    Episodes name the delivery that started them and the one that resolved them (the approval
    page shows that body, the sender check reads its principal). SQLite gives a new row the id
    one past the largest (the webhook's writer numbers a batch the same way), so deleting the
    newest row would hand its id, and those before it, to new deliveries, which episodes
    would then name. The newest row holds the ids: after a quiet spell longer than the
    retention it outlives it, until the next delivery. Postgres takes ids from a sequence.
    """
    D = tables.deliveries
    old = D.c.received_at < older_than
    if db.is_sqlite:
        old = sa.and_(old, D.c.id < sa.select(sa.func.max(D.c.id)).scalar_subquery())

    def one_batch(conn: sa.Connection) -> int:
        ids = sa.select(D.c.id).where(old).order_by(D.c.id).limit(batch)
        return conn.execute(sa.delete(D).where(D.c.id.in_(ids))).rowcount or 0

    deleted = 0
    while True:
        done = await db.write_sync("retention", one_batch, background=True)
        deleted += done
        if done < batch:
            return deleted


async def prune_alert_episodes(
    db: database.Database, *, ended_before: dt.datetime, batch: int = 200
) -> retention_mod.Pruned:
    """Delete expired episodes no run refers to; reduce the rest (see ``domain.retention``).

    Expired: resolved, the resolution handled, resolved before ``ended_before``, and no run of
    it still active."""
    E, R = tables.alert_episodes, tables.runs
    resolved = alerts.AlertStatus.RESOLVED.value
    # An episode's runs are looked up per episode (a scalar subquery, never made a join),
    # from ``uq_runs_episode_playbook``. As ``EXISTS`` Postgres read every run for each batch
    # (a hashed subplan over the whole history: 32 ms a batch of 200 with 10⁵ runs, so a
    # first pass over a long history grew with its square) and held each episode against
    # every active run (an anti-join with the status index: a storm's runs, for each one).
    # "Not finished" rather than "active": the same runs, but a condition the partial index
    # of active runs cannot answer, which it would walk whole for each episode.
    active_run = _first_run(R.c.status.not_in([s.value for s in runs.RUN_TERMINAL]))
    expired = sa.and_(
        E.c.status == resolved,
        E.c.handled_status == resolved,
        E.c.resolved_at < ended_before,
        active_run.is_(None),
    )
    referenced = _first_run().is_not(None)
    not_reduced = sa.or_(E.c.first_delivery_id.is_not(None), E.c.generator_url != "")

    def delete_batch(after: int) -> Callable[[sa.Connection], Page]:
        def work(conn: sa.Connection) -> Page:
            rows = conn.execute(
                sa.select(E.c.id, referenced.label("referenced"))
                .where(expired, E.c.id > after)
                .order_by(E.c.id)
                .limit(batch)
            ).all()
            ids = [row.id for row in rows if not row.referenced]
            deleted = conn.execute(sa.delete(E).where(E.c.id.in_(ids))).rowcount if ids else 0
            return deleted or 0, rows[-1].id if len(rows) == batch else None

        return work

    def reduce_batch(after: int) -> Callable[[sa.Connection], Page]:
        def work(conn: sa.Connection) -> Page:
            rows = conn.execute(
                sa.select(E.c.id, E.c.labels)
                .where(expired, not_reduced, E.c.id > after)
                .order_by(E.c.id)
                .limit(batch)
            ).all()
            if rows:
                conn.execute(_REDUCE, [_reduced(row.id, row.labels) for row in rows])
            return len(rows), rows[-1].id if len(rows) == batch else None

        return work

    deleted = await _pages(db, delete_batch)
    reduced = await _pages(db, reduce_batch)
    return retention_mod.Pruned(reduced=reduced, deleted=deleted)


def _first_run(*where: sa.ColumnElement[bool]) -> sa.ScalarSelect[int]:
    """The id of a run of the episode at hand (meeting ``where``), or NULL."""
    R = tables.runs
    return (
        sa.select(R.c.id)
        .where(R.c.episode_id == tables.alert_episodes.c.id, *where)
        .limit(1)
        .scalar_subquery()
    )


async def _pages(db: database.Database, batch: Batch) -> int:
    """Run ``batch(after)`` transactions from the first id on, each after the last id the
    one before returned, until one returns none; the rows they changed."""
    changed, after = 0, 0
    while True:
        done, last = await db.write_sync("retention", batch(after), background=True)
        changed += done
        if last is None:
            return changed
        after = last


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
