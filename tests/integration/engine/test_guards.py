from __future__ import annotations

import sqlalchemy as sa

from tests.integration.engine.test_engine import alert_body
from tests.support.notify import FakeNotifier

DISRUPTIVE = """
name: disruptive
match: {alertname: GPUXidError79}
exclusive: true
steps:
  - {id: note, action: test.record, params: {label: "note-{{ target.node }}"}}
  - {id: cordon, action: test.disrupt, params: {label: "{{ target.node }}"}}
"""


def disrupted(h):
    return sorted(
        r["label"]
        for r in h.records()
        if r["kind"] == "apply" and "-" in r["label"] and not r["label"].startswith("note-")
    )


async def _held(h):
    held = []
    for run in await h.runs():
        for step in (await h.run_detail(run["id"]))["steps"]:
            if step["status"] == "pending" and "held" in step["output"]:
                held.append((run["node"], step["output"]["held"]))
    return held


async def test_the_budget_caps_disrupted_nodes_and_the_rest_wait_visibly(make_harness):
    h = await make_harness(DISRUPTIVE, guards={"max_nodes": 2, "max_disruptive_runs": 50})
    for i in range(4):
        await h.post(alert_body(node=f"gpu-node-{i:02d}"))
    await h.settle()
    assert len(disrupted(h)) == 2
    notes = [r for r in h.records() if r["kind"] == "apply" and r["label"].startswith("note-")]
    assert len(notes) == 4  # non-disruptive steps are never held
    held = await _held(h)
    assert len(held) == 2
    assert all(reason == "disruption budget in use: 2 of 2 nodes" for _, reason in held)
    breaker = await (await h.client.get("/api/v1/breaker")).json()
    assert breaker["open"] is False
    assert len(breaker["disruptedNodes"]) == 2


async def test_a_storm_opens_the_breaker_notifies_and_resumes_after_a_reset(make_harness, clock):
    notifier = FakeNotifier()
    h = await make_harness(
        DISRUPTIVE,
        notifier=notifier,
        guards={"max_nodes": 2, "max_disruptive_runs": 5, "recheck": "5s"},
    )
    for i in range(3):
        await h.post(alert_body(node=f"gpu-node-{i:02d}"))
    await h.settle()
    assert len(disrupted(h)) == 2
    for i in range(3, 10):
        await h.post(alert_body(node=f"gpu-node-{i:02d}"))
    clock.advance(6)
    await h.settle()
    breaker = await (await h.client.get("/api/v1/breaker")).json()
    assert breaker["open"] is True
    assert "circuit breaker opened" in breaker["reason"]
    assert len(disrupted(h)) == 2
    events = [n["data"]["event"] for n in notifier.sent]
    assert [event for event in events if event != "held"] == ["breaker_opened"]
    assert all("held" in n["message"] for n in notifier.sent if n["data"]["event"] == "held")
    reasons = {reason for _, reason in await _held(h)}
    assert any("circuit breaker" in reason for reason in reasons)
    # Nodes returned to service free their budget; the reset lets the rest go on, within it.
    for node in sorted(disrupted(h)):
        await h.store.run("test", lambda tx, node=node: tx.release_disruptions(node=node))
    refused = await h.client.post("/api/v1/breaker/reset", json={})
    assert refused.status == 400
    reset = await h.client.post("/api/v1/breaker/reset", json={"comment": "storm understood"})
    assert reset.status == 200
    assert (await reset.json())["resetBy"] == "anonymous"
    clock.advance(6)
    await h.settle()
    assert len(disrupted(h)) == 4
    assert (await (await h.client.get("/api/v1/breaker")).json())["open"] is False


async def test_a_flapping_node_needs_approval_after_its_daily_limit(make_harness, clock):
    h = await make_harness(DISRUPTIVE, guards={"max_per_node_per_day": 2, "max_nodes": 5})
    for minute in range(3):
        await h.post(alert_body(starts=f"2026-11-30T00:{minute:02d}:00Z"))
        await h.settle()
        clock.advance(60)
    runs = sorted(await h.runs(), key=lambda r: r["id"])
    assert [r["status"] for r in runs] == ["succeeded", "succeeded", "waiting_approval"]
    assert "need approval" in runs[2]["reason"]
    detail = await h.run_detail(runs[2]["id"])
    assert [s["status"] for s in detail["steps"]] == ["succeeded", "waiting_approval"]


