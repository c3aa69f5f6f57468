from __future__ import annotations

import datetime as dt
import json
import re
import time
from unittest import mock

import pytest

from remediator.adapters.db import store as sql_store
from remediator.domain import runs
from remediator.engine import lifecycle
from tests.support.alerts import alert_body

TWO_STEPS = """
name: two-steps
match: {alertname: GPUXidError79}
on_resolve: cancel
steps:
  - {id: first, action: test.record, params: {label: one}}
  - {id: second, action: test.record, params: {label: two}}
"""


def applied(h):
    return [r["label"] for r in h.records() if r["kind"] == "apply"]


async def test_a_firing_alert_runs_every_step_in_order_and_audits_each_transition(make_harness):
    h = await make_harness(TWO_STEPS)
    await h.post(alert_body())
    await h.settle()
    [run] = await h.runs()
    assert run["status"] == "succeeded"
    assert run["node"] == "gpu-node-03"
    detail = await h.run_detail(run["id"])
    assert [s["status"] for s in detail["steps"]] == ["succeeded", "succeeded"]
    assert applied(h) == ["one", "two"]
    transitions = [(e["kind"], e["toStatus"]) for e in detail["events"]]
    assert transitions[0] == ("run.created", "pending")
    assert transitions[-1] == ("run.transition", "succeeded")
    assert transitions.count(("step.transition", "running")) == 2


