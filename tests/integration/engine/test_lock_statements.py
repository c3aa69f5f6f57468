"""A start takes its node and its playbook slot in one statement, and the runs a pass ends
give up their locks in one statement (two lock inserts and a delete an alert in a burst):
the locks themselves behave as before."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa

from remediator.adapters.db import audit
from remediator.adapters.db import store as sql_store
from remediator.domain import runs
from remediator.engine import lifecycle
from tests.contract.plans import new_run
from tests.support.alerts import alert_body
from tests.support.statements import NOW, Statements


async def _pending(store: sql_store.SqlStore, nodes: list[str]) -> list[int]:
    def create(tx: sql_store.SqlTx) -> list[int]:
        made = [tx.insert_run(new_run(node=node), actor="test") for node in nodes]
        return [run_id for run_id in made if run_id is not None]

    made: list[int] = await store.run("prepare", create)
    return made


def _start(tx: sql_store.SqlTx, run_ids: list[int], concurrency: int = 10) -> list[bool]:
    tx.read_runs(run_ids, steps=False)
    started = []
    for run_id in run_ids:
        run = tx.get_run(run_id)
        assert run is not None
        started.append(lifecycle.start_run(tx, run, concurrency=concurrency))
    return started


async def _locks(store: sql_store.SqlStore) -> dict[str, int | None]:
    async with store.db.read() as conn:
        rows = await conn.execute(sa.text("SELECT key, run_id FROM locks"))
        return {row.key: row.run_id for row in rows}


async def test_a_start_takes_its_node_and_its_slot_in_one_statement(
    store: sql_store.SqlStore,
) -> None:
    nodes = ["gpu-node-01", "gpu-node-02", "gpu-node-03"]
    run_ids = await _pending(store, nodes)
    with Statements() as statements:
        assert await store.run("start", lambda tx: _start(tx, run_ids)) == [True] * 3
    assert len(statements.starting("INSERT INTO locks")) == 3  # was 6
    locks = await _locks(store)
    assert {key: locks[key] for key in locks if key.startswith("node:")} == {
        f"node:{node}": run_id for node, run_id in zip(nodes, run_ids, strict=True)
    }
    # each run's own slot: its id modulo the concurrency
    assert {key: locks[key] for key in locks if key.startswith("slot:")} == {
        f"slot:reboot:{run_id % 10}": run_id for run_id in run_ids
    }


async def test_a_start_on_a_node_someone_holds_takes_nothing(store: sql_store.SqlStore) -> None:
    holder, waiting = await _pending(store, ["gpu-node-01", "gpu-node-01"])
    assert await store.run("first", lambda tx: _start(tx, [holder])) == [True]
    assert await store.run("second", lambda tx: _start(tx, [waiting])) == [False]
    locks = await _locks(store)
    assert locks == {"node:gpu-node-01": holder, f"slot:reboot:{holder % 10}": holder}


async def test_a_start_whose_first_slot_was_taken_meanwhile_takes_the_next(
    store: sql_store.SqlStore,
) -> None:
    [run_id] = await _pending(store, ["gpu-node-01"])

    def start(tx: sql_store.SqlTx) -> list[bool]:
        tx.held_keys("slot:reboot:")  # read now: the run's own slot looks free
        tx.conn.conn.execute(  # another replica takes it
            sa.text("INSERT INTO locks (key, run_id, acquired_at) VALUES (:key, NULL, :at)"),
            {"key": f"slot:reboot:{run_id % 2}", "at": NOW},
        )
        return _start(tx, [run_id], concurrency=2)

    assert await store.run("start", start) == [True]
    locks = await _locks(store)
    assert locks[f"slot:reboot:{(run_id + 1) % 2}"] == run_id
    assert locks["node:gpu-node-01"] == run_id


async def test_the_runs_a_pass_ends_release_their_locks_in_one_statement(
    store: sql_store.SqlStore,
) -> None:
    run_ids = await _pending(store, ["gpu-node-01", "gpu-node-02", "gpu-node-03"])
    assert await store.run("start", lambda tx: _start(tx, run_ids)) == [True] * 3
    waiting = await _pending(store, ["gpu-node-01"])

    def end_and_start(tx: sql_store.SqlTx) -> list[bool]:
        tx.read_runs(run_ids)
        for run_id in run_ids:
            run = tx.get_run(run_id)
            assert run is not None
            lifecycle.finish_run(tx, run, runs.RunStatus.SUCCEEDED, reason="done")
        # the same pass starts a run on a node and in a slot just given up
        return _start(tx, waiting, concurrency=3)

    with Statements() as statements:
        assert await store.run("end", end_and_start) == [True]
    assert len(statements.starting("DELETE FROM locks")) == 1  # was 3
    assert await _locks(store) == {
        "node:gpu-node-01": waiting[0],
        f"slot:reboot:{waiting[0] % 3}": waiting[0],
    }
    assert (await audit.AuditQueries(store.db).verify()).ok


async def test_held_releases_go_with_a_rolled_back_savepoint(store: sql_store.SqlStore) -> None:
    [run_id] = await _pending(store, ["gpu-node-01"])
    assert await store.run("start", lambda tx: _start(tx, [run_id])) == [True]

    def end_in_failed_unit(tx: sql_store.SqlTx) -> None:
        def unit() -> None:
            with tx.savepoint():
                tx.release_run_locks(run_id)
                raise RuntimeError("the unit fails")

        with pytest.raises(RuntimeError):
            unit()

    await store.run("end", end_in_failed_unit)
    assert await _locks(store) == {
        "node:gpu-node-01": run_id,
        f"slot:reboot:{run_id % 10}": run_id,
    }


async def test_the_guard_decisions_of_a_claim_batch_read_their_nodes_disruptions_once(
    store: sql_store.SqlStore,
) -> None:
    """The nodes of a batch of claims are noted; the first decision reads the disruptions
    of all of them, after the guards' lock, and every decision answers as a read of its own
    node would (when last disrupted, whether active, in all pools and in the decision's)."""
    [run_id] = await _pending(store, ["gpu-node-09"])
    earlier = NOW - dt.timedelta(minutes=30)

    def disrupt(tx: sql_store.SqlTx) -> None:
        tx.record_disruption(run_id=run_id, node="gpu-node-01", pool="a")
        tx.record_disruption(run_id=run_id, node="gpu-node-02", pool="b")

    await sql_store.SqlStore(store.db, clock=lambda: earlier).run("earlier", disrupt)

    def released(tx: sql_store.SqlTx) -> None:
        tx.record_disruption(run_id=run_id, node="gpu-node-03", pool="a")
        tx.release_disruptions(node="gpu-node-03")

    await store.run("released", released)
    nodes = ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]

    def decide(tx: sql_store.SqlTx, note: bool) -> list[Any]:  # (noted: then one disrupted)
        if note:
            tx.note_guard_nodes(nodes)
        tx.lock_guards()
        found = []
        for node in nodes:
            for pool in (None, "a"):
                snapshot = tx.guard_snapshot(
                    node=node, since=NOW, disruptive_playbooks=(), gpu_nodes=10, pool=pool
                )
                found.append(
                    (node, pool, snapshot.node_last_disrupted, node in snapshot.disrupted_nodes)
                )
        if not note:
            return found
        tx.record_disruption(run_id=run_id, node="gpu-node-04", pool="a")
        snapshot = tx.guard_snapshot(
            node="gpu-node-04", since=NOW, disruptive_playbooks=(), gpu_nodes=10, pool="a"
        )
        found.append(("gpu-node-04", "a", snapshot.node_last_disrupted, True))
        return found

    alone = await store.run("alone", lambda tx: decide(tx, note=False))
    with Statements() as statements:
        noted = await store.run("noted", lambda tx: decide(tx, note=True))
    assert noted[:-1] == alone
    assert noted == [
        ("gpu-node-01", None, earlier, True),
        ("gpu-node-01", "a", earlier, True),
        ("gpu-node-02", None, earlier, True),
        ("gpu-node-02", "a", earlier, False),
        ("gpu-node-03", None, NOW, False),
        ("gpu-node-03", "a", NOW, False),
        ("gpu-node-04", None, None, False),
        ("gpu-node-04", "a", None, False),
        ("gpu-node-04", "a", NOW, True),
    ]
    per_node = [s for s in statements.seen if "FROM disruptions WHERE disruptions.node" in s]
    assert len(per_node) == 2  # the noted nodes at once, then gpu-node-04 after its disruption
    assert "IN" in per_node[0]


