"""The engine's run and step lifecycle, end to end on the in-memory store (milliseconds each)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import Iterator

import pytest

from remediator.domain import alerts, errors, runs
from remediator.engine import lifecycle
from tests.support.alerts import alert_body

TWO_STEPS = """
name: two-steps
match: {alertname: GPUXidError79}
steps:
  - {id: first, action: test.record, params: {label: one}}
  - {id: second, action: test.record, params: {label: two}}
"""


async def test_a_firing_alert_runs_every_step_in_order(make_engine):
    h = make_engine(TWO_STEPS)
    await h.fire()
    await h.settle()
    [run] = h.runs()
    assert (run.status, run.node, run.kind) == (
        runs.RunStatus.SUCCEEDED,
        "gpu-node-03",
        runs.RunKind.ALERT,
    )
    assert h.statuses(run.id) == ["succeeded", "succeeded"]
    assert [step.effect for step in h.steps(run.id)] == [runs.Effect.APPLIED] * 2
    assert h.applied() == ["one", "two"]
    trail = [(e.kind, e.to_status) for e in h.store.events(run_id=run.id)]
    assert trail[0] == ("run.created", "pending")
    assert trail[-1] == ("run.transition", "succeeded")
    assert trail.count(("step.transition", "running")) == 2
    assert h.store.verify().ok
    assert not (await h.store.probe()).any


async def test_a_repeated_delivery_creates_no_second_run(make_engine):
    h = make_engine(TWO_STEPS)
    await h.fire()
    await h.settle()
    await h.fire()
    await h.settle()
    assert len(h.runs()) == 1
    assert h.applied() == ["one", "two"]


async def test_a_temporary_failure_retries_at_a_persisted_time(make_engine):
    h = make_engine(
        """
        name: flaky
        match: {alertname: GPUXidError79}
        steps:
          - id: s
            action: test.record
            params: {label: flaky, fail_attempts: 1}
            retries: {max_attempts: 3, backoff: 30s}
        """
    )
    await h.fire()
    await h.settle()
    [run] = h.runs()
    [step] = h.steps(run.id)
    assert (step.status, step.attempt, step.effect) == (
        runs.StepStatus.PENDING,
        1,
        runs.Effect.UNKNOWN,
    )
    assert step.due_at == h.clock.now + dt.timedelta(seconds=30)
    assert "attempt 1 fails" in step.error
    h.clock.advance(29)
    await h.settle()
    assert h.applied() == []
    h.clock.advance(2)
    await h.settle()
    assert h.applied() == ["flaky"]
    [step] = h.steps(run.id)
    assert (step.status, step.attempt) == (runs.StepStatus.SUCCEEDED, 2)
    assert h.runs()[0].status is runs.RunStatus.SUCCEEDED


async def test_a_permanent_failure_stops_the_run_and_skips_the_rest(make_engine):
    h = make_engine(
        """
        name: breaks
        match: {alertname: GPUXidError79}
        steps:
          - {id: a, action: test.record, params: {label: a, fail_permanently: true}}
          - {id: b, action: test.record, params: {label: b}}
        """
    )
    await h.fire()
    await h.settle()
    [run] = h.runs()
    assert run.status is runs.RunStatus.FAILED
    assert h.statuses(run.id) == ["failed", "skipped"]


GATED_UNDO = """
name: gated
match: {alertname: GPUXidError79}
on_resolve: undo
steps:
  - {id: hold, action: test.gate, params: {label: hold}, undo: true}
  - {id: after, action: test.record, params: {label: after}, undo: true}
