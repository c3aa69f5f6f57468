"""Steps a guard holds wait in line for what holds them (``steps.waiting_for``). A node
leaving the disruption budget wakes the oldest step held for it at once; a breaker reset
wakes the steps it held; the first in line for a budget is looked at again every
``recheck``, the rest not at all until woken. Rechecking every held step every
``recheck`` cost a storm held by a budget of 10 nodes a recheck a held step each time (3,000
alerts: 5 % of a core on SQLite). The real client and the simulated cluster."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
import sqlalchemy as sa

from remediator.adapters.db import database, tables
from remediator.adapters.db import store as sql_store
from remediator.sim import fleet as fleet_mod
from remediator.sim import testing
from tests.integration.guards.test_storm import xid_alert
from tests.integration.playbooks.test_driver_upgrade import seen_by_the_server, set_label
from tests.support.statements import NOW, instructions_as_rows_grow, postgres_rows_read

pytestmark = pytest.mark.timeout(120)

NODES = [f"gpu-held-{i}" for i in range(6)]
UPGRADING = ("remediator.io/driver-upgrade", "in-progress")  # (the simulated operator leaves it)

CORDON = """
name: cordon-on-xid
match: {alertname: GPUXidError79}
on_resolve: undo
steps:
  - {id: cordon, action: node.cordon, undo: true}
"""


def small_fleet(nodes: Mapping[str, Mapping[str, str]]) -> fleet_mod.Fleet:
    """GPU nodes of one GPU each, with their labels, at a hundredth of real time."""
    return fleet_mod.Fleet.model_validate(
        {
            "settings": {"time_scale": 0.01},
            "nodes": [
                {
                    "name": name,
                    "labels": {"nvidia.com/gpu.present": "true", **labels},
                    "gpus": {"count": 1},
                }
                for name, labels in nodes.items()
            ],
        }
    )


@pytest.fixture
async def sim():
    async with testing.running_sim(small_fleet({node: {} for node in NODES})) as running:
        yield running


def cordoned(sim: testing.RunningSim) -> list[str]:
    return [n for n in NODES if sim.node(n)["spec"].get("unschedulable")]


def resolved_alert(node: str) -> bytes:
    body = json.loads(xid_alert(node))
    body["status"] = body["alerts"][0]["status"] = "resolved"
    body["alerts"][0]["endsAt"] = "2026-11-30T12:30:00Z"
    return json.dumps(body).encode()


async def held(h: Any) -> dict[str, tuple[str | None, str]]:
    """Each pending cordon's node: what it waits for, and when it is looked at again."""
    S, R = tables.steps, tables.runs
    async with h.store.db.read() as conn:
        rows = await conn.execute(
            sa.select(R.c.node, S.c.waiting_for, S.c.output)
            .join(R, R.c.id == S.c.run_id)
            .where(S.c.status == "pending", S.c.action == "node.cordon")
            .order_by(S.c.id)
        )
        return {row.node: (row.waiting_for, row.output["held_until"]) for row in rows}


async def storm(make_harness: Any, sim: testing.RunningSim, **guards: Any) -> Any:
    h = await make_harness(
        CORDON,
        kubernetes={"mode": "url", "url": sim.url, "token": sim.token},
        guards={
            "max_nodes": 2,
            "max_percent": 100,
            "max_disruptive_runs": 100,
            "recheck": "10s",
            "budget_recheck": "10m",
        }
        | guards,
    )
    for node in NODES:
        assert (await h.post(xid_alert(node))).status == 200
    await h.settle()
    return h


async def test_a_node_leaving_the_budget_starts_the_first_in_line_at_once(make_harness, sim, clock):
    h = await storm(make_harness, sim)
    assert cordoned(sim) == NODES[:2]
    first = await held(h)
    assert list(first) == NODES[2:]
    assert {wait for wait, _ in first.values()} == {"budget:"}
    run = next(r for r in await h.runs() if r["node"] == NODES[2])
    page = await (await h.client.get(f"/runbooks/runs/{run['id']}")).text()
    assert "goes when a node leaves the budget, oldest first, rechecked" in page

    clock.advance(11)  # a recheck: the first in line is looked at again, and held again
    await h.settle()
    again = await held(h)
    assert again[NODES[2]][1] > first[NODES[2]][1]
    assert all(again[node] == first[node] for node in NODES[3:])  # not looked at
    assert cordoned(sim) == NODES[:2]

    # The first node's alert resolves: its cordon is undone, which frees its place, and the
    # first in line takes it in the same settling, with no recheck due.
    assert (await h.post(resolved_alert(NODES[0]))).status == 200
    await h.settle()
    assert cordoned(sim) == [NODES[1], NODES[2]]
    after = await held(h)
    assert list(after) == NODES[3:]
    assert after[NODES[3]][1] > again[NODES[3]][1]  # the next, looked at as the first went
    assert all(after[node] == first[node] for node in NODES[4:])


async def test_a_place_freed_without_a_wake_is_taken_at_the_next_recheck(make_harness, sim, clock):
    """A wake can be lost: the replica that freed the place dies before its commit's wake
    is acted on, or two replicas race for the same first in line. The leader's recheck of
    the first in line (every ``recheck``) takes the place all the same; the rest of the
    line stays as it is."""
    h = await storm(make_harness, sim)
    first = await held(h)
    async with h.store.db.write("test") as conn:  # freed, and nobody woken
        await conn.execute(
            sa.update(tables.disruptions)
            .where(tables.disruptions.c.node == NODES[0])
            .values(released_at=NOW)
        )
    await h.settle()
    assert cordoned(sim) == NODES[:2]  # no wake: nothing moved

    clock.advance(11)
    await h.settle()
    assert cordoned(sim) == NODES[:3]
    after = await held(h)
    assert list(after) == NODES[3:]
    assert all(after[node] == first[node] for node in NODES[4:])  # not looked at