async def test_the_disruptions_a_claim_batch_records_are_one_statement(
    store: sql_store.SqlStore,
) -> None:
    [run_id] = await _pending(store, ["gpu-node-09"])

    def claim(tx: sql_store.SqlTx) -> list[Any]:
        tx.lock_guards()
        before = tx.guard_snapshot(
            node=None, since=NOW, disruptive_playbooks=(), gpu_nodes=10
        ).disrupted_nodes
        counted = [len(before)]
        for n in range(1, 4):
            tx.record_disruption(run_id=run_id, node=f"gpu-node-0{n}", pool="a")
            counted.append(len(before))  # kept current, no read

        def dropped() -> None:
            with tx.savepoint():
                tx.record_disruption(run_id=run_id, node="gpu-node-04", pool="a")
                raise RuntimeError("the unit fails")

        with pytest.raises(RuntimeError):
            dropped()
        after = tx.guard_snapshot(
            node=None, since=NOW, disruptive_playbooks=(), gpu_nodes=10
        ).disrupted_nodes  # read again (the savepoint dropped what it knew): sees them
        return [*counted, len(after), sorted(after)]

    with Statements() as statements:
        found = await store.run("claim", claim)
    assert found == [0, 1, 2, 3, 3, ["gpu-node-01", "gpu-node-02", "gpu-node-03"]]
    assert len(statements.starting("INSERT INTO disruptions")) == 1  # was 4


