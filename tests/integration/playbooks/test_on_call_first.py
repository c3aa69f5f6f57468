"""On-call hears of a hardware fault before remediator touches the node: every shipped playbook
with a disruptive step notifies first, so a cordon held by the disruption budget or gated by the
daily limit is never silent."""

from __future__ import annotations

from typing import Any

import pytest

from remediator.actions import builtin_registry
from remediator.adapters import files
from remediator.domain import playbooks
from remediator.sim import testing
from tests.integration.playbooks.conftest import (
    RULES,
    FakeNotifier,
    MakeGpuHarness,
    built,
    cordoned,
    fixture,
    only_run,
    statuses,
    step,
)

pytestmark = pytest.mark.timeout(60)

XID_NODE = "gpu-node-03"  # the captured Xid 79 alert
OTHER_NODE = "gpu-node-04"


def shipped() -> list[playbooks.Playbook]:
    loaded, problems = files.load_playbooks([RULES], builtin_registry())
    assert problems == []
    return list(loaded)


def disruptive_actions() -> set[str]:
    return {action.name for action in builtin_registry().all() if action.disruptive}


def test_every_shipped_playbook_that_disrupts_a_node_notifies_first() -> None:
    disruptive = disruptive_actions()
    checked = []
    for playbook in shipped():
        enabled = [s for s in playbook.steps if s.enabled]
        if playbook.manual or not any(s.action in disruptive for s in enabled):
            continue
        first = enabled[0]
        assert first.action == "notify", f"{playbook.name} starts with {first.action}"
        # A broken channel must not keep the node in service.
        assert first.on_failure is playbooks.OnFailure.CONTINUE, playbook.name
        assert not first.requires_approval, playbook.name
        assert any(s.action == "notify" for s in enabled[1:]), f"{playbook.name}: no later notify"
        checked.append(playbook.name)
    assert sorted(checked) == [
        "gpu-ecc-uncorrectable",
        "gpu-row-remap",
        "gpu-temperature-critical",
        "gpu-xid-error",
        "gpu-xid-hang",
        "gpu-xid-memory",
        "gpu-xid-nvlink",
        "gpu-xid-recovery-action",
    ]


def xid79(sim: testing.RunningSim, node: str, gpu: int) -> bytes:
    return built(
        "GPUXidError79-firing-1alerts",
        alertname="GPUXidError79",
        set_labels={
            "node": node,
            "Hostname": node,
            "instance": f"{node}:9400",
            "gpu": str(gpu),
            "device": f"nvidia{gpu}",
            "UUID": sim.gpu(node, gpu).uuid,
        },
        drop_labels=("pod", "namespace", "container"),
        summary=f"GPU {gpu} on {node} has fallen off the bus (Xid 79)",
        fingerprint="79a0c0ffee000004",
    )


def started_for(notifier: FakeNotifier, node: str) -> list[dict[str, Any]]:
    about = [s for s in notifier.sent if s["data"]["node"] == node]
    return [s for s in about if s["data"].get("stage") == "started"]


def first_event_of(detail: dict[str, Any], key: str) -> int:
    step_id = step(detail, key)["id"]
    return next(i for i, e in enumerate(detail["events"]) if e["stepId"] == step_id)


async def test_a_xid79_held_by_the_disruption_budget_is_told_to_on_call_before_its_cordon(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    # Default guards: 10 % of the four simulated GPU nodes, rounded up, is one node.
    h = await gpu_harness(guards={})
    for data in (fixture("GPUXidError79-firing-1alerts"), xid79(sim, OTHER_NODE, 1)):
        response = await h.post(data)
        assert response.status == 200, await response.text()
    await h.settle()  # one engine pass: no time passes, no guard is rechecked

    runs = {r["node"]: await h.run_detail(r["id"]) for r in await h.runs(playbook="gpu-xid-error")}
    assert sorted(runs) == [XID_NODE, OTHER_NODE]
    assert [cordoned(sim, node) for node in runs].count(True) == 1
    held_node = next(node for node in runs if not cordoned(sim, node))
    held = runs[held_node]
    cordon = step(held, "cordon")
    assert cordon["status"] == "pending", statuses(held)
    assert "disruption budget in use" in cordon["output"]["held"]
    told_of_held = [s["message"] for s in notifier.sent if s["data"]["node"] == held_node]
    assert told_of_held, f"on-call heard nothing of {held_node} while its cordon is held"
    assert statuses(held)["notify-start"] == "succeeded"

    # Both nodes' on-call notifications went out, the held one included, before any cordon.
    for node, detail in runs.items():
        [told] = started_for(notifier, node)
        uuid = sim.gpu(node, 3 if node == XID_NODE else 1).uuid
        assert told["data"]["gpu_uuid"] == uuid
        assert uuid in told["message"]
        assert f"Node {node}" in told["message"]
        assert "disruption budget" in told["message"]
        assert told["data"]["needs_approval"] == "drain"
        assert first_event_of(detail, "notify-start") < first_event_of(detail, "cordon")


async def test_a_cordon_gated_by_the_daily_limit_is_told_to_on_call_while_it_waits(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    node = "gpu-node-02"  # the captured uncorrectable-ECC alert
    h = await gpu_harness(guards={"max_percent": 50.0, "max_per_node_per_day": 1})
    earlier = built(
        "GPUECCUncorrectableError-firing-1alerts",
        alertname="GPUECCCorrectableRateHigh",
        set_labels={"severity": "warning"},
        summary="Correctable ECC errors are growing fast on GPU 5 of gpu-node-02",
        fingerprint="7c0ffee5badc0de1",
    )
    for data in (earlier, fixture("GPUECCUncorrectableError-firing-1alerts")):
        response = await h.post(data)
        assert response.status == 200, await response.text()
        await h.settle()

    detail = await only_run(h, playbook="gpu-ecc-uncorrectable")
    assert "disruptive steps need approval" in detail["reason"]
    assert not cordoned(sim, node)
    sent = [s["message"] for s in notifier.sent if s["data"].get("playbook") == detail["playbook"]]
    assert sent, "on-call heard nothing while the cordon waits for approval"
    assert statuses(detail)["notify-start"] == "succeeded"
    assert statuses(detail)["cordon"] == "waiting_approval"
    [told] = started_for(notifier, node)
    assert "Uncorrectable ECC errors on GPU 5 of gpu-node-02" in told["message"]
    assert sim.gpu(node, 5).uuid in told["message"]
    assert "daily run limit" in told["message"]
