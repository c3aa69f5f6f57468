"""The fleet view's node states, budgets per pool and nodes only the store names."""

from __future__ import annotations

import datetime as dt

from remediator.domain import fleet, guards

NOW = dt.datetime(2026, 12, 1, 3, 0, tzinfo=dt.UTC)


def _node(name: str, **values: object) -> fleet.ClusterNode:
    return fleet.ClusterNode(name=name, labels=values.pop("labels", {}), **values)  # type: ignore[arg-type]


def test_each_node_shows_its_most_urgent_state():
    listed = [
        _node("a"),
        _node("b", unschedulable=True),
        _node("c", labels={"gpu-status": "faulty"}, unschedulable=True),
        _node("d"),
        _node("e"),
        _node("f"),
    ]
    records = fleet.Records(
        runs=(
            fleet.ActiveRun(id=7, node="d", playbook="drain", status="running", draining=True),
            fleet.ActiveRun(id=8, node="e", playbook="gpu-xid-error", status="running"),
        ),
        disruptions=(fleet.Disruption(run=3, node="b", pool=None, since=NOW),),
        held=(fleet.HeldStep(run=8, step="drain", action="node.drain", node="e", reason="budget"),),
        capped=(fleet.CappedGpu(node="f", run=9, uuid="GPU-1", limit=250.0, previous=400.0),),
    )
    status = fleet.assemble(listed, records, config=guards.GuardConfig(max_nodes=2))
    states = {node.name: (node.state, node.runs) for node in status.nodes}
    assert states == {
        "a": ("healthy", ()),
        "b": ("cordoned", (3,)),
        "c": ("faulty", ()),
        "d": ("draining", (7,)),
        "e": ("held", (8,)),
        "f": ("capped", ()),
    }
    assert status.node("b").detail == "cordoned by run 3"
    [budget] = status.budgets
    assert (budget.pool, budget.used, budget.allowed, budget.nodes) == (None, 1, 1, ("b",))


def test_budgets_are_per_pool_and_a_node_only_the_store_names_is_kept():
    listed = [_node(f"n{i}", labels={"rack": "r1" if i < 5 else "r2"}) for i in range(10)]
    records = fleet.Records(
        disruptions=(
            fleet.Disruption(run=1, node="n1", pool="r1", since=NOW),
            fleet.Disruption(run=2, node="gone", pool="r2", since=NOW),
        )
    )
    config = guards.GuardConfig(pool_label="rack", max_nodes=3, max_percent=40)
    status = fleet.assemble(listed, records, config=config)
    budgets = {b.pool: (b.used, b.allowed) for b in status.budgets}
    assert budgets == {"r1": (1, 2), "r2": (1, 2)}
    gone = status.node("gone")
    assert gone is not None
    assert not gone.known_to_cluster
    assert gone.runs == (2,)


def test_without_a_cluster_the_budget_is_the_absolute_cap():
    status = fleet.assemble(None, fleet.Records(), config=guards.GuardConfig(max_nodes=4))
    assert status.nodes == ()
    assert [(b.used, b.allowed) for b in status.budgets] == [(0, 4)]
