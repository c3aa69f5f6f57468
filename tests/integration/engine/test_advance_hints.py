"""The advance stage reads hints (``advance_hints``), not every running run: a transaction that
may leave a run with a next step to decide notes it when it commits, and one that gives the
run a step under way (or ends it) needs no note. What it costs follows what changed, not how
many runs are under way (with 10,000 runs each on a running or due step the probe walked them
all, 10 ms on SQLite and 19 ms on Postgres, before every pass)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa

from remediator.adapters.db import database, tables
from remediator.adapters.db import store as sql_store
from remediator.domain import records, runs, transitions
from tests.contract.plans import new_run
from tests.support.statements import (
    NOW,  # the ``store`` fixture's clock
    instructions_as_rows_grow,
    postgres_rows_read,
)


async def _hinted(db: database.Database) -> list[int]:
    async with db.read() as conn:
        found = await conn.execute(
            sa.select(tables.advance_hints.c.run_id).order_by(tables.advance_hints.c.id)
        )
        return list(found.scalars())


def _first(tx: sql_store.SqlTx, run_id: int) -> records.Step:
    return tx.steps_of_run(run_id)[0]


def _started(tx: sql_store.SqlTx, node: str = "gpu-node-01") -> int:
    run_id = tx.insert_run(new_run(node=node), actor="test")
    assert run_id is not None
    run = tx.get_run(run_id)
    assert run is not None
    tx.apply(transitions.move_run(run, runs.RunStatus.RUNNING, reason="go"))
    return run_id


def _started_and_claimed(tx: sql_store.SqlTx) -> int:
    """The engine's ordinary pass: a run started, its first step made due and claimed."""
    run_id = _started(tx)
    _claim(tx, tx.apply(transitions.make_due(_first(tx, run_id), now=NOW)))
    return run_id


def _advance(tx: sql_store.SqlTx, limit: int) -> list[int]:
    """The advance stage: take the runs to advance and make each one's first step due."""
    taken = [run.id for run in tx.active_runs_with_no_active_step(limit)]
    for run_id in taken:
        tx.apply(transitions.make_due(_first(tx, run_id), now=NOW))
    return taken


def _claim(tx: sql_store.SqlTx, step: records.Step) -> records.Step:
    return tx.apply(transitions.claim(step, owner="w1", lease_until=NOW, now=NOW))


def _succeed(tx: sql_store.SqlTx, step: records.Step) -> records.Step:
    result = transitions.Result(status=runs.StepStatus.SUCCEEDED, output={})
    return tx.apply(transitions.finish(step, result, owner="w1", now=NOW))


async def test_a_run_started_and_given_a_running_step_in_one_transaction_leaves_no_hint(
    store: sql_store.SqlStore,
) -> None:
    """The engine's ordinary pass: started, first step due and claimed. The run has a step
    under way, so nothing is noted; the step's end notes it."""
    db = store.db
    run_id = await store.run("pass", _started_and_claimed)
    assert await _hinted(db) == []

    def finish(tx: sql_store.SqlTx) -> None:
        _succeed(tx, _first(tx, run_id))

    await store.run("finish", finish)
    assert await _hinted(db) == [run_id]
    assert (await store.probe()).advance


async def test_a_step_finished_and_its_run_advanced_in_one_transaction_leaves_no_hint(
    store: sql_store.SqlStore,
) -> None:
    """A step's end and its run's next step in one transaction (the engine's follow-up)."""
    db = store.db
    run_id = await store.run("pass", _started_and_claimed)

    def finish_and_advance(tx: sql_store.SqlTx) -> None:
        first, second = tx.steps_of_run(run_id)
        _succeed(tx, first)
        tx.apply(transitions.make_due(second, now=NOW))

    await store.run("follow-up", finish_and_advance)
    assert await _hinted(db) == []
    assert not (await store.probe()).advance


async def test_an_approval_makes_its_step_due_and_leaves_no_hint(store: sql_store.SqlStore) -> None:
    """Parked for approval, then approved: the run is running again with its step due, so
    there is nothing to advance (and nothing for every probe to look at until a pass)."""
    db = store.db

    def start_and_park(tx: sql_store.SqlTx) -> int:
        run_id = _started(tx)
        due = tx.apply(transitions.make_due(_first(tx, run_id), now=NOW))
        tx.apply(transitions.park(due))
        run = tx.get_run(run_id)
        assert run is not None
        tx.apply(transitions.move_run(run, runs.RunStatus.WAITING_APPROVAL, reason="park"))
        return run_id

    run_id = await store.run("pass", start_and_park)
    assert await _hinted(db) == []

    def approve(tx: sql_store.SqlTx) -> None:
        step, run = _first(tx, run_id), tx.get_run(run_id)
        assert run is not None
        tx.apply(transitions.approve(step, now=NOW, actor="oncall", reason="ok", data={}))
        tx.apply(transitions.move_run(run, runs.RunStatus.RUNNING, reason="approved"))

    await store.run("approve", approve)
    assert await _hinted(db) == []
    assert {"advance": False, "due": True}.items() <= vars(await store.probe()).items()


