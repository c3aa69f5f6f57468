"""Driver upgrades: the gpu-driver-upgrade runbook rolls a new driver over nodes one at a
time through the simulated GPU Operator, stops at the first failure, and alert-driven
disruptive steps wait while a node's driver is being upgraded."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import pytest

from remediator.sim import testing, upgrades
from tests.integration.playbooks.conftest import (
    FakeNotifier,
    MakeGpuHarness,
    approve,
    cordoned,
    fixture,
    labels,
    node_events,
    only_run,
    post,
    statuses,
    step,
    trigger,
)

pytestmark = pytest.mark.timeout(120)

STATE = "nvidia.com/gpu-driver-upgrade-state"
MARK = "remediator.io/driver-upgrade"


def set_label(sim: testing.RunningSim, node: str, key: str, value: str | None) -> None:
    def change(obj: dict[str, Any]) -> None:
        node_labels = obj["metadata"].setdefault("labels", {})
        if value is None:
            node_labels.pop(key, None)
        else:
            node_labels[key] = value

    sim.cluster.store.mutate("nodes", "", node, change)


@pytest.mark.parametrize(
    ("key", "upgrading", "done", "holder"),
    [
        (STATE, "pod-restart-required", "upgrade-done", "the GPU Operator is upgrading its driver"),
        (MARK, "in-progress", None, "remediator's driver rollout is upgrading it"),
    ],
)
async def test_an_xid_cordon_waits_while_the_node_driver_is_being_upgraded(
    gpu_harness: MakeGpuHarness,
    sim: testing.RunningSim,
    clock: Any,
    key: str,
    upgrading: str,
    done: str | None,
    holder: str,
) -> None:
    node = "gpu-node-03"
    set_label(sim, node, key, upgrading)
    h = await gpu_harness()
    await post(h, fixture("GPUXidError79-firing-1alerts"))
    detail = await only_run(h, playbook="gpu-xid-error")
    cordon = step(detail, "cordon")
    assert cordon["status"] == "pending", statuses(detail)
    assert cordon["output"]["held"] == f"node {node}: {holder} ({key}={upgrading})"
    assert not cordoned(sim, node)

    clock.advance(20)  # still upgrading at the recheck: still held
    await h.settle()
    assert step(await only_run(h, playbook="gpu-xid-error"), "cordon")["status"] == "pending"

    set_label(sim, node, key, done)
    await seen_by_the_server(h, node, key, done)
    clock.advance(20)
    await h.settle()
    detail = await only_run(h, playbook="gpu-xid-error")
    assert step(detail, "cordon")["status"] == "succeeded", statuses(detail)
    assert cordoned(sim, node)


async def seen_by_the_server(
    h: Any, node: str, key: str, value: str | None, *, unschedulable: bool | None = None
) -> None:
    """Wait (5 s at most) until the server's node watch delivered a change: a pass right
    after the change may still see the node as it was (a busy machine is slower)."""
    cluster = h.components.cluster
    for _ in range(500):
        info = await cluster.get_node(node)
        if info.labels.get(key) == value and unschedulable in (None, info.unschedulable):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the server never saw {key}={value} on {node}")


H100 = "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
NODES = ["gpu-node-01", "gpu-node-02", "gpu-node-03"]
OLD, NEW = "535.129.03", "550.127.05"


async def start_rollout(h: Any, **params: Any) -> dict[str, Any]:
    """Triggered by alice, approved by another operator (as separation of duties wants)."""
    defaults = {"selector": H100, "target_version": NEW, "batch_size": 1, "pause_seconds": 0}
    run_id = await trigger(
        h, "gpu-driver-upgrade", defaults | {"channel": "default"} | params, None
    )
    detail = await h.run_detail(run_id)
    assert detail["status"] == "waiting_approval", statuses(detail)
    assert await approve(h, detail, "rollout", "maintenance window CHG-1234") == 200
    for _ in range(200):  # the rollout step runs in the background: wait for it to end
        detail = await h.run_detail(run_id)
        if detail["status"] in ("succeeded", "failed"):
            return detail
        await asyncio.sleep(0.1)
        await h.settle()
    raise AssertionError(statuses(detail))


def driver_version(sim: testing.RunningSim, node: str) -> str:
    return sim.cluster.hosts[node].driver_version


async def test_the_rollout_upgrades_three_nodes_one_at_a_time_in_order(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    upgrades.policy(sim.cluster).version = NEW
    h = await gpu_harness()
    detail = await start_rollout(h)
    assert detail["status"] == "succeeded", step(detail, "rollout")["output"]
    output = step(detail, "rollout")["output"]
    assert [(n["node"], n["result"]) for n in output["nodes"]] == [
        (node, "upgraded") for node in NODES
    ]
    policy = upgrades.policy(sim.cluster)
    assert policy.upgraded == NODES
    assert policy.peak == 1
    for node in NODES:
        assert driver_version(sim, node) == NEW
        assert not cordoned(sim, node)
        assert labels(sim, node)[STATE] == "upgrade-done"
        assert "remediator.io/driver-upgrade" not in labels(sim, node)
        assert {
            "RemediatorCordon",
            "RemediatorDrain",
            "RemediatorDriverUpgrade",
            "RemediatorUncordon",
        } <= set(node_events(sim, node))
    assert driver_version(sim, "gpu-node-04") == OLD  # not selected
    assert "rolled out" in notifier.sent[-1]["message"]


async def test_the_rollout_stops_at_the_first_failed_upgrade_and_notifies(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    upgrades.policy(sim.cluster).version = NEW
    upgrades.policy(sim.cluster).failing.add("gpu-node-02")
    h = await gpu_harness()
    detail = await start_rollout(h)
    assert detail["status"] == "failed", statuses(detail)
    assert upgrades.policy(sim.cluster).upgraded == ["gpu-node-01", "gpu-node-02"]
    assert driver_version(sim, "gpu-node-01") == NEW
    assert not cordoned(sim, "gpu-node-01")
    # The failed node stays out for a person; the next one was never touched.
    assert driver_version(sim, "gpu-node-02") == OLD
    assert cordoned(sim, "gpu-node-02")
    assert labels(sim, "gpu-node-02")["remediator.io/driver-upgrade"] == "failed"
    assert labels(sim, "gpu-node-02")[STATE] == "upgrade-failed"
    assert driver_version(sim, "gpu-node-03") == OLD
    assert not cordoned(sim, "gpu-node-03")
    assert STATE not in labels(sim, "gpu-node-03")
    stopped = [n for n in notifier.sent if n["data"].get("event") == "driver_rollout_stopped"]
    assert len(stopped) == 1
    assert "gpu-node-02" in stopped[0]["message"]
    assert stopped[0]["data"]["not_started"] == ["gpu-node-03"]
    assert step(detail, "notify")["status"] != "succeeded"


async def test_a_batch_of_two_nodes_is_upgraded_before_the_next_node_starts(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    upgrades.policy(sim.cluster).version = NEW
    h = await gpu_harness()
    detail = await start_rollout(h, batch_size=2)
    assert detail["status"] == "succeeded", step(detail, "rollout")["output"]
    upgraded = upgrades.policy(sim.cluster).upgraded
    assert sorted(upgraded[:2]) == NODES[:2]
    assert upgraded[2:] == NODES[2:]
    assert all(driver_version(sim, node) == NEW for node in NODES)


async def test_the_hook_method_asks_the_configured_service_for_each_upgrade(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, tmp_path: pathlib.Path
) -> None:
    # The sim's hook pins the requested version and upgrades the node, as a fleet tool would.
    hook = {
        "method": "hook",
        "hook_url": f"{sim.url}/sim/v1/driver-upgrades",
        "hook_token_file": tmp_path / "reboot-hook-token",  # the sim's token, written already
    }
    h = await gpu_harness(driver_upgrade=hook)
    detail = await start_rollout(h)
    assert detail["status"] == "succeeded", step(detail, "rollout")["output"]
    assert upgrades.policy(sim.cluster).upgraded == NODES
    assert all(driver_version(sim, node) == NEW for node in NODES)


async def test_a_rollout_triggered_again_stops_at_a_failed_node_until_a_person_clears_it(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    policy = upgrades.policy(sim.cluster)
    policy.version = NEW
    policy.failing.add("gpu-node-02")
    h = await gpu_harness()
    assert (await start_rollout(h))["status"] == "failed"

    again = await start_rollout(h)  # nothing cleared: stops at once, touches nothing
    assert again["status"] == "failed"
    assert "gpu-node-02 failed an earlier driver upgrade" in step(again, "rollout")["error"]
    assert policy.upgraded == ["gpu-node-01", "gpu-node-02"]

    policy.failing.clear()  # the node is fixed; a person clears the mark and uncordons it
    set_label(sim, "gpu-node-02", MARK, None)
    sim.cluster.store.mutate(
        "nodes", "", "gpu-node-02", lambda obj: obj["spec"].update(unschedulable=False)
    )
    await seen_by_the_server(h, "gpu-node-02", MARK, None, unschedulable=False)
    resumed = await start_rollout(h)
    assert resumed["status"] == "succeeded", step(resumed, "rollout")["output"]
    assert [n["result"] for n in step(resumed, "rollout")["output"]["nodes"]] == [
        "already at the target version",
        "upgraded",
        "upgraded",
    ]
    assert all(driver_version(sim, node) == NEW for node in NODES)
    assert not any(cordoned(sim, node) for node in NODES)


async def test_the_runbook_is_triggered_over_the_api_with_its_defaults(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    h = await gpu_harness()
    response = await h.client.post(
        "/api/v1/runbooks/gpu-driver-upgrade/runs",
        json={"params": {"selector": H100, "target_version": NEW}, "dryRun": True},
    )
    assert response.status == 201, await response.text()
    await h.settle()
    [run] = await h.runs(playbook="gpu-driver-upgrade")
    assert run["params"] == {
        "selector": H100,
        "target_version": NEW,
        "batch_size": 1,
        "pause_seconds": 60,
        "channel": "default",
    }
    assert upgrades.policy(sim.cluster).upgraded == []
    refused = await h.client.post(
        "/api/v1/runbooks/gpu-driver-upgrade/runs",
        json={"params": {"selector": H100, "target_version": "550; reboot"}},
    )
    assert refused.status == 400


async def rollout_events(h: Any, run_id: int) -> list[tuple[str, str]]:
    response = await h.client.get(
        "/api/v1/audit/events", params={"run": str(run_id), "limit": "500"}
    )
    assert response.status == 200, await response.text()
    items = sorted((await response.json())["items"], key=lambda e: e["id"])
    return [(e["kind"], e["data"]["node"]) for e in items if e["kind"].startswith("budget.")]


async def test_a_node_the_rollout_left_out_of_service_counts_in_the_disruption_budget(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    policy = upgrades.policy(sim.cluster)
    policy.version = NEW
    policy.failing.add("gpu-node-02")
    h = await gpu_harness(guards={"max_nodes": 1, "max_percent": 100.0})
    detail = await start_rollout(h)
    assert detail["status"] == "failed", statuses(detail)
    assert await rollout_events(h, detail["id"]) == [
        ("budget.taken", "gpu-node-01"),
        ("budget.released", "gpu-node-01"),
        ("budget.taken", "gpu-node-02"),  # failed: out of service until returned
    ]

    await post(h, fixture("GPUXidError79-firing-1alerts"))  # gpu-node-03
    xid = await only_run(h, playbook="gpu-xid-error")
    cordon = step(xid, "cordon")
    assert cordon["status"] == "pending", statuses(xid)
    assert cordon["output"]["held"] == "disruption budget in use: 1 of 1 nodes"
    assert not cordoned(sim, "gpu-node-03")


async def test_a_batch_the_disruption_budget_has_no_room_for_waits_node_by_node(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, clock: Any
) -> None:
    policy = upgrades.policy(sim.cluster)
    policy.version = NEW
    h = await gpu_harness(guards={"max_nodes": 1, "max_percent": 100.0})
    run_id = await trigger(
        h,
        "gpu-driver-upgrade",
        {"selector": H100, "target_version": NEW, "batch_size": 2, "pause_seconds": 0}
        | {"channel": "default"},
        None,
    )
    assert await approve(h, await h.run_detail(run_id), "rollout", "CHG-1234") == 200
    for _ in range(200):
        rollout = step(await h.run_detail(run_id), "rollout")
        if rollout.get("error"):
            break
        await asyncio.sleep(0.05)
        await h.settle()
    assert rollout["status"] == "pending"  # tried again later, not stopped
    assert rollout["error"].endswith("waits: disruption budget in use: 1 of 1 nodes")
    assert len(policy.upgraded) == 1  # the other node of the batch was not touched
    waiting = next(n for n in NODES[:2] if n not in policy.upgraded)
    assert not cordoned(sim, waiting)
    assert MARK not in labels(sim, waiting)

    for _ in range(40):  # each retry takes the next node once the last is back in service
        clock.advance(300)
        await h.settle()
        detail = await h.run_detail(run_id)
        if detail["status"] in ("succeeded", "failed"):
            break
        await asyncio.sleep(0.1)
    assert detail["status"] == "succeeded", step(detail, "rollout")
    assert sorted(policy.upgraded) == NODES
    assert policy.peak == 1
