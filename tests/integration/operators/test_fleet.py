"""The fleet view: ``GET /api/v1/fleet`` and ``/runbooks/fleet`` show the store's view of the
nodes (cordoned by a run, held steps), the budget and the breaker; an admin resets the breaker
from the page, an operator may not."""

from __future__ import annotations

import re

from remediator.domain import transitions
from remediator.engine import guarding
from tests.integration.operators.conftest import GATED, alert_body, bearer, waiting_step


async def _disrupted_and_held(h) -> int:
    assert (await h.post(alert_body(), **bearer("alertmanager"))).status == 200
    await h.settle()
    run_id, step_id = await waiting_step(h, bearer("root"))

    def work(tx):
        tx.record_disruption(run_id=run_id, node="gpu-node-03")
        guarding.open_breaker(tx, "6 disruptive runs within 0:10:00")
        step = tx.get_step(step_id)
        moved = tx.apply(transitions.approve(step, now=tx.now, actor="t", reason="t", data={}))
        tx.apply(
            transitions.hold(moved, until=tx.now, reason="circuit breaker is open", kind="breaker")
        )

    await h.store.run("test", work)
    return run_id


async def test_the_fleet_shows_a_cordoned_node_its_run_the_held_step_and_the_breaker(
    make_harness, tokens_path
):
    h = await make_harness(GATED, tokens=tokens_path)
    run_id = await _disrupted_and_held(h)
    response = await h.client.get("/api/v1/fleet", headers=bearer("ada"))
    assert response.status == 200
    body = await response.json()
    assert set(body) >= {"nodes", "budgets", "breaker", "held"}
    [node] = body["nodes"]
    assert node["name"] == "gpu-node-03"
    assert node["state"] == "held"
    assert node["runs"] == [run_id]
    assert set(node) >= {"name", "pool", "state", "runs", "cappedGpus", "labels", "cordoned"}
    assert body["budgets"] == [{"pool": None, "used": 1, "allowed": 2, "nodes": ["gpu-node-03"]}]
    assert body["breaker"]["open"] is True
    assert body["breaker"]["reason"].startswith("6 disruptive runs")
    [held] = body["held"]
    assert (held["run"], held["step"], held["node"]) == (run_id, "drain", "gpu-node-03")
    assert held["reason"] == "circuit breaker is open"

    page = await (await h.client.get("/runbooks/fleet", headers=bearer("olivia"))).text()
    assert 'id="node-gpu-node-03" data-state="held"' in page
    assert f'href="/runbooks/runs/{run_id}"' in page
    assert 'id="breaker-reset"' not in page  # operators see the breaker, admins reset it
    assert 'href="/runbooks/audit"' not in page  # the trail is the auditors'
    run_page = await (await h.client.get(f"/runbooks/runs/{run_id}", headers=bearer("ada"))).text()
    held_note = run_page.split('class="held-note"')[1].split("</p>")[0]
    assert "circuit breaker is open" in held_note
    assert 'href="/runbooks/audit"' in run_page
    refused = await h.client.post(
        "/runbooks/breaker/reset", data={"comment": "x", "csrf": "x"}, headers=bearer("olivia")
    )
    assert refused.status == 403


async def test_an_admin_resets_the_breaker_from_the_fleet_page(make_harness):
    h = await make_harness(GATED)
    await _disrupted_and_held(h)
    page = await (await h.client.get("/runbooks/fleet")).text()
    assert 'id="breaker-reset"' in page
    csrf = re.search(r'id="breaker-reset".*?name="csrf" value="([^"]+)"', page, re.S).group(1)
    response = await h.client.post(
        "/runbooks/breaker/reset",
        data={"comment": "storm understood", "csrf": csrf},
        allow_redirects=False,
    )
    assert response.status == 303
    after = await (await h.client.get(response.headers["Location"])).text()
    assert 'id="flash"' in after
    assert "storm understood" in after
    assert (await (await h.client.get("/api/v1/fleet")).json())["breaker"]["open"] is False