"""


async def test_a_resolve_while_a_step_runs_cancels_the_run_and_undoes_what_it_did(make_engine):
    h = make_engine(GATED_UNDO)
    await h.fire()
    while not h.gate.entered.is_set():  # passes until the first step is inside its apply
        await h.engine.tick()
        await asyncio.sleep(0)
    await h.resolve()
    await h.engine.tick()  # the resolution: the running step goes on, the rest is cancelled
    [run] = h.runs()
    assert run.status is runs.RunStatus.RUNNING
    assert h.statuses(run.id) == ["running", "cancelled"]
    h.gate.gate.set()
    await h.settle()
    alert_run, undo_run = h.runs()
    assert alert_run.status is runs.RunStatus.CANCELLED
    assert h.statuses(alert_run.id) == ["undone", "cancelled"]
    assert [s.effect for s in h.steps(alert_run.id)] == [runs.Effect.UNDONE, runs.Effect.NONE]
    assert (undo_run.kind, undo_run.parent_run_id, undo_run.status) == (
        runs.RunKind.UNDO,
        alert_run.id,
        runs.RunStatus.SUCCEEDED,
    )
    assert [s.key for s in h.steps(undo_run.id)] == ["undo-hold"]
    assert (h.gate.applied, h.gate.undone) == (["hold"], ["hold"])
    assert h.applied() == []  # the step after the resolution never ran


async def test_a_lost_lease_and_a_resolve_end_the_run_and_undo_the_unknown_effect(make_engine):
    h = make_engine(
        """
        name: undoes
        match: {alertname: GPUXidError79}
        on_resolve: undo
        steps:
          - {id: cordon, action: test.record, params: {label: cordon}, undo: true}
          - {id: drain, action: test.record, params: {label: drain}, undo: true}
        """
    )
    await h.fire()
    await h.engine.handle_episodes()
    await h.engine.start_runs()
    await h.engine.advance_runs()
    # A worker claims the first step and dies (maybe inside apply) without a word.
    [claimed] = await h.store.run(
        "claim",
        lambda tx: [
            lifecycle.claim_step(tx, step, owner="dead-worker", lease_until=tx.now)
            for step in tx.lock_due_steps(1)
        ],
    )
    await h.resolve()
    h.clock.advance(1)
    await h.settle()
    alert_run, undo_run = h.runs()
    assert alert_run.status is runs.RunStatus.CANCELLED
    cordon, drain = h.steps(alert_run.id)
    assert (cordon.status, cordon.effect) == (runs.StepStatus.CANCELLED, runs.Effect.UNDONE)
    assert drain.status is runs.StepStatus.CANCELLED
    assert "alert resolved" in cordon.error
    [undo_step] = h.steps(undo_run.id)
    assert (undo_step.key, undo_step.undo_of, undo_step.status) == (
        "undo-cordon",
        claimed.id,
        runs.StepStatus.SUCCEEDED,
    )
    assert undo_run.status is runs.RunStatus.SUCCEEDED
    assert h.applied() == []
    assert h.applied("undo") == ["cordon"]
    ended = [e for e in h.store.events(run_id=alert_run.id) if e.step_id == claimed.id]
    assert ended[-2].data["effect"] == "unknown"  # cancelled, maybe applied: undo planned


async def test_a_failed_undo_fails_the_undo_run_and_tells_on_call(make_engine):
    h = make_engine(
        """
        name: stubborn
        match: {alertname: GPUXidError79}
        on_resolve: undo
        steps:
          - {id: taint, action: test.record, params: {label: taint, fail_undo: true}, undo: true}
        """
    )
    await h.fire()
    await h.settle()
    await h.resolve()
    await h.settle()
    alert_run, undo_run = h.runs()
    assert alert_run.status is runs.RunStatus.SUCCEEDED
    assert (undo_run.kind, undo_run.status) == (runs.RunKind.UNDO, runs.RunStatus.FAILED)
    [undo_step] = h.steps(undo_run.id)
    assert undo_step.status is runs.StepStatus.FAILED
    assert "undo fails for good" in undo_step.error
    [notice] = [s for s in h.notifier.sent if s["data"]["event"] == "undo_failed"]
    assert notice["data"]["run_id"] == undo_run.id
    assert f"undo run {undo_run.id} ended failed: undo-taint failed" in notice["message"]
    assert notice["key"] == f"undo-failed-{undo_run.id}"


async def test_a_step_needing_approvals_parks_the_run_and_resumes_once_enough_approve(
    make_engine,
):
    h = make_engine(
        """
        name: gated
        match: {alertname: GPUXidError79}
        steps:
          - {id: safe, action: test.record, params: {label: safe}}
          - {id: risky, action: test.record, params: {label: risky}, requires_approval: true,
             approvals: 2}
        """
    )
    await h.fire()
    await h.settle()
    [run] = h.runs()
    assert run.status is runs.RunStatus.WAITING_APPROVAL
    assert h.statuses(run.id) == ["succeeded", "waiting_approval"]
    assert h.applied() == ["safe"]
    assert [s["data"]["event"] for s in h.notifier.sent] == ["approval"]
    risky = h.steps(run.id)[1]
    waiting = await h.decide(risky.id, principal="alice")
    assert waiting.status is runs.StepStatus.WAITING_APPROVAL
    with pytest.raises(errors.Conflict, match="alice already decided"):
        await h.decide(risky.id, principal="alice")
    await h.settle()
    assert h.applied() == ["safe"]
    approved = await h.decide(risky.id, principal="bob")
    assert approved.status is runs.StepStatus.PENDING
    await h.settle()
    assert h.applied() == ["safe", "risky"]
    assert h.runs()[0].status is runs.RunStatus.SUCCEEDED
    decided = [e for e in h.store.events(run_id=run.id) if e.data.get("decision") == "approved"]
    assert [e.actor for e in decided] == ["alice", "bob"]


async def test_a_rejection_ends_the_run_rejected(make_engine):
    h = make_engine(
        """
        name: gated
        match: {alertname: GPUXidError79}
        steps:
          - {id: risky, action: test.record, params: {label: risky}, requires_approval: true}
          - {id: after, action: test.record, params: {label: after}}
        """
    )
    await h.fire()
    await h.settle()
    [run] = h.runs()
    rejected = await h.decide(h.steps(run.id)[0].id, principal="alice", approve=False)
    assert rejected.status is runs.StepStatus.REJECTED
    await h.settle()
    assert h.runs()[0].status is runs.RunStatus.REJECTED
    assert h.statuses(run.id) == ["rejected", "skipped"]
    assert h.applied() == []


def _cooling(on_resolve: str) -> str:
    return f"""
        name: cooling
        match: {{alertname: GPUTemperatureHigh}}
        cooldown: 15m
        cooldown_per: gpu
        exclusive: false
        on_resolve: {on_resolve}
        steps:
          - {{id: cap, action: test.record, params: {{label: cap}}, undo: true}}
        """


async def _episode(h, *, starts: str, status: str = "firing") -> None:
    body = alert_body(
        alertname="GPUTemperatureHigh", status=status, starts=starts, gpu="GPU-1", fingerprint="f1"
    )
    await h.store.receive(alerts.parse_payload(body))
    await h.settle()


async def test_a_resolution_that_undoes_the_fix_ends_the_cooldown(make_engine):
    h = make_engine(_cooling("undo"))
    await _episode(h, starts="2026-11-30T00:00:00Z")
    await _episode(h, starts="2026-11-30T00:00:00Z", status="resolved")
    assert (h.applied(), h.applied("undo")) == (["cap"], ["cap"])
    h.clock.advance(300)
    await _episode(h, starts="2026-11-30T00:05:00Z")  # hot again within the 15 minutes
    assert (h.applied(), h.applied("undo")) == (["cap", "cap"], ["cap"])
    assert [e.kind for e in h.store.events()].count("run.cooldown_ended") == 1
    assert not [s for s in h.notifier.sent if s["data"].get("event") == "suppressed"]


async def test_a_refire_while_the_fix_is_in_place_is_still_suppressed_and_told_once(make_engine):
    h = make_engine(_cooling("undo"))
    await _episode(h, starts="2026-11-30T00:00:00Z")
    h.clock.advance(300)
    await _episode(h, starts="2026-11-30T00:05:00Z")  # the resolution never reached us
    await _episode(h, starts="2026-11-30T00:05:00Z")  # the same episode delivered again
    assert len(h.runs()) == 1
    assert h.applied() == ["cap"]
    [notice] = [s for s in h.notifier.sent if s["data"].get("event") == "suppressed"]
    assert "cooling is cooling down on node gpu-node-03, GPU GPU-1" in notice["message"]
    assert "the cooldown of 0:15:00 ends" in notice["message"]


async def test_a_cooldown_outlives_a_resolution_that_keeps_the_fix(make_engine):
    h = make_engine(_cooling("cancel"))
    await _episode(h, starts="2026-11-30T00:00:00Z")
    await _episode(h, starts="2026-11-30T00:00:00Z", status="resolved")
    h.clock.advance(300)
    await _episode(h, starts="2026-11-30T00:05:00Z")
    assert (len(h.runs()), h.applied(), h.applied("undo")) == (1, ["cap"], [])
    assert "run.cooldown_ended" not in [e.kind for e in h.store.events()]
    [notice] = [s for s in h.notifier.sent if s["data"].get("event") == "suppressed"]
    assert (
        notice["data"]["reason"]
        == "playbook cooling is cooling down on node gpu-node-03, GPU GPU-1"
    )


ON_ONE_GPU = """
name: on-one-gpu
match: {alertname: GPUTemperatureHigh}
exclusive: false
steps:
  - {id: hold, action: test.gate, params: {label: hold}}
