"""Two replicas on one Postgres, each with its own thread, event loop and connection pool, keep
the engine's lock design honest: their ordinary engine transactions (claims, transitions,
audit events) hold their locks side by side and meet only to link their events into the
chain, while their fleet guard decisions happen one after the other, so the disruption
budget admits exactly as many nodes as it allows.

Only Postgres locks rows (SQLite has one writer at a time), so these run on Postgres only.
A replica's transaction is synchronous code run on its own event loop's thread: blocking
inside it (to hold the transaction open) stalls that replica alone, never the other one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from remediator.adapters.db import audit as db_audit
from remediator.adapters.db import database, migrate, tables
from remediator.adapters.db import store as sql_store
from remediator.domain import guards, playbooks, records, runs, transitions
from remediator.engine import guarding, lifecycle
from tests.conftest import FakeClock

pytestmark = pytest.mark.postgres

WAIT = 5.0  # the longest any replica waits for another: a wrong design fails, never hangs
HOLD = 0.7  # how long replica A keeps its decided transaction open before committing
LEASE_SECONDS = 30.0
DISRUPTIVE = frozenset({"cordon"})


class Replica(threading.Thread):
    """One engine replica running one write transaction of ``work`` on the shared database,
    after ``start_after`` (if given) is set."""

    def __init__(
        self,
        name: str,
        url: str,
        clock: FakeClock,
        work: Callable[[sql_store.SqlTx], Any],
        *,
        start_after: threading.Event | None = None,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.url = url
        self.clock = clock
        self.work = work
        self.start_after = start_after
        self.result: Any = None
        self.error: BaseException | None = None
        self.committed = threading.Event()

    def run(self) -> None:
        try:
            if self.start_after is not None and not self.start_after.wait(WAIT):
                raise TimeoutError(f"{self.name} was never told to start")
            self.result = asyncio.run(self._transaction())
        except BaseException as error:  # reported by finish() in the test's thread
            self.error = error

    async def _transaction(self) -> Any:
        db = database.Database(self.url)
        try:
            result = await sql_store.SqlStore(db, clock=self.clock).run(self.name, self.work)
            self.committed.set()
            return result
        finally:
            await db.dispose()

    def finish(self) -> Any:
        self.join(WAIT * 2)
        assert not self.is_alive(), f"{self.name} never finished its transaction"
        if self.error is not None:
            raise self.error
        return self.result


def new_run(node: str, action: str) -> records.NewRun:
    return records.NewRun(
        playbook="replica-test",
        kind=runs.RunKind.MANUAL,
        episode_id=None,
        node=node,
        gpu=None,
        principal="oncall",
        reason="test",
        steps=(
            records.NewStep(seq=0, key=action, phase=runs.StepPhase.DO, action=action, params={}),
        ),
    )


async def prepare(
    url: str, clock: FakeClock, *, due: list[str], pending: list[str], action: str
) -> None:
    """Migrate the database; create a running run with a due step on each ``due`` node and a
    pending run on each ``pending`` node."""
    db = database.Database(url)
    try:
        await migrate.upgrade(db)

        def work(tx: sql_store.SqlTx) -> None:
            for node in due:
                run_id = tx.insert_run(new_run(node, action), actor="oncall")
                assert run_id is not None
                run = tx.get_run(run_id)
                assert run is not None
                tx.apply(transitions.move_run(run, runs.RunStatus.RUNNING, reason="started"))
                tx.apply(transitions.make_due(tx.steps_of_run(run_id)[0], now=tx.now))
            for node in pending:
                tx.insert_run(new_run(node, action), actor="oncall")

        await sql_store.SqlStore(db, clock=clock).run("prepare", work)
    finally:
        await db.dispose()


@dataclasses.dataclass
class Stored:
    runs: dict[int, records.Run]
    steps: dict[int, records.Step]
    event_ids: list[int]
    events: list[dict[str, Any]]
    disruptions: list[dict[str, Any]]
    chain: db_audit.ChainReport


async def stored(url: str) -> Stored:
    db = database.Database(url)
    try:
        async with db.read() as conn:

            async def rows(table: sa.Table) -> list[Any]:
                return list(await conn.execute(sa.select(table).order_by(table.c.id)))

            all_runs = [sql_store.run_from_row(row) for row in await rows(tables.runs)]
            all_steps = [sql_store.step_from_row(row) for row in await rows(tables.steps)]
            events = [dict(row._mapping) for row in await rows(tables.audit_events)]
            disruptions = [dict(row._mapping) for row in await rows(tables.disruptions)]
        chain = await db_audit.AuditQueries(db).verify()
        return Stored(
            runs={run.id: run for run in all_runs},
            steps={step.id: step for step in all_steps},
            event_ids=[event["id"] for event in events],
            events=events,
            disruptions=disruptions,
            chain=chain,
        )
    finally:
        await db.dispose()


def claim_event_ids(state: Stored, step_id: int) -> list[int]:
    return [
        event["id"]
        for event in state.events
        if event["step_id"] == step_id and event["to_status"] == runs.StepStatus.RUNNING.value
    ]


def gate(config: guards.GuardConfig) -> guarding.Gate:
    return guarding.Gate(
        base=config, index=playbooks.PlaybookIndex([]), disruptive_actions=DISRUPTIVE, fleet=None
    )


def claim_and_start(tx: sql_store.SqlTx, owner: str) -> tuple[records.Step, records.Run]:
    """A replica's engine pass, in miniature: claim a due step (past the gate) and start a
    pending run; each appends its audit event."""
    (step,) = tx.lock_due_steps(1)
    assert gate(guards.GuardConfig()).admit(tx, step)
    until = lifecycle.lease_until(tx.now, LEASE_SECONDS)
    claimed = lifecycle.claim_step(tx, step, owner=owner, lease_until=until)
    (pending,) = tx.lock_pending_runs(1)
    started = tx.apply(transitions.move_run(pending, runs.RunStatus.RUNNING, reason="started"))
    return claimed, started


def while_a_is_open(
    url: str,
    clock: FakeClock,
    a_work: Callable[[sql_store.SqlTx], Any],
    b_work: Callable[[sql_store.SqlTx], Any],
) -> tuple[Any, Any, bool]:
    """Replica A does ``a_work`` and keeps its transaction open (its rows locked, its events
    pending); replica B then does ``b_work``. Both results, and whether B committed while A
    was still open."""
    a_open, release = threading.Event(), threading.Event()

    def a_then_hold(tx: sql_store.SqlTx) -> Any:
        done = a_work(tx)
        a_open.set()
        release.wait(WAIT)
        return done

    a = Replica("replica-a", url, clock, a_then_hold)
    b = Replica("replica-b", url, clock, b_work, start_after=a_open)
    a.start()
    b.start()
    try:
        assert a_open.wait(WAIT), "replica A never did its work"
        side_by_side = b.committed.wait(WAIT) and not a.committed.is_set()
    finally:
        release.set()
        a_done, b_done = a.finish(), b.finish()
    return a_done, b_done, side_by_side


def test_two_replicas_engine_transactions_hold_their_locks_concurrently(pg_url, clock):
    """Replica A claims a step and starts a run, then keeps its transaction open; replica B
    does the same on other rows and commits meanwhile. Locking the chain head (or any row
    both share) before the end of a transaction would make B wait for A."""
    asyncio.run(
        prepare(pg_url, clock, due=["gpu-a1", "gpu-b1"], pending=["gpu-a2", "gpu-b2"], action="log")
    )
    (a_claimed, a_started), (b_claimed, b_started), side_by_side = while_a_is_open(
        pg_url,
        clock,
        lambda tx: claim_and_start(tx, "replica-a"),
        lambda tx: claim_and_start(tx, "replica-b"),
    )
    assert side_by_side, "replica B's transaction waited for replica A's to end"

    state = asyncio.run(stored(pg_url))
    assert {a_claimed.id, b_claimed.id} == {
        step.id for step in state.steps.values() if step.status is runs.StepStatus.RUNNING
    }
    assert state.steps[a_claimed.id].lease_owner == "replica-a"
    assert state.steps[b_claimed.id].lease_owner == "replica-b"
    assert a_started.id != b_started.id
    assert all(run.status is runs.RunStatus.RUNNING for run in state.runs.values())
    # B linked its events while A was open; A's followed, continuing the chain B left.
    (b_event,), (a_event,) = (
        claim_event_ids(state, b_claimed.id),
        claim_event_ids(state, a_claimed.id),
    )
    assert b_event < a_event
    assert state.chain.ok, state.chain.reason
    assert state.chain.checked == len(state.event_ids)
    assert state.event_ids == list(range(1, len(state.event_ids) + 1))


def test_the_budget_guard_admits_exactly_its_budget_under_concurrent_replicas(pg_url, clock):
    """Replica A admits as many disruptive steps as the budget allows and stays open a moment;
    replica B decides on the others meanwhile. The guards lock, held until A commits, makes B
    count A's disruptions and hold its steps; without it B counts none and admits them too."""
    budget = 2
    nodes = [f"gpu-{n}" for n in range(2 * budget)]
    asyncio.run(prepare(pg_url, clock, due=nodes, pending=[], action="cordon"))
    config = guards.GuardConfig(max_nodes=budget, max_percent=100)
    a_decided = threading.Event()

    def a_work(tx: sql_store.SqlTx) -> list[records.Step]:
        admitted = admit_and_claim(tx, "replica-a", budget)
        a_decided.set()
        time.sleep(HOLD)  # decided, disruptions recorded, not yet committed
        return admitted

    def admit_and_claim(tx: sql_store.SqlTx, owner: str, room: int) -> list[records.Step]:
        decider = gate(config)
        until = lifecycle.lease_until(tx.now, LEASE_SECONDS)
        return [
            lifecycle.claim_step(tx, step, owner=owner, lease_until=until)
            for step in tx.lock_due_steps(room)
            if decider.admit(tx, step, report=lifecycle.Report())
        ]

    a = Replica("replica-a", pg_url, clock, a_work)
    b = Replica(
        "replica-b",
        pg_url,
        clock,
        lambda tx: admit_and_claim(tx, "replica-b", len(nodes)),
        start_after=a_decided,
    )
    a.start()
    b.start()
    a_admitted, b_admitted = a.finish(), b.finish()

    state = asyncio.run(stored(pg_url))
    disrupted = sorted(row["node"] for row in state.disruptions if row["released_at"] is None)
    assert len(disrupted) == budget, f"disrupted {disrupted} with a budget of {budget}"
    claimed = [step for step in state.steps.values() if step.status is runs.StepStatus.RUNNING]
    assert {step.id for step in claimed} == {step.id for step in a_admitted + b_admitted}
    assert sorted(state.runs[step.run_id].node for step in claimed) == disrupted
    held = [step for step in state.steps.values() if step.status is runs.StepStatus.PENDING]
    assert len(held) == len(nodes) - budget
    for step in held:
        assert step.output["held_kind"] == "budget"
        assert "budget" in step.output["held"]
    assert state.chain.ok, state.chain.reason
    assert state.event_ids == list(range(1, len(state.event_ids) + 1))


