"""``Store.probe``: which kinds of engine work exist, read without a write transaction."""

from __future__ import annotations

import dataclasses

from remediator.domain import runs, transitions
from tests.contract.plans import claimed_step, fire, new_run, run, started_run


async def _flags(backend) -> set[str]:
    probe = await backend.store.probe()
    return {name for name, value in dataclasses.asdict(probe).items() if value}


async def test_an_empty_store_has_no_work(backend):
    probe = await backend.store.probe()
    assert not probe.any
    assert await _flags(backend) == set()


async def test_each_kind_of_work_shows_in_its_own_flag(backend):
    episode = await fire(backend)
    assert await _flags(backend) == {"episodes"}
    await run(backend, lambda tx: tx.mark_episode_handled(episode))
    assert await _flags(backend) == set()
    run_id = await run(
        backend, lambda tx: tx.insert_run(new_run(episode_id=episode.id), actor="engine")
    )
    assert await _flags(backend) == {"startable"}
    current = await run(backend, lambda tx: tx.get_run(run_id))
    await run(
        backend,
        lambda tx: tx.apply(transitions.move_run(current, runs.RunStatus.RUNNING, reason="go")),
    )
    assert await _flags(backend) == {"advance"}
    first = (await run(backend, lambda tx: tx.steps_of_run(run_id)))[0]
    await run(backend, lambda tx: tx.apply(transitions.make_due(first, now=tx.now)))
    assert await _flags(backend) == {"due"}


async def test_an_expired_lease_shows_once_its_time_has_passed(backend):
    await claimed_step(backend, lease_seconds=5)
    await run(
        backend, lambda tx: [tx.mark_episode_handled(e) for e in tx.lock_unhandled_episodes(9)]
    )
    assert await _flags(backend) == set()
    backend.clock.advance(6)
    assert await _flags(backend) == {"expired"}


async def test_a_resolved_run_with_a_due_step_is_work_to_advance_not_to_claim(backend):
    _, started = await started_run(backend)
    first = (await run(backend, lambda tx: tx.steps_of_run(started.id)))[0]
    await run(backend, lambda tx: tx.apply(transitions.make_due(first, now=tx.now)))
    await fire(backend, status="resolved")
    assert await _flags(backend) == {"episodes", "advance"}