async def test_a_step_woken_for_a_place_it_cannot_take_hands_it_to_the_next(
    make_harness, sim, clock
):
    h = await storm(make_harness, sim)
    # The first in line's node starts a driver upgrade while it waits: woken by the budget,
    # it is held by the upgrade instead, and the place goes to the next in line.
    set_label(sim, NODES[2], *UPGRADING)
    await seen_by_the_server(h, NODES[2], *UPGRADING)
    assert (await h.post(resolved_alert(NODES[0]))).status == 200
    await h.settle()
    assert cordoned(sim) == [NODES[1], NODES[3]]
    after = await held(h)
    assert after[NODES[2]][0] is None  # rechecked on the recheck, as upgrades are
    assert {after[node][0] for node in NODES[4:]} == {"budget:"}


async def test_a_breaker_reset_looks_at_the_steps_it_held_at_once(make_harness, sim, clock):
    h = await storm(make_harness, sim, max_nodes=10, max_disruptive_runs=3)
    assert cordoned(sim) == []
    assert {wait for wait, _ in (await held(h)).values()} == {"breaker:"}

    reset = await h.client.post("/api/v1/breaker/reset", json={"comment": "seen"})
    assert reset.status == 200
    await h.settle()  # no recheck due
    assert cordoned(sim) == NODES


async def _seed_held_steps(db: database.Database, first: int, count: int) -> None:
    """Running runs ``first`` to ``first + count - 1``, each with a step the budget holds
    (and one it finished): a storm held by its budget. Statistics taken after."""
    ids = range(first, first + count)
    run = {"playbook": "reboot", "kind": "alert", "exclusive": True, "dry_run": False}
    run |= {"params": {}, "on_resolve": "cancel", "reason": "", "created_at": NOW}
    run |= {"updated_at": NOW, "status": "running"}
    step = {"phase": "do", "action": "node.drain", "params": {}, "requires_approval": False}
    step |= {"approvals_required": 1, "attempt": 0, "max_attempts": 1, "timeout_seconds": 60}
    step |= {"on_failure": "stop", "retry": {}, "effect": "none"}
    async with db.write("seed") as conn:
        await conn.execute(
            sa.insert(tables.runs), [run | {"id": i, "node": f"busy-{i}"} for i in ids]
        )
        await conn.execute(
            sa.insert(tables.steps),
            [
                step
                | {"id": 2 * i, "run_id": i, "seq": 0, "key": "cordon", "status": "succeeded"}
                | {"output": {}, "due_at": None, "waiting_for": None}
                for i in ids
            ]
            + [
                step
                | {"id": 2 * i + 1, "run_id": i, "seq": 1, "key": "drain", "status": "pending"}
                | {"output": {"held_kind": "budget"}, "due_at": NOW, "waiting_for": "budget:"}
                for i in ids
            ],
        )
        await conn.execute(sa.text("ANALYZE"))


# The leader's recheck of the first in line (the keys held steps wait for, and the oldest
# step waiting for one) and a release's wake of the oldest.
_RECHECK_READS = (
    sql_store._NEXT_HELD_KEY.params(w_after=""),
    sql_store._OLDEST_HELD.params(w_key="budget:", w_count=1),
)


async def test_the_recheck_and_a_wake_do_not_walk_the_held_steps(tmp_path: Any) -> None:
    """With 20 or 2,000 steps the budget holds, finding the first in line executes the same
    instructions: it reads the index of what held steps wait for, a seek a key."""
    counts = await instructions_as_rows_grow(tmp_path / "held.db", _seed_held_steps, _RECHECK_READS)
    assert counts[0] == counts[1]


@pytest.mark.postgres
async def test_postgres_reads_one_held_step_to_find_the_first_in_line(pg_url: str) -> None:
    assert await postgres_rows_read(pg_url, _seed_held_steps, _RECHECK_READS, "steps") == [1, 1]


async def test_the_breaker_holds_the_first_in_line_and_the_line_stays_as_it_is(
    make_harness, sim, clock
):
    """The breaker opens while steps wait for the budget. A node leaving the budget wakes the
    first in line, which the breaker holds: it hands nothing on (the next would be held too;
    a storm's whole line would be looked at, a step a pass). The reset lets it go."""
    h = await make_harness(
        CORDON,
        kubernetes={"mode": "url", "url": sim.url, "token": sim.token},
        guards={"max_nodes": 2, "max_percent": 100, "max_disruptive_runs": 5},
    )
    for node in NODES[:4]:
        assert (await h.post(xid_alert(node))).status == 200
    await h.settle()
    for node in NODES[4:]:  # six runs within the breaker's window: it opens
        assert (await h.post(xid_alert(node))).status == 200
    await h.settle()
    assert cordoned(sim) == NODES[:2]
    assert [wait for wait, _ in (await held(h)).values()] == ["budget:"] * 2 + ["breaker:"] * 2

    assert (await h.post(resolved_alert(NODES[0]))).status == 200
    await h.settle()
    waits = {node: wait for node, (wait, _) in (await held(h)).items()}
    assert waits == {NODES[2]: "breaker:", NODES[3]: "budget:"} | dict.fromkeys(
        NODES[4:], "breaker:"
    )

    reset = await h.client.post("/api/v1/breaker/reset", json={"comment": "seen"})
    assert reset.status == 200
    await h.settle()
    assert cordoned(sim) == [NODES[1], NODES[2]]