def test_two_replicas_start_runs_of_one_playbook_side_by_side(pg_url, clock):
    """Replica A starts a pending run (its node and a concurrency slot of the playbook), then
    keeps its transaction open; replica B starts another run of the same playbook meanwhile.
    Both read the same free slots; had they picked the same one, B's insert of that key would
    wait for A's transaction to end (Postgres waits on a uniqueness conflict with an
    uncommitted row), so every start of a storm on one replica would queue behind the
    other's."""
    asyncio.run(prepare(pg_url, clock, due=[], pending=["gpu-a", "gpu-b"], action="log"))

    def start(tx: sql_store.SqlTx) -> records.Run:
        (pending,) = tx.lock_pending_runs(1)
        assert lifecycle.start_run(tx, pending, concurrency=10)
        started = tx.get_run(pending.id)
        assert started is not None
        return started

    a_started, b_started, side_by_side = while_a_is_open(pg_url, clock, start, start)
    assert side_by_side, "replica B's start waited for replica A's to end"

    assert {a_started.node, b_started.node} == {"gpu-a", "gpu-b"}
    state = asyncio.run(stored(pg_url))
    assert all(run.status is runs.RunStatus.RUNNING for run in state.runs.values())
    locks = asyncio.run(held_locks(pg_url))
    slots = {key: holder for key, holder in locks.items() if key.startswith("slot:")}
    assert sorted(slots.values()) == sorted([a_started.id, b_started.id])
    assert all(key.startswith("slot:replica-test:") for key in slots)
    assert locks["node:gpu-a"] != locks["node:gpu-b"]


