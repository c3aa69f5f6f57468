"""gpu.recovery_action (Xid 154): the driver's recommendation decides the run's rung."""

from __future__ import annotations

import dataclasses

import pytest

from remediator.actions import drain, ladder, recovery, reset
from remediator.domain import errors, ladders
from remediator.sim import testing
from tests.integration.kube.conftest import MakeContext, run_action
from tests.integration.kube.test_ladder_actions import MemoryLadder, with_services

NODE = "gpu-node-02"


@pytest.mark.parametrize(
    ("recommended", "rung"),
    [
        ("GPU Reset", "reset"),
        ("Drain and Reset", "reset"),
        ("Drain P2P", "reset"),
        ("Node Reboot", "reboot"),
    ],
)
async def test_the_run_takes_the_rung_nvidia_smi_recommends(
    sim: testing.RunningSim, make_ctx: MakeContext, recommended: str, rung: str
) -> None:
    gpu = sim.gpu(NODE, 2)
    gpu.recovery_action = recommended
    memory = MemoryLadder()
    ctx = with_services(make_ctx(node=NODE, gpu=gpu.uuid), ladder=memory)
    output = await run_action(recovery.RecoveryAction(), ctx, {})
    assert output["recommended"] == recommended
    assert output["source"] == "nvidia-smi gpu_recovery_action"
    assert output["rung"] == rung
    assert await ladder.run_rung(ctx) is ladders.Rung(rung)
    again = await run_action(recovery.RecoveryAction(), ctx, {})  # decided once per run
    assert again["already_in_place"] is True


async def test_none_puts_the_run_on_no_rung_and_the_rung_steps_stand_aside(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    gpu = sim.gpu(NODE, 2)
    memory = MemoryLadder()
    ctx = with_services(make_ctx(node=NODE, gpu=gpu.uuid), ladder=memory)
    output = await run_action(recovery.RecoveryAction(), ctx, {})
    assert output["recommended"] == "None"
    assert output["rung"] is None
    before = {p["metadata"]["name"] for p in sim.pods(node=NODE)}
    stood_aside = await run_action(reset.ResetAction(), ctx, {"rung": "reset"})
    assert stood_aside["skipped"] is True
    assert "driver recommends None" in stood_aside["reason"]
    drained = await run_action(drain.DrainAction(), ctx, {"rungs": ["reset", "reboot"]})
    assert drained["skipped"] is True
    assert {p["metadata"]["name"] for p in sim.pods(node=NODE)} == before
    assert sim.node(NODE)["spec"].get("unschedulable") is not True
    [key] = memory.states
    assert "rung" not in memory.states[key]  # a declined episode leaves the ladder as it was


async def test_the_alert_label_wins_over_nvidia_smi_and_a_lost_gpu_is_rebooted(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    gpu = sim.gpu(NODE, 2)
    base = make_ctx(node=NODE, gpu=gpu.uuid)
    labelled = dataclasses.replace(
        base, labels={"recovery_action": "NODE_REBOOT"}, services={"ladder": MemoryLadder()}
    )
    output = await run_action(recovery.RecoveryAction(), labelled, {})
    assert (output["source"], output["rung"]) == ("alert label recovery_action", "reboot")

    gpu.lost = True
    lost = with_services(base, ladder=MemoryLadder())
    output = await run_action(recovery.RecoveryAction(), lost, {})
    assert output["rung"] == "reboot"
    assert "does not answer" in output["source"]


async def test_a_recommendation_remediator_cannot_follow_fails_the_step(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    gpu = sim.gpu(NODE, 2)
    gpu.recovery_action = "N/A"
    ctx = with_services(make_ctx(node=NODE, gpu=gpu.uuid), ladder=MemoryLadder())
    with pytest.raises(errors.ActionFailed, match="'N/A'") as failed:
        await run_action(recovery.RecoveryAction(), ctx, {})
    assert not failed.value.temporary


def test_recommendations_are_read_in_every_spelling() -> None:
    assert recovery.normalize("Drain and Reset") == "drain and reset"
    assert recovery.normalize("NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET") == "drain and reset"
    assert recovery.normalize(" gpu-reset ") == "gpu reset"
    assert recovery.normalize("[N/A]") is None
    assert recovery.worst(["none", "gpu reset", "node reboot"]) == "node reboot"
