"""Steps: claims with a lease, compare-and-set on status and owner, due steps, lost leases."""

from __future__ import annotations

import datetime as dt

import pytest

from remediator.domain import errors, playbooks, runs, transitions
from tests.contract.plans import claimed_step, due_step, fire, run, started_run

SUCCEEDED = transitions.Result(status=runs.StepStatus.SUCCEEDED, output={"ok": True})


async def test_a_claim_puts_the_attempt_on_record_with_a_lease(backend):
    step = await due_step(backend)
    until = backend.clock.now + dt.timedelta(seconds=30)
    claimed = await run(
        backend,
        lambda tx: tx.apply(transitions.claim(step, owner="w1", lease_until=until, now=tx.now)),
    )
    assert claimed.status is runs.StepStatus.RUNNING
    assert (claimed.lease_owner, claimed.lease_expires_at) == ("w1", until)
    assert (claimed.attempt, claimed.started_at, claimed.due_at) == (1, backend.clock.now, None)
    assert await run(backend, lambda tx: tx.get_step(step.id)) == claimed


async def test_a_second_claim_of_the_same_read_is_a_conflict(backend):
    step = await due_step(backend)

    def claim(tx):
        return tx.apply(transitions.claim(step, owner="w2", lease_until=tx.now, now=tx.now))

    await run(backend, claim)
    with pytest.raises(errors.Conflict, match=f"step {step.id} is no longer pending"):
        await run(backend, claim)


async def test_only_the_lease_owner_finishes_its_attempt(backend):
    claimed = await claimed_step(backend, owner="w1")

    def finish(owner):
        change = transitions.finish(claimed, SUCCEEDED, owner=owner, now=backend.clock.now)
        return run(backend, lambda tx: tx.apply(change))

    with pytest.raises(errors.Conflict):
        await finish("w2")
    backend.clock.advance(3)
    done = await finish("w1")  # decided now
    assert done.status is runs.StepStatus.SUCCEEDED
    assert done.effect is runs.Effect.APPLIED
    assert (done.lease_owner, done.lease_expires_at, done.due_at) == (None, None, None)
    assert done.finished_at == backend.clock.now
    assert done.output == {"ok": True}


async def test_a_finish_without_an_owner_ends_the_step_whoever_holds_it(backend):
    claimed = await claimed_step(backend, owner="w1")
    failed = transitions.Result(
        status=runs.StepStatus.FAILED, output={}, error="gave up", reached_apply=True
    )
    done = await run(
        backend, lambda tx: tx.apply(transitions.finish(claimed, failed, owner=None, now=tx.now))
    )
    assert (done.status, done.effect, done.error) == (
        runs.StepStatus.FAILED,
        runs.Effect.UNKNOWN,
        "gave up",
    )


async def test_a_temporary_failure_is_pending_again_at_its_retry_time(backend):
    claimed = await claimed_step(backend)
    retry_at = backend.clock.now + dt.timedelta(seconds=30)
    result = transitions.Result(
        status=runs.StepStatus.PENDING, output={}, error="busy", retry_at=retry_at
    )
    again = await run(
        backend, lambda tx: tx.apply(transitions.finish(claimed, result, owner="w1", now=tx.now))
    )
    assert (again.status, again.due_at, again.attempt) == (runs.StepStatus.PENDING, retry_at, 1)
    assert await run(backend, lambda tx: list(tx.lock_due_steps(10))) == []
    backend.clock.advance(30)
    assert [s.id for s in await run(backend, lambda tx: tx.lock_due_steps(10))] == [claimed.id]


async def test_due_steps_are_pending_steps_of_running_runs_whose_time_has_come(backend):
    _, started = await started_run(backend)
    first, second = await run(backend, lambda tx: tx.steps_of_run(started.id))
    now = backend.clock.now
    later = now + dt.timedelta(seconds=10)
    await run(backend, lambda tx: tx.apply(transitions.make_due(second, now=now)))
    await run(backend, lambda tx: tx.apply(transitions.make_due(first, now=later)))

    def due(tx):
        return [s.id for s in tx.lock_due_steps(10)]

    assert await run(backend, due) == [second.id]
    backend.clock.advance(10)
    assert await run(backend, due) == [second.id, first.id]  # by due time, not by sequence
    assert await run(backend, lambda tx: [s.id for s in tx.lock_due_steps(1)]) == [second.id]


