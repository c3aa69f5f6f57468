"""A notify step through the whole app: routed by the alert's labels to a PagerDuty channel,
linked to the console's run page, and resolved by its undo when the alert resolves."""

from __future__ import annotations

import pytest

from tests.support.alerts import alert_body
from tests.support.notify import RecordingServer

PAGE = """
name: page-on-xid
match: {alertname: GPUXidError79}
on_resolve: undo
steps:
  - id: page
    action: notify
    params: {message: "Xid 79 on {{ target.node }}"}
    undo: true
"""


@pytest.fixture
async def server(aiohttp_server) -> RecordingServer:
    return await RecordingServer().start(aiohttp_server)


async def test_a_routed_page_links_the_run_and_is_resolved_with_the_alert(make_harness, server):
    h = await make_harness(
        PAGE,
        external_url="https://remediator.example.test",
        notify_channels={
            "default": {"type": "slack", "url": server.url("/slack")},
            "on-call": {
                "type": "pagerduty",
                "url": server.url("/v2/enqueue"),
                "routing_key": "R0UTINGKEY0123456789",
            },
        },
        notify_routing={"routes": [{"matchers": ['severity="critical"'], "channel": "on-call"}]},
    )
    await h.post(alert_body(node="gpu-node-05"))
    await h.settle()
    [run] = await h.runs(playbook="page-on-xid")
    [trigger] = server.bodies("/v2/enqueue")
    assert trigger["event_action"] == "trigger"
    assert trigger["dedup_key"] == f"remediator-run-{run['id']}"
    assert trigger["payload"]["summary"] == "Xid 79 on gpu-node-05"
    assert trigger["payload"]["source"] == "gpu-node-05"
    assert trigger["payload"]["severity"] == "critical"
    run_page = f"https://remediator.example.test/runbooks/runs/{run['id']}"
    assert trigger["links"] == [{"href": run_page, "text": f"remediator run {run['id']}"}]
    assert (await h.client.get(f"/runbooks/runs/{run['id']}")).status == 200
    [step] = (await h.run_detail(run["id"]))["steps"]
    assert step["output"]["channel"] == "on-call"
    assert step["output"]["routed_by"] == 'route 1 (severity="critical")'
    assert "R0UTINGKEY" not in str(step["output"])

    await h.post(alert_body(node="gpu-node-05", status="resolved"))
    await h.settle()
    _, resolve = server.bodies("/v2/enqueue")
    assert resolve == {
        "routing_key": "R0UTINGKEY0123456789",
        "event_action": "resolve",
        "dedup_key": f"remediator-run-{run['id']}",
    }
    assert server.bodies("/slack") == []