RECORD = """
name: record
match: {alertname: GPUXidError79}
steps:
  - {id: first, action: test.record, params: {label: one}}
"""


async def _planned(h: Any, nodes: list[str]) -> None:
    for n, node in enumerate(nodes):
        await h.post(alert_body(node=node, fingerprint=f"{n:016x}"))
    assert await h.engine.handle_episodes()


async def test_the_runs_a_pass_starts_take_their_locks_in_one_statement(make_harness: Any) -> None:
    """On Postgres a start's statement was a round trip a run: the largest part of a pass over
    new alerts. The pass's starts take every node and slot in one statement."""
    h = await make_harness(RECORD)
    nodes = ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
    await _planned(h, nodes)
    with Statements() as statements:
        assert await h.engine.start_runs()
    assert len(statements.starting("INSERT INTO locks")) == 1  # was 4
    found = await h.runs()
    assert {run["status"] for run in found} == {"running"}
    locks = await _locks(h.store)
    assert {key: locks[key] for key in locks if key.startswith("node:")} == {
        f"node:{run['node']}": run["id"] for run in found
    }
    slots = {key: run_id for key, run_id in locks.items() if key.startswith("slot:record:")}
    assert sorted(slots.values()) == sorted(run["id"] for run in found)  # a slot each
    assert (await audit.AuditQueries(h.store.db).verify()).ok


async def test_two_runs_of_one_pass_on_one_node_start_one_after_the_other(
    make_harness: Any,
) -> None:
    h = await make_harness(RECORD + "concurrency: 10\n")
    await h.post(alert_body(node="gpu-node-01", fingerprint="00000000000000a1"))
    await h.post(alert_body(node="gpu-node-01", fingerprint="00000000000000a2"))
    assert await h.engine.handle_episodes()
    assert await h.engine.start_runs()
    first, second = sorted(await h.runs(), key=lambda run: run["id"])
    assert (first["status"], second["status"]) == ("running", "pending")
    locks = await _locks(h.store)
    assert locks["node:gpu-node-01"] == first["id"]
    assert second["id"] not in locks.values()  # nothing held for the run that waits


