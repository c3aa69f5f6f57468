"""Cordon, labels, taints and events through the real client against the simulator."""

from __future__ import annotations

import pytest

from remediator.actions import kube, taints
from remediator.domain import errors
from remediator.ports import cluster as port
from remediator.sim import testing
from tests.integration.kube.conftest import MakeContext, node_events, run_action, run_undo

CORDONED_BY = "remediator.io/cordoned-by"


async def test_cordon_marks_the_node_with_the_run_and_undo_uncordons_it(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    action = kube.CordonAction()
    ctx = make_ctx(run_id=7)
    output = await run_action(action, ctx, {})
    node = sim.node("gpu-node-01")
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["annotations"][CORDONED_BY] == "run-7"
    assert output["cordoned"] is True
    assert [e["reason"] for e in node_events(sim, "gpu-node-01")] == ["RemediatorCordon"]
    assert "run 7" in node_events(sim, "gpu-node-01")[0]["message"]
    assert (await run_action(action, ctx, {}))["already_in_place"] is True

    undone = await run_undo(action, make_ctx(run_id=7, applied_output=output), {})
    node = sim.node("gpu-node-01")
    assert not node["spec"].get("unschedulable")
    assert CORDONED_BY not in (node["metadata"].get("annotations") or {})
    assert undone["uncordoned"] is True


async def test_undo_of_cordon_leaves_a_node_uncordoned_by_hand_alone(
    sim: testing.RunningSim, cluster: port.Cluster, make_ctx: MakeContext
) -> None:
    action = kube.CordonAction()
    output = await run_action(action, make_ctx(run_id=8), {})
    await cluster.patch_node("gpu-node-01", unschedulable=False)  # an operator, by hand
    await cluster.patch_node("gpu-node-01", unschedulable=True)  # ... and someone else again
    await cluster.patch_node("gpu-node-01", annotations={CORDONED_BY: None})
    undone = await run_undo(action, make_ctx(run_id=8, applied_output=output), {})
    assert undone["left_alone"] == "cordon state changed by someone else"
    assert sim.node("gpu-node-01")["spec"]["unschedulable"] is True

    await cluster.patch_node("gpu-node-01", unschedulable=False)
    undone = await run_undo(action, make_ctx(run_id=8, applied_output=output), {})
    assert undone["left_alone"] == "uncordoned by someone else"
    assert not sim.node("gpu-node-01")["spec"].get("unschedulable")


async def test_undo_of_cordon_records_uncordoned_by_someone_else(
    sim: testing.RunningSim, cluster: port.Cluster, make_ctx: MakeContext
) -> None:
    action = kube.CordonAction()
    output = await run_action(action, make_ctx(run_id=9), {})
    await cluster.patch_node("gpu-node-01", unschedulable=False)  # annotation stays behind
    undone = await run_undo(action, make_ctx(run_id=9, applied_output=output), {})
    assert undone["left_alone"] == "uncordoned by someone else"
    assert CORDONED_BY not in (sim.node("gpu-node-01")["metadata"].get("annotations") or {})


async def test_uncordon_refuses_a_node_that_remediator_did_not_cordon(
    sim: testing.RunningSim, cluster: port.Cluster, make_ctx: MakeContext
) -> None:
    await cluster.patch_node("gpu-node-02", unschedulable=True)
    action = kube.UncordonAction()
    with pytest.raises(errors.ActionFailed, match="not cordoned by remediator"):
        await run_action(action, make_ctx(node="gpu-node-02"), {})
    assert sim.node("gpu-node-02")["spec"]["unschedulable"] is True
    output = await run_action(
        action, make_ctx(node="gpu-node-02"), {"only_if_cordoned_by_us": False}
    )
    assert output["uncordoned"] is True
    assert not sim.node("gpu-node-02")["spec"].get("unschedulable")


async def test_uncordon_of_a_node_cordoned_by_an_earlier_run_clears_the_mark(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    await run_action(kube.CordonAction(), make_ctx(run_id=1), {})
    output = await run_action(kube.UncordonAction(), make_ctx(run_id=2), {})
    assert output["cordoned_by"] == "run-1"
    assert not sim.node("gpu-node-01")["spec"].get("unschedulable")
    reasons = sorted(e["reason"] for e in node_events(sim, "gpu-node-01"))
    assert reasons == ["RemediatorCordon", "RemediatorUncordon"]


async def test_a_node_outside_the_gpu_selector_is_refused(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    with pytest.raises(errors.ActionFailed, match="does not match the GPU node selector") as info:
        await run_action(kube.CordonAction(), make_ctx(node="cpu-node-01"), {})
    assert info.value.temporary is False
    assert not sim.node("cpu-node-01")["spec"].get("unschedulable")


class ConflictOnce:
    """Delegates to the real cluster; before the first write, someone else edits the node."""

    def __init__(self, inner: port.Cluster, sim: testing.RunningSim) -> None:
        self._inner = inner
        self._sim = sim
        self.conflicts = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def _interfere(self, node: str) -> None:
        if self.conflicts == 0:
            self.conflicts += 1
            await self._inner.patch_node(node, labels={"someone-else": "was-here"})

    async def patch_node(self, name: str, **kwargs: object) -> port.NodeInfo:
        await self._interfere(name)
        return await self._inner.patch_node(name, **kwargs)  # type: ignore[arg-type]

    async def replace_node_taints(
        self, name: str, taints: list[port.Taint], *, resource_version: str
    ) -> port.NodeInfo:
        await self._interfere(name)
        return await self._inner.replace_node_taints(
            name, taints, resource_version=resource_version
        )


async def test_label_retries_after_a_concurrent_409_and_undo_restores_previous_values(
    sim: testing.RunningSim, cluster: port.Cluster, make_ctx: MakeContext
) -> None:
    racing = ConflictOnce(cluster, sim)
    action = kube.LabelAction()
    params = {"labels": {"gpu-status": "faulty", "maintenance": "planned"}}
    output = await run_action(action, make_ctx(kube=racing), params)
    assert racing.conflicts == 1
    labels = sim.node("gpu-node-01")["metadata"]["labels"]
    assert labels["gpu-status"] == "faulty"
    assert labels["someone-else"] == "was-here"
    assert output["previous"] == {"gpu-status": None, "maintenance": None}

    await cluster.patch_node("gpu-node-01", labels={"maintenance": "done"})  # by hand
    undone = await run_undo(action, make_ctx(applied_output=output), params)
    labels = sim.node("gpu-node-01")["metadata"]["labels"]
    assert "gpu-status" not in labels
    assert undone["restored"] == {"gpu-status": None}
    assert undone["left_alone"] == {"maintenance": "changed by someone else to 'done'"}
    assert labels["maintenance"] == "done"


async def test_taint_retries_after_a_concurrent_409_and_undo_restores_the_old_taint(
    sim: testing.RunningSim, cluster: port.Cluster, make_ctx: MakeContext
) -> None:
    racing = ConflictOnce(cluster, sim)
    action = taints.TaintAction()
    params = {"taints": [{"key": "nvidia.com/gpu", "value": "faulty", "effect": "NoSchedule"}]}
    output = await run_action(action, make_ctx(kube=racing), params)
    assert racing.conflicts == 1
    assert sim.node("gpu-node-01")["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "faulty", "effect": "NoSchedule"}
    ]
    assert output["replaced"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ]
    assert (await run_action(action, make_ctx(), params))["already_in_place"] is True
    await run_undo(action, make_ctx(applied_output=output), params)
    assert sim.node("gpu-node-01")["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ]


async def test_untaint_removes_by_key_and_undo_puts_it_back(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    action = taints.UntaintAction()
    params = {"taints": [{"key": "nvidia.com/gpu"}]}
    output = await run_action(action, make_ctx(), params)
    assert not sim.node("gpu-node-01")["spec"].get("taints")
    assert [e["reason"] for e in node_events(sim, "gpu-node-01")] == ["RemediatorUntaint"]
    await run_undo(action, make_ctx(applied_output=output), params)
    assert sim.node("gpu-node-01")["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ]