async def test_a_hint_is_taken_by_the_advance_stage_and_a_stale_one_is_deleted(
    store: sql_store.SqlStore,
) -> None:
    db = store.db
    advanced = await store.run("start", _started)
    stale = await store.run("start", lambda tx: _started(tx, node="gpu-node-02"))
    assert await _hinted(db) == [advanced, stale]

    def move_on(tx: sql_store.SqlTx) -> None:  # (in a later transaction: its hint stays)
        tx.apply(transitions.make_due(_first(tx, stale), now=NOW))

    await store.run("due", move_on)
    assert await _hinted(db) == [advanced, stale]

    assert await store.run("advance", lambda tx: _advance(tx, 10)) == [advanced]
    assert await _hinted(db) == []
    assert not (await store.probe()).advance


async def test_a_run_taken_but_left_to_advance_is_hinted_again(store: sql_store.SqlStore) -> None:
    """The advance stage deletes the hint of a run it takes; if advancing it changed nothing
    (it failed, and its unit was undone), the run is noted again when the transaction
    commits."""
    db = store.db
    run_id = await store.run("start", _started)

    def take(tx: sql_store.SqlTx) -> list[int]:
        return [run.id for run in tx.active_runs_with_no_active_step(10)]

    assert await store.run("advance", take) == [run_id]
    assert await _hinted(db) == [run_id]
    assert await store.run("advance", take) == [run_id]


async def test_hints_beyond_the_limit_stay_for_the_next_pass(store: sql_store.SqlStore) -> None:
    db = store.db
    first = await store.run("start", _started)
    second = await store.run("start", lambda tx: _started(tx, node="gpu-node-02"))

    def take_one(tx: sql_store.SqlTx) -> list[int]:
        return _advance(tx, 1)

    assert await store.run("advance", take_one) == [first]
    assert await _hinted(db) == [second]
    assert await store.run("advance", take_one) == [second]
    assert await _hinted(db) == []


class _Undone(Exception):
    pass


def _undone(tx: sql_store.SqlTx, work: Any) -> None:
    """``work`` in a savepoint that is then rolled back (a unit of the engine that failed)."""
    try:
        with tx.savepoint():
            work()
            raise _Undone
    except _Undone:
        pass


async def test_a_savepoint_undone_takes_back_what_it_noted_and_what_it_cleared(
    store: sql_store.SqlStore,
) -> None:
    db = store.db

    def start_then_fail_to_advance(tx: sql_store.SqlTx) -> int:
        run_id = _started(tx)
        _undone(tx, lambda: tx.apply(transitions.make_due(_first(tx, run_id), now=NOW)))
        return run_id

    run_id = await store.run("pass", start_then_fail_to_advance)
    assert await _hinted(db) == [run_id]  # the run still has its first step to decide

    def claim_then_fail_to_finish(tx: sql_store.SqlTx) -> int:
        other = _started(tx, node="gpu-node-02")
        running = _claim(tx, tx.apply(transitions.make_due(_first(tx, other), now=NOW)))
        _undone(tx, lambda: _succeed(tx, running))
        return other

    other = await store.run("pass", claim_then_fail_to_finish)
    assert other not in await _hinted(db)  # its step is still running


async def test_a_resolution_not_yet_handled_is_advance_work_without_a_hint(
    store: sql_store.SqlStore,
) -> None:
    """A run whose alert resolved is advanced (to cancel what is left) though no step of it
    changed: found through the resolutions the engine has not handled yet."""
    db = store.db
    starts_at = NOW - dt.timedelta(minutes=5)
    async with db.write("fire") as conn:
        episode_id = (
            await conn.execute(
                sa.insert(tables.alert_episodes)
                .values(
                    fingerprint="5eed",
                    starts_at=starts_at,
                    alertname="GPUXidError79",
                    status="firing",
                    handled_status="firing",
                    labels={},
                    annotations={},
                    generator_url="",
                    created_at=NOW,
                )
                .returning(tables.alert_episodes.c.id)
            )
        ).scalar_one()

    def start(tx: sql_store.SqlTx) -> int:
        run_id = tx.insert_run(new_run(episode_id=episode_id), actor="test")
        assert run_id is not None
        tx.apply(transitions.move_run(tx.get_run(run_id), runs.RunStatus.RUNNING, reason=""))
        tx.apply(transitions.make_due(_first(tx, run_id), now=NOW))
        return run_id

    run_id = await store.run("start", start)
    await store.run("drop stale", lambda tx: tx.active_runs_with_no_active_step(10))
    assert await _hinted(db) == []
    assert not (await store.probe()).advance
    async with db.write("resolve") as conn:
        await conn.execute(sa.update(tables.alert_episodes).values(status="resolved"))
    assert (await store.probe()).advance
    found = await store.run(
        "advance", lambda tx: [r.id for r in tx.active_runs_with_no_active_step(10)]
    )
    assert found == [run_id]