async def test_a_start_that_fails_gives_up_the_locks_taken_for_it(
    make_harness: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The locks are taken before each start's own unit: a start whose unit fails (undone in
    its savepoint) gives them up, so its node is not held by a run that did not start."""
    h = await make_harness(RECORD)
    await _planned(h, ["gpu-node-01", "gpu-node-02"])
    runs_by_node = {run["node"]: run["id"] for run in await h.runs()}
    broken = runs_by_node["gpu-node-02"]
    move_run = lifecycle.transitions.move_run

    def failing(run: Any, to: Any, **kwargs: Any) -> Any:
        if run.id == broken and to is runs.RunStatus.RUNNING:
            raise RuntimeError("a bug in the start of one run")
        return move_run(run, to, **kwargs)

    monkeypatch.setattr(lifecycle.transitions, "move_run", failing)
    assert await h.engine.start_runs()
    statuses = {run["node"]: run["status"] for run in await h.runs()}
    assert statuses == {"gpu-node-01": "running", "gpu-node-02": "pending"}
    locks = await _locks(h.store)
    assert broken not in locks.values()
    assert locks["node:gpu-node-01"] == runs_by_node["gpu-node-01"]
    monkeypatch.setattr(lifecycle.transitions, "move_run", move_run)
    assert await h.engine.start_runs()  # the next pass starts it
    assert {run["status"] for run in await h.runs()} == {"running"}


async def test_a_pass_that_gives_way_keeps_no_locks_for_the_starts_it_left(
    make_harness: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that gives way to the webhook after its first start leaves the others pending
    for the next pass, holding nothing (their locks were taken with the first's), given up in
    one statement: in a burst on SQLite a pass gave way every few starts, and giving up each
    run's locks alone was a statement an alert."""
    h = await make_harness(RECORD)
    await _planned(h, ["gpu-node-01", "gpu-node-02", "gpu-node-03"])
    monkeypatch.setattr(sql_store.SqlTx, "should_yield", lambda self: True)
    with Statements() as statements:
        assert await h.engine.start_runs()
    assert len(statements.starting("DELETE FROM locks")) == 1  # was 2: one a run left
    found = sorted(await h.runs(), key=lambda run: run["id"])
    assert [run["status"] for run in found] == ["running", "pending", "pending"]
    locks = await _locks(h.store)
    assert set(locks.values()) == {found[0]["id"]}
    monkeypatch.undo()
    assert await h.engine.start_runs()
    assert {run["status"] for run in await h.runs()} == {"running"}


async def test_starts_whose_locks_cannot_be_taken_together_take_them_one_by_one(
    make_harness: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taking the pass's locks together runs outside each start's unit: should it fail, each
    start takes its own in its unit, as before, and no pass is lost to it."""
    h = await make_harness(RECORD)
    await _planned(h, ["gpu-node-01", "gpu-node-02"])

    def broken(self: Any, wanted: Any) -> set[str]:
        raise RuntimeError("a bug in taking locks together")

    monkeypatch.setattr(sql_store.SqlTx, "take_locks", broken)
    with Statements() as statements:
        assert await h.engine.start_runs()
    assert {run["status"] for run in await h.runs()} == {"running"}
    assert len(statements.starting("INSERT INTO locks")) == 2  # one a run


async def test_a_start_that_got_part_of_its_locks_gives_them_up_and_waits(
    make_harness: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another replica takes a node between the pass's read of the pending runs and its
    locks: that run got its slot only, gives it up, and stays pending holding nothing."""
    h = await make_harness(RECORD)
    await _planned(h, ["gpu-node-01", "gpu-node-02"])
    reserve = lifecycle.reserve_starts

    def raced(tx: Any, pending: Any, concurrency: Any) -> Any:
        tx.conn.conn.execute(  # another replica's lock, with no run of ours
            sa.text("INSERT INTO locks (key, run_id, acquired_at) VALUES (:key, NULL, :at)"),
            {"key": "node:gpu-node-02", "at": NOW},
        )
        return reserve(tx, pending, concurrency)

    monkeypatch.setattr(lifecycle, "reserve_starts", raced)
    assert await h.engine.start_runs()
    found = {run["node"]: run for run in await h.runs()}
    assert found["gpu-node-01"]["status"] == "running"
    assert found["gpu-node-02"]["status"] == "pending"
    locks = await _locks(h.store)
    assert locks["node:gpu-node-02"] is None  # still the other replica's
    assert found["gpu-node-02"]["id"] not in locks.values()  # its slot given up
