"""Manual runbooks for one node or for every GPU node a selector matches."""

from __future__ import annotations

import pytest

from remediator.sim import testing

RUNBOOK = """
name: check-node
manual: true
target: {require_node: false}
parameters:
  node: {type: string, required: true, pattern: "[a-z0-9-]+"}
steps:
  - {id: check, action: node.check_operator_pods, params: {node: "{{ params.node }}"}}
"""


@pytest.fixture
async def sim():
    async with testing.running_sim() as running:
        yield running


async def test_a_selector_starts_one_run_per_matching_gpu_node(make_harness, sim):
    h = await make_harness(RUNBOOK, kubernetes={"mode": "url", "url": sim.url, "token": sim.token})
    response = await h.client.post(
        "/api/v1/runbooks/check-node/runs",
        json={"selector": "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"},
    )
    assert response.status == 201, await response.text()
    started = await response.json()
    assert [run["node"] for run in started["runs"]] == ["gpu-node-01", "gpu-node-02", "gpu-node-03"]
    await h.settle()
    runs = await h.runs(kind="manual")
    assert sorted(r["node"] for r in runs) == ["gpu-node-01", "gpu-node-02", "gpu-node-03"]
    assert {r["principal"] for r in runs} == {"anonymous"}
    assert {r["params"]["node"] for r in runs} == {"gpu-node-01", "gpu-node-02", "gpu-node-03"}


async def test_a_node_parameter_names_the_node_the_run_holds(make_harness, sim):
    h = await make_harness(RUNBOOK, kubernetes={"mode": "url", "url": sim.url, "token": sim.token})
    response = await h.client.post(
        "/api/v1/runbooks/check-node/runs", json={"params": {"node": "gpu-node-04"}}
    )
    assert response.status == 201
    run = (await h.runs(kind="manual"))[0]
    assert run["node"] == "gpu-node-04"


async def test_a_selector_matching_nothing_or_with_a_node_is_refused(make_harness, sim):
    h = await make_harness(RUNBOOK, kubernetes={"mode": "url", "url": sim.url, "token": sim.token})
    none = await h.client.post("/api/v1/runbooks/check-node/runs", json={"selector": "pool=none"})
    assert none.status == 400
    both = await h.client.post(
        "/api/v1/runbooks/check-node/runs", json={"selector": "a=b", "node": "gpu-node-01"}
    )
    assert both.status == 400
    hostile = await h.client.post(
        "/api/v1/runbooks/check-node/runs", json={"selector": "a=$(reboot)"}
    )
    assert hostile.status == 400
    assert await h.runs() == []


LOOSE = """
name: check-any
manual: true
target: {require_node: false}
parameters:
  node: {type: string, required: true}
steps:
  - {id: check, action: node.check_operator_pods, params: {node: "{{ params.node }}"}}
"""


@pytest.mark.parametrize("end", ["\n", "\r"])
async def test_a_node_with_a_line_end_is_refused_naming_the_field(make_harness, sim, end):
    kubernetes = {"mode": "url", "url": sim.url, "token": sim.token}
    h = await make_harness(RUNBOOK, LOOSE, kubernetes=kubernetes)
    node = "gpu-node-01" + end
    for body, field in (({"node": node}, "node"), ({"params": {"node": node}}, "params.node")):
        response = await h.client.post("/api/v1/runbooks/check-node/runs", json=body)
        assert response.status == 400, await response.text()
        error = (await response.json())["error"]
        assert error["code"] == "invalid"
        assert [f["field"] for f in error["fields"]] == [field]
    # A node parameter without a pattern of its own is the run's node all the same: checked
    # as one before anything is stored.
    response = await h.client.post(
        "/api/v1/runbooks/check-any/runs", json={"params": {"node": node}}
    )
    assert response.status == 400, await response.text()
    error = (await response.json())["error"]
    assert [f["field"] for f in error["fields"]] == ["params.node"]
    assert "is not a Kubernetes node name" in error["message"]
    assert await h.runs() == []
