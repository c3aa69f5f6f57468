"""Locks: one holder per key, expiring locks that lapse on their own, releases by run."""

from __future__ import annotations

import datetime as dt

from remediator.domain import runs, transitions
from tests.contract.plans import alert_run, fire, new_run, run


async def test_a_held_key_cannot_be_taken_again_until_released(backend):
    _, run_id = await alert_run(backend)

    def take(tx):
        return tx.try_lock("node:gpu-node-03", run_id=run_id, expires_at=None)

    assert await run(backend, take) is True
    assert await run(backend, take) is False  # not even by the run that holds it
    await run(backend, lambda tx: tx.release_locks(["node:gpu-node-03", "node:absent"]))
    assert await run(backend, take) is True


async def test_an_expiring_lock_lapses_at_its_expiry(backend):
    until = backend.clock.now + dt.timedelta(minutes=10)

    def take(tx):
        return tx.try_lock("cooldown:reboot:gpu-node-03", run_id=None, expires_at=until)

    def held(tx):
        return tx.held_keys("cooldown:")

    assert await run(backend, take) is True
    backend.clock.advance(599)
    assert await run(backend, take) is False
    assert await run(backend, held) == {"cooldown:reboot:gpu-node-03"}
    backend.clock.advance(1)
    assert await run(backend, held) == set()
    assert await run(backend, take) is True  # the lapsed holder loses it


async def test_held_keys_are_the_live_locks_under_a_prefix(backend):
    _, run_id = await alert_run(backend)
    soon = backend.clock.now + dt.timedelta(seconds=5)

    def take(tx):
        tx.try_lock("slot:reboot:0", run_id=run_id, expires_at=None)
        tx.try_lock("slot:reboot:1", run_id=None, expires_at=soon)
        tx.try_lock("slot:drain:0", run_id=run_id, expires_at=None)

    await run(backend, take)
    assert await run(backend, lambda tx: tx.held_keys("slot:reboot:")) == {
        "slot:reboot:0",
        "slot:reboot:1",
    }
    backend.clock.advance(5)
    assert await run(backend, lambda tx: tx.held_keys("slot:reboot:")) == {"slot:reboot:0"}
    assert await run(backend, lambda tx: tx.held_keys("slot:")) == {
        "slot:reboot:0",
        "slot:drain:0",
    }


async def test_releasing_a_runs_locks_keeps_its_expiring_ones_and_other_runs_locks(backend):
    _, mine = await alert_run(backend)
    _, theirs = await alert_run(backend, playbook="drain")
    later = backend.clock.now + dt.timedelta(hours=1)

    def take(tx):
        tx.try_lock("node:gpu-node-03", run_id=mine, expires_at=None)
        tx.try_lock("slot:reboot:0", run_id=mine, expires_at=None)
        tx.try_lock("cooldown:reboot:gpu-node-03", run_id=mine, expires_at=later)
        tx.try_lock("slot:drain:0", run_id=theirs, expires_at=None)

    await run(backend, take)
    await run(backend, lambda tx: tx.release_run_locks(mine))
    assert await run(backend, lambda tx: tx.held_keys("")) == {
        "cooldown:reboot:gpu-node-03",
        "slot:drain:0",
    }


async def test_the_lock_holder_is_the_active_run_holding_the_key(backend):
    _, holder = await alert_run(backend)
    until = backend.clock.now + dt.timedelta(minutes=10)

    def take(tx):
        tx.try_lock("node:gpu-node-03", run_id=holder, expires_at=None)
        tx.try_lock("cooldown:reboot:gpu-node-03", run_id=None, expires_at=until)

    await run(backend, take)
    assert await run(backend, lambda tx: tx.lock_holder("node:gpu-node-03")) == holder
    assert await run(backend, lambda tx: tx.lock_holder("node:gpu-node-0")) is None  # exact key
    assert await run(backend, lambda tx: tx.lock_holder("cooldown:reboot:gpu-node-03")) is None
    assert await run(backend, lambda tx: tx.lock_holder("node:gpu-node-04")) is None

    def end(tx):
        current = tx.get_run(holder)
        tx.apply(transitions.move_run(current, runs.RunStatus.CANCELLED, reason="done"))

    await run(backend, end)  # a lock left behind by an ended run holds nothing
    assert await run(backend, lambda tx: tx.lock_holder("node:gpu-node-03")) is None


async def test_held_keys_follow_the_transactions_own_locks_and_releases(backend):
    _, run_id = await alert_run(backend)
    _, other = await alert_run(backend, playbook="drain", node="gpu-node-04")
    assert other is not None
    assert other != run_id
    await run(backend, lambda tx: tx.try_lock("slot:p:5", run_id=other, expires_at=None))

    def within_one_transaction(tx):
        # held_keys is the transaction's own set, kept current: copied to compare later
        seen = [set(tx.held_keys("slot:p:"))]
        tx.try_lock("slot:p:0", run_id=run_id, expires_at=None)
        tx.try_lock("slot:p:5", run_id=run_id, expires_at=None)  # held by the other run
        tx.try_lock("node:x", run_id=run_id, expires_at=None)
        seen.append(set(tx.held_keys("slot:p:")))
        tx.release_locks(["slot:p:0"])
        seen.append(set(tx.held_keys("slot:p:")))
        tx.try_lock("slot:p:1", run_id=run_id, expires_at=None)
        tx.release_run_locks(other)
        seen.append(set(tx.held_keys("slot:p:")))
        return seen

    assert await run(backend, within_one_transaction) == [
        {"slot:p:5"},
        {"slot:p:0", "slot:p:5"},
        {"slot:p:5"},
        {"slot:p:1"},
    ]


async def test_keys_taken_together_are_each_their_own_runs_and_none_held_is_taken(backend):
    """``take_locks``: each key for its own run in one go; a key someone holds stays
    theirs, one whose holder's time ran out is taken, and the transaction's held keys
    follow."""
    _, first = await alert_run(backend)
    second_episode = await fire(backend, node="gpu-node-04", fingerprint="f4")
    second = await run(
        backend,
        lambda tx: tx.insert_run(
            new_run(episode_id=second_episode.id, node="gpu-node-04"), actor="engine"
        ),
    )
    soon = backend.clock.now + dt.timedelta(seconds=5)

    def hold(tx):
        tx.try_lock("node:gpu-node-05", run_id=None, expires_at=None)
        tx.try_lock("slot:reboot:3", run_id=None, expires_at=soon)

    await run(backend, hold)
    backend.clock.advance(5)  # the slot's holder's time has run out; the node's has not

    def take(tx):
        got = tx.take_locks(
            {
                "node:gpu-node-03": first,
                "slot:reboot:3": first,
                "node:gpu-node-04": second,
                "node:gpu-node-05": second,
            }
        )
        return got, set(tx.held_keys("slot:reboot:"))

    got, held = await run(backend, take)
    assert got == {"node:gpu-node-03", "slot:reboot:3", "node:gpu-node-04"}
    assert held == {"slot:reboot:3"}
    assert await run(backend, lambda tx: tx.lock_holder("node:gpu-node-03")) == first
    assert await run(backend, lambda tx: tx.lock_holder("node:gpu-node-04")) == second
    assert await run(backend, lambda tx: tx.take_locks({})) == set()
