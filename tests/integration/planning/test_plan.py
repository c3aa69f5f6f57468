"""Plans read live state from the simulator through the real client and change nothing."""

from __future__ import annotations

import json
import time

import pytest

from remediator.sim import testing
from tests.conftest import am_fixture

PLAYBOOK = """
name: hot-then-drain
match: {alertname: GPUTemperatureHigh}
steps:
  - id: cap
    action: gpu.power_cap
    params: {percent_of_default: 70}
  - id: drain
    action: node.drain
    params: {ignore_daemonsets: true, delete_emptydir_data: true, timeout_seconds: 60}
    requires_approval: true
"""


@pytest.fixture
async def sim():
    async with testing.running_sim() as running:
        yield running


async def test_a_plan_shows_gpus_pods_blocking_budgets_and_guards_without_changing_anything(
    make_harness, sim
):
    h = await make_harness(
        PLAYBOOK,
        kubernetes={"mode": "url", "url": sim.url, "token": sim.token},
        guards={"max_nodes": 1},
    )
    limits_before = [sim.gpu("gpu-node-01", i).power_limit for i in range(2)]
    response = await h.client.post(
        "/api/v1/plan",
        data=am_fixture("GPUTemperatureHigh-firing-2alerts"),
        headers={"Content-Type": "application/json"},
    )
    assert response.status == 200, await response.text()
    [first, _] = (await response.json())["alerts"]
    [playbook] = first["playbooks"]
    assert playbook["node"] == "gpu-node-01"
    cap, drain = playbook["steps"]
    gpus = cap["preview"]["state"]["gpus"]
    assert len(gpus) == 1
    assert gpus[0]["uuid"] == "GPU-659ac159-c80d-597b-9774-44ba7b02381d"
    assert gpus[0]["current_limit"] == 700.0
    assert gpus[0]["set_limit"] == 490.0
    assert cap["disruptive"] is False
    preview = drain["preview"]
    assert "ml-training/llama-finetune-0" in preview["evict"]
    assert any(key.startswith("gpu-operator/") for key in preview["skipped"])
    assert drain["requiresApproval"] is True
    assert drain["guard"] == {"go": True, "reason": "within budget: 1 of 1 nodes"}
    # Nothing changed: no run, the node schedulable, the limits as they were.
    assert await h.runs() == []
    assert sim.node("gpu-node-01")["spec"].get("unschedulable") in (None, False)
    assert [sim.gpu("gpu-node-01", i).power_limit for i in range(2)] == limits_before


async def test_a_waiting_run_has_a_plan_for_its_remaining_steps(make_harness, sim):
    h = await make_harness(PLAYBOOK, kubernetes={"mode": "url", "url": sim.url, "token": sim.token})
    await h.post(am_fixture("GPUTemperatureHigh-firing-2alerts"))
    await h.settle()
    runs = await h.runs()
    waiting = [r for r in runs if r["status"] == "waiting_approval"]
    assert waiting
    response = await h.client.get(f"/api/v1/runs/{waiting[0]['id']}/plan")
    assert response.status == 200
    plan = await response.json()
    steps = {s["key"]: s for s in plan["steps"]}
    assert steps["cap"]["status"] == "succeeded"
    assert steps["drain"]["status"] == "waiting_approval"
    assert steps["drain"]["preview"]["evict"]
    assert (await h.client.get("/api/v1/runs/999/plan")).status == 404


async def test_a_plan_refuses_what_is_not_a_payload(make_harness):
    h = await make_harness(PLAYBOOK)
    response = await h.client.post(
        "/api/v1/plan", data=b'{"alerts": 1}', headers={"Content-Type": "application/json"}
    )
    assert response.status == 400
    assert (await response.json())["error"]["fields"]


async def test_a_plan_of_more_alerts_than_a_plan_takes_is_refused_at_once(make_harness):
    """Every alert is planned with a guard verdict from the database and each step previewed:
    a body of 1,000 alerts, within the 1 MiB limit, kept one reader's request busy for half a
    minute."""
    h = await make_harness(PLAYBOOK)
    payload = json.loads(am_fixture("GPUTemperatureHigh-firing-2alerts"))
    alert = payload["alerts"][0]
    payload["alerts"] = [
        alert | {"fingerprint": f"{n:016x}", "labels": alert["labels"] | {"node": f"n{n}"}}
        for n in range(500)
    ]
    started = time.monotonic()
    response = await h.client.post(
        "/api/v1/plan", data=json.dumps(payload), headers={"Content-Type": "application/json"}
    )
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["fields"] == [
        {"field": "alerts", "message": "at most 20 alerts per plan, got 500"}
    ]
    assert time.monotonic() - started < 2
    payload["alerts"] = payload["alerts"][:20]
    response = await h.client.post(
        "/api/v1/plan", data=json.dumps(payload), headers={"Content-Type": "application/json"}
    )
    assert response.status == 200, await response.text()
    assert len((await response.json())["alerts"]) == 20


LABEL_PLAYBOOK = """
name: mark-hot
match: {alertname: GPUTemperatureHigh}
steps:
  - id: mark
    action: node.label
    params: {labels: {nvidia.com/mig.strategy: mixed, remediator.io/hot: "true"}}
"""


async def _plan(h) -> dict:
    response = await h.client.post(
        "/api/v1/plan",
        data=am_fixture("GPUTemperatureHigh-firing-2alerts"),
        headers={"Content-Type": "application/json"},
    )
    assert response.status == 200, await response.text()
    return await response.json()


async def test_a_label_plan_shows_the_value_the_node_has_now_as_previous(make_harness, sim):
    h = await make_harness(
        LABEL_PLAYBOOK, kubernetes={"mode": "url", "url": sim.url, "token": sim.token}
    )
    [mark] = (await _plan(h))["alerts"][0]["playbooks"][0]["steps"]
    state = mark["preview"]["state"]
    assert mark["preview"]["already_in_place"] is False
    assert state["set"] == {"nvidia.com/mig.strategy": "mixed", "remediator.io/hot": "true"}
    assert state["previous"] == {"nvidia.com/mig.strategy": "single", "remediator.io/hot": None}


async def test_an_alert_already_received_plans_no_new_run_and_names_the_existing_one(
    make_harness, sim
):
    h = await make_harness(PLAYBOOK, kubernetes={"mode": "url", "url": sim.url, "token": sim.token})
    before = await _plan(h)
    assert all(not a["deduplicated"] and a["playbooks"] for a in before["alerts"])
    await h.post(am_fixture("GPUTemperatureHigh-firing-2alerts"))
    await h.settle()
    runs = await h.runs()
    after = await _plan(h)
    for alert in after["alerts"]:
        assert alert["playbooks"] == []
        assert alert["deduplicated"].startswith("deduplicated: a repeat of episode ")
        assert "starts no run" in alert["deduplicated"]
    named = " ".join(a["deduplicated"] for a in after["alerts"])
    assert all(f"#{run['id']} hot-then-drain" in named for run in runs)
    assert len(await h.runs()) == len(runs)  # planning changed nothing
