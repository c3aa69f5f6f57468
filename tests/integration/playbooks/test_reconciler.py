"""The reconciler compares what runs applied with the live (simulated) cluster: a kept effect
that vanished is reported and never re-applied, an effect its undo could not reverse is
reported as orphaned, effects a later run returned are closed quietly; each once."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from remediator.sim import testing
from tests.integration.conftest import Harness
from tests.integration.playbooks.conftest import (
    FakeNotifier,
    MakeGpuHarness,
    cordoned,
    fixture,
    only_run,
    post,
    statuses,
    step,
    trigger,
)

pytestmark = pytest.mark.timeout(120)

XID_NODE = "gpu-node-03"
HOT_NODE = "gpu-node-01"
KINDS = ("effect.orphaned", "effect.vanished", "effect.released")


async def effect_events(h: Harness, *kinds: str) -> list[dict[str, Any]]:
    response = await h.client.get("/api/v1/audit/events", params={"limit": "500"})
    assert response.status == 200
    return [e for e in (await response.json())["items"] if e["kind"] in (kinds or KINDS)]


async def reported(h: Harness) -> dict[str, float]:
    text = await (await h.client.get("/metrics")).text()
    found = {}
    for line in text.splitlines():
        if line.startswith("remediator_orphaned_effects_total{"):
            name, value = line.rsplit(" ", 1)
            found[name.split('kind="')[1].rstrip('"}')] = float(value)
    return found


async def patch_node(sim: testing.RunningSim, node: str, patch: dict[str, Any]) -> None:
    """What someone with kubectl does behind remediator's back."""
    headers = {**sim.headers, "Content-Type": "application/merge-patch+json"}
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.patch(f"{sim.url}/api/v1/nodes/{node}", json=patch) as response,
    ):
        assert response.status == 200, await response.text()


async def reject(h: Harness, detail: dict[str, Any], key: str) -> None:
    url = f"/api/v1/runs/{detail['id']}/steps/{step(detail, key)['id']}/reject"
    response = await h.client.post(url, json={"comment": "keep it cordoned and watch"})
    assert response.status == 200, await response.text()
    await h.settle()


async def xid_run_kept_out_of_service(h: Harness) -> dict[str, Any]:
    await post(h, fixture("GPUXidError79-firing-1alerts"))
    detail = await only_run(h, playbook="gpu-xid-error")
    await reject(h, detail, "drain")
    detail = await h.run_detail(detail["id"])
    assert detail["status"] == "rejected", statuses(detail)
    return detail


