"""Step changes are decided at once and written in batch: a stage's claims, or a batch of
outcomes, are one statement per kind of change, not one per step (a 1,000-alert burst ran
six step updates an alert). The compare-and-set holds as before, reads see what is held,
a rolled-back savepoint takes its held changes with it, and the audit seals what was
written."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa

from remediator.adapters.db import audit, tables
from remediator.adapters.db import store as sql_store
from remediator.domain import errors, records, runs, transitions
from remediator.engine import isolation, lifecycle
from tests.contract.plans import new_run
from tests.support.statements import NOW, Statements, episodes

S = tables.steps


async def _started_runs(store: sql_store.SqlStore, count: int) -> list[int]:
    def create(tx: sql_store.SqlTx) -> list[int]:
        made = []
        for n in range(count):
            run_id = tx.insert_run(new_run(node=f"gpu-node-{n:02}"), actor="test")
            assert run_id is not None
            run = tx.get_run(run_id)
            assert run is not None
            tx.apply(transitions.move_run(run, runs.RunStatus.RUNNING, reason="go"))
            made.append(run_id)
        return made

    made: list[int] = await store.run("prepare", create)
    return made


def _first_steps(tx: sql_store.SqlTx, run_ids: list[int]) -> list[records.Step]:
    return [tx.steps_of_run(run_id)[0] for run_id in run_ids]


async def test_the_claims_of_a_stage_are_one_statement(store: sql_store.SqlStore) -> None:
    run_ids = await _started_runs(store, 6)
    until = NOW + dt.timedelta(seconds=30)

    def claim_all(tx: sql_store.SqlTx) -> list[records.Step]:
        claimed = []
        for step in _first_steps(tx, run_ids):
            due = tx.apply(transitions.make_due(step, now=tx.now))
            claimed.append(
                tx.apply(transitions.claim(due, owner="w1", lease_until=until, now=tx.now))
            )
        return claimed

    with Statements() as statements:
        claimed = await store.run("claim", claim_all)
    # made due and claimed: one row write each, all in one statement (was 12)
    assert len(statements.containing("UPDATE steps")) == 1
    stored = await store.run("read", lambda tx: _first_steps(tx, run_ids))
    assert stored == claimed
    assert {(s.status, s.lease_owner, s.attempt) for s in stored} == {
        (runs.StepStatus.RUNNING, "w1", 1)
    }


async def test_reads_in_the_transaction_see_the_held_changes(store: sql_store.SqlStore) -> None:
    run_ids = await _started_runs(store, 3)

    def make_due_then_look(tx: sql_store.SqlTx) -> list[int]:
        for step in _first_steps(tx, run_ids):
            tx.apply(transitions.make_due(step, now=tx.now))
        return sorted(step.run_id for step in tx.lock_due_steps(10))

    assert await store.run("due", make_due_then_look) == run_ids


async def test_a_held_change_is_a_conflict_if_its_row_moved_before_it_was_written(
    store: sql_store.SqlStore,
) -> None:
    [run_id] = await _started_runs(store, 1)

    def race(tx: sql_store.SqlTx) -> None:
        [step] = _first_steps(tx, [run_id])
        tx.apply(transitions.make_due(step, now=tx.now))
        # another writer moves the row meanwhile (past the transaction's own view)
        tx.conn.conn.execute(sa.update(S).where(S.c.id == step.id).values(status="cancelled"))
        tx.write_pending()

    with pytest.raises(errors.Conflict, match="is no longer pending"):
        await store.run("race", race)
    [step] = await store.run("read", lambda tx: _first_steps(tx, [run_id]))
    assert step.status is runs.StepStatus.PENDING  # the whole transaction rolled back


async def test_a_rolled_back_savepoint_takes_its_held_changes_with_it(
    store: sql_store.SqlStore,
) -> None:
    run_ids = await _started_runs(store, 2)

    def one_fails(tx: sql_store.SqlTx) -> None:
        first, second = _first_steps(tx, run_ids)
        with tx.savepoint():
            tx.apply(transitions.make_due(first, now=tx.now))

        def poisoned() -> None:
            with tx.savepoint():
                tx.apply(transitions.make_due(second, now=tx.now))
                raise RuntimeError("poison")

        with pytest.raises(RuntimeError):
            poisoned()

    await store.run("pass", one_fails)
    first, second = await store.run("read", lambda tx: _first_steps(tx, run_ids))
    assert (first.status, second.status) == (runs.StepStatus.PENDING, runs.StepStatus.PENDING)
    assert (first.due_at, second.due_at) == (NOW, None)


async def test_the_audit_seals_held_rows_as_they_were_written(
    store: sql_store.SqlStore,
) -> None:
    run_ids = await _started_runs(store, 3)
    until = NOW + dt.timedelta(seconds=30)
    result = transitions.Result(status=runs.StepStatus.SUCCEEDED, output={"ok": True})

    def claim_and_finish(tx: sql_store.SqlTx) -> None:
        for step in _first_steps(tx, run_ids):
            due = tx.apply(transitions.make_due(step, now=tx.now))
            claimed = tx.apply(transitions.claim(due, owner="w1", lease_until=until, now=tx.now))
            tx.apply(transitions.finish(claimed, result, owner="w1", now=tx.now))

    await store.run("steps", claim_and_finish)
    report = await audit.AuditQueries(store.db).verify()
    assert report.ok, report
    # each step's three events seal the one row the three changes wrote
    query = sa.select(tables.audit_events.c.step_id, tables.audit_events.c.rows).where(
        tables.audit_events.c.step_id.is_not(None)
    )
    async with store.db.read() as conn:
        seals = {
            (row.step_id, digest)
            for row in await conn.execute(query)
            for digest in row.rows["steps"].values()
        }
    assert len(seals) == len(run_ids)
    assert all(isinstance(digest, str) and digest for _, digest in seals)


@pytest.mark.parametrize("raced_first", [True, False], ids=["raced-first", "raced-last"])
async def test_a_pass_whose_held_change_lost_its_row_skips_only_that_unit(
    store: sql_store.SqlStore, raced_first: bool
) -> None:
    """Without savepoints, a held change meets its row when it is next written: in the next
    unit (raced first), or at the end of the pass (raced last). Either way the pass runs
    again with a savepoint per unit, where the conflict is the unit's own."""
    first_run, second_run = await _started_runs(store, 2)
    attempts: list[list[Any]] = []

    def work(tx: sql_store.SqlTx) -> None:
        outcomes: list[Any] = []
        attempts.append(outcomes)
        report = lifecycle.Report()

        def raced() -> records.Step:
            [step] = _first_steps(tx, [first_run])
            # another writer moves the row after this unit read it
            tx.conn.conn.execute(sa.update(S).where(S.c.id == step.id).values(status="cancelled"))
            return tx.apply(transitions.make_due(step, now=tx.now))

        def clean() -> records.Step:
            [step] = _first_steps(tx, [second_run])
            return tx.apply(transitions.make_due(step, now=tx.now))

        units = [("raced", raced), ("clean", clean)]
        for key, unit in units if raced_first else units[::-1]:
            moved = isolation.run_unit(tx, key, unit, quarantine=lambda error: None, report=report)
            outcomes.append(moved and moved.due_at)

    await isolation.transaction(store, "pass", work)
    # the first attempt ended at the conflict (wherever its row was next written); the
    # second ran each unit in a savepoint: the raced one skipped, the other one done
    assert len(attempts) == 2
    assert attempts[1] == ([None, NOW] if raced_first else [NOW, None])
    first, second = await store.run("read", lambda tx: _first_steps(tx, [first_run, second_run]))
    assert (first.due_at, second.due_at) == (None, NOW)


