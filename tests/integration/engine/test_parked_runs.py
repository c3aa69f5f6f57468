"""A pending run that cannot start is parked behind what it waits for (``runs.waiting_for``: its
node's or GPU's lock, or its playbook's slots) and not looked at again until a release of that
wakes it. The start check reads the runs to try, not every pending run: with 10,000 runs
waiting behind held nodes it walked them all before every pass, 6 ms on SQLite and 53 ms on
Postgres."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from remediator.adapters.db import database, tables
from remediator.adapters.db import store as sql_store
from remediator.domain import runs
from remediator.engine import lifecycle
from tests.contract.plans import new_run
from tests.support.statements import (
    NOW,  # the ``store`` fixture's clock
    instructions_as_rows_grow,
    postgres_rows_read,
)


async def _waiting(db: database.Database) -> dict[int, str | None]:
    """What each pending run waits for (None: it is tried at the next pass)."""
    R = tables.runs
    async with db.read() as conn:
        rows = await conn.execute(
            sa.select(R.c.id, R.c.waiting_for).where(R.c.status == "pending").order_by(R.c.id)
        )
        return {row.id: row.waiting_for for row in rows}


def _insert(tx: sql_store.SqlTx, node: str = "gpu-node-01") -> int:
    run_id = tx.insert_run(new_run(node=node), actor="test")
    assert run_id is not None
    return run_id


def _start_stage(tx: sql_store.SqlTx, concurrency: int = 10) -> list[int]:
    """The engine's start stage: try the pending runs it is given, oldest first."""
    return [
        run.id
        for run in tx.lock_pending_runs(64)
        if lifecycle.start_run(tx, run, concurrency=concurrency)
    ]


def _finish(tx: sql_store.SqlTx, run_id: int) -> None:
    run = tx.get_run(run_id)
    assert run is not None
    lifecycle.finish_run(tx, run, runs.RunStatus.SUCCEEDED, reason="done")


async def test_a_run_behind_a_held_node_waits_for_its_lock_and_starts_once_it_is_released(
    store: sql_store.SqlStore,
) -> None:
    db = store.db
    holder = await store.run("insert", _insert)
    assert await store.run("start", _start_stage) == [holder]
    behind = await store.run("insert", _insert)
    assert (await store.probe()).startable  # not tried yet

    assert await store.run("start", _start_stage) == []
    assert await _waiting(db) == {behind: "node:gpu-node-01"}
    assert not (await store.probe()).startable  # nothing to try while the holder runs
    assert await store.run("start", _start_stage) == []  # (and not offered if asked)

    await store.run("finish", lambda tx: _finish(tx, holder))
    assert await _waiting(db) == {behind: None}
    assert (await store.probe()).startable
    assert await store.run("start", _start_stage) == [behind]


async def _one_running_two_waiting_for_its_slot(store: sql_store.SqlStore) -> list[int]:
    """Three runs of a playbook of concurrency 1 on three nodes: the first started."""
    nodes = ("gpu-node-01", "gpu-node-02", "gpu-node-03")
    found = [await store.run("insert", lambda tx, n=n: _insert(tx, n)) for n in nodes[:1]]
    assert await store.run("start", lambda tx: _start_stage(tx, 1)) == found
    found += [await store.run("insert", lambda tx, n=n: _insert(tx, n)) for n in nodes[1:]]
    assert await store.run("start", lambda tx: _start_stage(tx, 1)) == []
    return found


async def test_runs_behind_a_full_playbook_wait_for_a_slot_and_the_oldest_takes_it(
    store: sql_store.SqlStore,
) -> None:
    db = store.db
    first, second, third = await _one_running_two_waiting_for_its_slot(store)
    assert await _waiting(db) == {second: "slot:reboot:", third: "slot:reboot:"}
    assert not (await store.probe()).startable

    await store.run("finish", lambda tx: _finish(tx, first))
    assert await _waiting(db) == {second: None, third: "slot:reboot:"}  # one slot: the oldest
    assert await store.run("start", lambda tx: _start_stage(tx, 1)) == [second]
    assert await _waiting(db) == {third: "slot:reboot:"}


async def test_a_run_woken_for_a_slot_that_waits_for_its_node_hands_the_slot_on(
    store: sql_store.SqlStore,
) -> None:
    """Woken for the slot its playbook freed, the oldest waiting run finds its node taken
    meanwhile (by a run of another playbook): it waits for the node, and the next run waiting
    for a slot is woken in its place, rather than the slot staying free while runs wait."""
    db = store.db
    first, second, third = await _one_running_two_waiting_for_its_slot(store)

    def other_playbook(tx: sql_store.SqlTx) -> int:
        run_id = tx.insert_run(new_run(node="gpu-node-02", playbook="drain"), actor="test")
        assert run_id is not None
        return run_id

    drain = await store.run("insert", other_playbook)
    assert await store.run("start", lambda tx: _start_stage(tx, 1)) == [drain]
    await store.run("finish", lambda tx: _finish(tx, first))
    assert await _waiting(db) == {second: None, third: "slot:reboot:"}

    assert await store.run("start", lambda tx: _start_stage(tx, 1)) == []
    assert await _waiting(db) == {second: "node:gpu-node-02", third: None}
    assert await store.run("start", lambda tx: _start_stage(tx, 1)) == [third]


async def test_a_run_is_not_parked_behind_a_lock_released_in_the_same_transaction(
    store: sql_store.SqlStore,
) -> None:
    """A pass that parks a run behind a node, then ends the node's holder (its advance stage
    comes after its start stage), leaves the run to be tried at the next pass: the wait is
    checked when the transaction commits."""
    db = store.db
    holder = await store.run("insert", _insert)
    await store.run("start", _start_stage)
    behind = await store.run("insert", _insert)

    def start_then_finish(tx: sql_store.SqlTx) -> list[int]:
        started = _start_stage(tx)
        _finish(tx, holder)
        return started

    assert await store.run("pass", start_then_finish) == []
    assert await _waiting(db) == {behind: None}
    assert await store.run("start", _start_stage) == [behind]


