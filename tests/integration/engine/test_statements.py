"""The statements an engine pass runs are built once, not per call (building a query and its
cache key cost more CPU than running it, and a pass ran two dozen of them), compiled once, and
run one after the other without waiting for the event loop in between."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any

import pytest
import sqlalchemy as sa

from remediator.adapters.db import database, migrate, tables
from remediator.adapters.db import store as sql_store
from remediator.domain import transitions
from tests.contract.plans import new_run

NOW = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)


async def test_the_reads_and_writes_of_a_pass_build_no_statement(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = database.Database(database_url)
    await migrate.upgrade(db)
    store = sql_store.SqlStore(db, clock=lambda: NOW)
    try:
        run_id = await store.run("prepare", lambda tx: tx.insert_run(new_run(), actor="test"))
        built: list[str] = []
        for name in ("select", "update", "insert", "delete", "exists"):
            made = getattr(sa, name)

            def counting(*args: Any, _made: Any = made, _name: str = name, **kw: Any) -> Any:
                built.append(_name)
                return _made(*args, **kw)

            monkeypatch.setattr(sa, name, counting)

        def one_pass(tx: sql_store.SqlTx) -> None:
            tx.lock_unhandled_episodes(64)
            tx.lock_pending_runs(64)
            tx.active_runs_with_no_active_step(64)
            tx.lock_due_steps(64)
            for pool in (None, "pool-a"):
                tx.guard_snapshot(
                    node="gpu-node-03",
                    since=NOW - dt.timedelta(hours=1),
                    disruptive_playbooks=["reboot"],
                    gpu_nodes=8,
                    pool=pool,
                )
            tx.held_keys("slot:reboot:")
            tx.record_disruption(run_id=run_id, node="gpu-node-03")
            tx.get_guard_state("breaker")

        await store.run("pass", one_pass)
        await store.probe()
        assert built == []
    finally:
        await db.dispose()


async def test_a_guard_decision_counts_the_disrupted_nodes_without_reading_them(
    database_url: str,
) -> None:
    """A storm leaves thousands of nodes cordoned: every pass read each of their rows to
    count them. A decision asks how many, and about its own node, and keeps both current."""
    db = database.Database(database_url)
    await migrate.upgrade(db)
    store = sql_store.SqlStore(db, clock=lambda: NOW)
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    try:
        run_id = await store.run("prepare", lambda tx: tx.insert_run(new_run(), actor="test"))

        def disrupt(tx: sql_store.SqlTx) -> None:
            for n in range(50):
                tx.record_disruption(run_id=run_id, node=f"node-{n}", pool="a" if n % 2 else "b")

        await store.run("prepare", disrupt)

        def decide(tx: sql_store.SqlTx) -> list[Any]:
            def snapshot(pool: str | None) -> Any:
                return tx.guard_snapshot(
                    node="gpu-node-03",
                    since=NOW - dt.timedelta(hours=1),
                    disruptive_playbooks=["reboot"],
                    gpu_nodes=100,
                    pool=pool,
                ).disrupted_nodes

            found = []
            for pool in (None, "a"):
                nodes = snapshot(pool)
                found += [len(nodes), "node-7" in nodes, "node-8" in nodes, "gpu-node-03" in nodes]
            tx.record_disruption(run_id=run_id, node="gpu-node-03", pool="a")
            tx.record_disruption(run_id=run_id, node="node-8", pool="a")  # disrupted already
            for pool in (None, "a"):
                nodes = snapshot(pool)
                found += [len(nodes), "gpu-node-03" in nodes]
            return found

        sa.event.listen(sa.engine.Engine, "before_cursor_execute", seen)
        try:
            found = await store.run("decide", decide)
        finally:
            sa.event.remove(sa.engine.Engine, "before_cursor_execute", seen)
        assert found == [50, True, True, False, 25, True, False, False, 51, True, 27, True]
        assert not [s for s in statements if s.lstrip().startswith("SELECT DISTINCT")]
        # node-7 and node-8 asked about in each scope; the decision's own node was answered
        # by the read of its last disruption (the cooldown), not by a statement of its own
        asked = [s for s in statements if "EXISTS" in s and "disruptions" in s]
        assert len(asked) == 4
    finally:
        await db.dispose()


async def test_a_transactions_disruptions_are_written_by_one_statement(
    database_url: str,
) -> None:
    """A storm's pass records a disruption for each node it cordons. They are held and
    written together: one INSERT, never the driver's executemany (psycopg2's sends one
    statement, and waits one round trip, a row)."""
    db = database.Database(database_url)
    await migrate.upgrade(db)
    store = sql_store.SqlStore(db, clock=lambda: NOW)
    inserts: list[tuple[str, str]] = []

    def seen(conn: Any, cursor: Any, statement: str, params: Any, ctx: Any, many: bool) -> None:
        if statement.lstrip().startswith("INSERT INTO disruptions"):
            inserts.append((statement, ctx.execute_style.name))

    try:
        run_id = await store.run("prepare", lambda tx: tx.insert_run(new_run(), actor="test"))

        def disrupt(tx: sql_store.SqlTx) -> None:
            for n in range(40):
                tx.record_disruption(run_id=run_id, node=f"node-{n}", pool="a")
            tx.record_disruption(run_id=run_id, node="node-3", pool="a")  # recorded already

        sa.event.listen(sa.engine.Engine, "before_cursor_execute", seen)
        try:
            await store.run("storm", disrupt)
        finally:
            sa.event.remove(sa.engine.Engine, "before_cursor_execute", seen)
        if db.is_postgres:  # one statement of 41 rows, not psycopg2's executemany
            assert [style for _, style in inserts] == ["INSERTMANYVALUES"]
            assert inserts[0][0].count("), (") == 40
        else:
            assert len(inserts) == 1  # (SQLite's executemany is a loop in its own process)

        def read(tx: sql_store.SqlTx) -> int:
            snapshot = tx.guard_snapshot(
                node=None, since=NOW, disruptive_playbooks=[], gpu_nodes=None, pool="a"
            )
            return len(snapshot.disrupted_nodes)

        assert await store.run("read", read) == 40
    finally:
        await db.dispose()


async def test_held_step_changes_are_one_statement_of_the_same_text_for_any_number(
    database_url: str,
) -> None:
    """A pass's held step changes are written by one UPDATE. On Postgres its rows come as an
    array a column: the same statement, with a parameter a column, for 3 rows or 40 (it was
    a ``VALUES`` list of a cast placeholder a value, padded to the next of a few sizes: 40
    rows by 4 columns sent 256 values, every one parsed and planned by Postgres and put
    through SQLAlchemy's bind processing by the server)."""
    db = database.Database(database_url)
    await migrate.upgrade(db)
    store = sql_store.SqlStore(db, clock=lambda: NOW)
    updates: list[tuple[str, int]] = []

    def seen(conn: Any, cursor: Any, statement: str, params: Any, ctx: Any, many: bool) -> None:
        if statement.lstrip().startswith(("UPDATE steps", "WITH v")):
            updates.append((" ".join(statement.split()), len(params)))

    def prepare(tx: sql_store.SqlTx) -> list[int]:
        ids = [tx.insert_run(new_run(node=f"gpu-node-{n:02}"), actor="test") for n in range(43)]
        return [run_id for run_id in ids if run_id is not None]

    def hold(tx: sql_store.SqlTx, run_ids: list[int], due: dt.datetime) -> None:
        tx.read_runs(run_ids)
        for run_id in run_ids:
            step = tx.steps_of_run(run_id)[0]
            change = transitions.StepChange(
                step=step, to=step.status, values={"due_at": due}, reason="test", event=None
            )
            tx.apply(change)

    try:
        run_ids = await store.run("prepare", prepare)
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", seen)
        try:
            await store.run("three", lambda tx: hold(tx, run_ids[:3], NOW))
            await store.run("forty", lambda tx: hold(tx, run_ids[3:], NOW + dt.timedelta(1)))
        finally:
            sa.event.remove(sa.engine.Engine, "before_cursor_execute", seen)
        assert len(updates) == 2  # one statement a transaction
        if db.is_postgres:
            (three, three_params), (forty, forty_params) = updates
            assert three == forty
            assert three_params == forty_params == 4  # id, expected status, due_at, status

        def due_times(tx: sql_store.SqlTx) -> list[dt.datetime | None]:
            tx.read_runs(run_ids)
            return [tx.steps_of_run(run_id)[0].due_at for run_id in run_ids]

        due = await store.run("read", due_times)
        assert due == [NOW] * 3 + [NOW + dt.timedelta(1)] * 40
    finally:
        await db.dispose()


async def test_a_snapshots_disrupted_nodes_refuse_to_be_read_after_their_transaction(
    database_url: str,
) -> None:
    db = database.Database(database_url)
    await migrate.upgrade(db)
    store = sql_store.SqlStore(db, clock=lambda: NOW)
    try:
        nodes = await store.run(
            "decide",
            lambda tx: (
                tx.guard_snapshot(
                    node=None, since=NOW, disruptive_playbooks=[], gpu_nodes=None
                ).disrupted_nodes
            ),
        )
        with pytest.raises(RuntimeError, match="read in its transaction"):
            len(nodes)
    finally:
        await db.dispose()


async def test_runs_still_active_are_found_through_the_status_index_after_analyze(
    tmp_path: Any,
) -> None:
    """With a long history every run has finished, and after ``ANALYZE`` SQLite judged
    ``status = ?`` unselective: the probe and the start and advance stages scanned every run
    (80 ms each with 10⁶ runs). They read the runs by key, or on an index of the runs they
    want (the pending runs to try to start: ``ix_runs_startable``), whatever the statistics
    say."""
    import sqlite3
    import warnings

    from sqlalchemy.dialects import sqlite

    db = database.Database(f"sqlite+aiosqlite:///{tmp_path / 'r.db'}")
    await migrate.upgrade(db)
    await db.dispose()
    con = sqlite3.connect(tmp_path / "r.db")
    con.execute("ANALYZE")
    con.execute("DELETE FROM sqlite_stat1 WHERE tbl = 'runs'")
    con.executemany(  # a million runs, one status: what ANALYZE wrote for the seeded history
        "INSERT INTO sqlite_stat1 VALUES ('runs', ?, ?)",
        [("ix_runs_status", "1000000 1000000 1"), ("ix_runs_node", "1000000 1000 1")],
    )
    con.commit()
    con.execute("ANALYZE sqlite_master")  # load the statistics
    probe = {c.name: c for c in sql_store._PROBE.selected_columns}
    queries = {
        "probe startable": sa.select(probe["startable"]),
        "probe advance": sa.select(probe["advance"]),
        "start stage": sql_store._LOCK_STARTABLE[0],
        "advance stage": sql_store._LOCK_ADVANCEABLE[0],
        "advance stage's rest": sql_store._STILL_ADVANCEABLE,
    }
    plans = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # literal NULLs for the unbound parameters
        for name, query in queries.items():
            sql = str(
                query.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True})
            )
            rows = con.execute("EXPLAIN QUERY PLAN " + sql).fetchall()
            plans[name] = [row[3] for row in rows if "runs" in row[3] and "steps" not in row[3]]
    con.close()
    for name, plan in plans.items():
        if "start" in name:  # that index holds only the runs to try (none parked)
            assert plan == ["SCAN runs USING INDEX ix_runs_startable"], (name, plan)
        else:  # the hinted runs by id, those of resolutions not yet handled by episode
            assert all("PRIMARY KEY" in step or "(episode_id=?)" in step for step in plan), (
                name,
                plan,
            )


