"""Appending a transaction's events to the audit chain on Postgres: the chain's head is locked
(``FOR UPDATE``) until the transaction commits, so every other replica's flush waits for it.
Everything an event needs but its place in the chain (its row's values, its canonical text) is
prepared before the head is locked, and the events and the new head go in one statement after
it. Measured in a two-replica burst, the head was held half the time, most of it by
SQLAlchemy's processing of the events' rows.

The rows stored that way are the rows SQLAlchemy's insert stores, and the chain verifies."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa

from remediator.adapters.db import audit as db_audit
from remediator.adapters.db import database, migrate, tables
from remediator.adapters.db import store as sql_store
from remediator.domain import audit
from tests.support.statements import Statements

pytestmark = pytest.mark.postgres

NOW = dt.datetime(2026, 12, 1, 12, 0, 0, 250000, tzinfo=dt.UTC)
KEYS = audit.AuditKeys(keys={"k1": b"k" * 32}, current="k1")
EVENTS: list[dict[str, Any]] = [
    {"kind": "run.created", "actor": "engine", "run_id": 7, "reason": "alert GpuXid79 (100 %)"},
    {
        "kind": "step.transition",
        "actor": "oncall@example.com",
        "run_id": 7,
        "step_id": 9,
        "episode_id": 3,
        "from_status": "pending",
        "to_status": "running",
        "reason": "it's 'quoted', \\ back-slashed, ünïcode; %s %(x)s",
        "data": {"id": 0, "nested": {"list": [1, 2.5, None, True, "x"]}, "é": "ü"},
    },
    {"kind": "run.note", "actor": "engine", "reason": "", "data": {}},
]


async def _store(url: str, keys: audit.AuditKeys | None) -> sql_store.SqlStore:
    db = database.Database(url)
    await migrate.upgrade(db)
    return sql_store.SqlStore(db, clock=lambda: NOW, keys=keys)


def _append(tx: sql_store.SqlTx) -> None:
    for event in EVENTS:
        tx.add_event(**event)


async def _rows(db: database.Database) -> list[dict[str, Any]]:
    """Every event as Postgres holds it (its own text of each value), in id order."""
    async with db.read() as conn:
        found = await conn.execute(
            sa.text(
                "SELECT id, at::text AS at, kind, actor, run_id, step_id, episode_id, "
                "from_status, to_status, reason, data::text AS data, prev_hash, hash, key_id, "
                "rows::text AS rows, rows IS NULL AS rows_null FROM audit_events ORDER BY id"
            )
        )
        return [dict(row._mapping) for row in found]


@pytest.mark.parametrize("keys", [None, KEYS], ids=["plain", "keyed"])
async def test_the_events_and_the_head_go_in_one_statement_after_the_head_is_locked(
    pg_url: str, keys: audit.AuditKeys | None
) -> None:
    store = await _store(pg_url, keys)
    try:
        await store.run("first", _append)  # a head to lock
        with Statements() as statements:
            await store.run("second", _append)
        seen = statements.seen
        (locked,) = [n for n, s in enumerate(seen) if "FROM audit_head" in s and "FOR UPDATE" in s]
        assert len(seen[locked + 1 :]) == 1, seen[locked + 1 :]  # was an INSERT and an UPDATE
        stored = await _rows(store.db)
        assert [row["id"] for row in stored] == list(range(1, 2 * len(EVENTS) + 1))
        report = await db_audit.AuditQueries(store.db, keys=keys).verify()
        assert report.ok, report.reason
        assert report.checked == 2 * len(EVENTS)
        head = await _head(store.db)
        assert head == (stored[-1]["id"], stored[-1]["hash"])
    finally:
        await store.db.dispose()


async def test_the_stored_events_are_what_sqlalchemy_s_insert_stores(pg_url: str) -> None:
    store = await _store(pg_url, KEYS)
    try:
        await store.run("append", _append)
        ours = await _rows(store.db)

        def by_sqlalchemy(tx: sql_store.SqlTx) -> None:  # the same events, ids after ours
            unset = dict.fromkeys(("run_id", "step_id", "episode_id", "from_status", "to_status"))
            tx.conn.conn.execute(
                sa.insert(tables.audit_events),
                [
                    {
                        **unset,
                        "data": {},
                        **event,
                        "id": row["id"] + 100,
                        "at": NOW,
                        "prev_hash": row["prev_hash"],
                        "hash": row["hash"],
                        "key_id": "k1",
                        "rows": None,
                    }
                    for row, event in zip(ours, EVENTS, strict=True)
                ],
            )

        await store.run("by sqlalchemy", by_sqlalchemy)
        theirs = (await _rows(store.db))[len(ours) :]
        assert len(theirs) == len(ours) == len(EVENTS)
        for mine, other in zip(ours, theirs, strict=True):
            assert {**other, "id": other["id"] - 100} == mine
        assert ours[0]["rows"] == "null"  # JSON's null, as SQLAlchemy stores a None
        assert not ours[0]["rows_null"]
    finally:
        await store.db.dispose()


async def _head(db: database.Database) -> tuple[int, str]:
    async with db.read() as conn:
        row = (await conn.execute(sa.select(tables.audit_head))).one()
        return row.last_id, row.last_hash
