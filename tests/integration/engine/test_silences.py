from __future__ import annotations

import json

import httpx
import respx

from tests.integration.engine.test_engine import alert_body

AM = "http://alertmanager.test:9093"

SILENCING = """
name: silencing
match: {alertname: GPUXidError79}
silence: {duration: 1h, labels: [node, alertname]}
steps:
  - {id: cordon, action: test.disrupt, params: {label: cordon}}
  - {id: wait, action: test.record, params: {label: wait}, requires_approval: true}
"""


async def test_a_disruptive_run_silences_its_node_until_it_ends(make_harness):
    with respx.mock(assert_all_called=False) as am:
        created = am.post(f"{AM}/api/v2/silences").mock(
            return_value=httpx.Response(200, json={"silenceID": "s-1"})
        )
        expired = am.delete(f"{AM}/api/v2/silence/s-1").mock(return_value=httpx.Response(200))
        am.route(host="127.0.0.1").pass_through()
        h = await make_harness(SILENCING, alertmanager_url=AM)
        await h.post(alert_body())
        await h.settle()
        assert created.call_count == 1
        body = json.loads(created.calls.last.request.content)
        assert body["matchers"] == [
            {"name": "alertname", "value": "GPUXidError79", "isRegex": False, "isEqual": True},
            {"name": "node", "value": "gpu-node-03", "isRegex": False, "isEqual": True},
        ]
        assert body["createdBy"] == "remediator"
        assert expired.call_count == 0
        [run] = await h.runs()
        step = (await h.run_detail(run["id"]))["steps"][1]
        await h.client.post(
            f"/api/v1/runs/{run['id']}/steps/{step['id']}/reject", json={"comment": "no"}
        )
        await h.settle()
        assert expired.call_count == 1
        kinds = [e["kind"] for e in (await h.run_detail(run["id"]))["events"]]
        assert "silence.created" in kinds
        assert "silence.expired" in kinds


async def test_an_unreachable_alertmanager_does_not_stop_the_run(make_harness):
    with respx.mock(assert_all_called=False) as am:
        am.post(f"{AM}/api/v2/silences").mock(return_value=httpx.Response(503))
        am.route(host="127.0.0.1").pass_through()
        h = await make_harness(
            SILENCING.replace(", requires_approval: true", ""), alertmanager_url=AM
        )
        await h.post(alert_body())
        await h.settle()
        [run] = await h.runs()
        assert run["status"] == "succeeded"
