"""The console's runs and audit views: filters, paging and export links with the same
filters; a filter that cannot be used is named and left out; auditors only for the trail."""

from __future__ import annotations

import html
import re

from tests.integration.operators.conftest import GATED, alert_body, bearer


async def _runs(h, nodes):
    for node in nodes:
        response = await h.post(alert_body(node=node), **bearer("alertmanager"))
        assert response.status == 200
        await h.settle()


async def test_runs_are_filtered_by_node_and_paged(make_harness, tokens_path, monkeypatch):
    from remediator.adapters.http import history

    monkeypatch.setattr(history, "PAGE_SIZE", 2)
    h = await make_harness(GATED, tokens=tokens_path)
    await _runs(h, ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"])
    page = await (await h.client.get("/runbooks/runs", headers=bearer("olivia"))).text()
    assert page.count('<tr class="run">') == 2
    older = html.unescape(re.search(r'id="older" href="([^"]+)"', page).group(1))
    assert older == "/runbooks/runs?before=3"
    rest = await (await h.client.get(older, headers=bearer("olivia"))).text()
    assert re.findall(r'<a href="/runbooks/runs/(\d+)">', rest) == ["2", "1"]
    assert 'id="exports"' not in page  # operators get no audit exports

    one = await h.client.get(
        "/runbooks/runs?node=gpu-node-03&status=&from=yesterday", headers=bearer("ada")
    )
    assert one.status == 200
    text = await one.text()
    assert re.findall(r'<a href="/runbooks/runs/(\d+)">', text) == ["3"]
    assert "from &#x27;yesterday&#x27; is not a time" in text
    assert 'value="gpu-node-03"' in text  # the form keeps the filter
    csv = html.unescape(re.search(r'id="export-csv" href="([^"]+)"', text).group(1))
    assert csv == "/api/v1/audit/export?node=gpu-node-03&format=csv"
    exported = await h.client.get(csv, headers=bearer("ada"))
    assert exported.status == 200
    assert "gpu-node-03" in await exported.text()


async def test_the_audit_view_filters_events_and_links_their_export(make_harness, tokens_path):
    h = await make_harness(GATED, tokens=tokens_path)
    await _runs(h, ["gpu-node-01", "gpu-node-02"])
    refused = await h.client.get("/runbooks/audit", headers=bearer("olivia"))
    assert refused.status == 403
    page = await (
        await h.client.get("/runbooks/audit?run=2&from=2026-01-01T00:00", headers=bearer("ada"))
    ).text()
    runs = set(re.findall(r'<a href="/runbooks/runs/(\d+)">run', page))
    assert runs == {"2"}
    jsonl = html.unescape(re.search(r'id="export-jsonl" href="([^"]+)"', page).group(1))
    assert jsonl == "/api/v1/audit/export?since=2026-01-01T00%3A00%3A00Z&run=2&format=jsonl"
    assert (await h.client.get(jsonl, headers=bearer("ada"))).status == 200
    wrong = await h.client.get("/runbooks/audit?run=x", headers=bearer("ada"))
    assert wrong.status == 400
