"""The engine's claims read in proportion to the work found, whatever the planner's statistics
say. A storm comes after a quiet spell: Postgres's statistics then say that almost no run is
running and almost no step is due (autovacuum analyses a table once a tenth of it changed, so
a 1,000-alert storm over a long history never refreshes them). The claim of due steps joined
them to their runs, and on those statistics Postgres took each running run in turn and read
every due step for it, the run's id only a filter: a storm of N read N² rows a claim."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa

from remediator.adapters.db import database, migrate, tables
from remediator.adapters.db import store as sql_store
from remediator.domain import records, runs

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


def _episode(n: int, *, handled: bool = True) -> dict[str, Any]:
    at = NOW - dt.timedelta(days=400) + dt.timedelta(seconds=n)
    return {
        "id": n,
        "fingerprint": f"5eed{n:012x}",
        "starts_at": at,
        "alertname": "GPUXidError79",
        "status": "resolved",
        "handled_status": "resolved" if handled else None,
        "labels": {"alertname": "GPUXidError79", "node": f"gpu-node-{n:05}"},
        "annotations": {},
        "generator_url": "http://prometheus/graph",
        "created_at": at,
        "resolved_at": at + dt.timedelta(minutes=5),
    }


def _rows_read(conn: sa.Connection, *tables_read: str) -> int:
    """Rows of ``tables_read`` this transaction has read so far (sequentially or by index)."""
    read = conn.execute(
        sa.text(
            "SELECT coalesce(sum(coalesce(idx_tup_fetch, 0) + seq_tup_read), 0) "
            "FROM pg_stat_xact_user_tables WHERE relname = ANY(:names)"
        ),
        {"names": list(tables_read)},
    ).scalar_one()
    return int(read)


async def _history(db: database.Database, episodes: int, *, runs_for: range) -> None:
    """``episodes`` resolved, handled episodes, a finished run for those in ``runs_for``, and
    statistics taken on them (what autovacuum leaves after a long history)."""
    async with db.engine.begin() as conn:
        await conn.execute(
            sa.insert(tables.alert_episodes), [_episode(n) for n in range(1, episodes + 1)]
        )
        rows = [_run(n, runs.RunStatus.SUCCEEDED) | {"episode_id": n} for n in runs_for]
        if rows:
            await conn.execute(sa.insert(tables.runs), rows)
    async with db.engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(sa.text("ANALYZE alert_episodes"))
        await conn.execute(sa.text("ANALYZE runs"))


async def test_the_probe_finds_new_episodes_without_reading_the_handled_ones(pg_url: str) -> None:
    """Postgres takes ``handled_status <> status`` to hold for nearly every row, whatever
    ANALYZE found: as ``EXISTS`` the probe's "any new episode?" read every episode stored, before
    every pass (18 ms with 10⁵)."""
    db = database.Database(pg_url)
    await migrate.upgrade(db)
    try:
        await _history(db, HISTORY, runs_for=range(0))

        def probe(conn: sa.Connection) -> tuple[bool, int]:
            found = conn.execute(sql_store._PROBE, {"now": NOW}).one()
            return bool(found.episodes), _rows_read(conn, "alert_episodes")

        found, read = await db.read_sync("probe", probe)
        assert not found
        assert read <= 10, read  # EXISTS: 3,000
        async with db.engine.begin() as conn:  # then one arrives
            await conn.execute(sa.insert(tables.alert_episodes), [_episode(HISTORY + 1) | {
                "status": "firing", "handled_status": None, "resolved_at": None}])  # fmt: skip
        found, read = await db.read_sync("probe", probe)
        assert found
        assert read <= 10, read
    finally:
        await db.dispose()


async def test_a_retention_batch_reads_the_runs_of_its_episodes_not_every_run(
    pg_url: str,
) -> None:
    """Whether an expired episode has a run, and an active one, is asked per episode, from
    the index of each episode's runs. As ``EXISTS`` Postgres answered the first for a whole
    batch by reading every run stored (a hashed subplan), so a first pass over a long history
    grew with its square; asked as "an active run of it?", it walked the index of active runs
    (a storm's, after a quiet spell's statistics) for each episode."""
    from remediator.adapters.db import retention

    db = database.Database(pg_url)
    await migrate.upgrade(db)
    try:
        await _history(db, HISTORY, runs_for=range(1, HISTORY + 1, 2))  # every other one
        async with db.engine.begin() as conn:  # a storm under way, of episodes not expired
            storm = range(HISTORY + 1, HISTORY + STORM + 1)
            await conn.execute(
                sa.insert(tables.alert_episodes),
                [_episode(n) | {"resolved_at": NOW, "status": "firing"} for n in storm],
            )
            await conn.execute(
                sa.insert(tables.runs),
                [_run(n, runs.RunStatus.RUNNING) | {"episode_id": n} for n in storm],
            )
        read_runs: list[int] = []
        write_sync = db.write_sync

        async def counting(operation: str, work: Any, **kwargs: Any) -> Any:
            def counted(conn: sa.Connection) -> Any:
                before = _rows_read(conn, "runs")
                try:
                    return work(conn)
                finally:
                    read_runs.append(_rows_read(conn, "runs") - before)

            return await write_sync(operation, counted, **kwargs)

        db.write_sync = counting  # type: ignore[method-assign]
        pruned = await retention.prune_alert_episodes(
            db, ended_before=NOW - dt.timedelta(days=90), batch=200
        )
        assert pruned.deleted == HISTORY // 2  # those with no run
        assert pruned.reduced == HISTORY // 2  # those with one, kept for it
        # each batch: the runs of its 200 episodes, at most one read per question each
        assert max(read_runs) <= 2 * 200, read_runs  # EXISTS: all 1,500 runs, every batch
    finally:
        await db.dispose()


async def test_the_engine_s_postgres_transactions_are_not_compiled(pg_url: str) -> None:
    """JIT compilation is off where the engine's, the webhook's and retention's statements
    run: each reads a few rows, and a retention batch estimated over the whole history spent
    most of its time compiling (25 functions, 50 ms for a 200-row answer)."""
    db = database.Database(pg_url)
    try:
        jit = await db.read_sync("jit", lambda conn: conn.execute(sa.text("SHOW jit")).scalar())
        assert jit == "off"
    finally:
        await db.dispose()


async def test_a_quiet_spell_s_probe_reads_no_step_of_the_storm_before_it(pg_url: str) -> None:
    """Statistics taken during a storm (autovacuum analyses a table once a tenth of it changed:
    in the middle of one, most runs running, most steps due) stay until the next tenth
    changes, which a quiet spell never brings. On them Postgres answered the probe's "is a run
    ready to advance?" with a hash of every step stored (an ``EXISTS`` made a hashed subplan),
    built again in every probe, once a second, for as long as the quiet lasted."""
    db = database.Database(pg_url)
    await migrate.upgrade(db)
    try:
        storm = range(1, HISTORY + 1)
        due = NOW - dt.timedelta(seconds=1)
        async with db.engine.begin() as conn:  # the storm, as autovacuum saw it
            await conn.execute(
                sa.insert(tables.runs), [_run(n, runs.RunStatus.RUNNING) for n in storm]
            )
            await conn.execute(
                sa.insert(tables.steps), [_step(n, runs.StepStatus.PENDING, due) for n in storm]
            )
        async with db.engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(sa.text("ANALYZE runs"))
            await conn.execute(sa.text("ANALYZE steps"))
        async with db.engine.begin() as conn:  # then it ends
            await conn.execute(sa.update(tables.steps).values(status="succeeded", due_at=None))
            await conn.execute(sa.update(tables.runs).values(status="succeeded"))

        def probe(conn: sa.Connection) -> tuple[records.Probe, int]:
            found = conn.execute(sql_store._PROBE, {"now": NOW}).one()
            return records.Probe(**found._mapping), _rows_read(conn, "runs", "steps")

        found, read = await db.read_sync("probe", probe)
        assert not any(dataclasses.astuple(found))
        assert read <= 10, read  # EXISTS: every step (hashed, or scanned for a due one), 6,000
    finally:
        await db.dispose()


async def test_the_reconciler_reads_an_effect_s_undo_runs_without_reading_every_run(
    pg_url: str,
) -> None:
    """For every effect it looks at, the reconciler reads the run's undo runs (and a run's
    page its child runs): with no index on the parent run, each read scanned every run
    stored, 55 ms with 10⁶, for each of the effects a pass looks at."""
    db = database.Database(pg_url)
    await migrate.upgrade(db)
    try:
        await _history(db, HISTORY, runs_for=range(0))
        async with db.engine.begin() as conn:  # a long history of runs and their undo runs
            await conn.execute(
                sa.insert(tables.runs),
                [
                    _run(n, runs.RunStatus.SUCCEEDED)
                    | ({"kind": "undo", "parent_run_id": n - 1} if n % 2 == 0 else {})
                    for n in range(1, HISTORY + 1)
                ],
            )
        async with db.engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(sa.text("ANALYZE runs"))
        kept = HISTORY + 1
        async with db.engine.begin() as conn:  # a lost GPU's cordon, kept after its run ended
            await conn.execute(
                sa.insert(tables.alert_episodes),
                [_episode(kept) | {"status": "firing", "handled_status": "firing"}],
            )
            await conn.execute(
                sa.insert(tables.runs),
                [
                    _run(kept, runs.RunStatus.SUCCEEDED)
                    | {"episode_id": kept, "kind": "alert", "on_resolve": "continue"}
                ],
            )
            await conn.execute(
                sa.insert(tables.steps),
                [
                    _step(kept, runs.StepStatus.SUCCEEDED, None)
                    | {"action": "node.cordon", "effect": runs.Effect.APPLIED.value}
                ],
            )
        store = sql_store.SqlStore(db, clock=lambda: NOW)

        def ledger(tx: sql_store.SqlTx) -> tuple[list[records.LedgerEntry], int]:
            entries = tx.effect_ledger(
                actions=["node.cordon"], returning=["node.uncordon"], closed_by=[], limit=10
            )
            return entries, _rows_read(tx.conn, "runs")

        entries, read = await store.run("ledger", ledger)
        assert [entry.step.id for entry in entries] == [kept]
        assert entries[0].undo_runs == ()
        # the ledger read and one entry's: its run, its undo runs, a later run on its node
        assert read <= 10, read  # with no index on the parent run: every run, 3,004
    finally:
        await db.dispose()