async def test_disruptive_steps_wait_for_the_change_window(make_harness, clock):
    window = {"days": ["tue"], "start": "02:00", "end": "04:00", "timezone": "UTC"}
    h = await make_harness(DISRUPTIVE, guards={"change_windows": [window]})
    await h.post(alert_body())
    await h.settle()
    assert disrupted(h) == []
    [(_, reason)] = await _held(h)
    assert reason.startswith("outside change windows; next opens 2026-12-01T02:00:00")
    clock.now = clock.now.replace(day=1, month=12, hour=2, minute=1)
    await h.settle()
    assert disrupted(h) == ["gpu-node-03"]


async def test_a_playbook_can_tighten_the_global_guards(make_harness):
    h = await make_harness(
        DISRUPTIVE.replace("exclusive: true", "exclusive: true\nguards: {max_nodes: 1}"),
        guards={"max_nodes": 5},
    )
    for i in range(3):
        await h.post(alert_body(node=f"gpu-node-{i:02d}"))
    await h.settle()
    assert len(disrupted(h)) == 1


async def test_dry_run_is_not_held_and_takes_no_budget(make_harness):
    h = await make_harness(DISRUPTIVE, dry_run=True, guards={"max_nodes": 1})
    for i in range(3):
        await h.post(alert_body(node=f"gpu-node-{i:02d}"))
    await h.settle()
    assert [r["status"] for r in await h.runs()] == ["succeeded"] * 3
    assert h.records() == []
    assert (await (await h.client.get("/api/v1/breaker")).json())["disruptedNodes"] == []


DISRUPT_FIRST = """
name: disrupt-first
match: {alertname: GPUXidError79}
exclusive: true
steps:
  - {id: cordon, action: test.disrupt, params: {label: "{{ target.node }}"}}
"""


async def test_a_pass_admitting_a_burst_reads_the_fleets_guard_state_once(make_harness):
    """Guard decisions are O(affected nodes): a pass that admits twelve disruptive steps reads
    which nodes are disrupted once and counts on from its own decisions, instead of reading
    the whole disrupted set again for every step (a burst was quadratic). The budget still
    admits exactly its size."""
    h = await make_harness(DISRUPT_FIRST, guards={"max_nodes": 10, "max_disruptive_runs": 50})
    for i in range(12):
        await h.post(alert_body(node=f"gpu-node-{i:02d}"))
    reads: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany):
        if "FROM disruptions" in statement and "DISTINCT" in statement:
            reads.append(statement)

    sa.event.listen(sa.Engine, "before_cursor_execute", count)
    try:
        assert await h.engine.tick()
    finally:
        sa.event.remove(sa.Engine, "before_cursor_execute", count)
    await h.settle()
    assert len(reads) == 1
    assert len(disrupted(h)) == 10
    assert len(await _held(h)) == 2


async def test_a_breaker_a_steps_outcome_trips_is_announced_though_its_next_step_is_held(
    make_harness,
):
    """The cordons follow their notes in the transactions that record the notes; the first
    trips the breaker and is held with the other. The trip is announced once, after that
    commit, like a trip in a pass (it rode on the engine and was said only if some later
    outcome's next step started)."""
    notifier = FakeNotifier()
    h = await make_harness(
        DISRUPTIVE, notifier=notifier, guards={"max_nodes": 5, "max_disruptive_runs": 1}
    )
    for i in range(2):
        await h.post(alert_body(node=f"gpu-node-{i:02d}"))
    await h.settle()
    assert disrupted(h) == []
    notes = [r for r in h.records() if r["kind"] == "apply" and r["label"].startswith("note-")]
    assert len(notes) == 2
    opened = [n for n in notifier.sent if n["data"]["event"] == "breaker_opened"]
    assert len(opened) == 1
    assert "circuit breaker opened" in opened[0]["message"]
