"""Links on the runbook pages come from alert payloads: only http(s) URLs become links."""

from __future__ import annotations

import json

from tests.integration.operators.conftest import GATED, alert_body, waiting_step


async def _page(h, generator: str, external: str) -> str:
    payload = json.loads(alert_body())
    payload["alerts"][0]["generatorURL"] = generator
    payload["externalURL"] = external
    assert (await h.post(json.dumps(payload).encode())).status == 200
    await h.settle()
    run_id, _ = await waiting_step(h)
    response = await h.client.get(f"/runbooks/runs/{run_id}")
    assert response.status == 200
    return await response.text()


async def test_a_javascript_url_from_an_alert_is_never_a_link(make_harness):
    h = await make_harness(GATED)
    page = await _page(h, "javascript:alert(document.cookie)", "JavaScript:alert(1)")
    assert "GPUXidError79" in page
    assert "javascript:" not in page.lower()
    assert ">graph</a>" not in page
    approvals = await (await h.client.get("/runbooks")).text()
    assert "GPUXidError79" in approvals
    assert "javascript:" not in approvals.lower()


async def test_http_urls_from_an_alert_are_links(make_harness):
    h = await make_harness(GATED)
    page = await _page(h, "http://prometheus.example:9090/graph?g0.expr=up", "https://am.example")
    assert (
        '<a href="http://prometheus.example:9090/graph?g0.expr=up" rel="noreferrer">graph' in page
    )
    assert '<a href="https://am.example/#/alerts?' in page
    approvals = await (await h.client.get("/runbooks")).text()
    assert '<a href="https://am.example/#/alerts?' in approvals
