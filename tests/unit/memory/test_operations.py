"""The operations layer on the in-memory store: decisions, manual triggers and the breaker,
each answered with a typed result (no HTTP, no database)."""

from __future__ import annotations

from typing import Any

import pytest

from remediator.domain import errors, fleet, runs
from remediator.engine import lifecycle, operations
from remediator.ports import cluster as cluster_port

GATED = """
name: gated
match: {alertname: GPUXidError79}
steps:
  - {id: note, action: test.record, params: {label: note}}
  - {id: drain, action: test.record, params: {label: drain}, requires_approval: true}
"""

RETURN = """
name: return-to-service
manual: true
parameters:
  node: {type: string, required: true}
  reason: {type: string, required: true}
steps:
  - {id: note, action: test.record, params: {label: "back {{ params.reason }}"}}
"""


class Records:
    async def fleet_records(self) -> fleet.Records:
        raise AssertionError("not asked in these tests")


class Cluster:
    """Lists the GPU nodes it was given, whatever the selector (which it keeps)."""

    gpu_node_selector = "nvidia.com/gpu.present=true"

    def __init__(self, *nodes: str) -> None:
        self.nodes = nodes
        self.selectors: list[str] = []

    async def gpu_nodes(self) -> list[Any]:
        return await self.list_nodes(self.gpu_node_selector)

    async def list_nodes(self, label_selector: str = "") -> list[Any]:
        self.selectors.append(label_selector)
        return [
            cluster_port.NodeInfo(
                name=name,
                labels={},
                annotations={},
                taints=[],
                unschedulable=False,
                resource_version="1",
            )
            for name in self.nodes
        ]


def operations_of(h: Any, *, cluster: Any = None) -> tuple[operations.Operations, list[Any]]:
    """Operations over the harness's store and engine; the list collects wake-ups and
    published reports."""
    seen: list[Any] = []

    async def publish(report: lifecycle.Report) -> None:
        seen.append(report)
        await h.engine.publish(report)

    return operations.Operations(
        store=h.store,
        records=Records(),
        registry=h.engine.services.registry,
        index=lambda: h.engine.rules.index,
        cluster=lambda: cluster,
        notifier=h.notifier,
        guards=h.engine.settings.guards,
        clock=h.clock,
        wake=lambda: seen.append("wake"),
        publish=publish,
    ), seen


async def _waiting(h: Any) -> tuple[int, int]:
    await h.fire()
    await h.settle()
    [run] = h.runs()
    return run.id, h.steps(run.id)[1].id


async def test_an_approval_answers_the_step_as_it_is_afterwards_and_wakes_the_engine(
    make_engine,
):
    h = make_engine(GATED)
    ops, seen = operations_of(h)
    run_id, step_id = await _waiting(h)
    decided = await ops.decide(
        run_id=run_id, step_id=step_id, principal="alice", approve=True, comment="looked"
    )
    assert decided == operations.Decision(run_id, step_id, runs.StepStatus.PENDING, 1)
    assert seen[-1] == "wake"
    await h.settle()
    assert h.runs()[0].status is runs.RunStatus.SUCCEEDED
    assert h.applied() == ["note", "drain"]


async def test_a_rejection_answers_rejected_and_publishes_the_run_it_ended(make_engine):
    h = make_engine(GATED)
    ops, seen = operations_of(h)
    run_id, step_id = await _waiting(h)
    decided = await ops.decide(
        run_id=run_id, step_id=step_id, principal="alice", approve=False, comment="not now"
    )
    assert decided.status is runs.StepStatus.REJECTED
    [report, _wake] = seen
    assert [run.status for run in report.finished] == [runs.RunStatus.REJECTED]


async def test_a_decision_on_a_step_of_another_run_is_not_found(make_engine):
    h = make_engine(GATED)
    ops, seen = operations_of(h)
    run_id, step_id = await _waiting(h)
    with pytest.raises(errors.NotFound, match=f"step {step_id} of run {run_id + 1} not found"):
        await ops.decide(
            run_id=run_id + 1, step_id=step_id, principal="alice", approve=True, comment="x"
        )
    assert h.statuses(run_id) == ["succeeded", "waiting_approval"]
    assert seen == []


async def test_a_trigger_starts_a_manual_run_on_the_node_naming_the_principal(make_engine):
    h = make_engine(RETURN)
    ops, seen = operations_of(h)
    started = await ops.trigger(
        playbook="return-to-service",
        node="gpu-node-07",
        params={"reason": "fixed"},
        principal="bob",
    )
    [run] = h.runs()
    assert started == operations.Triggered(run.id, "return-to-service", "gpu-node-07", "bob")
    assert (run.kind, run.node, run.principal) == (runs.RunKind.MANUAL, "gpu-node-07", "bob")
    assert run.params == {"node": "gpu-node-07", "reason": "fixed"}
    assert seen == ["wake"]
    created = [e for e in h.store.events(run_id=run.id) if e.kind == "run.created"]
    assert [e.actor for e in created] == ["bob"]