async def test_a_savepoint_undone_takes_back_the_runs_it_parked(store: sql_store.SqlStore) -> None:
    db = store.db
    await store.run("insert", _insert)
    await store.run("start", _start_stage)
    behind = await store.run("insert", _insert)

    class Undone(Exception):
        pass

    def start_then_fail(tx: sql_store.SqlTx) -> None:
        try:
            with tx.savepoint():
                _start_stage(tx)
                raise Undone
        except Undone:
            pass

    await store.run("pass", start_then_fail)
    assert await _waiting(db) == {behind: None}


async def test_the_leaders_sweep_wakes_a_run_whose_wait_is_over(store: sql_store.SqlStore) -> None:
    """Runs parked behind a lock that was released without waking them (by a replica of an
    older version) are woken by the sweep; those whose wait still holds are not: a node
    still held, or a playbook's slots all taken (as many as ``slots`` says it may run)."""
    db = store.db
    nodes = ("gpu-node-01", "gpu-node-02", "gpu-node-03")
    holders = [await store.run("insert", lambda tx, n=n: _insert(tx, n)) for n in nodes]
    assert await store.run("start", lambda tx: _start_stage(tx, 2)) == holders[:2]
    behind = [await store.run("insert", lambda tx, n=n: _insert(tx, n)) for n in nodes[:2]]
    await store.run("start", lambda tx: _start_stage(tx, 2))
    # Parked behind their nodes, they handed on the slot they might have been woken for: the
    # run waiting for one is tried again, and waits again (no slot is free).
    assert (await _waiting(db))[holders[2]] is None
    await store.run("start", lambda tx: _start_stage(tx, 2))
    assert await _waiting(db) == {
        holders[2]: "slot:reboot:",
        behind[0]: "node:gpu-node-01",
        behind[1]: "node:gpu-node-02",
    }
    assert await store.wake_parked_runs(lambda playbook: 2) == 0

    async with db.write("an older replica's release") as conn:
        await conn.execute(sa.delete(tables.locks).where(tables.locks.c.run_id == holders[0]))
    assert await store.wake_parked_runs(lambda playbook: 2) == 2  # its node, and its slot
    assert await _waiting(db) == {
        holders[2]: None,
        behind[0]: None,
        behind[1]: "node:gpu-node-02",
    }
    assert await store.wake_parked_runs(lambda playbook: 2) == 0


async def test_a_playbook_that_may_run_more_at_once_wakes_its_parked_runs_at_the_sweep(
    store: sql_store.SqlStore,
) -> None:
    """Its concurrency raised by a reload of the rules: the runs waiting for its slots are
    tried again, though no slot was released."""
    db = store.db
    first = await store.run("insert", lambda tx: _insert(tx, "gpu-node-01"))
    second = await store.run("insert", lambda tx: _insert(tx, "gpu-node-02"))
    assert await store.run("start", lambda tx: _start_stage(tx, 1)) == [first]
    assert await _waiting(db) == {second: "slot:reboot:"}
    assert await store.wake_parked_runs(lambda playbook: 1) == 0
    assert await store.wake_parked_runs(lambda playbook: 2) == 1
    assert await store.run("start", lambda tx: _start_stage(tx, 2)) == [second]


async def _seed_parked_runs(db: database.Database, first: int, count: int) -> None:
    """Running runs ``first`` to ``first + count - 1``, each holding its node, and as many
    pending runs parked behind them: a storm whose nodes are all busy (a drain waiting for
    approval keeps its node for hours). Statistics taken after, as autovacuum would."""
    holders = range(first, first + count)
    common = {"playbook": "reboot", "kind": "manual", "exclusive": True, "dry_run": False}
    common |= {"params": {}, "on_resolve": "cancel", "reason": "", "created_at": NOW}
    common |= {"updated_at": NOW}
    async with db.write("seed") as conn:
        await conn.execute(
            sa.insert(tables.runs),
            [
                common
                | {"id": holder, "status": "running", "node": f"busy-{holder}"}
                | {"waiting_for": None}
                for holder in holders
            ]
            + [
                common
                | {"id": 100_000 + holder, "status": "pending", "node": f"busy-{holder}"}
                | {"waiting_for": f"node:busy-{holder}"}
                for holder in holders
            ],
        )
        await conn.execute(
            sa.insert(tables.locks),
            [
                {"key": f"node:busy-{holder}", "run_id": holder, "acquired_at": NOW}
                for holder in holders
            ],
        )
        await conn.execute(sa.text("ANALYZE"))


_START_READS = (
    sa.select({c.name: c for c in sql_store._PROBE.selected_columns}["startable"]),
    sql_store._LOCK_STARTABLE[0].params(w_limit=64),
)


async def test_the_start_check_does_not_walk_the_runs_waiting_behind_held_nodes(
    tmp_path: Any,
) -> None:
    """With 20 or 2,000 runs waiting behind held nodes, the probe's start check and the start
    stage's read execute the same instructions: they read the runs to try, none here (the
    walk of the pending runs, each asked whether its node was held, grew with them)."""
    counts = await instructions_as_rows_grow(tmp_path / "busy.db", _seed_parked_runs, _START_READS)
    assert counts[0] == counts[1]


@pytest.mark.postgres
async def test_postgres_reads_no_waiting_run_to_find_the_runs_to_start(pg_url: str) -> None:
    assert await postgres_rows_read(pg_url, _seed_parked_runs, _START_READS, "runs") == [0, 0]