async def held_locks(url: str) -> dict[str, int | None]:
    db = database.Database(url)
    try:
        async with db.read() as conn:
            rows = await conn.execute(sa.select(tables.locks.c.key, tables.locks.c.run_id))
            return {row.key: row.run_id for row in rows}
    finally:
        await db.dispose()


def test_replicas_advance_hinted_runs_side_by_side_and_a_run_held_elsewhere_keeps_its_hint(
    pg_url, clock
):
    """Three started runs, each hinted (``advance_hints``). Replica A takes the first to
    advance and, as an operator's action would, locks the second's row, then stays open;
    replica B's advance stage meanwhile skips A's hint and A's run, takes the third and
    commits without waiting. The second run's hint stays for a later pass: B deleted only
    what it took."""
    asyncio.run(
        prepare(pg_url, clock, due=[], pending=["gpu-h1", "gpu-h2", "gpu-h3"], action="log")
    )

    def start_all(tx: sql_store.SqlTx) -> list[int]:
        return [
            tx.apply(transitions.move_run(run, runs.RunStatus.RUNNING, reason="started")).id
            for run in tx.lock_pending_runs(10)
        ]

    first, second, third = asyncio.run(_in_one_transaction(pg_url, clock, start_all))

    def advance(tx: sql_store.SqlTx, limit: int) -> list[int]:
        taken = tx.active_runs_with_no_active_step(limit)
        for run in taken:
            tx.apply(transitions.make_due(tx.steps_of_run(run.id)[0], now=tx.now))
        return [run.id for run in taken]

    def a_work(tx: sql_store.SqlTx) -> list[int]:
        taken = advance(tx, 1)
        tx.conn.execute(
            sa.select(tables.runs.c.id).where(tables.runs.c.id == second).with_for_update()
        )
        return taken

    a_taken, b_taken, side_by_side = while_a_is_open(
        pg_url, clock, a_work, lambda tx: advance(tx, 10)
    )
    assert side_by_side, "replica B's advance stage waited for replica A's transaction"
    assert (a_taken, b_taken) == ([first], [third])
    assert asyncio.run(_hinted_runs(pg_url)) == [second]