async def test_a_resolved_alert_starts_no_step_unless_its_playbook_continues(backend):
    cancelling = await due_step(backend)
    continuing = await due_step(
        backend, playbook="keeps-going", on_resolve=playbooks.ResolvePolicy.CONTINUE
    )

    def due(tx):
        return [s.id for s in tx.lock_due_steps(10)]

    assert await run(backend, due) == [cancelling.id, continuing.id]
    await fire(backend, status="resolved")
    assert await run(backend, due) == [continuing.id]


async def test_steps_of_runs_that_are_not_running_are_never_due(backend):
    step = await due_step(backend)
    current = await run(backend, lambda tx: tx.get_run(step.run_id))
    await run(
        backend,
        lambda tx: tx.apply(
            transitions.move_run(current, runs.RunStatus.WAITING_APPROVAL, reason="")
        ),
    )
    assert await run(backend, lambda tx: list(tx.lock_due_steps(10))) == []


async def test_a_lease_expires_after_its_time_and_its_step_is_handed_back_with_unknown_effect(
    backend,
):
    claimed = await claimed_step(backend, owner="w1", lease_seconds=10)
    expired = await run(backend, lambda tx: tx.expired_leases(10))
    assert expired == []
    backend.clock.advance(10)
    assert await run(backend, lambda tx: tx.expired_leases(10)) == []  # not before its end
    backend.clock.advance(1)
    [lost] = await run(backend, lambda tx: tx.expired_leases(10))
    assert lost.id == claimed.id
    back = await run(
        backend,
        lambda tx: tx.apply(transitions.requeue(lost, due_at=tx.now, reason="lease expired")),
    )
    assert (back.status, back.effect, back.lease_owner, back.due_at) == (
        runs.StepStatus.PENDING,
        runs.Effect.UNKNOWN,
        None,
        backend.clock.now,
    )
    assert await run(backend, lambda tx: tx.expired_leases(10)) == []


async def test_a_heartbeat_renews_only_its_own_live_lease(backend):
    claimed = await claimed_step(backend, owner="w1", lease_seconds=10)
    until = backend.clock.now + dt.timedelta(seconds=60)

    def renew(owner, step_id=claimed.id):
        return run(
            backend,
            lambda tx: tx.update_step_output(step_id, owner, {"evicted": 3}, until),
        )

    assert await renew("w2") is False
    assert await renew("w1", step_id=999) is False
    assert await renew("w1") is True
    renewed = await run(backend, lambda tx: tx.get_step(claimed.id))
    assert (renewed.output, renewed.lease_expires_at) == ({"evicted": 3}, until)
    backend.clock.advance(30)
    assert await run(backend, lambda tx: tx.expired_leases(10)) == []
    assert [s.id for s in await run(backend, lambda tx: tx.steps_leased_by("w1"))] == [claimed.id]
    assert await run(backend, lambda tx: tx.steps_leased_by("w2")) == []
    await run(
        backend,
        lambda tx: tx.apply(transitions.finish(renewed, SUCCEEDED, owner="w1", now=tx.now)),
    )
    assert await renew("w1") is False
    assert await run(backend, lambda tx: tx.steps_leased_by("w1")) == []


async def test_a_hold_writes_its_event_once_per_reason(backend):
    step = await due_step(backend)
    until = backend.clock.now + dt.timedelta(minutes=1)

    async def hold(reason):
        current = await run(backend, lambda tx: tx.get_step(step.id))
        change = transitions.hold(current, until=until, reason=reason, kind="budget")
        return await run(backend, lambda tx: tx.apply(change))

    held = await hold("budget spent")
    assert held.due_at == until
    assert held.output["held"] == "budget spent"
    await hold("budget spent")
    await hold("breaker open")
    kinds = [(e["kind"], e["reason"]) for e in await backend.events() if e["step_id"] == step.id]
    assert kinds == [
        ("step.held", "budget spent"),
        ("step.held", "breaker open"),
    ]
