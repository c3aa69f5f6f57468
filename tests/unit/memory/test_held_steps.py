"""The in-memory store keeps the held steps' line as the SQL store does: a node leaving the
disruption budget lets the first step waiting for it go at once, not at its recheck."""

from __future__ import annotations

from remediator.domain import guards

DISRUPT = """
name: disrupt
match: {alertname: GPUXidError79}
steps:
  - {id: cordon, action: test.disrupt, params: {label: "{{ target.node }}"}}
"""


async def test_a_node_leaving_the_budget_lets_the_first_in_line_go(make_engine):
    config = guards.GuardConfig(max_nodes=1, max_disruptive_runs=100)
    h = make_engine(DISRUPT, guards=config)
    for node in ("gpu-a", "gpu-b", "gpu-c"):
        await h.fire(node=node)
    await h.settle()
    assert h.applied() == ["gpu-a"]
    waiting = {run.node: h.steps(run.id)[0].waiting_for for run in h.runs()}
    assert waiting == {"gpu-a": None, "gpu-b": "budget:", "gpu-c": "budget:"}
    held = [n["message"] for n in h.notifier.sent if n["data"].get("event") == "held"]
    assert len(held) == 2
    assert "It goes on when a node leaves the budget and its turn in line comes" in held[0]

    await h.store.run("back in service", lambda tx: tx.release_disruptions(node="gpu-a"))
    await h.settle()  # no recheck due
    assert h.applied() == ["gpu-a", "gpu-b"]
    assert h.steps(h.runs()[2].id)[0].waiting_for == "budget:"