async def test_a_trigger_whose_node_and_params_node_differ_is_refused(make_engine):
    h = make_engine(RETURN)
    ops, _ = operations_of(h)
    with pytest.raises(errors.ValidationFailed, match="name different nodes") as refused:
        await ops.trigger(
            playbook="return-to-service",
            node="gpu-node-07",
            params={"node": "gpu-node-08", "reason": "fixed"},
            principal="bob",
        )
    assert [f["field"] for f in refused.value.fields] == ["node", "params.node"]
    assert h.runs() == []


async def test_a_trigger_refuses_what_is_not_a_node_name_and_playbooks_that_are_not_manual(
    make_engine,
):
    h = make_engine(RETURN, GATED)
    ops, _ = operations_of(h)
    with pytest.raises(errors.ValidationFailed, match="not a Kubernetes node name"):
        await ops.trigger(
            playbook="return-to-service", node="Node_7", params={"reason": "x"}, principal="bob"
        )
    with pytest.raises(errors.NotFound, match="no manual runbook 'gated'"):
        await ops.trigger(playbook="gated", node="gpu-node-07", params={}, principal="bob")
    with pytest.raises(errors.ValidationFailed, match="invalid parameters"):
        await ops.trigger(
            playbook="return-to-service", node="gpu-node-07", params={}, principal="b"
        )
    assert h.runs() == []


async def test_a_selector_starts_one_run_per_matching_gpu_node(make_engine):
    h = make_engine(RETURN)
    cluster = Cluster("gpu-node-09", "gpu-node-02")
    ops, _ = operations_of(h, cluster=cluster)
    selected = await ops.trigger_selected(
        playbook="return-to-service", selector="pool=a", params={"reason": "x"}, principal="bob"
    )
    assert selected.selector == "pool=a"
    assert [(r.node, r.principal) for r in selected.runs] == [
        ("gpu-node-02", "bob"),
        ("gpu-node-09", "bob"),
    ]
    assert cluster.selectors == ["nvidia.com/gpu.present=true,pool=a"]
    assert sorted(run.node for run in h.runs()) == ["gpu-node-02", "gpu-node-09"]


async def test_a_selector_without_a_cluster_or_with_params_node_is_refused(make_engine):
    h = make_engine(RETURN)
    ops, _ = operations_of(h)
    with pytest.raises(errors.ValidationFailed, match="no Kubernetes cluster is configured"):
        await ops.trigger_selected(
            playbook="return-to-service", selector="pool=a", params={}, principal="bob"
        )
    with pytest.raises(errors.ValidationFailed, match="not both"):
        await ops.trigger_selected(
            playbook="return-to-service",
            selector="pool=a",
            params={"node": "gpu-node-02"},
            principal="bob",
        )
    ops, _ = operations_of(h, cluster=Cluster())
    with pytest.raises(errors.ValidationFailed, match="no GPU node matches 'pool=a'"):
        await ops.trigger_selected(
            playbook="return-to-service", selector="pool=a", params={}, principal="bob"
        )
    assert h.runs() == []


async def test_the_breaker_status_lists_the_disrupted_nodes(make_engine):
    h = make_engine(GATED)
    ops, _ = operations_of(h)
    assert await ops.breaker_status() == operations.BreakerStatus(
        open=False,
        reason=None,
        opened_at=None,
        reset_at=None,
        reset_by=None,
        reset_comment=None,
        disrupted_nodes=(),
    )
    run_id, _ = await _waiting(h)
    opened = h.clock().isoformat()

    def disrupt(tx: Any) -> None:
        tx.record_disruption(run_id=run_id, node="gpu-node-05")
        tx.record_disruption(run_id=run_id, node="gpu-node-03")
        tx.set_guard_state("breaker", {"open": True, "reason": "3 failures", "opened_at": opened})

    await h.store.run("test.disrupt", disrupt)
    status = await ops.breaker_status()
    assert (status.open, status.reason, status.opened_at) == (True, "3 failures", opened)
    assert status.disrupted_nodes == ("gpu-node-03", "gpu-node-05")


async def test_a_breaker_reset_answers_the_closed_breaker_with_who_and_why(make_engine):
    h = make_engine(GATED)
    ops, seen = operations_of(h)
    await h.store.run(
        "test.open", lambda tx: tx.set_guard_state("breaker", {"open": True, "reason": "storm"})
    )
    status = await ops.reset_breaker(principal="carol", comment="storm is over")
    assert (status.open, status.reset_by, status.reset_comment) == (
        False,
        "carol",
        "storm is over",
    )
    assert status.reset_at == h.clock().isoformat()
    assert seen == ["wake"]
    [reset] = [e for e in h.store.events() if e.kind == "breaker.reset"]
    assert (reset.actor, reset.reason, reset.from_status) == ("carol", "storm is over", "open")


async def test_a_run_plan_previews_the_steps_still_to_run_and_an_unknown_run_has_none(
    make_engine,
):
    h = make_engine(GATED)
    ops, _ = operations_of(h)
    run_id, _ = await _waiting(h)
    plan = await ops.plan_run(run_id)
    assert plan is not None
    assert (plan.run, plan.playbook, plan.node) == (run_id, "gated", "gpu-node-03")
    assert [(s["key"], s["status"]) for s in plan.steps] == [
        ("note", "succeeded"),
        ("drain", "waiting_approval"),
    ]
    assert "preview" in plan.steps[1]
    assert "preview" not in plan.steps[0]
    assert await ops.plan_run(run_id + 1) is None