async def _pending_runs(store: sql_store.SqlStore, count: int) -> list[int]:
    def create(tx: sql_store.SqlTx) -> list[int]:
        made = [tx.insert_run(new_run(node=f"gpu-node-{n:02}"), actor="test") for n in range(count)]
        return [run_id for run_id in made if run_id is not None]

    made: list[int] = await store.run("prepare", create)
    return made


async def test_the_runs_a_stage_starts_and_ends_are_one_statement(
    store: sql_store.SqlStore,
) -> None:
    run_ids = await _pending_runs(store, 5)

    def start_and_end(tx: sql_store.SqlTx) -> list[records.Run]:
        moved = []
        tx.read_runs(run_ids, steps=False)  # as a stage reads them: in batch, first
        for run_id in run_ids:
            run = tx.get_run(run_id)
            assert run is not None
            started = tx.apply(transitions.move_run(run, runs.RunStatus.RUNNING, reason="go"))
            moved.append(
                tx.apply(transitions.move_run(started, runs.RunStatus.SUCCEEDED, reason="done"))
            )
        return moved

    with Statements() as statements:
        moved = await store.run("runs", start_and_end)
    assert len([s for s in statements.seen if "UPDATE runs" in s]) == 1  # was 10
    stored = await store.run("read", lambda tx: [tx.get_run(run_id) for run_id in run_ids])
    assert stored == moved
    assert {(run.status, run.finished_at) for run in stored} == {(runs.RunStatus.SUCCEEDED, NOW)}
    assert (await audit.AuditQueries(store.db).verify()).ok


