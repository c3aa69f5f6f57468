"""A manual run has one target: the node it locks, the guards count, the audit trail names and
its steps act on. An operator cannot hold one node and return another to service while an Xid
run holds it; and the uncordon action refuses a node another run holds even when its own run
does not hold the node."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import pytest

from remediator.sim import testing
from tests.integration.conftest import Harness
from tests.integration.operators.conftest import TOKENS, bearer, write_tokens
from tests.integration.playbooks.conftest import (
    MakeGpuHarness,
    cordoned,
    fixture,
    labels,
    statuses,
    step,
    taint_keys,
)
from tests.support.alerts import alert_body

pytestmark = pytest.mark.timeout(90)

NODE = "gpu-node-03"  # the node of the captured Xid alert
OTHER = "gpu-node-04"
RUNBOOK = "/api/v1/runbooks/return-node-to-service/runs"


async def _xid_run_waiting(h: Harness, sim: testing.RunningSim) -> dict[str, Any]:
    response = await h.post(fixture("GPUXidError79-firing-1alerts"), **bearer("alertmanager"))
    assert response.status == 200, await response.text()
    await h.settle()
    [run] = await _get(h, "/api/v1/runs", playbook="gpu-xid-error")
    detail: dict[str, Any] = await _get(h, f"/api/v1/runs/{run['id']}")
    assert statuses(detail)["drain"] == "waiting_approval", statuses(detail)
    _assert_out_of_service(sim)
    return detail


def _assert_out_of_service(sim: testing.RunningSim) -> None:
    assert cordoned(sim, NODE)
    assert labels(sim, NODE)["gpu-status"] == "faulty"
    assert "nvidia.com/gpu-unhealthy" in taint_keys(sim, NODE)


async def _get(h: Harness, path: str, **params: str) -> Any:
    response = await h.client.get(path, params=params, headers=bearer("root"))
    assert response.status == 200, await response.text()
    found = await response.json()
    return found.get("items", found)


async def _signed_in_csrf(h: Harness) -> str:
    login = await h.client.get("/runbooks/login")
    match = re.search(r'name="csrf" value="([^"]+)"', await login.text())
    assert match is not None
    signed = await h.client.post(
        "/runbooks/login",
        data={"token": TOKENS["olivia"][0], "csrf": match.group(1)},
        allow_redirects=False,
    )
    assert signed.status == 303
    page = await (await h.client.get("/runbooks")).text()
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match is not None
    return match.group(1)


async def test_a_runbook_naming_two_nodes_is_refused_naming_both_on_every_path(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, tmp_path: pathlib.Path
) -> None:
    h = await gpu_harness(tokens=write_tokens(tmp_path))
    await _xid_run_waiting(h, sim)
    body = {"node": OTHER, "params": {"node": NODE}}
    response = await h.client.post(RUNBOOK, json=body, headers=bearer("olivia"))
    assert response.status == 400, await response.text()
    error = (await response.json())["error"]
    assert error["code"] == "invalid"
    assert f"node '{OTHER}' and params.node '{NODE}' name different nodes" in error["message"]
    assert sorted(f["field"] for f in error["fields"]) == ["node", "params.node"]

    csrf = await _signed_in_csrf(h)
    form = {"csrf": csrf, "node": OTHER, "param.node": NODE}
    page = await h.client.post(
        "/runbooks/return-node-to-service/trigger", data=form, allow_redirects=False
    )
    assert page.status == 400, page.status
    text = await page.text()
    assert f"node &#x27;{OTHER}&#x27; and params.node &#x27;{NODE}&#x27;" in text
    assert "name different nodes" in text

    selector = {"selector": "nvidia.com/gpu.present=true", "params": {"node": NODE}}
    response = await h.client.post(RUNBOOK, json=selector, headers=bearer("olivia"))
    assert response.status == 400, await response.text()

    assert await _get(h, "/api/v1/runs", kind="manual") == []
    await h.settle()
    _assert_out_of_service(sim)


async def test_a_runbook_run_holds_audits_and_acts_on_the_one_node_it_names(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, tmp_path: pathlib.Path
) -> None:
    h = await gpu_harness(tokens=write_tokens(tmp_path))
    xid = await _xid_run_waiting(h, sim)
    # params.node alone: the run holds that node, so it waits for the Xid run to end.
    response = await h.client.post(
        RUNBOOK, json={"params": {"node": NODE}}, headers=bearer("olivia")
    )
    assert response.status == 201, await response.text()
    started = await response.json()
    assert started["node"] == NODE
    await h.settle()
    run = await _get(h, f"/api/v1/runs/{started['runId']}")
    assert (run["status"], run["node"], run["params"]["node"]) == ("pending", NODE, NODE)
    _assert_out_of_service(sim)
    audited = await _get(h, "/api/v1/audit/runs", node=NODE)
    assert {r["id"] for r in audited} == {xid["id"], started["runId"]}

    # node alone fills the runbook's node parameter: the run acts on the node it holds.
    response = await h.client.post(
        RUNBOOK, json={"node": OTHER, "dryRun": True}, headers=bearer("olivia")
    )
    assert response.status == 201, await response.text()
    dry = await _get(h, f"/api/v1/runs/{(await response.json())['runId']}")
    assert (dry["node"], dry["params"]["node"]) == (OTHER, OTHER)
    assert step(dry, "uncordon")["params"]["node"] == OTHER


HOLD = """
name: hold-node
match: {alertname: GPUXidError79}
steps:
  - {id: cordon, action: node.cordon}
  - {id: drain, action: test.record, params: {label: drain}, requires_approval: true}
"""

LOOSE = """
name: loose-uncordon
manual: true
exclusive: false
target: {require_node: false}
parameters:
  node: {type: string, required: true}
steps:
  - id: uncordon
    action: node.uncordon
    params: {node: "{{ params.node }}", only_if_cordoned_by_us: false}
"""


async def test_uncordon_refuses_a_node_another_run_holds(
    make_harness: Any, sim: testing.RunningSim
) -> None:
    kubernetes = {"mode": "url", "url": sim.url, "token": sim.token, "retry_max_seconds": 5.0}
    h = await make_harness(HOLD, LOOSE, kubernetes=kubernetes, guards={"max_percent": 50.0})
    response = await h.post(alert_body(node=NODE))
    assert response.status == 200, await response.text()
    await h.settle()
    [holder] = await h.runs(playbook="hold-node")
    assert holder["status"] == "waiting_approval"
    assert cordoned(sim, NODE)
    # Not exclusive: the run takes no node lock, so only the action's own check stands.
    response = await h.client.post(
        "/api/v1/runbooks/loose-uncordon/runs", json={"params": {"node": NODE}}
    )
    assert response.status == 201, await response.text()
    await h.settle()
    loose = await h.run_detail((await response.json())["runId"])
    assert loose["status"] == "failed", statuses(loose)
    uncordon = step(loose, "uncordon")
    assert uncordon["status"] == "failed"
    assert f"refused: node {NODE} is held by runs [{holder['id']}]" in uncordon["error"]
    assert cordoned(sim, NODE)