async def _seed_busy_runs(db: database.Database, first: int, count: int) -> None:
    """Running runs ``first`` to ``first + count - 1``, each with its first step due and its
    second waiting: what a storm held by the disruption budget leaves (no hint: nothing
    changed since). Statistics taken after, as autovacuum would."""
    ids = range(first, first + count)
    common = {"phase": "do", "action": "test.record", "params": {}, "status": "pending"}
    steps = [
        common
        | {"run_id": run_id, "seq": seq, "key": f"s{seq}", "due_at": NOW if seq == 0 else None}
        | {"requires_approval": False, "approvals_required": 1, "attempt": 0}
        | {"max_attempts": 3, "timeout_seconds": 60.0, "on_failure": "stop"}
        | {"retry": {}, "output": {}}
        for run_id in ids
        for seq in (0, 1)
    ]
    async with db.write("seed") as conn:
        await conn.execute(
            sa.insert(tables.runs),
            [
                {"id": run_id, "playbook": "reboot", "kind": "manual", "status": "running"}
                | {"node": f"busy-{run_id}", "exclusive": True, "dry_run": False, "params": {}}
                | {"on_resolve": "cancel", "reason": "", "created_at": NOW, "updated_at": NOW}
                for run_id in ids
            ],
        )
        await conn.execute(sa.insert(tables.steps), steps)
        await conn.execute(sa.text("ANALYZE"))


async def test_the_advance_check_does_not_walk_the_runs_under_way(tmp_path: Any) -> None:
    """With 20 or 2,000 runs each on a due step, the probe's advance check and the advance
    stage's read execute the same instructions: they start from the hints and the unhandled
    resolutions, not from the running runs (2,000 of them made the walk a hundred times the
    work)."""
    counts = await instructions_as_rows_grow(tmp_path / "busy.db", _seed_busy_runs, _ADVANCE_READS)
    assert counts[0] == counts[1]


_ADVANCE_READS = (
    sa.select({c.name: c for c in sql_store._PROBE.selected_columns}["advance"]),
    sql_store._LOCK_ADVANCEABLE[0].params(w_ids=[0], w_limit=64),
)


@pytest.mark.postgres
async def test_postgres_reads_the_runs_to_advance_by_key_not_the_runs_under_way(
    pg_url: str,
) -> None:
    """The same on Postgres, in rows read, with 2,000 runs under way: none (no run is hinted,
    none resolving). An ``id IN (...) OR episode_id IN (...)`` was planned as a walk of the
    running runs with the OR as a filter (10,000 rows removed, 2.8 ms); as one ``id IN`` of
    both it is a lookup by key."""
    assert await postgres_rows_read(pg_url, _seed_busy_runs, _ADVANCE_READS, "runs") == [0, 0]


async def test_the_leaders_sweep_hints_a_run_to_advance_that_no_hint_names(
    store: sql_store.SqlStore,
) -> None:
    """A run left to advance with no hint (changed by a replica of an older version) is
    hinted by the sweep, and then advanced; runs hinted already, or with a step under way,
    are not hinted again."""
    db = store.db
    unseen = await store.run("start", _started)
    hinted = await store.run("start", lambda tx: _started(tx, node="gpu-node-02"))

    def busy(tx: sql_store.SqlTx) -> int:
        run_id = _started(tx, node="gpu-node-03")
        tx.apply(transitions.make_due(_first(tx, run_id), now=NOW))
        return run_id

    await store.run("start", busy)
    async with db.write("an older replica's change") as conn:
        hints = tables.advance_hints
        await conn.execute(sa.delete(hints).where(hints.c.run_id == unseen))
    assert await _hinted(db) == [hinted]
    assert await store.hint_runs_to_advance() == 1
    assert sorted(await _hinted(db)) == [unseen, hinted]
    assert await store.hint_runs_to_advance() == 0
    found = await store.run(
        "advance", lambda tx: [run.id for run in tx.active_runs_with_no_active_step(10)]
    )
    assert found == [unseen, hinted]