async def test_a_held_run_change_is_a_conflict_if_its_run_moved_meanwhile(
    store: sql_store.SqlStore,
) -> None:
    [run_id] = await _pending_runs(store, 1)

    def race(tx: sql_store.SqlTx) -> None:
        run = tx.get_run(run_id)
        assert run is not None
        tx.apply(transitions.move_run(run, runs.RunStatus.RUNNING, reason="go"))
        tx.conn.conn.execute(
            sa.update(tables.runs).where(tables.runs.c.id == run_id).values(status="cancelled")
        )
        tx.write_pending()

    with pytest.raises(errors.Conflict, match=f"run {run_id} is cancelled; cannot move it"):
        await store.run("race", race)


async def test_the_episodes_a_pass_handles_are_marked_in_one_statement(
    store: sql_store.SqlStore,
) -> None:
    await episodes(store, 4)

    def handle(tx: sql_store.SqlTx) -> list[int]:
        found = tx.lock_unhandled_episodes(10)
        for episode in found:
            tx.mark_episode_handled(episode)
        return [episode.id for episode in tx.lock_unhandled_episodes(10)]  # sees the marks

    with Statements() as statements:
        assert await store.run("handle", handle) == []
    assert len([s for s in statements.seen if "UPDATE alert_episodes" in s]) == 1  # was 4
    assert await store.run("again", lambda tx: tx.lock_unhandled_episodes(10)) == []


async def test_batches_of_any_size_share_a_few_statements(store: sql_store.SqlStore) -> None:
    """One statement per row count was compiled afresh for nearly every batch of a storm."""
    run_ids = await _started_runs(store, 12)

    def make_due(count: int) -> Any:
        def work(tx: sql_store.SqlTx) -> None:
            for step in _first_steps(tx, run_ids[:count]):
                tx.apply(transitions.make_due(step, now=tx.now + dt.timedelta(seconds=count)))

        return work

    with Statements() as statements:
        for count in (5, 6, 7, 8, 9, 12):
            await store.run("due", make_due(count))
    updates = {text for text in statements.seen if "UPDATE steps" in text}
    assert len(updates) <= 2  # on SQLite, 8 rows and 16 rows (on Postgres, any number: 1)
    due = await store.run("read", lambda tx: [s.due_at for s in _first_steps(tx, run_ids)])
    assert due == [NOW + dt.timedelta(seconds=12)] * 12  # padding rows changed nothing
