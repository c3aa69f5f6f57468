"""Separation of duties: the principal whose token delivered an alert does not approve the run
it started."""

from __future__ import annotations

from tests.integration.operators.conftest import (
    GATED,
    alert_body,
    bearer,
    detail,
    waiting_step,
    write_tokens,
)

# A token that may both deliver alerts and operate (one Alertmanager token reused by people).
BOTH = {"am-ops": ["ingest", "operator"]}


def both_headers() -> dict[str, str]:
    return {"Authorization": "Bearer am-ops-token-padding-000000"}


async def test_the_principal_who_delivered_the_alert_cannot_approve_its_run(make_harness, tmp_path):
    h = await make_harness(GATED, tokens=write_tokens(tmp_path, BOTH))
    response = await h.post(alert_body(), **both_headers())
    assert response.status == 200, await response.text()
    await h.settle()
    run_id, step_id = await waiting_step(h, bearer("olivia"))
    url = f"/api/v1/runs/{run_id}/steps/{step_id}/approve"
    own = await h.client.post(url, json={"comment": "mine"}, headers=both_headers())
    assert own.status == 403, await own.text()
    error = (await own.json())["error"]
    assert error["code"] == "forbidden"
    assert f"am-ops delivered the alert that started run {run_id}" in error["message"]
    await h.settle()
    assert (await detail(h, run_id))["status"] == "waiting_approval"
    other = await h.client.post(url, json={"comment": "checked"}, headers=bearer("olivia"))
    assert other.status == 200, await other.text()
    await h.settle()
    found = await detail(h, run_id)
    assert found["status"] == "succeeded"
    assert [a["principal"] for a in found["approvals"]] == ["olivia"]


async def test_the_alert_sender_may_approve_when_the_rule_is_off(make_harness, tmp_path):
    h = await make_harness(
        GATED, tokens=write_tokens(tmp_path, BOTH), approval_forbid_alert_sender=False
    )
    await h.post(alert_body(), **both_headers())
    await h.settle()
    run_id, step_id = await waiting_step(h, bearer("olivia"))
    url = f"/api/v1/runs/{run_id}/steps/{step_id}/approve"
    own = await h.client.post(url, json={"comment": "mine"}, headers=both_headers())
    assert own.status == 200, await own.text()
    await h.settle()
    assert (await detail(h, run_id))["status"] == "succeeded"


async def test_without_tokens_anonymous_deliveries_do_not_block_anonymous_approvals(
    make_harness,
):
    h = await make_harness(GATED)
    await h.post(alert_body())
    await h.settle()
    run_id, step_id = await waiting_step(h)
    url = f"/api/v1/runs/{run_id}/steps/{step_id}/approve"
    response = await h.client.post(url, json={"comment": "ok"})
    assert response.status == 200, await response.text()
