"""A budget per pool: with `pool_label`, each pool gets its own share of disrupted nodes."""

from __future__ import annotations

import pytest

from remediator.sim import testing
from tests.integration.guards.test_held_steps import CORDON, resolved_alert, small_fleet
from tests.integration.guards.test_held_steps import held as waiting
from tests.integration.guards.test_storm import xid_alert

NODES = {f"gpu-{rack}-{i}": rack for rack in ("a", "b") for i in range(3)}

RACK = "topology.example.com/rack"


@pytest.fixture
async def sim():
    fleet = small_fleet({name: {RACK: rack} for name, rack in NODES.items()})
    async with testing.running_sim(fleet) as running:
        yield running


async def test_each_pool_gets_its_own_budget(make_harness, sim):
    h = await make_harness(
        CORDON,
        kubernetes={"mode": "url", "url": sim.url, "token": sim.token},
        guards={
            "max_nodes": 10,
            "max_percent": 33,
            "pool_label": RACK,
            "max_disruptive_runs": 100,
        },
    )
    for node in NODES:
        await h.post(xid_alert(node))
    await h.settle()
    cordoned = [n for n in NODES if sim.node(n)["spec"].get("unschedulable")]
    assert sorted(NODES[n] for n in cordoned) == ["a", "b"]
    held = []
    for run in await h.runs():
        step = (await h.run_detail(run["id"]))["steps"][0]
        if step["status"] == "pending":
            held.append(step["output"]["held"])
    assert held == ["disruption budget in use: 1 of 1 nodes"] * 4
    # Each pool's held steps wait in its own line: a node of rack a leaving the budget lets
    # rack a's first in line go at once, and rack b's line is not looked at.
    lines = await waiting(h)
    assert {node: wait for node, (wait, _) in lines.items()} == {
        n: f"budget:{rack}" for n, rack in NODES.items() if n not in cordoned
    }
    (first_a,) = (n for n in cordoned if NODES[n] == "a")
    assert (await h.post(resolved_alert(first_a))).status == 200
    await h.settle()
    now = [n for n in NODES if sim.node(n)["spec"].get("unschedulable")]
    next_a = next(n for n in lines if NODES[n] == "a")
    assert sorted(now) == sorted({*cordoned, next_a} - {first_a})
    after = await waiting(h)
    assert all(after[n] == lines[n] for n in lines if NODES[n] == "b")