async def test_temporary_failures_retry_at_a_persisted_time(make_harness, clock):
    h = await make_harness(
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
    await h.post(alert_body())
    await h.settle()
    [run] = await h.runs()
    step = (await h.run_detail(run["id"]))["steps"][0]
    assert step["status"] == "pending"
    assert step["attempt"] == 1
    assert step["dueAt"] == (clock.now + dt.timedelta(seconds=30)).isoformat()
    assert applied(h) == []
    clock.advance(29)
    await h.settle()
    assert applied(h) == []
    clock.advance(2)
    await h.settle()
    assert applied(h) == ["flaky"]
    assert (await h.run_detail(run["id"]))["status"] == "succeeded"


async def test_a_permanent_failure_stops_the_run_and_skips_the_rest(make_harness):
    h = await make_harness(
        """
        name: breaks
        match: {alertname: GPUXidError79}
        steps:
          - {id: a, action: test.record, params: {label: a, fail_permanently: true}}
          - {id: b, action: test.record, params: {label: b}}
        """
    )
    await h.post(alert_body())
    await h.settle()
    [run] = await h.runs()
    detail = await h.run_detail(run["id"])
    assert detail["status"] == "failed"
    assert [s["status"] for s in detail["steps"]] == ["failed", "skipped"]
    assert "fails for good" in detail["steps"][0]["error"]


async def test_on_failure_continue_goes_on_to_the_next_step_and_the_run_says_it_failed(
    make_harness,
):
    h = await make_harness(
        """
        name: tolerant
        match: {alertname: GPUXidError79}
        steps:
          - {id: a, action: test.record, params: {label: a, fail_permanently: true},
             on_failure: continue}
          - {id: b, action: test.record, params: {label: b}}
        """
    )
    await h.post(alert_body())
    await h.settle()
    [run] = await h.runs()
    detail = await h.run_detail(run["id"])
    assert [s["status"] for s in detail["steps"]] == ["failed", "succeeded"]
    assert detail["status"] == "failed"
    assert applied(h) == ["b"]


async def test_an_expired_lease_is_swept_and_the_effect_is_not_applied_twice(make_harness, clock):
    h = await make_harness(TWO_STEPS)
    await h.post(alert_body())
    await h.engine.handle_episodes()
    await h.engine.start_runs()
    await h.engine.advance_runs()
    # A worker claims the first step, applies its effect, then dies before recording it.
    [step] = await h.store.run(
        "test",
        lambda tx: [
            lifecycle.claim_step(tx, due, owner="dead-worker", lease_until=clock.now)
            for due in tx.lock_due_steps(1)
        ],
    )
    from tests.support import recording

    with h.record_path.open("a") as stream:
        stream.write(
            json.dumps(
                {
                    "kind": "apply",
                    "key": f"run-{step.run_id}-step-{step.id}",
                    "label": "one",
                    "pid": 0,
                }
            )
            + "\n"
        )
    clock.advance(1)
    await h.settle()
    detail = await h.run_detail(step.run_id)
    assert detail["status"] == "succeeded"
    first = detail["steps"][0]
    assert first["output"]["already_in_place"] is True
    assert first["attempt"] == 2
    assert applied(h) == ["one", "two"]
    reasons = [e["reason"] for e in detail["events"]]
    assert any("lease of dead-worker expired" in reason for reason in reasons)
    assert recording.read_records(h.record_path)


async def test_a_step_needing_approval_waits_and_runs_once_approved(make_harness):
    h = await make_harness(
        """
        name: gated
        match: {alertname: GPUXidError79}
        steps:
          - {id: safe, action: test.record, params: {label: safe}}
          - {id: risky, action: test.record, params: {label: risky}, requires_approval: true}
        """
    )
    await h.post(alert_body())
    await h.settle()
    [run] = await h.runs()
    detail = await h.run_detail(run["id"])
    assert detail["status"] == "waiting_approval"
    risky = detail["steps"][1]
    assert risky["status"] == "waiting_approval"
    assert applied(h) == ["safe"]
    url = f"/api/v1/runs/{run['id']}/steps/{risky['id']}/approve"
    missing = await h.client.post(url, json={})
    assert missing.status == 400
    response = await h.client.post(url, json={"comment": "drain approved"})
    assert response.status == 200
    again = await h.client.post(url, json={"comment": "again"})
    assert again.status == 409
    await h.settle()
    assert applied(h) == ["safe", "risky"]
    detail = await h.run_detail(run["id"])
    assert detail["status"] == "succeeded"
    approval = [e for e in detail["events"] if e["data"].get("decision") == "approved"]
    assert approval[0]["actor"] == "anonymous"
    assert approval[0]["reason"] == "drain approved"


async def test_rejection_ends_the_run_and_skips_what_is_left(make_harness):
    h = await make_harness(
        """
        name: gated
        match: {alertname: GPUXidError79}
        steps:
          - {id: risky, action: test.record, params: {label: risky}, requires_approval: true}
          - {id: after, action: test.record, params: {label: after}}
        """
    )
    await h.post(alert_body())
    await h.settle()
    [run] = await h.runs()
    risky = (await h.run_detail(run["id"]))["steps"][0]
    url = f"/api/v1/runs/{run['id']}/steps/{risky['id']}/reject"
    assert (await h.client.post(url, json={"comment": "not now"})).status == 200
    await h.settle()
    detail = await h.run_detail(run["id"])
    assert detail["status"] == "rejected"
    assert [s["status"] for s in detail["steps"]] == ["rejected", "skipped"]
    assert applied(h) == []


async def test_a_resolved_alert_cancels_a_pending_approval_and_never_runs_it(make_harness):
    h = await make_harness(
        """
        name: gated
        match: {alertname: GPUXidError79}
        on_resolve: cancel
        steps:
          - {id: drain, action: test.record, params: {label: drain}, requires_approval: true}
        """
    )
    await h.post(alert_body())
    await h.settle()
    [run] = await h.runs()
    drain = (await h.run_detail(run["id"]))["steps"][0]
    await h.post(alert_body(status="resolved"))
    await h.settle()
    url = f"/api/v1/runs/{run['id']}/steps/{drain['id']}/approve"
    assert (await h.client.post(url, json={"comment": "too late"})).status == 409
    await h.settle()
    detail = await h.run_detail(run["id"])
    assert detail["status"] == "cancelled"
    assert detail["steps"][0]["status"] == "cancelled"
    assert applied(h) == []


async def test_a_resolution_between_claim_and_start_never_starts_the_step(make_harness):
    h = await make_harness(TWO_STEPS)
    await h.post(alert_body())
    await h.engine.handle_episodes()
    await h.engine.start_runs()
    await h.engine.advance_runs()
    await h.post(alert_body(status="resolved"))
    # The resolution is stored but not yet handled; the due step must not be claimed.
    await h.engine.claim_steps()
    await h.settle()
    [run] = await h.runs()
    assert (await h.run_detail(run["id"]))["status"] == "cancelled"
    assert applied(h) == []


UNDOABLE = """
name: undoable
match: {alertname: GPUTemperatureHigh}
on_resolve: undo
exclusive: false
steps:
  - {id: cap, action: test.record, params: {label: cap}, undo: true}
  - {id: note, action: test.record, params: {label: note}, undo: true}
  - {id: last, action: test.record, params: {label: last}}
"""


async def test_resolution_runs_declared_undos_newest_first(make_harness):
    h = await make_harness(UNDOABLE)
    await h.post(alert_body(alertname="GPUTemperatureHigh"))
    await h.settle()
    await h.post(alert_body(alertname="GPUTemperatureHigh", status="resolved"))
    await h.settle()
    all_runs = await h.runs()
    undo = next(r for r in all_runs if r["kind"] == "undo")
    original = next(r for r in all_runs if r["kind"] == "alert")
    assert undo["parentRunId"] == original["id"]
    assert undo["status"] == "succeeded"
    undos = [r for r in h.records() if r["kind"] == "undo"]
    assert [u["applied"]["label"] for u in undos] == ["note", "cap"]
    steps = (await h.run_detail(original["id"]))["steps"]
    assert [s["status"] for s in steps] == ["undone", "undone", "succeeded"]
    # A repeated resolved delivery creates nothing more.
    await h.post(alert_body(alertname="GPUTemperatureHigh", status="resolved"))
    await h.settle()
    assert len(await h.runs()) == 2


async def test_one_active_run_per_node_makes_the_next_wait(make_harness):
    h = await make_harness(
        """
        name: gated
        match: {alertname: [GPUXidError79, GPUECCUncorrectableError]}
        steps:
          - {id: a, action: test.record, params: {label: "{{ alert.alertname }}"},
             requires_approval: true}
        """
    )
    await h.post(alert_body())
    await h.post(alert_body(alertname="GPUECCUncorrectableError"))
    await h.settle()
    statuses = {r["reason"]: r["status"] for r in await h.runs()}
    assert statuses == {
        "GPUXidError79 fired": "waiting_approval",
        "GPUECCUncorrectableError fired": "pending",
    }
    first = next(r for r in await h.runs() if r["status"] == "waiting_approval")
    step = (await h.run_detail(first["id"]))["steps"][0]
    await h.client.post(
        f"/api/v1/runs/{first['id']}/steps/{step['id']}/reject", json={"comment": "no"}
    )
    await h.settle()
    statuses = {r["reason"]: r["status"] for r in await h.runs()}
    assert statuses["GPUECCUncorrectableError fired"] == "waiting_approval"


async def test_a_refire_within_the_cooldown_starts_no_new_run(make_harness, clock):
    h = await make_harness(
        """
        name: cooling
        match: {alertname: GPUTemperatureHigh}
        cooldown: 10m
        steps:
          - {id: cap, action: test.record, params: {label: cap}}
        """
    )
    await h.post(alert_body(alertname="GPUTemperatureHigh", starts="2026-11-30T00:00:00Z"))
    await h.settle()
    clock.advance(300)
    await h.post(alert_body(alertname="GPUTemperatureHigh", starts="2026-11-30T00:05:00Z"))
    await h.settle()
    assert len(await h.runs()) == 1
    clock.advance(301)
    await h.post(alert_body(alertname="GPUTemperatureHigh", starts="2026-11-30T00:10:01Z"))
    await h.settle()
    assert len(await h.runs()) == 2
    assert applied(h) == ["cap", "cap"]


async def test_dry_run_records_the_plan_and_touches_nothing(make_harness):
    h = await make_harness(TWO_STEPS, dry_run=True)
    await h.post(alert_body())
    await h.settle()
    [run] = await h.runs()
    detail = await h.run_detail(run["id"])
    assert detail["dryRun"] is True
    assert detail["status"] == "succeeded"
    assert [s["output"]["dry_run"] for s in detail["steps"]] == [True, True]
    assert "would" in detail["steps"][0]["output"]
    assert applied(h) == []


async def test_an_alert_without_a_node_is_recorded_as_a_failed_run(make_harness):
    h = await make_harness(TWO_STEPS)
    body = json.loads(alert_body())
    del body["alerts"][0]["labels"]["node"]
    await h.post(json.dumps(body).encode())
    await h.settle()
    [run] = await h.runs()
    assert run["status"] == "failed"
    assert "no node label" in run["reason"]
    assert applied(h) == []


async def test_hostile_label_values_stay_data(make_harness):
    h = await make_harness(
        """
        name: echo
        match: {alertname: GPUXidError79}
        exclusive: false
        steps:
          - {id: a, action: test.record, params: {label: "{{ labels.pod }}"}}
        """
    )
    hostile = "$(reboot); `rm -rf /` {{ labels.node }}"
    await h.post(alert_body(extra_labels={"pod": hostile}))
    await h.settle()
    assert applied(h) == [hostile]


@pytest.mark.parametrize("count", [3])
async def test_each_episode_gets_its_own_run(make_harness, count):
    h = await make_harness(TWO_STEPS.replace("on_resolve: cancel", "exclusive: false"))
    for i in range(count):
        await h.post(alert_body(node=f"gpu-node-{i:02d}"))
    await h.settle()
    assert sorted(r["status"] for r in await h.runs()) == ["succeeded"] * count
    assert runs.RunStatus.SUCCEEDED.value == "succeeded"


async def test_a_disabled_step_is_recorded_as_skipped_and_never_runs(make_harness):
    h = await make_harness(
        """
        name: partly-disabled
        match: {alertname: GPUXidError79}
        steps:
          - {id: a, action: test.record, params: {label: a}}
          - {id: evict, action: test.record, params: {label: evict}, enabled: false}
        """
    )
    await h.post(alert_body())
    await h.settle()
    [run] = await h.runs()
    detail = await h.run_detail(run["id"])
    assert detail["status"] == "succeeded"
    assert [s["status"] for s in detail["steps"]] == ["succeeded", "skipped"]
    assert applied(h) == ["a"]


async def test_a_manual_run_records_its_principal_and_runs(make_harness):
    from remediator.engine import lifecycle

    h = await make_harness(
        """
        name: manual-check
        manual: true
        parameters:
          node: {type: string, required: true, pattern: "[a-z0-9-]+"}
        steps:
          - {id: a, action: test.record, params: {label: "{{ params.node }}"}}
        """
    )
    playbook = h.components.rules.index.get("manual-check")
    run_id = await h.store.run(
        "trigger",
        lambda tx: lifecycle.create_manual_run(
            tx,
            playbook,
            h.components.registry,
            params={"node": "gpu-node-01"},
            node="gpu-node-01",
            principal="alice",
            dry_run=False,
        ),
    )
    await h.settle()
    detail = await h.run_detail(run_id)
    assert detail["kind"] == "manual"
    assert detail["principal"] == "alice"
    assert detail["status"] == "succeeded"
    assert detail["events"][0]["actor"] == "alice"
    assert applied(h) == ["gpu-node-01"]


async def test_a_cooldown_per_gpu_lets_another_gpu_of_the_node_through(make_harness, clock):
    h = await make_harness(
        """
        name: per-gpu
        match: {alertname: GPUTemperatureHigh}
        cooldown: 10m
        cooldown_per: gpu
        exclusive: false
        steps:
          - {id: cap, action: test.record, params: {label: "{{ target.gpu }}"}}
        """
    )
    for gpu, minute in (("0", "00"), ("1", "01"), ("0", "02")):
        await h.post(
            alert_body(
                alertname="GPUTemperatureHigh",
                starts=f"2026-11-30T00:{minute}:00Z",
                fingerprint=f"{int(gpu) + 1:016x}" if minute != "02" else "f" * 16,
                extra_labels={"UUID": f"GPU-{gpu}"},
            )
        )
        await h.settle()
        clock.advance(60)
    assert sorted(applied(h)) == ["GPU-0", "GPU-1"]


@pytest.mark.parametrize("budget", [0.0, 60.0])
async def test_an_engine_batch_gives_way_to_a_waiting_webhook_commit(make_harness, budget):
    """Once it has held SQLite's writer for ``YIELD_AFTER`` (here 0, or a minute), a batch
    commits what it did and leaves the rest to the next pass; before that it goes on (giving
    way after every single item kept the engine behind under steady webhook traffic)."""
    h = await make_harness(TWO_STEPS)
    for node in ("gpu-node-01", "gpu-node-02", "gpu-node-03"):
        await h.post(alert_body(node=node))
    db = h.store.db
    lock = db._write_lock
    if lock is not None:
        lock.urgent_waiting += 1  # as while a webhook commit waits for SQLite's one writer
    try:
        with mock.patch.object(sql_store, "YIELD_AFTER", budget):
            assert await h.engine.handle_episodes()
        created_first = len(await h.runs())
    finally:
        if lock is not None:
            lock.urgent_waiting -= 1
    if db.is_sqlite and budget == 0:
        # One episode per transaction while the webhook waits; the rest on later passes.
        assert created_first == 1
        assert await h.engine.handle_episodes()
        assert len(await h.runs()) == 3
    else:
        # within its budget (or on Postgres, whose writers do not queue behind each other)
        assert created_first == 3
    assert not await h.engine.handle_episodes()


async def test_a_transaction_that_gave_way_gives_the_next_one_longer(make_harness):
    """Under more webhook traffic than short passes keep up with, every pass gave way, and
    each cut pass cost the next a probe and a transaction of its own: the engine's CPU an
    alert rose as it fell behind. A transaction that gave way doubles the next one's time
    (up to four times), and one that did not ask, or was not told to, brings it back."""
    h = await make_harness(TWO_STEPS)
    store, db = h.store, h.store.db
    budgets: list[float] = []

    def work(tx, *, hold: float = 0.0, ask: bool = True):
        budgets.append(tx.yield_after)
        time.sleep(hold)
        return tx.should_yield() if ask else None

    lock = db._write_lock
    if lock is not None:
        lock.urgent_waiting += 1  # as while a webhook commit waits for SQLite's one writer
    try:
        with mock.patch.object(sql_store, "YIELD_AFTER", 0.05):
            gave_way = [await store.run("pass", lambda tx: work(tx, hold=0.25)) for _ in range(4)]
            await store.run("finish", lambda tx: work(tx, ask=False))  # asks nothing: no change
            # 0.1 s is past the base time, within the lengthened one
            within = await store.run("pass", lambda tx: work(tx, hold=0.1))
            await store.run("pass", lambda tx: work(tx))
    finally:
        if lock is not None:
            lock.urgent_waiting -= 1
    if db.is_sqlite:
        assert gave_way == [True] * 4
        assert within is False
        assert budgets == pytest.approx([0.05, 0.1, 0.2, 0.2, 0.2, 0.2, 0.05])
    else:  # Postgres's writers do not queue behind each other: nothing waits, nothing gives way
        assert gave_way == [False] * 4
        assert budgets == pytest.approx([0.05] * 7)


async def test_each_stage_reads_its_runs_context_in_batch_not_per_run(make_harness):
    """When passes split (a webhook waits), the next stage finds runs it did not create: it
    reads their steps, episodes and runs a few statements for the lot, not one per run."""
    import sqlalchemy as sa

    h = await make_harness(TWO_STEPS.replace("on_resolve: cancel", "exclusive: false"))
    for i in range(4):
        await h.post(alert_body(node=f"gpu-node-{i:02d}"))
    one_by_one: list[str] = []
    by_id = re.compile(r"WHERE (runs\.id|alert_episodes\.id|steps\.run_id) = (\?|%\(|\$)")

    def seen(conn, cursor, statement, *args):
        found = by_id.search(" ".join(statement.split()))
        if found and statement.lstrip().startswith("SELECT"):
            one_by_one.append(found[1])

    assert await h.engine.handle_episodes()
    sa.event.listen(sa.Engine, "before_cursor_execute", seen)
    try:
        assert await h.engine.start_runs()  # each stage in its own transaction
        assert await h.engine.advance_runs()
        assert await h.engine.claim_steps()
    finally:
        sa.event.remove(sa.Engine, "before_cursor_execute", seen)
    await h.settle()
    assert one_by_one == []
    assert sorted(r["status"] for r in await h.runs()) == ["succeeded"] * 4
