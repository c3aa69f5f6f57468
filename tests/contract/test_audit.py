"""The audit trail: one event per transition, the same fields on every backend, one chain."""

from __future__ import annotations

from remediator.domain import audit, runs, transitions
from tests.contract.plans import alert_run, run

OK = transitions.Result(status=runs.StepStatus.SUCCEEDED, output={"ok": True})
STEP = {"action": "test.record", "phase": "do"}


async def _live_a_run(backend) -> None:
    """Create, start, run the first step, skip the second, finish."""
    _, run_id = await alert_run(backend)

    def start(tx):
        pending = tx.get_run(run_id)
        tx.apply(transitions.move_run(pending, runs.RunStatus.RUNNING, reason="locks acquired"))
        first = tx.steps_of_run(run_id)[0]
        tx.apply(transitions.make_due(first, now=tx.now))

    def claim(tx):
        [due] = tx.lock_due_steps(10)
        tx.apply(transitions.claim(due, owner="w1", lease_until=tx.now, now=tx.now))

    def finish(tx):
        first, second = tx.steps_of_run(run_id)
        tx.apply(transitions.finish(first, OK, owner="w1", now=tx.now))
        tx.apply(transitions.end(second, runs.StepStatus.SKIPPED, now=tx.now, reason="enough"))
        running = tx.get_run(run_id)
        tx.apply(transitions.move_run(running, runs.RunStatus.SUCCEEDED, reason="all done"))

    for work in (start, claim, finish):
        await run(backend, work)


async def test_every_transition_writes_one_event_with_the_same_fields_on_every_backend(backend):
    await _live_a_run(backend)
    events = await backend.events()
    assert {event["at"] for event in events} == {backend.clock.now}
    shown = [
        (
            e["id"],
            e["kind"],
            e["actor"],
            e["run_id"],
            e["step_id"],
            e["episode_id"],
            e["from_status"],
            e["to_status"],
            e["reason"],
            e["data"],
        )
        for e in events
    ]
    created = {
        "playbook": "reboot",
        "kind": "alert",
        "node": "gpu-node-03",
        "gpu": None,
        "dry_run": False,
        "steps": ["first", "second"],
    }
    assert shown == [
        (1, "run.created", "engine", 1, None, 1, None, "pending", "test", created),
        (2, "run.transition", "engine", 1, None, 1, "pending", "running", "locks acquired", {}),
        (
            3,
            "step.transition",
            "engine",
            1,
            1,
            None,
            "pending",
            "running",
            "attempt 1 of 1",
            {"key": "first", **STEP, "attempt": 1, "owner": "w1"},
        ),
        (
            4,
            "step.transition",
            "engine",
            1,
            1,
            None,
            "running",
            "succeeded",
            "done",
            {"key": "first", **STEP, "effect": "applied", "output": {"ok": True}},
        ),
        (
            5,
            "step.transition",
            "engine",
            1,
            2,
            None,
            "pending",
            "skipped",
            "enough",
            {"key": "second", **STEP},
        ),
        (6, "run.transition", "engine", 1, None, 1, "running", "succeeded", "all done", {}),
    ]


async def test_events_form_one_hash_chain_from_genesis(backend):
    await _live_a_run(backend)
    events = await backend.events()
    previous = audit.GENESIS
    for event in events:
        assert event["prev_hash"] == previous
        assert event["hash"] == audit.chain_hash(previous, event)
        previous = event["hash"]
    assert audit.verify(events).ok
    assert await backend.chain_ok()


async def test_events_added_by_the_engine_keep_their_fields(backend):
    await run(
        backend,
        lambda tx: tx.add_event(
            "breaker.reset",
            actor="alice",
            reason="looked at it",
            from_status="open",
            to_status="closed",
            data={"nested": {"list": [1, "two", None]}},
        ),
    )
    [event] = await backend.events()
    assert event["id"] == 1
    assert (event["kind"], event["actor"], event["reason"]) == (
        "breaker.reset",
        "alice",
        "looked at it",
    )
    assert (event["run_id"], event["step_id"], event["episode_id"]) == (None, None, None)
    assert event["data"] == {"nested": {"list": [1, "two", None]}}
    assert await backend.chain_ok()
