"""Approvals are guarded transitions: one winner, distinct principals, expiry, no self-approval."""

from __future__ import annotations

import asyncio

from remediator.adapters.db import queries
from tests.integration.operators.conftest import (
    GATED,
    MANUAL,
    TWO_PERSON,
    alert_body,
    bearer,
    detail,
    waiting_step,
    write_tokens,
)


def applied(h, label):
    return [r for r in h.records() if r["kind"] == "apply" and r["label"] == label]


def events(run, **match):
    return [e for e in run["events"] if all(e.get(k) == v for k, v in match.items())]


async def test_ten_concurrent_approvals_make_one_transition_and_one_execution(
    make_harness, tmp_path
):
    operators = {f"op{n}": ["operator"] for n in range(10)}
    tokens = write_tokens(tmp_path, operators)
    h = await make_harness(GATED, tokens=tokens)
    await h.post(alert_body(), **bearer("alertmanager"))
    await h.settle()
    run_id, step_id = await waiting_step(h, bearer("olivia"))
    url = f"/api/v1/runs/{run_id}/steps/{step_id}/approve"

    async def approve(name):
        headers = {"Authorization": f"Bearer {name}-token-padding-000000"}
        response = await h.client.post(url, json={"comment": f"go ({name})"}, headers=headers)
        return response.status

    statuses = await asyncio.gather(*(approve(name) for name in operators))
    assert sorted(statuses) == [200] + [409] * 9
    await h.settle()
    assert len(applied(h, "drain")) == 1
    found = await detail(h, run_id)
    assert found["status"] == "succeeded"
    moved = events(found, kind="step.transition", stepId=step_id, toStatus="pending")
    assert len(moved) == 1
    assert len(found["approvals"]) == 1


async def test_two_person_rule_needs_two_distinct_principals(make_harness, tokens_path):
    h = await make_harness(TWO_PERSON, tokens=tokens_path)
    await h.post(alert_body(), **bearer("alertmanager"))
    await h.settle()
    run_id, step_id = await waiting_step(h, bearer("olivia"))
    url = f"/api/v1/runs/{run_id}/steps/{step_id}/approve"
    first = await h.client.post(url, json={"comment": "one"}, headers=bearer("olivia"))
    assert first.status == 200
    assert (await first.json())["status"] == "waiting_approval"
    again = await h.client.post(url, json={"comment": "me again"}, headers=bearer("olivia"))
    assert again.status == 409
    await h.settle()
    assert applied(h, "drain") == []
    second = await h.client.post(url, json={"comment": "two"}, headers=bearer("oscar"))
    assert second.status == 200
    assert (await second.json())["status"] == "pending"
    await h.settle()
    assert len(applied(h, "drain")) == 1
    found = await detail(h, run_id)
    assert [a["principal"] for a in found["approvals"]] == ["olivia", "oscar"]
    [moved] = events(found, kind="step.transition", toStatus="pending")
    assert moved["actor"] == "oscar"
    assert moved["data"]["approvers"] == ["olivia", "oscar"]
    [partial] = events(found, kind="step.approval")
    assert partial["actor"] == "olivia"


async def test_the_principal_who_triggered_a_manual_run_cannot_approve_it(
    make_harness, tokens_path
):
    h = await make_harness(MANUAL, tokens=tokens_path)
    response = await h.client.post(
        "/api/v1/runbooks/return-to-service/runs",
        json={"node": "gpu-node-07", "params": {"reason": "repaired"}},
        headers=bearer("olivia"),
    )
    assert response.status == 201, await response.text()
    await h.settle()
    run_id, step_id = await waiting_step(h, bearer("olivia"))
    url = f"/api/v1/runs/{run_id}/steps/{step_id}/approve"
    own = await h.client.post(url, json={"comment": "mine"}, headers=bearer("olivia"))
    assert own.status == 403
    assert (await own.json())["error"]["code"] == "forbidden"
    other = await h.client.post(url, json={"comment": "checked"}, headers=bearer("oscar"))
    assert other.status == 200
    await h.settle()
    found = await detail(h, run_id)
    assert found["status"] == "succeeded"
    assert found["principal"] == "olivia"
    assert events(found, kind="run.created")[0]["actor"] == "olivia"
    assert [r["label"] for r in h.records() if r["kind"] == "apply"] == ["back repaired"]


