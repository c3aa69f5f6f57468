"""The engine's claims read in proportion to the work found, whatever the planner's statistics
say. A storm comes after a quiet spell: Postgres's statistics then say that almost no run is
running and almost no step is due (autovacuum analyses a table once a tenth of it changed, so
a 1,000-alert storm over a long history never refreshes them). The claim of due steps joined
them to their runs, and on those statistics Postgres took each running run in turn and read
every due step for it, the run's id only a filter: a storm of N read N² rows a claim."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa

from remediator.adapters.db import database, migrate, tables
from remediator.adapters.db import store as sql_store
from remediator.domain import runs

pytestmark = pytest.mark.postgres

NOW = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)
HISTORY = 3000
STORM = 400


def _run(n: int, status: runs.RunStatus) -> dict[str, Any]:
    return {
        "id": n,
        "playbook": "storm",
        "kind": runs.RunKind.MANUAL.value,
        "status": status.value,
        "node": f"gpu-node-{n:05}",
        "exclusive": True,
        "dry_run": False,
        "params": {},
        "on_resolve": "cancel",
        "reason": "test",
        "created_at": NOW,
        "updated_at": NOW,
    }


def _step(n: int, status: runs.StepStatus, due: dt.datetime | None) -> dict[str, Any]:
    return {
        "id": n,
        "run_id": n,
        "seq": 0,
        "key": "cordon",
        "phase": runs.StepPhase.DO.value,
        "action": "cordon",
        "params": {},
        "status": status.value,
        "requires_approval": False,
        "approvals_required": 0,
        "attempt": 0,
        "max_attempts": 1,
        "timeout_seconds": 30.0,
        "on_failure": "stop",
        "retry": {},
        "effect": "none",
        "due_at": due,
        "output": {},
    }


async def test_a_storm_s_probe_and_claim_read_in_proportion_to_its_due_steps(pg_url: str) -> None:
    db = database.Database(pg_url)
    await migrate.upgrade(db)
    try:
        async with db.engine.begin() as conn:
            done = range(1, HISTORY + 1)
            await conn.execute(
                sa.insert(tables.runs), [_run(n, runs.RunStatus.SUCCEEDED) for n in done]
            )
            await conn.execute(
                sa.insert(tables.steps), [_step(n, runs.StepStatus.SUCCEEDED, None) for n in done]
            )
        async with db.engine.connect() as conn:  # the quiet spell's statistics
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(sa.text("ANALYZE runs"))
            await conn.execute(sa.text("ANALYZE steps"))
        async with db.engine.begin() as conn:  # then the storm
            storm = range(HISTORY + 1, HISTORY + STORM + 1)
            await conn.execute(
                sa.insert(tables.runs), [_run(n, runs.RunStatus.RUNNING) for n in storm]
            )
            due = NOW - dt.timedelta(seconds=1)
            await conn.execute(
                sa.insert(tables.steps), [_step(n, runs.StepStatus.PENDING, due) for n in storm]
            )

        store = sql_store.SqlStore(db, clock=lambda: NOW)

        def rows_read(conn: sa.Connection) -> int:
            """Rows of runs and steps this transaction has read so far."""
            read = conn.execute(
                sa.text(
                    "SELECT sum(coalesce(idx_tup_fetch, 0) + seq_tup_read) "
                    "FROM pg_stat_xact_user_tables WHERE relname IN ('runs', 'steps')"
                )
            ).scalar_one()
            return int(read)

        def probe(conn: sa.Connection) -> tuple[bool, int]:
            found = conn.execute(sql_store._PROBE, {"now": NOW}).one()
            return bool(found.due), rows_read(conn)

        def claim(tx: sql_store.SqlTx) -> tuple[int, int]:
            claimed = len(list(tx.lock_due_steps(32)))
            return claimed, rows_read(tx.conn)

        due_found, read = await db.read_sync("probe", probe)
        assert due_found
        # the running runs and their steps, for "advance" (no run is advanceable) and for
        # "due"; joined, "due" read 80,000 rows
        assert read <= 6 * STORM, read
        claimed, read = await store.run("claim", claim)
        assert claimed == 32
        # each due step and its run, a few index entries and rows each; joined: 80,000 rows
        assert read <= 6 * STORM, read
    finally:
        await db.dispose()