"""


async def test_runs_on_the_same_gpu_never_overlap(make_engine):
    h = make_engine(ON_ONE_GPU)
    gpu = "GPU-00000000-0000-0000-0000-000000000001"
    for fingerprint, on in (("a", gpu), ("b", gpu), ("c", "GPU-other")):
        body = alert_body(alertname="GPUTemperatureHigh", gpu=on, fingerprint=fingerprint)
        await h.store.receive(alerts.parse_payload(body))
    while len(h.gate.applied) < 1 and not h.gate.entered.is_set():
        await h.engine.tick()
        await asyncio.sleep(0)
    for _ in range(5):
        await h.engine.tick()
        await asyncio.sleep(0)
    first, second, other = h.runs()
    assert first.gpu == second.gpu == gpu
    assert first.status is runs.RunStatus.RUNNING
    assert second.status is runs.RunStatus.PENDING  # waits for the GPU, not for the node
    assert other.status is runs.RunStatus.RUNNING  # another GPU of the same node goes on
    h.gate.gate.set()
    await h.settle()
    assert [run.status for run in h.runs()] == [runs.RunStatus.SUCCEEDED] * 3
    assert h.gate.applied == ["hold"] * 3


@contextlib.contextmanager
def transactions(h) -> Iterator[list[str]]:
    """The store's transactions while the block runs, by operation (reads as ``read:op``)."""
    seen: list[str] = []
    run_tx, read_tx = h.store.run, h.store.read

    async def counted_run(operation, work):
        seen.append(operation)
        return await run_tx(operation, work)

    async def counted_read(operation, work):
        seen.append(f"read:{operation}")
        return await read_tx(operation, work)

    h.store.run, h.store.read = counted_run, counted_read
    try:
        yield seen
    finally:
        h.store.run, h.store.read = run_tx, read_tx


