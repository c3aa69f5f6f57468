"""New alert runs are held with the ids they will have and written together: the runs a
pass plans are one statement, and their steps another (a 1,000-alert burst wrote two
statements an alert). Reads see them, the audit seals them as written, a run the episode
already has is a conflict the pass resolves with savepoints (as ``insert_run`` returning
``None``), and the repeat-offender count of a batch is one read that counts its own runs."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa

from remediator.adapters.db import audit, tables
from remediator.adapters.db import store as sql_store
from remediator.domain import errors, runs
from remediator.engine import isolation, lifecycle
from tests.contract.plans import new_run
from tests.support.alerts import alert_body
from tests.support.statements import NOW, Statements, episodes

E = tables.alert_episodes
R = tables.runs


def _plan(tx: sql_store.SqlTx, episode_ids: list[int], **kwargs: Any) -> list[int | None]:
    tx.batch_inserts()
    tx.lock_unhandled_episodes(len(episode_ids))
    return [
        tx.insert_run(new_run(episode_id=episode_id, node=f"gpu-node-{n:02}", **kwargs), actor="t")
        for n, episode_id in enumerate(episode_ids)
    ]


async def test_the_runs_a_pass_plans_are_one_statement_and_their_steps_another(
    store: sql_store.SqlStore,
) -> None:
    episode_ids = await episodes(store, 6)
    with Statements() as statements:
        made = await store.run("plan", lambda tx: _plan(tx, episode_ids))
    assert len(statements.starting("INSERT INTO runs")) == 1  # was 6
    assert len(statements.starting("INSERT INTO steps")) == 1  # was 6
    assert len(set(made)) == 6
    assert None not in made

    def read(tx: sql_store.SqlTx) -> list[tuple[Any, ...]]:
        return [
            (run.episode_id, run.node, [step.key for step in tx.steps_of_run(run.id)])
            for run_id in made
            if run_id is not None and (run := tx.get_run(run_id)) is not None
        ]

    assert await store.run("read", read) == [
        (episode_id, f"gpu-node-{n:02}", ["first", "second"])
        for n, episode_id in enumerate(episode_ids)
    ]
    assert (await audit.AuditQueries(store.db).verify()).ok


async def test_reads_in_the_pass_see_its_held_runs(store: sql_store.SqlStore) -> None:
    episode_ids = await episodes(store, 3)

    def plan_and_read(tx: sql_store.SqlTx) -> tuple[Any, ...]:
        made = _plan(tx, episode_ids)
        assert tx.conn.inserting  # held so far
        pending = tx.lock_pending_runs(10)  # a read of runs: they are written first
        assert not tx.conn.inserting
        run_id = made[0]
        assert run_id is not None
        return (
            [run.id for run in pending],
            made,
            [step.status for step in tx.steps_of_run(run_id)],
            [run.id for run in tx.runs_of_episode(episode_ids[0])],
        )

    pending, made, statuses, of_episode = await store.run("plan", plan_and_read)
    assert sorted(pending) == sorted(made)
    assert statuses == [runs.StepStatus.PENDING, runs.StepStatus.PENDING]
    assert of_episode == [made[0]]


async def test_the_audit_seals_held_runs_and_steps_as_they_were_written(
    store: sql_store.SqlStore,
) -> None:
    episode_ids = await episodes(store, 2)
    made = await store.run("plan", lambda tx: _plan(tx, episode_ids))
    assert (await audit.AuditQueries(store.db).verify()).ok
    query = sa.select(tables.audit_events.c.run_id, tables.audit_events.c.rows).where(
        tables.audit_events.c.kind == "run.created"
    )
    async with store.db.read() as conn:
        sealed = {row.run_id: row.rows for row in await conn.execute(query)}
    assert set(sealed) == set(made)
    for rows in sealed.values():
        assert len(rows["runs"]) == 1
        assert len(rows["steps"]) == 2
        digests = [*rows["runs"].values(), *rows["steps"].values()]
        assert all(isinstance(digest, str) and len(digest) == 64 for digest in digests)


async def test_a_held_run_the_episode_already_has_is_a_conflict(
    store: sql_store.SqlStore,
) -> None:
    [episode_id] = await episodes(store, 1)
    first = await store.run(
        "first", lambda tx: tx.insert_run(new_run(episode_id=episode_id), actor="t")
    )

    def again(tx: sql_store.SqlTx) -> None:
        _plan(tx, [episode_id])
        tx.write_pending()

    with pytest.raises(errors.Conflict, match=f"episode {episode_id} already has an? alert run"):
        await store.run("again", again)
    assert [r.id for r in await store.run("read", lambda tx: tx.runs_of_episode(episode_id))] == [
        first
    ]


async def test_a_pass_planning_a_run_the_episode_has_runs_again_with_savepoints(
    store: sql_store.SqlStore,
) -> None:
    """The pass meets the existing run only when its new runs are written: it runs again,
    each unit in a savepoint, where ``insert_run`` answers ``None`` as it always did, and
    the other episode's run is created."""
    taken, free = await episodes(store, 2)
    await store.run("first", lambda tx: tx.insert_run(new_run(episode_id=taken), actor="t"))
    attempts: list[list[int | None]] = []

    def work(tx: sql_store.SqlTx) -> None:
        made: list[int | None] = []
        attempts.append(made)
        report = lifecycle.Report()
        for episode_id in (taken, free):
            made.append(
                isolation.run_unit(
                    tx,
                    f"episode:{episode_id}",
                    lambda episode_id=episode_id: tx.insert_run(
                        new_run(episode_id=episode_id), actor="t"
                    ),
                    quarantine=lambda error: None,
                    report=report,
                )
            )

    await isolation.transaction(store, "pass", work)
    assert len(attempts) == 2
    assert attempts[1][0] is None
    assert attempts[1][1] is not None
    of = await store.run("read", lambda tx: [len(tx.runs_of_episode(e)) for e in (taken, free)])
    assert of == [1, 1]


