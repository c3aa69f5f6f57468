"""The console's run page: the decision first (alert, waiting step, Approve / Reject with a
comment), a confirmation after deciding, approvals only where a step needs them."""

from __future__ import annotations

import re

from tests.integration.operators.conftest import GATED, alert_body, waiting_step


def _csrf(text: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', text)
    assert found is not None
    return found.group(1)


async def test_the_run_page_opens_on_the_decision_and_confirms_it(make_harness):
    h = await make_harness(GATED)
    assert (await h.post(alert_body())).status == 200
    await h.settle()
    run_id, step_id = await waiting_step(h)
    page = await (await h.client.get(f"/runbooks/runs/{run_id}")).text()
    first = page.index('id="first-screen"')
    assert first < page.index('id="timeline"')
    assert 'id="alertname">GPUXidError79' in page
    note, drain = page.split('id="steps"')[1].split('<tr id="step-')[1:3]
    assert " of 1" not in note  # a step that needs no approval shows none
    assert "0 of 1" in drain
    assert "0 of 1 approvals" in page.split('id="decision"')[1]
    assert "<time datetime=" in page
    assert 'formaction="/runbooks/runs/' in page

    response = await h.client.post(
        f"/runbooks/runs/{run_id}/steps/{step_id}/approve",
        data={"comment": "looks right", "csrf": _csrf(page)},
        allow_redirects=False,
    )
    assert response.status == 303
    assert response.headers["Location"] == f"/runbooks/runs/{run_id}?decided={step_id}"
    after = await (await h.client.get(response.headers["Location"])).text()
    flash = after.split('id="flash"')[1].split("</div>")[0]
    assert "You approved step <strong>drain</strong>" in flash
    assert "looks right" in flash
    assert 'class="decision"' not in after
    events = after.split('id="events"')[1]
    assert "approval" in events


async def test_the_run_page_says_what_a_run_that_has_not_started_waits_for(make_harness):
    """A second alert for a node whose run waits for approval (and keeps the node): its run
    waits for that run, and its page says so, linking the node's runs."""
    h = await make_harness(GATED)
    assert (await h.post(alert_body())).status == 200
    await h.settle()
    holder, _ = await waiting_step(h)
    assert (await h.post(alert_body(fingerprint="0" * 15 + "2"))).status == 200
    await h.settle()
    runs = (await (await h.client.get("/api/v1/runs")).json())["items"]
    waiting = {run["id"]: run["waitingFor"] for run in runs}
    [behind] = set(waiting) - {holder}
    assert waiting == {holder: None, behind: "node:gpu-node-03"}

    page = await (await h.client.get(f"/runbooks/runs/{behind}")).text()
    note = page.split('id="decision"')[1].split('class="waiting-note"')[1].split("</p>")[0]
    holds = f'<a href="/runbooks/runs/{holder}">run {holder}</a> holds node'
    assert f"{holds} <strong>gpu-node-03</strong>" in note
    assert 'href="/runbooks/runs?node=gpu-node-03"' in note
    detail = await (await h.client.get(f"/api/v1/runs/{behind}")).json()
    assert (detail["waitingFor"], detail["waitingBehind"]) == ("node:gpu-node-03", holder)
    held = await (await h.client.get(f"/runbooks/runs/{holder}")).text()
    assert 'class="waiting-note"' not in held
