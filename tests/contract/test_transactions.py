"""``Store.run``: all of a transaction or nothing; a lost compare-and-set is the caller's to
handle; a savepoint rolls back only its own block."""

from __future__ import annotations

import pytest

from remediator.domain import errors, runs, transitions
from tests.contract.plans import alert_run, fire, new_run, run


async def test_a_transaction_that_raises_leaves_nothing_behind(backend):
    episode = await fire(backend)
    before = await backend.events()

    def work(tx):
        run_id = tx.insert_run(new_run(episode_id=episode.id), actor="engine")
        tx.try_lock("node:gpu-node-03", run_id=run_id, expires_at=None)
        tx.set_guard_state("breaker", {"open": True})
        tx.record_disruption(run_id=run_id, node="gpu-node-03")
        tx.mark_episode_handled(episode)
        tx.add_event("test.note", actor="tester")
        raise RuntimeError("the work fails halfway")

    with pytest.raises(RuntimeError, match="halfway"):
        await run(backend, work)

    def read(tx):
        return (
            tx.runs_of_episode(episode.id),
            tx.held_keys("node:"),
            tx.get_guard_state("breaker"),
            set(
                tx.guard_snapshot(
                    node=None, since=tx.now, disruptive_playbooks=[], gpu_nodes=None
                ).disrupted_nodes
            ),
            [e.id for e in tx.lock_unhandled_episodes(10)],
        )

    assert await run(backend, read) == ([], set(), {}, set(), [episode.id])
    assert await backend.events() == before
    assert await backend.chain_ok()


async def test_a_transaction_that_returns_commits_everything_and_returns_the_result(backend):
    episode = await fire(backend)
    run_id = await run(
        backend, lambda tx: tx.insert_run(new_run(episode_id=episode.id), actor="engine")
    )
    assert isinstance(run_id, int)
    [found] = await run(backend, lambda tx: tx.runs_of_episode(episode.id))
    assert found.id == run_id
    assert found.created_at == backend.clock.now


async def test_a_lost_compare_and_set_raises_conflict_and_the_transaction_stays_usable(backend):
    _, run_id = await alert_run(backend)

    def work(tx):
        stale = tx.get_run(run_id)
        tx.apply(transitions.move_run(stale, runs.RunStatus.RUNNING, reason="first"))
        with pytest.raises(errors.Conflict, match=f"run {run_id} is running"):
            tx.apply(transitions.move_run(stale, runs.RunStatus.RUNNING, reason="again"))
        tx.add_event("test.after_conflict", actor="tester", run_id=run_id)
        return tx.get_run(run_id).status

    assert await run(backend, work) is runs.RunStatus.RUNNING
    kinds = [event["kind"] for event in await backend.events()]
    assert kinds[-2:] == ["run.transition", "test.after_conflict"]


async def test_a_savepoint_rolls_back_only_its_own_block(backend):
    if not await run(backend, lambda tx: hasattr(tx, "savepoint")):
        pytest.skip("this backend's transactions have no savepoints")
    _, run_id = await alert_run(backend)

    def failing_unit(tx):
        with tx.savepoint():
            tx.add_event("test.inside", actor="tester")
            tx.try_lock("node:gpu-node-03", run_id=run_id, expires_at=None)
            tx.apply(transitions.move_run(tx.get_run(run_id), runs.RunStatus.RUNNING, reason="x"))
            raise RuntimeError("the unit fails")

    def work(tx):
        tx.add_event("test.before", actor="tester")
        with pytest.raises(RuntimeError, match="the unit fails"):
            failing_unit(tx)
        with tx.savepoint():
            tx.add_event("test.kept", actor="tester")
        return tx.held_keys("node:"), tx.get_run(run_id).status

    assert await run(backend, work) == (set(), runs.RunStatus.PENDING)
    events = await backend.events()
    assert [event["kind"] for event in events][-2:] == ["test.before", "test.kept"]
    assert [event["id"] for event in events] == list(range(1, len(events) + 1))
    assert await backend.chain_ok()