async def _in_one_transaction(
    url: str, clock: FakeClock, work: Callable[[sql_store.SqlTx], Any]
) -> Any:
    db = database.Database(url)
    try:
        return await sql_store.SqlStore(db, clock=clock).run("test", work)
    finally:
        await db.dispose()


async def _hinted_runs(url: str) -> list[int]:
    db = database.Database(url)
    try:
        async with db.read() as conn:
            hints = tables.advance_hints
            found = await conn.execute(sa.select(hints.c.run_id).order_by(hints.c.id))
            return list(found.scalars())
    finally:
        await db.dispose()


def _holder_and_one_behind(url: str, clock: FakeClock) -> tuple[int, int]:
    """A started run holding node gpu-p1, and a pending run on the same node (not yet tried)."""
    asyncio.run(prepare(url, clock, due=[], pending=["gpu-p1"], action="log"))

    def start(tx: sql_store.SqlTx) -> int:
        (holder,) = tx.lock_pending_runs(10)
        assert lifecycle.start_run(tx, holder, concurrency=10)
        behind = tx.insert_run(new_run("gpu-p1", "log"), actor="oncall")
        assert behind is not None
        return holder.id

    holder = asyncio.run(_in_one_transaction(url, clock, start))
    return holder, holder + 1


def _finish(tx: sql_store.SqlTx, run_id: int) -> None:
    run = tx.get_run(run_id)
    assert run is not None
    lifecycle.finish_run(tx, run, runs.RunStatus.SUCCEEDED, reason="done")


async def _waiting_for(url: str, run_id: int) -> str | None:
    db = database.Database(url)
    try:
        async with db.read() as conn:
            R = tables.runs
            found = await conn.execute(sa.select(R.c.waiting_for).where(R.c.id == run_id))
            waiting: str | None = found.scalar_one()
            return waiting
    finally:
        await db.dispose()


def test_a_release_in_another_replica_waits_for_a_park_behind_its_key_then_wakes_the_run(
    pg_url, clock
):
    """Replica A parks a run behind a held node and stays open; replica B meanwhile ends the
    node's holder. B's release of the lock waits for A's commit (A read the lock row ``FOR
    SHARE``) and then wakes the run A parked. Had B committed first, its wake would have missed
    a park not yet committed, and the run would wait for a lock no one holds."""
    holder, behind = _holder_and_one_behind(pg_url, clock)

    def park(tx: sql_store.SqlTx) -> list[records.Run]:
        offered = tx.lock_pending_runs(10)
        tx._write_parks()  # (as its commit would, then held open)
        return offered

    offered, _, side_by_side = while_a_is_open(pg_url, clock, park, lambda tx: _finish(tx, holder))
    assert offered == []
    assert not side_by_side, (
        "replica B released the lock while A's park of a run behind it was open"
    )
    assert asyncio.run(_waiting_for(pg_url, behind)) is None