GATE_THEN_RECORD = """
name: two-steps
match: {alertname: GPUXidError79}
steps:
  - {id: first, action: test.gate, params: {label: first}}
  - {id: second, action: test.record, params: {label: second}}
"""


async def test_one_pass_turns_a_new_alert_into_its_claimed_first_step(make_engine):
    """Planning, starting, advancing and claiming feed each other within one pass: the first
    step of a new episode's run is claimed by the pass that sees the episode, not by later
    passes one poll interval apart."""
    h = make_engine(GATE_THEN_RECORD)
    await h.fire()
    with transactions(h) as operations:
        assert await h.engine.tick()
        [run] = h.runs()
        assert (run.status, h.statuses(run.id)) == (
            runs.RunStatus.RUNNING,
            ["running", "pending"],
        )
        await asyncio.wait_for(h.gate.entered.wait(), 5)  # on its way, with no other pass
    # ...by one transaction: the step's context was read by the claim, not by a read of its own
    assert operations == ["pass"]


async def test_steps_that_finish_together_are_recorded_in_one_transaction(make_engine):
    """Group commit of outcomes: a burst's steps finish side by side, and their outcomes go
    into one transaction (each in a savepoint of its own), not one transaction per step."""
    h = make_engine(GATE_THEN_RECORD)
    for node in ("gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"):
        await h.fire(node=node)
    await h.engine.tick()
    assert len(h.engine._in_flight) == 4
    with transactions(h) as operations:
        h.gate.gate.set()
        await h.engine.wait_in_flight()
    # the four first steps in one transaction (which claimed the four second steps), then
    # the four second steps in another
    assert operations == ["step.finish", "step.finish"]
    assert all(h.statuses(r.id) == ["succeeded", "succeeded"] for r in h.runs())
    await h.settle()
    assert {r.status for r in h.runs()} == {runs.RunStatus.SUCCEEDED}
    assert h.store.verify().ok


async def test_a_runs_next_step_starts_from_the_transaction_that_recorded_the_one_before(
    make_engine,
):
    """A step's outcome, its run's advance and the next step's claim commit together, and the
    next step runs at once in the same slot: no probe, no pass in between; the last outcome
    ends the run in the same way."""
    h = make_engine(GATE_THEN_RECORD)
    await h.fire()
    await h.engine.tick()
    with transactions(h) as operations:
        h.gate.gate.set()
        await h.engine.wait_in_flight()
    [run] = h.runs()
    assert (run.status, h.statuses(run.id)) == (
        runs.RunStatus.SUCCEEDED,
        ["succeeded", "succeeded"],
    )
    assert operations == ["step.finish", "step.finish"]
    assert h.engine._in_flight == {}
    assert h.store.verify().ok


async def test_an_outcome_that_cannot_be_recorded_fails_alone(make_engine, monkeypatch):
    """One step whose record raises (a bug) leaves the other outcomes of its batch recorded."""
    h = make_engine(GATE_THEN_RECORD)
    for node in ("gpu-node-01", "gpu-node-02"):
        await h.fire(node=node)
    await h.engine.tick()
    [bad, good] = sorted(h.engine._in_flight)
    finish = lifecycle.finish_step

    def breaks_on_one(tx, step, *args, **kwargs):
        if step.id == bad:
            raise RuntimeError("a bug in recording")
        return finish(tx, step, *args, **kwargs)

    monkeypatch.setattr(lifecycle, "finish_step", breaks_on_one)
    h.gate.gate.set()
    await h.engine.wait_in_flight()
    steps = {s.id: s.status.value for r in h.runs() for s in h.steps(r.id)}
    assert (steps[bad], steps[good]) == ("running", "succeeded")
