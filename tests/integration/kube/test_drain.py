"""node.drain end to end: PDBs, DaemonSets, filters, progress and the timeout report."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from remediator.actions import drain, pods
from remediator.domain import errors
from remediator.sim import testing
from tests.integration.kube.conftest import MakeContext, Progress, node_events, run_action

LLAMA_1 = "ml-training/llama-finetune-1"
FAST: dict[str, Any] = {"eviction_retry_interval_seconds": 0.1, "poll_interval_seconds": 0.05}


def set_min_available(sim: testing.RunningSim, value: int) -> None:
    def edit(pdb: dict[str, Any]) -> None:
        pdb["spec"] = {**pdb["spec"], "minAvailable": value}

    sim.store.mutate("poddisruptionbudgets.policy", "ml-training", "llama-finetune", edit)


async def test_drain_waits_for_a_blocking_pdb_and_finishes_once_it_is_relaxed(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    set_min_available(sim, 2)  # llama-finetune has 2 replicas: no disruption allowed
    progress = Progress()
    params = {**FAST, "delete_emptydir_data": True, "timeout_seconds": 20}
    task = asyncio.create_task(
        run_action(drain.DrainAction(), make_ctx(node="gpu-node-04", progress=progress), params)
    )
    await sim.wait_for(
        lambda: any(
            "ml-training/llama-finetune-1" in u.get("blocked", {}) for u in progress.updates
        )
    )
    blocked = next(u for u in progress.updates if u.get("blocked"))["blocked"]
    assert blocked["ml-training/llama-finetune-1"]["pdb"] == "llama-finetune"
    assert not task.done()
    set_min_available(sim, 1)
    output = await asyncio.wait_for(task, 15)

    assert sim.node("gpu-node-04")["spec"]["unschedulable"] is True
    left = {p["metadata"]["name"] for p in sim.pods(node="gpu-node-04")}
    assert not any(name.startswith(("llama-finetune", "vllm")) for name in left)
    assert any(name.startswith("nvidia-driver-daemonset") for name in left)  # DaemonSets stay
    assert "ml-training/llama-finetune-1" in output["gone"]
    assert output["remaining"] == []
    assert any(k.startswith("gpu-operator/") for k in output["skipped"])
    assert {"RemediatorCordon", "RemediatorDrain"} <= {
        e["reason"] for e in node_events(sim, "gpu-node-04")
    }
    assert progress.updates[-1]["remaining"] == []
    again = await run_action(drain.DrainAction(), make_ctx(node="gpu-node-04"), params)
    assert again["already_in_place"] is True


async def test_drain_timeout_names_the_blocked_pods_and_their_budgets(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    set_min_available(sim, 2)
    params = {**FAST, "delete_emptydir_data": True, "timeout_seconds": 1}
    with pytest.raises(errors.ActionFailed) as info:
        await run_action(drain.DrainAction(), make_ctx(node="gpu-node-04"), params)
    message = str(info.value)
    assert "timed out" in message
    assert "ml-training/llama-finetune-1 (blocked by PodDisruptionBudget llama-finetune)" in message
    blocked: Any = info.value.output["blocked"]
    assert blocked[LLAMA_1]["pdb"] == "llama-finetune"
    assert sim.node("gpu-node-04")["spec"]["unschedulable"] is True  # left cordoned


async def test_drain_refuses_unmanaged_and_emptydir_pods_and_evicts_nothing(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    before = {p["metadata"]["uid"] for p in sim.pods(node="gpu-node-03")}
    with pytest.raises(errors.ActionFailed) as info:
        await run_action(drain.DrainAction(), make_ctx(node="gpu-node-03"), FAST)
    assert "research/jupyter-alice" in str(info.value)
    assert "declares no controller" not in str(info.value)  # emptyDir is found first
    assert "local storage" in str(info.value)
    assert info.value.temporary is False
    assert {p["metadata"]["uid"] for p in sim.pods(node="gpu-node-03")} == before
    assert sim.node("gpu-node-03")["spec"]["unschedulable"] is True

    with pytest.raises(errors.ActionFailed, match="declares no controller"):
        await run_action(
            drain.DrainAction(),
            make_ctx(node="gpu-node-03"),
            {**FAST, "delete_emptydir_data": True},
        )


async def test_drain_without_ignoring_daemonsets_fails_listing_them(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    with pytest.raises(errors.ActionFailed, match="DaemonSet-managed") as info:
        await run_action(
            drain.DrainAction(), make_ctx(node="gpu-node-02"), {**FAST, "ignore_daemonsets": False}
        )
    assert "gpu-operator/nvidia-driver-daemonset" in str(info.value)


async def test_pod_evict_blocked_by_a_pdb_is_a_temporary_failure(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    action = pods.EvictAction()
    set_min_available(sim, 1)
    ok = await run_action(
        action, make_ctx(), {"namespace": "ml-training", "pod": "llama-finetune-0"}
    )
    assert ok["outcome"] == "evicted"
    with pytest.raises(errors.ActionFailed, match="PodDisruptionBudget llama-finetune") as info:
        await run_action(
            action, make_ctx(), {"namespace": "ml-training", "pod": "llama-finetune-1"}
        )
    assert info.value.temporary is True
    assert info.value.retry_after == 5.0