def test_a_run_is_not_parked_behind_a_lock_another_replica_is_releasing(pg_url, clock):
    """Replica A ends the node's holder, its lock's row deleted, and stays open; replica B
    meanwhile finds the run behind it (the lock still looks held) but does not park it: the
    row being deleted is skipped, and B commits without waiting. The run is tried again."""
    holder, behind = _holder_and_one_behind(pg_url, clock)

    def release(tx: sql_store.SqlTx) -> None:
        _finish(tx, holder)
        tx.write_pending()  # the lock's row deleted now (then held open)

    _, offered, side_by_side = while_a_is_open(
        pg_url, clock, release, lambda tx: tx.lock_pending_runs(10)
    )
    assert offered == []  # (its node looked held)
    assert side_by_side, "replica B's park waited for replica A's release"
    assert asyncio.run(_waiting_for(pg_url, behind)) is None


def _held_behind_two_disruptions(url: str, clock: FakeClock) -> list[int]:
    """Runs on gpu-d1 and gpu-d2 that disrupted their nodes, and two steps (on gpu-w1 and
    gpu-w2) the budget holds, waiting in line for it: their ids."""
    asyncio.run(prepare(url, clock, due=["gpu-w1", "gpu-w2"], pending=[], action="cordon"))

    def disrupt_and_hold(tx: sql_store.SqlTx) -> list[int]:
        for node in ("gpu-d1", "gpu-d2"):
            run_id = tx.insert_run(new_run(node, "cordon"), actor="oncall")
            assert run_id is not None
            tx.record_disruption(run_id=run_id, node=node)
        held = list(tx.lock_due_steps(10))
        for step in held:
            until = tx.now + guards.GuardConfig().budget_recheck
            change = transitions.hold(
                step, until=until, reason="budget in use", kind="budget", waiting_for="budget:"
            )
            tx.apply(change)
        return [step.id for step in held]

    return list(asyncio.run(_in_one_transaction(url, clock, disrupt_and_hold)))


async def _steps_waiting(url: str) -> dict[int, str | None]:
    db = database.Database(url)
    try:
        async with db.read() as conn:
            S = tables.steps
            found = await conn.execute(sa.select(S.c.id, S.c.waiting_for).order_by(S.c.id))
            return {row.id: row.waiting_for for row in found}
    finally:
        await db.dispose()


def test_two_replicas_freeing_the_budget_at_once_wake_two_held_steps(pg_url, clock):
    """Replica A ends one node's disruption and stays open, the oldest held step woken; replica
    B meanwhile ends the other's. B wakes the next in line, without waiting for A: the oldest
    is locked by A, and skipped. (Waiting, B would find the oldest already woken when A
    commits, and wake none: a place free and a step left waiting for it.)"""
    held = _held_behind_two_disruptions(pg_url, clock)

    def release(node: str) -> Callable[[sql_store.SqlTx], None]:
        def work(tx: sql_store.SqlTx) -> None:
            assert tx.release_disruptions(node=node) == 1
            tx.write_pending()  # (as its commit would)

        return work

    _, _, side_by_side = while_a_is_open(pg_url, clock, release("gpu-d1"), release("gpu-d2"))
    assert side_by_side, "replica B's wake waited for replica A's"
    waiting = asyncio.run(_steps_waiting(pg_url))
    assert [waiting[step_id] for step_id in held] == [None, None]


def test_two_replicas_releasing_slots_at_once_wake_two_waiting_runs(pg_url, clock):
    """The same for a playbook's slots: two runs of concurrency 2 end in two replicas at once,
    each waking one of the two runs waiting for a slot (the oldest, then the next)."""
    asyncio.run(
        prepare(pg_url, clock, due=[], pending=[f"gpu-s{i}" for i in range(4)], action="log")
    )

    def start(tx: sql_store.SqlTx) -> list[int]:
        offered = tx.lock_pending_runs(10)
        return [run.id for run in offered if lifecycle.start_run(tx, run, concurrency=2)]

    running = asyncio.run(_in_one_transaction(pg_url, clock, start))
    assert len(running) == 2
    waiting = [running[-1] + 1, running[-1] + 2]
    assert [asyncio.run(_waiting_for(pg_url, r)) for r in waiting] == ["slot:replica-test:"] * 2

    def end(run_id: int) -> Callable[[sql_store.SqlTx], None]:
        def work(tx: sql_store.SqlTx) -> None:
            _finish(tx, run_id)
            tx.write_pending()

        return work

    _, _, side_by_side = while_a_is_open(pg_url, clock, end(running[0]), end(running[1]))
    assert side_by_side, "replica B's wake waited for replica A's"
    assert [asyncio.run(_waiting_for(pg_url, r)) for r in waiting] == [None, None]
