"""``/metrics``: counters from intake and the engine, and gauges read from the database at
scrape time (approvals waiting, breaker, node budget), on SQLite and Postgres."""

from __future__ import annotations

import json

import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from remediator.adapters.db import tables
from tests.conftest import am_fixture, am_payload

PLAYBOOK = """
name: needs-approval
match: {alertname: GPUXidError79}
steps:
  - {id: a, action: test.record, params: {label: a}, requires_approval: true}
"""


async def _scrape(harness) -> dict[str, float]:
    response = await harness.client.get("/metrics")
    assert response.status == 200
    samples = {}
    for family in text_string_to_metric_families(await response.text()):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


async def test_gauges_follow_the_database_at_scrape_time(make_harness, clock):
    harness = await make_harness(PLAYBOOK)
    before = await _scrape(harness)
    assert before["remediator_approvals_pending"] == 0
    assert before["remediator_approval_oldest_age_seconds"] == 0
    assert before["remediator_breaker_open"] == 0  # no guard_state row: closed
    assert before["remediator_budget_nodes_in_use"] == 0
    assert before["remediator_leader"] == 1  # the only replica

    body = am_fixture("GPUXidError79-firing-1alerts")
    response = await harness.post(body)
    assert response.status == 200
    await harness.settle()
    clock.advance(90)
    run_id = (await harness.runs())[0]["id"]
    now = clock()
    async with harness.components.db.write() as conn:
        await conn.execute(
            sa.insert(tables.guard_state).values(
                key="breaker", value={"open": True}, updated_at=now
            )
        )
        for node in ("gpu-node-01", "gpu-node-02"):
            await conn.execute(
                sa.insert(tables.disruptions).values(run_id=run_id, node=node, started_at=now)
            )

    after = await _scrape(harness)
    assert after["remediator_approvals_pending"] == 1
    assert after["remediator_approval_oldest_age_seconds"] == 90
    assert after["remediator_breaker_open"] == 1
    assert after["remediator_budget_nodes_in_use"] == 2
    assert after["remediator_alerts_received_total{status=firing}"] == 1
    assert after["remediator_deliveries_total"] == 1


async def test_runs_waiting_to_start_are_counted_by_what_they_wait_for(make_harness):
    """A run waits for approval on gpu-node-01 and keeps the node; a second alert for that
    node makes a run that waits for it."""
    harness = await make_harness(PLAYBOOK)
    assert (await _scrape(harness))["remediator_runs_waiting{waiting_for=node}"] == 0
    first = am_payload("GPUXidError79-firing-1alerts")
    second = json.loads(json.dumps(first))
    second["alerts"][0]["fingerprint"] = "0" * 16
    for body in (first, second):
        response = await harness.post(json.dumps(body).encode())
        assert response.status == 200
        await harness.settle()
    samples = await _scrape(harness)
    assert samples["remediator_runs_waiting{waiting_for=node}"] == 1
    assert samples["remediator_runs_waiting{waiting_for=slot}"] == 0
    assert samples["remediator_runs_waiting{waiting_for=gpu}"] == 0


async def test_rejected_deliveries_are_counted_by_reason(make_harness):
    harness = await make_harness(PLAYBOOK)
    response = await harness.post(b"{not json")
    assert response.status == 400
    samples = await _scrape(harness)
    rejected = {
        k: v for k, v in samples.items() if k.startswith("remediator_deliveries_rejected_total")
    }
    assert sum(rejected.values()) == 1


async def test_a_rejected_or_expired_run_counts_as_finished(make_harness, clock):
    harness = await make_harness(PLAYBOOK, approval_timeout=600)
    for fingerprint in ("a1", "b2"):
        payload = am_payload("GPUXidError79-firing-1alerts")
        payload["alerts"][0]["fingerprint"] = fingerprint
        payload["alerts"][0]["labels"]["node"] = f"gpu-node-{fingerprint}"
        assert (await harness.post(json.dumps(payload).encode())).status == 200
    await harness.settle()
    first, second = sorted(r["id"] for r in await harness.runs())
    step_id = (await harness.run_detail(first))["steps"][0]["id"]
    rejected = await harness.client.post(
        f"/api/v1/runs/{first}/steps/{step_id}/reject", json={"comment": "not now"}
    )
    assert rejected.status == 200
    samples = await _scrape(harness)
    assert samples["remediator_runs_total{playbook=needs-approval,state=rejected}"] == 1

    clock.advance(601)
    assert await harness.components.expire_approvals() == 1
    assert (await harness.run_detail(second))["status"] == "rejected"
    samples = await _scrape(harness)
    assert samples["remediator_runs_total{playbook=needs-approval,state=rejected}"] == 2


DISRUPTIVE = """
name: disrupt
match: {alertname: GPUXidError79}
steps:
  - {id: cordon, action: test.disrupt, params: {label: "{{ target.node }}"}}
"""


async def test_held_steps_are_counted_by_what_holds_them(make_harness, clock):
    """Two steps wait in line for a budget of one node, counted on the index of what they wait
    for; a change window holds a step of a playbook that has one, read from its output."""
    from tests.integration.engine.test_engine import alert_body

    window = {"days": ["tue"], "start": "02:00", "end": "04:00", "timezone": "UTC"}
    harness = await make_harness(
        DISRUPTIVE,
        DISRUPTIVE.replace("name: disrupt", "name: in-window").replace(
            "GPUXidError79", "GPUECCUncorrectableError"
        )
        + f"guards: {{change_windows: [{json.dumps(window)}]}}\n",
        guards={"max_nodes": 1, "max_disruptive_runs": 100},
    )
    for node in ("gpu-node-01", "gpu-node-02", "gpu-node-03"):
        assert (await harness.post(alert_body(node=node))).status == 200
    body = alert_body(node="gpu-node-04", alertname="GPUECCUncorrectableError")
    assert (await harness.post(body)).status == 200
    await harness.settle()
    samples = await _scrape(harness)
    assert samples["remediator_steps_held{reason=budget}"] == 2
    assert samples["remediator_steps_held{reason=change_window}"] == 1
    assert samples["remediator_steps_held{reason=breaker}"] == 0
