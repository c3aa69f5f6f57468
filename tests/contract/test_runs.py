"""Runs: idempotent creation, guarded transitions, which runs may start and which to advance."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from remediator.domain import errors, playbooks, runs, transitions
from tests.contract.plans import NODE, alert_run, fire, new_run, run, started_run

RUNNING = runs.RunStatus.RUNNING


async def test_an_alert_run_is_created_once_per_episode_playbook_and_kind(backend):
    episode = await fire(backend)

    def insert(**kwargs):
        return run(
            backend, lambda tx: tx.insert_run(new_run(episode_id=episode.id, **kwargs), actor="e")
        )

    first = await insert()
    assert await insert() is None
    assert await insert(steps=("other",)) is None  # the key, not the content, decides
    undo = await insert(kind=runs.RunKind.UNDO)
    other = await insert(playbook="drain")
    assert len({first, undo, other}) == 3
    found = await run(backend, lambda tx: tx.runs_of_episode(episode.id))
    assert [(r.id, r.playbook, r.kind) for r in found] == [
        (first, "reboot", runs.RunKind.ALERT),
        (undo, "reboot", runs.RunKind.UNDO),
        (other, "drain", runs.RunKind.ALERT),
    ]
    created = [e for e in await backend.events() if e["kind"] == "run.created"]
    assert [e["run_id"] for e in created] == [first, undo, other]


async def test_runs_without_an_episode_are_never_deduplicated(backend):
    def insert(tx):
        return tx.insert_run(new_run(kind=runs.RunKind.MANUAL), actor="alice")

    assert await run(backend, insert) != await run(backend, insert)


async def test_a_new_run_has_pending_steps_in_order_and_disabled_ones_skipped(backend):
    episode, run_id = await alert_run(backend, steps=("a", "b", "c"), disabled=("b",))
    created = await run(backend, lambda tx: tx.get_run(run_id))
    assert created.status is runs.RunStatus.PENDING
    assert created.episode_id == episode.id
    assert created.node == NODE
    assert created.on_resolve is playbooks.ResolvePolicy.CANCEL
    assert (created.created_at, created.updated_at) == (backend.clock.now,) * 2
    assert created.finished_at is None
    steps = await run(backend, lambda tx: tx.steps_of_run(run_id))
    assert [(s.key, s.seq, s.status) for s in steps] == [
        ("a", 0, runs.StepStatus.PENDING),
        ("b", 1, runs.StepStatus.SKIPPED),
        ("c", 2, runs.StepStatus.PENDING),
    ]
    first, skipped = steps[0], steps[1]
    assert (first.attempt, first.effect, first.due_at, first.lease_owner) == (
        0,
        runs.Effect.NONE,
        None,
        None,
    )
    assert first.params == {"label": "a"}
    assert first.output == {}
    assert skipped.output == {"skipped": "disabled in the playbook"}
    assert first.retry.max_attempts == 1
    assert await run(backend, lambda tx: tx.get_step(first.id)) == first


async def test_a_run_created_ended_is_finished_at_once(backend):
    episode = await fire(backend)
    failed = new_run(episode_id=episode.id, status=runs.RunStatus.FAILED, steps=())
    run_id = await run(backend, lambda tx: tx.insert_run(failed, actor="engine"))
    created = await run(backend, lambda tx: tx.get_run(run_id))
    assert created.status is runs.RunStatus.FAILED
    assert created.finished_at == backend.clock.now
    event = (await backend.events())[-1]
    assert (event["kind"], event["to_status"], event["data"]["steps"]) == (
        "run.created",
        "failed",
        [],
    )


async def test_a_run_transition_is_a_compare_and_set_and_a_lost_one_is_a_conflict(backend):
    _, run_id = await alert_run(backend)
    pending = await run(backend, lambda tx: tx.get_run(run_id))
    backend.clock.advance(5)
    moved = await run(
        backend, lambda tx: tx.apply(transitions.move_run(pending, RUNNING, reason="go"))
    )
    assert moved.status is RUNNING
    assert moved.updated_at == backend.clock.now
    assert moved.finished_at is None
    with pytest.raises(errors.Conflict, match=f"run {run_id} is running; cannot move it"):
        await run(backend, lambda tx: tx.apply(transitions.move_run(pending, RUNNING, reason="x")))
    done = await run(
        backend,
        lambda tx: tx.apply(transitions.move_run(moved, runs.RunStatus.SUCCEEDED, reason="ok")),
    )
    assert done.finished_at == backend.clock.now
    with pytest.raises(errors.Conflict, match="is succeeded"):
        await run(
            backend,
            lambda tx: tx.apply(transitions.move_run(moved, runs.RunStatus.FAILED, reason="x")),
        )


async def test_a_run_moves_from_any_status_its_target_allows_not_only_the_one_it_was_read_in(
    backend,
):
    """The run compare-and-set is ``status IN (sources of the target)``: a change decided on a
    ``waiting_approval`` read still cancels a run that went back to ``running`` meanwhile (and
    its event names the status as read)."""
    _, started = await started_run(backend)
    waiting = await run(
        backend,
        lambda tx: tx.apply(
            transitions.move_run(started, runs.RunStatus.WAITING_APPROVAL, reason="park")
        ),
    )
    await run(backend, lambda tx: tx.apply(transitions.move_run(waiting, RUNNING, reason="ok")))
    cancelled = await run(
        backend,
        lambda tx: tx.apply(transitions.move_run(waiting, runs.RunStatus.CANCELLED, reason="x")),
    )
    assert cancelled.status is runs.RunStatus.CANCELLED
    event = (await backend.events())[-1]
    assert (event["from_status"], event["to_status"]) == ("waiting_approval", "cancelled")


async def test_a_transition_of_a_missing_row_is_a_conflict(backend):
    _, started = await started_run(backend)
    step = (await run(backend, lambda tx: tx.steps_of_run(started.id)))[0]
    ghost_run = dataclasses.replace(started, id=999, status=runs.RunStatus.PENDING)
    ghost_step = dataclasses.replace(step, id=999)
    with pytest.raises(errors.Conflict, match="run 999 is missing"):
        await run(backend, lambda tx: tx.apply(transitions.move_run(ghost_run, RUNNING, reason="")))
    with pytest.raises(errors.Conflict, match="step 999 is no longer pending"):
        await run(backend, lambda tx: tx.apply(transitions.make_due(ghost_step, now=tx.now)))


async def test_node_runs_are_counted_since_a_moment_without_undo_runs(backend):
    episode = await fire(backend)
    since = backend.clock.now

    def insert(tx, **kwargs):
        return tx.insert_run(new_run(**kwargs), actor="engine")

    await run(backend, lambda tx: insert(tx, episode_id=episode.id))
    backend.clock.advance(60)
    await run(backend, lambda tx: insert(tx, kind=runs.RunKind.MANUAL))
    await run(backend, lambda tx: insert(tx, episode_id=episode.id, kind=runs.RunKind.UNDO))
    await run(backend, lambda tx: insert(tx, kind=runs.RunKind.MANUAL, node="gpu-node-04"))

    def count(moment):
        return run(backend, lambda tx: tx.count_node_runs(NODE, since=moment))

    assert await count(since) == 2
    assert await count(since + dt.timedelta(seconds=1)) == 1
    assert await count(backend.clock.now + dt.timedelta(seconds=1)) == 0


async def test_a_pending_run_is_startable_unless_another_run_holds_its_node(backend):
    episode = await fire(backend)

    def insert(tx, **kwargs):
        return tx.insert_run(new_run(episode_id=episode.id, **kwargs), actor="engine")

    holder = await run(backend, lambda tx: insert(tx, playbook="holder"))
    blocked = await run(backend, lambda tx: insert(tx, playbook="blocked"))
    shared = await run(backend, lambda tx: insert(tx, playbook="shared", exclusive=False))
    anywhere = await run(backend, lambda tx: insert(tx, playbook="anywhere", node=None))

    def startable(tx):
        return [r.id for r in tx.lock_pending_runs(10)]

    assert await run(backend, startable) == [holder, blocked, shared, anywhere]
    assert await run(
        backend, lambda tx: tx.try_lock(f"node:{NODE}", run_id=holder, expires_at=None)
    )
    assert await run(backend, startable) == [holder, shared, anywhere]
    assert await run(backend, lambda tx: [r.id for r in tx.lock_pending_runs(2)]) == [
        holder,
        shared,
    ]
    await run(backend, lambda tx: tx.release_locks([f"node:{NODE}"]))
    # A node lock without a run (as a cooldown is held) blocks nobody.
    await run(backend, lambda tx: tx.try_lock(f"node:{NODE}", run_id=None, expires_at=None))
    assert await run(backend, startable) == [holder, blocked, shared, anywhere]


async def _advanceable(backend):
    return await run(backend, lambda tx: [r.id for r in tx.active_runs_with_no_active_step(10)])


async def test_a_running_run_with_no_active_step_is_advanced_and_one_with_a_due_step_is_not(
    backend,
):
    _, started = await started_run(backend)
    assert await _advanceable(backend) == [started.id]
    first, _ = await run(backend, lambda tx: tx.steps_of_run(started.id))
    await run(backend, lambda tx: tx.apply(transitions.make_due(first, now=tx.now)))
    assert await _advanceable(backend) == []
    due = await run(backend, lambda tx: tx.get_step(first.id))
    await run(backend, lambda tx: tx.apply(transitions.park(due)))
    assert await _advanceable(backend) == []  # waiting for approval is active too
    parked = await run(backend, lambda tx: tx.get_step(first.id))
    await run(
        backend,
        lambda tx: tx.apply(
            transitions.end(parked, runs.StepStatus.CANCELLED, now=tx.now, reason="")
        ),
    )
    assert await _advanceable(backend) == [started.id]


async def test_a_resolved_alert_run_is_advanced_with_a_due_step_but_not_with_a_running_one(
    backend,
):
    _, started = await started_run(backend)
    first, _ = await run(backend, lambda tx: tx.steps_of_run(started.id))
    await run(backend, lambda tx: tx.apply(transitions.make_due(first, now=tx.now)))
    assert await _advanceable(backend) == []
    await fire(backend, status="resolved")
    assert await _advanceable(backend) == [started.id]
    due = await run(backend, lambda tx: tx.get_step(first.id))
    await run(
        backend,
        lambda tx: tx.apply(transitions.claim(due, owner="w1", lease_until=tx.now, now=tx.now)),
    )
    assert await _advanceable(backend) == []


async def test_a_resolved_run_that_continues_is_not_advanced_while_a_step_is_due(backend):
    _, started = await started_run(backend, on_resolve=playbooks.ResolvePolicy.CONTINUE)
    first, _ = await run(backend, lambda tx: tx.steps_of_run(started.id))
    await run(backend, lambda tx: tx.apply(transitions.make_due(first, now=tx.now)))
    await fire(backend, status="resolved")
    assert await _advanceable(backend) == []


async def test_only_running_runs_are_advanced(backend):
    _, run_id = await alert_run(backend)
    assert await _advanceable(backend) == []
    pending = await run(backend, lambda tx: tx.get_run(run_id))
    await run(
        backend,
        lambda tx: tx.apply(transitions.move_run(pending, runs.RunStatus.CANCELLED, reason="")),
    )
    assert await _advanceable(backend) == []
