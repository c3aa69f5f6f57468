"""Convergence: every run ends, a maybe-applied effect is undone, no false success.

Each test is one failure measured on a drill (a crash or a fault while a step runs, then the
alert resolves) replayed deterministically with the fake clock, on SQLite and Postgres.
"""

from __future__ import annotations

from remediator.engine import lifecycle
from tests.support.alerts import alert_body
from tests.support.notify import FakeNotifier

UNDO_PLAYBOOK = """
name: capped
match: {alertname: GPUTemperatureHigh}
on_resolve: undo
steps:
  - id: cap
    action: test.record
    params: {label: cap%s}
    undo: true
  - {id: later, action: test.record, params: {label: later}}
"""


def playbook(extra: str = "") -> str:
    return UNDO_PLAYBOOK % extra


def records(h, kind):
    return [r for r in h.records() if r["kind"] == kind]


async def fire(h, status="firing"):
    response = await h.post(alert_body(alertname="GPUTemperatureHigh", status=status))
    assert response.status == 200


async def by_kind(h):
    runs = {r["kind"]: r for r in await h.runs()}
    return runs.get("alert"), runs.get("undo")


async def claim_as_dead_worker(h, clock):
    """A worker claims the first due step, applies its effect and dies before recording it."""
    await h.engine.handle_episodes()
    await h.engine.start_runs()
    await h.engine.advance_runs()
    claimed = await h.store.run(
        "test",
        lambda tx: [
            lifecycle.claim_step(tx, due, owner="dead-worker", lease_until=clock.now)
            for due in tx.lock_due_steps(1)
        ],
    )
    return claimed[0] if claimed else None


async def test_a_crash_while_a_step_runs_then_a_resolve_ends_the_run_and_undoes_the_effect(
    make_harness, clock
):
    h = await make_harness(playbook())
    await fire(h)
    step = await claim_as_dead_worker(h, clock)
    await fire(h, status="resolved")
    clock.advance(6)  # the dead worker's lease expires
    await h.settle()
    alert, undo = await by_kind(h)
    assert alert["status"] == "cancelled"
    first = (await h.run_detail(alert["id"]))["steps"][0]
    assert first["id"] == step.id
    assert first["status"] == "cancelled"
    assert first["effect"] == "undone"
    assert undo is not None
    assert undo["status"] == "succeeded"
    assert [r["label"] for r in records(h, "undo")] == ["cap"]
    assert records(h, "apply") == []  # nothing applied: the dead worker never recorded one


async def test_a_temporary_failure_after_apply_then_a_resolve_undoes_the_effect(
    make_harness, clock
):
    h = await make_harness(playbook(", fail_after_apply: 1"))
    await fire(h)
    await h.settle()
    alert, _ = await by_kind(h)
    cap = (await h.run_detail(alert["id"]))["steps"][0]
    assert (cap["status"], cap["effect"]) == ("pending", "unknown")  # retry later
    await fire(h, status="resolved")
    clock.advance(60)
    await h.settle()
    alert, undo = await by_kind(h)
    assert alert["status"] == "cancelled"
    assert undo is not None
    assert undo["status"] == "succeeded"
    assert [r["label"] for r in records(h, "apply")] == ["cap"]
    assert [r["label"] for r in records(h, "undo")] == ["cap"]


async def test_a_resolve_while_a_retry_waits_leaves_no_run_running(make_harness, clock):
    h = await make_harness(playbook(", fail_attempts: 1"))
    await fire(h)
    await h.settle()
    await fire(h, status="resolved")
    for _ in range(3):
        clock.advance(30)
        await h.settle()
    alert, undo = await by_kind(h)
    assert alert["status"] == "cancelled"
    steps = (await h.run_detail(alert["id"]))["steps"]
    # The failed attempt reached apply: its effect may be in place, so the undo ran.
    assert [(s["status"], s["effect"]) for s in steps] == [
        ("cancelled", "undone"),
        ("cancelled", "none"),
    ]
    assert undo is not None
    assert undo["status"] == "succeeded"


async def test_a_failed_undo_makes_the_undo_run_failed_and_tells_on_call(make_harness, clock):
    notifier = FakeNotifier()
    h = await make_harness(playbook(", fail_undo: true"), notifier=notifier)
    await fire(h)
    await h.settle()
    await fire(h, status="resolved")
    for _ in range(20):  # the undo is retried, then gives up for good
        clock.advance(60)
        await h.settle()
    alert, undo = await by_kind(h)
    assert alert["status"] == "succeeded"
    assert undo is not None
    assert undo["status"] == "failed"
    [told] = [n for n in notifier.sent if n["data"]["event"] == "undo_failed"]
    assert f"undo run {undo['id']} ended failed" in told["message"]
    assert told["data"]["run_id"] == undo["id"]


async def test_temporary_failures_are_retried_through_a_minute_long_outage(make_harness, clock):
    h = await make_harness(
        """
        name: outage
        match: {alertname: GPUXidError79}
        steps:
          - {id: a, action: test.record, params: {label: a, fail_attempts: 5}}
        """
    )
    await h.post(alert_body())
    await h.settle()
    for _ in range(8):  # 5 + 10 + 20 + 30 + 30 s of backoff: past a 60 s outage
        clock.advance(30)
        await h.settle()
    [run] = await h.runs()
    assert run["status"] == "succeeded"
    assert (await h.run_detail(run["id"]))["steps"][0]["attempt"] == 6


async def test_a_step_whose_workers_keep_dying_fails_after_its_retry_time(make_harness, clock):
    h = await make_harness(
        """
        name: poison-step
        match: {alertname: GPUXidError79}
        steps:
          - id: a
            action: test.record
            params: {label: a}
            retries: {max_attempts: 1, retry_for: 1m}
        """
    )
    await h.post(alert_body())
    for _ in range(10):
        step = await claim_as_dead_worker(h, clock)
        if step is None:
            break
        clock.advance(20)
        await h.engine.sweep()
        await h.engine.advance_runs()
    await h.settle()
    [run] = await h.runs()
    assert run["status"] == "failed"
    detail = await h.run_detail(run["id"])
    assert detail["steps"][0]["effect"] == "unknown"
    assert any("gave up" in e["reason"] for e in detail["events"])
