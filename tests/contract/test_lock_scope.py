"""Replicas on one Postgres meet only where they must: the audit chain head is locked only to
link a transaction's events at its end, and fleet guard decisions have a lock of their own."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from remediator.adapters.db import store as sql_store
from remediator.adapters.db import tables
from remediator.domain import runs, transitions
from tests.contract.plans import alert_run, run

# Row locks between replicas: Postgres only (SQLite has one writer at a time).
pytestmark = [
    pytest.mark.postgres,
    pytest.mark.parametrize("backend_url", ["postgres"], indirect=True),
]

WAIT = 0.5  # long enough to see a transaction blocked; it would wait forever


@pytest.fixture
def pg_backend(backend):
    return backend


async def _blocked(task: asyncio.Task) -> bool:
    done, _ = await asyncio.wait({task}, timeout=WAIT)
    return not done


async def test_engine_work_without_events_does_not_wait_for_the_chain_head(pg_backend):
    _, run_id = await alert_run(pg_backend)
    db = pg_backend.db
    async with db.write("holder") as holder:
        await holder.execute(sa.select(tables.audit_head).with_for_update())
        # A due time moves without an event: it must not queue behind the head.
        quiet = asyncio.create_task(
            run(
                pg_backend,
                lambda tx: tx.apply(transitions.make_due(tx.steps_of_run(run_id)[0], now=tx.now)),
            )
        )
        assert not await _blocked(quiet)
        await quiet
        # A transition appends an event: it does all its work, then waits to link it.
        moving = asyncio.create_task(
            run(
                pg_backend,
                lambda tx: tx.apply(
                    transitions.move_run(tx.get_run(run_id), runs.RunStatus.RUNNING, reason="go")
                ),
            )
        )
        assert await _blocked(moving)
    moved = await moving
    assert moved.status is runs.RunStatus.RUNNING
    assert await pg_backend.chain_ok()


async def test_guard_decisions_of_two_transactions_happen_one_after_the_other(pg_backend):
    db = pg_backend.db
    async with db.write("first decision") as first:
        await first.run_sync(
            lambda conn: sql_store.SqlTx(conn, db=db, now=pg_backend.clock.now).lock_guards()
        )
        second = asyncio.create_task(run(pg_backend, lambda tx: tx.lock_guards()))
        assert await _blocked(second)
    await second