async def test_a_held_run_the_database_refuses_fails_only_its_own_unit(
    store: sql_store.SqlStore,
) -> None:
    """A run the database refuses (on Postgres a node too long for its column, on SQLite,
    which stores any length, a parent run that does not exist) meets it only when the pass
    writes its new runs, outside any unit: the pass runs again with savepoints, where it is
    that unit's failure."""
    bad, good = await episodes(store, 2)
    refused = (
        new_run(episode_id=bad, node="n" * 300)
        if store.db.is_postgres
        else dataclasses.replace(new_run(episode_id=bad), parent_run_id=10**9)
    )
    failed: list[str] = []

    def work(tx: sql_store.SqlTx) -> None:
        report = lifecycle.Report()
        for episode_id, new in ((bad, refused), (good, new_run(episode_id=good))):
            isolation.run_unit(
                tx,
                f"episode:{episode_id}",
                lambda new=new: tx.insert_run(new, actor="t"),
                quarantine=failed.append,
                report=report,
                limit=1,
            )
        tx.lock_pending_runs(10)  # a read outside the units writes the held runs

    await isolation.transaction(store, "pass", work)
    assert len(failed) == 1
    assert ("too long" if store.db.is_postgres else "FOREIGN KEY") in failed[0]
    of = await store.run("read", lambda tx: [len(tx.runs_of_episode(e)) for e in (bad, good)])
    assert of == [0, 1]


async def test_a_rolled_back_savepoint_takes_its_held_runs_with_it(
    store: sql_store.SqlStore,
) -> None:
    kept, dropped = await episodes(store, 2)

    def work(tx: sql_store.SqlTx) -> None:
        tx.batch_inserts()
        tx.insert_run(new_run(episode_id=kept, node="gpu-node-01"), actor="t")

        def fails() -> None:
            with tx.savepoint():
                tx.insert_run(new_run(episode_id=dropped, node="gpu-node-02"), actor="t")
                raise RuntimeError("the unit fails")

        with pytest.raises(RuntimeError):
            fails()

    await store.run("plan", work)
    of = await store.run("read", lambda tx: [len(tx.runs_of_episode(e)) for e in (kept, dropped)])
    assert of == [1, 0]
    assert (await audit.AuditQueries(store.db).verify()).ok


async def test_the_repeat_offender_count_of_a_batch_is_one_read_and_counts_its_own_runs(
    store: sql_store.SqlStore,
) -> None:
    """Counted once for the batch's nodes, then kept current by the pass's new runs (held
    or written): the second run on a node in one pass counts the first."""
    episode_ids = await episodes(store, 3)
    since = NOW - dt.timedelta(hours=24)
    await store.run(
        "earlier",
        lambda tx: tx.insert_run(
            new_run(node="gpu-node-01", status=runs.RunStatus.FAILED), actor="t"
        ),
    )

    def plan(tx: sql_store.SqlTx) -> list[dict[str, int] | int]:
        tx.batch_inserts()
        tx.lock_unhandled_episodes(3)
        counted: list[dict[str, int] | int] = [
            tx.count_runs_by_node(["gpu-node-01", "gpu-node-02", "gpu-node-01"], since=since)
        ]
        for episode_id in episode_ids:
            tx.insert_run(new_run(episode_id=episode_id, node="gpu-node-01"), actor="t")
            counted.append(tx.count_node_runs("gpu-node-01", since=since))
        counted.append(tx.count_node_runs("gpu-node-03", since=since))  # not read: asked
        return counted

    with Statements() as statements:
        counted = await store.run("plan", plan)
    assert counted == [{"gpu-node-01": 1, "gpu-node-02": 0}, 2, 3, 4, 0]
    counts = [s for s in statements.seen if "count(" in s and "runs.node" in s]
    assert len(counts) == 2  # the batch's read, and gpu-node-03's
    assert len(statements.starting("INSERT INTO runs")) == 1


async def test_an_engine_pass_plans_a_storm_in_one_statement_per_table(make_harness) -> None:
    """The engine's planning pass: the batch's repeat-offender counts in one read, its new
    runs in one statement and their steps in another, and no savepoint."""
    h = await make_harness(
        """
        name: record
        match: {alertname: GPUXidError79}
        steps:
          - {id: a, action: test.record, params: {label: "{{ target.node }}"}}
          - {id: b, action: test.record, params: {label: "again"}}
        """
    )
    nodes = [f"gpu-node-{n:02}" for n in range(1, 5)]
    for node in nodes:
        assert (await h.post(alert_body(node=node))).status == 200
    with Statements() as statements:
        assert await h.engine.tick()
    await h.engine.wait_in_flight()
    assert len(statements.starting("INSERT INTO runs")) == 1  # was 4
    assert len(statements.starting("INSERT INTO steps")) == 1  # was 4
    assert len([s for s in statements.seen if "count(" in s and "runs.node" in s]) == 1  # was 4
    assert not statements.starting("SAVEPOINT")
    assert sorted(run["node"] for run in await h.runs()) == nodes