async def test_due_rows_become_steps_only_as_the_claim_loop_takes_them(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim loop that gives way to the webhook takes a few of the ``limit`` due rows it
    read: only those are made into step records (all 64 were, every pass)."""
    from remediator.domain import runs, transitions

    db = database.Database(database_url)
    await migrate.upgrade(db)
    store = sql_store.SqlStore(db, clock=lambda: NOW)
    try:

        def prepare(tx: sql_store.SqlTx) -> None:
            for node in ("gpu-node-01", "gpu-node-02", "gpu-node-03"):
                run_id = tx.insert_run(
                    new_run(node=node, status=runs.RunStatus.RUNNING), actor="test"
                )
                assert run_id is not None
                first = tx.steps_of_run(run_id)[0]
                tx.apply(transitions.make_due(first, now=NOW))

        await store.run("prepare", prepare)
        made: list[int] = []
        step_from_row = sql_store.step_from_row

        def counting(row: Any) -> Any:
            made.append(row.id)
            return step_from_row(row)

        monkeypatch.setattr(sql_store, "step_from_row", counting)

        def take_one(tx: sql_store.SqlTx) -> int:
            return next(iter(tx.lock_due_steps(64))).id

        taken = await store.run("claim", take_one)
        assert made == [taken]
    finally:
        await db.dispose()


async def test_the_statements_of_a_pass_are_compiled_once(database_url: str) -> None:
    """Every statement the probe and a pass run is found in SQLAlchemy's compiled cache the
    second time: one without a cache key (a custom construct that does not say what it holds)
    was compiled afresh on every execution, the probe before every pass included."""
    db = database.Database(database_url)
    await migrate.upgrade(db)
    store = sql_store.SqlStore(db, clock=lambda: NOW)
    misses: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        context = args[-2]
        if context is None or context.compiled is None:
            return  # written as SQL text (BEGIN IMMEDIATE): nothing to compile
        if context.cache_hit != context.cache_hit.CACHE_HIT:
            misses.append(f"{context.cache_hit.name}: {' '.join(statement.split())[:80]}")

    def one_pass(tx: sql_store.SqlTx) -> None:
        tx.lock_unhandled_episodes(64)
        tx.lock_pending_runs(64)
        tx.active_runs_with_no_active_step(64)
        list(tx.lock_due_steps(64))

    try:
        await store.run("prepare", lambda tx: tx.insert_run(new_run(), actor="test"))
        for _ in range(2):  # the first round fills the cache
            misses.clear()
            sa.event.listen(sa.Engine, "after_cursor_execute", seen)
            try:
                await store.probe()
                await store.run("pass", one_pass)
            finally:
                sa.event.remove(sa.Engine, "after_cursor_execute", seen)
        assert misses == []
    finally:
        await db.dispose()


async def test_a_transactions_statements_do_not_wait_for_the_event_loop(database_url: str) -> None:
    """An engine transaction runs its statements without a turn of the event loop between
    them: on a server busy with webhooks and Kubernetes calls, each statement that waited for
    a turn (asyncpg through SQLAlchemy's greenlet bridge) added that wait, 30 times an alert.
    A task hogging the loop in short slices counts the turns the transaction took."""
    db = database.Database(database_url)
    await migrate.upgrade(db)
    store = sql_store.SqlStore(db, clock=lambda: NOW)
    statements = 40
    turns = 0
    finished = False

    async def hog() -> None:
        nonlocal turns
        while not finished:
            time.sleep(0.002)  # a slice of CPU-bound work on the loop
            turns += 1
            await asyncio.sleep(0)

    def many(tx: sql_store.SqlTx) -> None:
        for _ in range(statements):
            tx.get_guard_state("breaker")
            tx.conn.execute(sa.text("SELECT 1"))

    try:
        await store.run("warm", many)  # connections opened, statements compiled
        hogging = asyncio.create_task(hog())
        await asyncio.sleep(0)
        before = turns
        await store.run("pass", many)
        taken = turns - before
        finished = True
        await hogging
        # Waiting for the loop, each of the 2 x 40 statements takes a turn at least (216
        # were counted); on a thread of its own the transaction takes a few, whatever it runs.
        assert taken < 2 * statements
    finally:
        await db.dispose()


async def test_what_a_transaction_wrote_or_read_in_a_batch_is_not_read_again(
    database_url: str,
) -> None:
    """A new run and its steps are kept from the insert; the runs a stage works on are read
    with their steps in two statements, however many there are, and their episodes in one
    more when the first is asked for (a stage that asks for none reads none); an expired
    lock is taken over in one. Each of these was a statement per run (or two per lock), 31
    an alert in a burst (23 after)."""
    db = database.Database(database_url)
    await migrate.upgrade(db)
    store = sql_store.SqlStore(db, clock=lambda: NOW)
    ran: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not statement.startswith(("BEGIN", "SAVEPOINT", "RELEASE")):
            ran.append(" ".join(statement.split())[:60])

    def insert_two(tx: sql_store.SqlTx) -> list[int]:
        ids = []
        for node in ("gpu-node-01", "gpu-node-02"):
            episode = tx.conn.execute(
                sa.insert(tables.alert_episodes).returning(tables.alert_episodes.c.id),
                {
                    "fingerprint": node,
                    "starts_at": NOW,
                    "alertname": "GPUXidError79",
                    "status": "firing",
                    "labels": {"alertname": "GPUXidError79", "node": node},
                    "annotations": {},
                    "generator_url": "",
                    "created_at": NOW,
                },
            ).scalar_one()
            run_id = tx.insert_run(new_run(episode_id=episode, node=node), actor="test")
            assert run_id is not None
            ran.clear()
            assert [s.key for s in tx.steps_of_run(run_id)] == ["first", "second"]
            assert tx.get_run(run_id) is not None
            assert ran == []  # kept from the insert
            ids.append(run_id)
        tx.try_lock("cooldown:x", run_id=None, expires_at=NOW)  # expired at once
        return ids

    def read_back(tx: sql_store.SqlTx, ids: list[int]) -> None:
        ran.clear()
        tx.read_runs(ids)
        assert len(ran) == 2  # runs, their steps
        ran.clear()
        for run_id in ids:
            run = tx.get_run(run_id)
            assert run is not None
            assert run.episode_id is not None
            assert tx.get_episode(run.episode_id) is not None
            assert len(tx.steps_of_run(run_id)) == 2
            assert tx.get_step(tx.steps_of_run(run_id)[0].id) is not None
        assert len(ran) == 1  # both episodes, when the first was asked for
        assert "alert_episodes" in ran[0]
        ran.clear()
        assert tx.try_lock("cooldown:x", run_id=ids[0], expires_at=None)
        assert len(ran) == 1  # the expired holder lost it, in one statement

    try:
        sa.event.listen(sa.Engine, "before_cursor_execute", seen)
        try:
            ids = await store.run("prepare", insert_two)
            await store.run("read", lambda tx: read_back(tx, ids))
        finally:
            sa.event.remove(sa.Engine, "before_cursor_execute", seen)
    finally:
        await db.dispose()


async def test_the_guards_lock_is_taken_once_a_transaction(database_url: str) -> None:
    """Every guard decision takes the guards lock; a pass admitting a hundred disruptive
    steps took it a hundred times (two statements each on Postgres), though the first holds
    it until the transaction ends."""
    db = database.Database(database_url)
    await migrate.upgrade(db)
    store = sql_store.SqlStore(db, clock=lambda: NOW)
    ran: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "guard_state" in statement:
            ran.append(statement)

    def decide_three_times(tx: sql_store.SqlTx) -> None:
        for _ in range(3):
            tx.lock_guards()

    try:
        sa.event.listen(sa.Engine, "before_cursor_execute", seen)
        try:
            await store.run("pass", decide_three_times)
            await store.run("pass", decide_three_times)
        finally:
            sa.event.remove(sa.Engine, "before_cursor_execute", seen)
        assert len(ran) == (4 if db.is_postgres else 0)  # two statements per transaction
    finally:
        await db.dispose()