async def test_a_kept_cordon_removed_by_hand_is_reported_once_and_not_reapplied(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    h = await gpu_harness()
    detail = await xid_run_kept_out_of_service(h)
    found = await h.components.reconcile()
    assert found.looked_at == 3  # cordon, label, taint: all still in place
    assert found.verdicts == []
    told = len(notifier.sent)

    await patch_node(sim, XID_NODE, {"spec": {"unschedulable": False}})
    found = await h.components.reconcile()
    [event] = await effect_events(h)
    assert event["kind"] == "effect.vanished"
    assert event["actor"] == "reconciler"
    assert event["runId"] == detail["id"]
    assert event["stepId"] == step(detail, "cordon")["id"]
    assert event["data"]["node"] == XID_NODE
    assert event["data"]["presence"] == "gone"
    assert "is not cordoned any more" in event["reason"]
    assert not cordoned(sim, XID_NODE)  # reported, never re-applied blindly
    [message] = notifier.messages()[told:]
    assert XID_NODE in message
    assert "cordon" in message
    assert (await reported(h)) == {"vanished": 1}

    again = await h.components.reconcile()
    assert again.verdicts == []
    assert again.looked_at == 2  # the cordon's entry is closed; label and taint are kept
    assert len(await effect_events(h)) == 1
    assert len(notifier.sent) == told + 1


async def test_a_node_lost_with_the_api_servers_state_reports_every_kept_effect(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    h = await gpu_harness()
    await xid_run_kept_out_of_service(h)
    await patch_node(
        sim,
        XID_NODE,
        {
            "metadata": {"labels": {"gpu-status": None}},
            "spec": {"unschedulable": False, "taints": None},
        },
    )
    await h.components.reconcile()
    events = await effect_events(h)
    assert sorted(e["data"]["step"] for e in events) == ["cordon", "label", "taint"]
    assert {e["kind"] for e in events} == {"effect.vanished"}
    assert (await reported(h)) == {"vanished": 3}


async def test_effects_a_later_run_returned_to_service_are_closed_quietly(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    h = await gpu_harness()
    await xid_run_kept_out_of_service(h)
    back = await h.run_detail(
        await trigger(h, "return-node-to-service", {"node": XID_NODE}, XID_NODE)
    )
    assert back["status"] == "succeeded", statuses(back)
    assert not cordoned(sim, XID_NODE)
    told = len(notifier.sent)
    await h.components.reconcile()
    events = await effect_events(h)
    assert {e["kind"] for e in events} == {"effect.released"}
    assert "cordon" in {e["data"]["step"] for e in events}
    assert len(notifier.sent) == told
    assert (await reported(h)) == {}


NODE_WRITES_FAIL = {
    "rules": [{"path_prefix": "/api/v1/nodes", "methods": ["PATCH"], "rate_500": 1.0}]
}


async def undo_ended(h: Harness, clock: Any, count: int) -> list[dict[str, Any]]:
    """Let the undo runs retry until their budget is spent (the fake clock moves 8 min)."""
    for _ in range(16):
        clock.advance(30)
        await h.settle()
    found = await h.runs(kind="undo")
    assert len(found) == count, found
    return [await h.run_detail(r["id"]) for r in sorted(found, key=lambda r: r["id"])]


async def hot_node_whose_undo_failed(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, clock: Any
) -> tuple[Harness, dict[str, Any]]:
    """The critical thermal run capped and cordoned; the alert resolved while every node
    write failed: the undo restored the cap but could not uncordon."""
    # Transport retries short: every failed write is retried by the engine at the fake clock.
    kubernetes = {"mode": "url", "url": sim.url, "token": sim.token, "retry_max_seconds": 0.2}
    h = await gpu_harness(kubernetes=kubernetes)
    await post(h, fixture("GPUTemperatureCritical-firing-1alerts"))
    detail = await only_run(h, playbook="gpu-temperature-critical")
    assert cordoned(sim, HOT_NODE)
    await set_faults(sim, NODE_WRITES_FAIL)
    await post(h, fixture("GPUTemperatureCritical-resolved-1alerts"))
    [undo] = await undo_ended(h, clock, 1)
    assert undo["status"] == "failed", statuses(undo)
    assert statuses(undo)["undo-cordon"] == "failed"
    assert cordoned(sim, HOT_NODE)
    return h, detail


async def test_a_cordon_its_undo_could_not_reverse_is_undone_once_the_api_answers(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier, clock: Any
) -> None:
    h, detail = await hot_node_whose_undo_failed(gpu_harness, sim, clock)
    await set_faults(sim, {"rules": []})
    told = len(notifier.sent)
    found = await h.components.reconcile()
    [verdict] = found.verdicts
    assert verdict.resolution == "undo-planned"
    [event] = await effect_events(h, "effect.undo_planned")
    assert event["stepId"] == step(detail, "cordon")["id"]
    assert f"cordoned by run-{detail['id']}" in event["reason"]
    await h.settle()
    _, again = await undo_ended(h, clock, 2)
    assert again["status"] == "succeeded", statuses(again)
    assert again["reason"] == f"effects still in place: undo run {detail['id']} again"
    assert not cordoned(sim, HOT_NODE)
    assert (await h.components.reconcile()).verdicts == []
    assert await effect_events(h, *KINDS) == []
    assert len(notifier.sent) == told  # recovered: nothing for on-call
    assert (await reported(h)) == {}


async def test_a_cordon_two_undos_could_not_reverse_is_reported_as_orphaned(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier, clock: Any
) -> None:
    h, detail = await hot_node_whose_undo_failed(gpu_harness, sim, clock)
    await h.components.reconcile()  # the API still fails: the second undo fails too
    await h.settle()
    await undo_ended(h, clock, 2)
    told = len(notifier.sent)
    await h.components.reconcile()
    [event] = await effect_events(h, "effect.orphaned")
    assert event["stepId"] == step(detail, "cordon")["id"]
    assert event["data"]["resolution"] == "reported"
    assert event["data"]["presence"] == "present"
    assert event["data"]["node"] == HOT_NODE
    assert cordoned(sim, HOT_NODE)  # left as it is
    assert any(HOT_NODE in m and "by hand" in m for m in notifier.messages()[told:])
    assert (await reported(h)) == {"orphaned": 1}
    assert (await h.components.reconcile()).verdicts == []  # reported once


async def set_faults(sim: testing.RunningSim, body: dict[str, object]) -> None:
    async with (
        aiohttp.ClientSession(headers=sim.headers) as http,
        http.put(f"{sim.url}/sim/v1/faults", json=body) as response,
    ):
        assert response.status == 200


async def test_a_power_cap_its_undo_could_not_restore_is_restored_once_the_gpu_answers(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, clock: Any
) -> None:
    kubernetes = {"mode": "url", "url": sim.url, "token": sim.token, "retry_max_seconds": 0.2}
    h = await gpu_harness(kubernetes=kubernetes)
    gpu = sim.gpu(HOT_NODE, 0)
    await post(h, fixture("GPUTemperatureCritical-firing-1alerts"))
    detail = await only_run(h, playbook="gpu-temperature-critical")
    assert gpu.power_limit < gpu.default_limit
    capped = gpu.power_limit
    driver = sim.driver_pod(HOT_NODE)["metadata"]["name"]
    exec_path = f"/api/v1/namespaces/gpu-operator/pods/{driver}/exec"
    await set_faults(sim, {"rules": [{"path_prefix": exec_path, "drop_websocket_rate": 1.0}]})
    await post(h, fixture("GPUTemperatureCritical-resolved-1alerts"))
    [undo] = await undo_ended(h, clock, 1)
    assert statuses(undo)["undo-power-cap"] == "failed"
    assert gpu.power_limit == capped

    found = await h.components.reconcile()  # nvidia-smi still cannot be reached
    assert found.verdicts == []
    assert any("power" in e or "exec" in e or "nvidia-smi" in e for e in found.errors)

    await set_faults(sim, {"rules": []})
    [verdict] = (await h.components.reconcile()).verdicts
    assert verdict.resolution == "undo-planned"
    assert verdict.entry.step.id == step(detail, "power-cap")["id"]
    assert f"at {capped:g} W (capped from {gpu.default_limit:g} W)" in verdict.observation.detail
    await h.settle()
    _, again = await undo_ended(h, clock, 2)
    assert again["status"] == "succeeded", statuses(again)
    assert gpu.power_limit == gpu.default_limit
    assert (await h.components.reconcile()).verdicts == []