async def test_an_approval_after_the_step_moved_is_a_conflict(make_harness, tokens_path):
    h = await make_harness(GATED, tokens=tokens_path)
    await h.post(alert_body(), **bearer("alertmanager"))
    await h.settle()
    run_id, step_id = await waiting_step(h, bearer("olivia"))
    base = f"/api/v1/runs/{run_id}/steps/{step_id}"
    reject = await h.client.post(f"{base}/reject", json={"comment": "no"}, headers=bearer("oscar"))
    assert reject.status == 200
    late = await h.client.post(f"{base}/approve", json={"comment": "yes"}, headers=bearer("olivia"))
    assert late.status == 409
    await h.settle()
    assert applied(h, "drain") == []
    assert (await detail(h, run_id))["status"] == "rejected"


async def test_an_expired_approval_rejects_the_run_by_default(make_harness, clock):
    h = await make_harness(GATED, approval_timeout=600)
    await h.post(alert_body())
    await h.settle()
    run_id, step_id = await waiting_step(h)
    clock.advance(599)
    assert await h.components.expire_approvals() == 0
    clock.advance(2)
    assert await h.components.expire_approvals() == 1
    await h.settle()
    found = await detail(h, run_id)
    assert found["status"] == "rejected"
    [expired] = events(found, kind="step.transition", stepId=step_id)[-1:]
    assert expired["toStatus"] == "rejected"
    assert expired["actor"] == "engine"
    assert expired["data"]["decision"] == "expired"
    late = await h.client.post(
        f"/api/v1/runs/{run_id}/steps/{step_id}/approve", json={"comment": "too late"}
    )
    assert late.status == 409
    assert applied(h, "drain") == []


async def test_expiry_can_cancel_instead(make_harness, clock):
    h = await make_harness(GATED, approval_timeout=60, approval_expiry_outcome="cancel")
    await h.post(alert_body())
    await h.settle()
    run_id, _ = await waiting_step(h)
    clock.advance(61)
    assert await h.components.expire_approvals() == 1
    await h.settle()
    found = await detail(h, run_id)
    assert found["status"] == "cancelled"
    assert [s["status"] for s in found["steps"]] == ["succeeded", "cancelled"]


async def test_more_waiting_approvals_than_listed_are_counted(make_harness, monkeypatch):
    """The oldest are listed and every one counted, on the API and the console's page (a
    list cut at its limit read as if it were all)."""
    monkeypatch.setattr(queries, "APPROVALS_SHOWN", 2)
    monkeypatch.setattr(queries, "PENDING_APPROVALS", queries.PENDING_APPROVALS.limit(2))
    h = await make_harness(GATED)
    for node in ("gpu-node-01", "gpu-node-02", "gpu-node-03"):
        assert (await h.post(alert_body(node=node, fingerprint=node))).status == 200
    await h.settle()
    answer = await (await h.client.get("/api/v1/approvals")).json()
    assert answer["total"] == 3
    assert [item["run"]["node"] for item in answer["items"]] == ["gpu-node-01", "gpu-node-02"]
    page = await (await h.client.get("/runbooks")).text()
    assert page.count('<tr class="pending-approval">') == 2
    assert "The oldest 2 of 3 steps waiting for approval are shown." in page


async def test_a_resolved_alert_withdraws_the_pending_approval(make_harness):
    h = await make_harness(GATED)
    await h.post(alert_body())
    await h.settle()
    run_id, step_id = await waiting_step(h)
    await h.post(alert_body(status="resolved"))
    await h.settle()
    assert (await h.client.get("/api/v1/approvals")).status == 200
    assert (await (await h.client.get("/api/v1/approvals")).json())["items"] == []
    late = await h.client.post(
        f"/api/v1/runs/{run_id}/steps/{step_id}/approve", json={"comment": "late"}
    )
    assert late.status == 409
    assert (await detail(h, run_id))["status"] == "cancelled"
