"""What is read at every scrape of the metrics and every refresh of the console does not walk
the history. The steps waiting for approval are read on their own index: the metrics count
them and the console lists them, and both walked every step ever stored (after a million
alerts, 2,000,000 steps: 0.2 s a scrape on SQLite, 0.1 s on Postgres, the same again for
each refresh of the console's approvals). The fleet view's reads are told their indexes on
SQLite: with the statistics of a long history it walked every run and step in id order,
four times, for 0.5 s a refresh."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from remediator.adapters import metrics
from remediator.adapters.db import database, migrate, queries, tables
from remediator.adapters.db import fleet as db_fleet
from tests.support.statements import (
    NOW,
    instructions_as_rows_grow,
    postgres_rows_read,
    sqlite_plan,
)

WAITING = 3  # steps waiting for approval, whatever the history's length


async def _seed_history(db: database.Database, first: int, count: int) -> None:
    """Finished runs ``first`` to ``first + count - 1`` with two finished steps each, and (in
    the first batch) ``WAITING`` runs whose second step waits for approval. Statistics
    taken after, as autovacuum would."""
    run = {"playbook": "cordon", "kind": "alert", "exclusive": True, "dry_run": False}
    run |= {"params": {}, "on_resolve": "cancel", "reason": "", "created_at": NOW}
    run |= {"updated_at": NOW}
    step = {"phase": "do", "action": "node.cordon", "params": {}, "requires_approval": False}
    step |= {"approvals_required": 1, "attempt": 0, "max_attempts": 1, "timeout_seconds": 60}
    step |= {"on_failure": "stop", "retry": {}, "effect": "none", "output": {}}
    waiting = set(range(first, first + WAITING)) if first == 1 else set()
    ids = range(first, first + count)
    async with db.write("seed") as conn:
        await conn.execute(
            sa.insert(tables.runs),
            [
                run
                | {"id": i, "node": f"node-{i}"}
                | {"status": "waiting_approval" if i in waiting else "succeeded"}
                for i in ids
            ],
        )
        await conn.execute(
            sa.insert(tables.steps),
            [
                step
                | {"id": 2 * i + seq, "run_id": i, "seq": seq, "key": f"s{seq}"}
                | {"status": "waiting_approval" if i in waiting and seq else "succeeded"}
                for i in ids
                for seq in (0, 1)
            ],
        )
        await conn.execute(sa.text("ANALYZE"))


_READS = (metrics._state_query(), queries.PENDING_APPROVALS)


async def test_the_scrape_and_the_approvals_do_not_walk_the_history(tmp_path: Any) -> None:
    """With 20 or 2,000 finished runs beside the same three waiting for approval, the
    approvals' list executes the same instructions, and the metrics' state a few more (the
    oldest waiting run is sought on the index of every run's status, a level deeper). Read
    by walking the steps, the approvals went from 907 to 12,634, the state from 745 to
    24,586."""
    counts = await instructions_as_rows_grow(tmp_path / "history.db", _seed_history, _READS)
    (state_before, approvals_before), (state_after, approvals_after) = counts
    assert approvals_after == approvals_before
    assert state_after - state_before < 50


@pytest.mark.postgres
async def test_postgres_reads_only_the_steps_waiting_for_approval(pg_url: str) -> None:
    assert await postgres_rows_read(pg_url, _seed_history, _READS, "steps") == [
        WAITING + WAITING,  # the count, and the oldest waiting run's steps
        WAITING,
    ]


_FLEET_READS = tuple(
    statement.params(ids=[1]) if statement is db_fleet._HELD_DETAIL else statement
    for statement in (
        db_fleet._ACTIVE_RUNS,
        db_fleet._DRAINING,
        db_fleet.LINES,
        db_fleet._IN_LINE,
        db_fleet._HELD_ON_THEIR_OWN,
        db_fleet._DISRUPTIONS,
        db_fleet._CAPS,
    )
)


async def test_the_fleet_view_does_not_walk_the_history(tmp_path: Any) -> None:
    """With 20 or 2,000 finished runs, each of the fleet view's reads executes the same
    instructions, give or take a seek a level deeper in an index; in id order over every run
    and step they grew with the history."""
    counts = await instructions_as_rows_grow(tmp_path / "fleet.db", _seed_history, _FLEET_READS)
    grown = [after - before for before, after in zip(*counts, strict=True)]
    assert all(growth < 50 for growth in grown), grown


@pytest.mark.postgres
@pytest.mark.parametrize("table", ["steps", "runs"])
async def test_postgres_fleet_view_reads_only_what_is_unfinished(pg_url: str, table: str) -> None:
    read = await postgres_rows_read(pg_url, _seed_history, _FLEET_READS, table)
    assert max(read) <= 2 * WAITING, read


async def test_as_sent_no_read_walks_the_runs_or_the_steps(tmp_path: Any) -> None:
    """The instruction counts above are taken with the values written in; the application
    binds them. As sent, with a history's statistics, every read searches an index for its
    runs and steps (without its hint the line of held steps was read by walking every step
    in id order)."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'plans.db'}"
    db = database.Database(url)
    await migrate.upgrade(db)
    await _seed_history(db, 1, 2000)
    await db.dispose()
    for statement in (*_READS, *_FLEET_READS):
        plan = sqlite_plan(url, statement)
        walks = [step for step in plan if step in ("SCAN steps", "SCAN runs")]
        assert not walks, plan
