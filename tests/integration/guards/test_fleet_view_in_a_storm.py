"""The fleet view in a storm held by its budget: the held steps counted by what they wait
for, the oldest shown with the guard's words, every node with a held step shown held, the
nodes' table a page at a time, the most urgent first. A 3,000-alert storm over 5,000 nodes
made the page 1.7 MB of HTML, held the loop 0.65 s at each refresh and showed 2,000 of its
held steps as if they were all. The real client and the simulated cluster."""

from __future__ import annotations

import re
from typing import Any

import pytest

from remediator.adapters.db import fleet as db_fleet
from remediator.adapters.http import fleet as http_fleet
from remediator.domain import fleet
from remediator.sim import testing
from tests.integration.guards.test_held_steps import NODES, small_fleet, storm

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def sim():
    async with testing.running_sim(small_fleet({node: {} for node in NODES})) as running:
        yield running


@pytest.fixture
def small_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet, "HELD_SHOWN", 2)
    monkeypatch.setattr(http_fleet, "PAGE_ROWS", 2)


async def _json(h: Any, query: str = "") -> Any:
    response = await h.client.get(f"/api/v1/fleet{query}")
    assert response.status == 200, await response.text()
    return await response.json()


async def test_the_held_steps_are_counted_by_line_and_the_oldest_shown(
    make_harness, sim, small_bounds
):
    h = await storm(make_harness, sim)  # 6 alerts, a budget of 2 nodes: 4 steps in line
    runs = {r["node"]: r["id"] for r in await h.runs()}
    view = await _json(h)
    assert view["heldTotal"] == 4
    [line] = view["lines"]
    assert (line["waitingFor"], line["what"], line["steps"]) == (
        "budget:",
        "the disruption budget",
        4,
    )
    assert (line["first"]["run"], line["first"]["node"]) == (runs[NODES[2]], NODES[2])
    # The oldest two, in the guard's own words; the others counted, not listed.
    assert [held["node"] for held in view["held"]] == NODES[2:4]
    assert all(held["reason"].startswith("disruption budget in use") for held in view["held"])
    assert {held["kind"] for held in view["held"]} == {"budget"}
    # Every node with a held step is held, listed or not.
    states = {node["name"]: node["state"] for node in view["nodes"]}
    assert states == {**{n: "cordoned" for n in NODES[:2]}, **{n: "held" for n in NODES[2:]}}
    unlisted = next(node for node in view["nodes"] if node["name"] == NODES[5])
    assert unlisted["detail"] == (
        f"run {runs[NODES[5]]} step cordon held: waits in line for the disruption budget"
    )
    assert view["truncated"] == []

    only_held = await _json(h, "?state=held")
    assert [node["name"] for node in only_held["nodes"]] == NODES[2:]
    for query, field in (("?state=bogus", "state"), ("?page=2", "page")):
        refused = await h.client.get(f"/api/v1/fleet{query}")
        assert refused.status == 400
        assert [f["field"] for f in (await refused.json())["error"]["fields"]] == [field]


async def test_the_api_lists_the_nodes_a_page_at_a_time_by_name(make_harness, sim):
    h = await storm(make_harness, sim)
    whole = await _json(h)
    assert whole["nodesTotal"] == len(whole["nodes"]) == len(NODES)
    assert whole["nextCursor"] is None
    listed, cursor, pages = [], None, 0
    while True:
        page = await _json(h, "?limit=4" + (f"&cursor={cursor}" if cursor else ""))
        pages += 1
        assert page["nodesTotal"] == len(NODES)
        assert page["heldTotal"] == whole["heldTotal"]  # the rest of the view is whole
        listed += page["nodes"]
        cursor = page["nextCursor"]
        if cursor is None:
            break
        assert cursor == page["nodes"][-1]["name"]
    assert pages == -(-len(NODES) // 4)
    assert listed == whole["nodes"]
    assert [n["name"] for n in listed] == sorted(NODES)

    held = await _json(h, "?state=held&limit=3")
    assert held["nodesTotal"] == 4
    assert [n["name"] for n in held["nodes"]] == NODES[2:5]
    rest = await _json(h, f"?state=held&limit=3&cursor={held['nextCursor']}")
    assert ([n["name"] for n in rest["nodes"]], rest["nextCursor"]) == (NODES[5:], None)
    # A cursor is a node's name, not necessarily one listed: the nodes after it.
    after = await _json(h, f"?cursor={NODES[0]}a")
    assert [n["name"] for n in after["nodes"]] == sorted(NODES)[1:]

    for query, field in (
        ("?limit=0", "limit"),
        ("?limit=5001", "limit"),
        ("?limit=two", "limit"),
        ("?cursor=Not_A_Node", "cursor"),
        ("?cursor=" + "a" * 254, "cursor"),
    ):
        refused = await h.client.get(f"/api/v1/fleet{query}")
        assert refused.status == 400, query
        assert [f["field"] for f in (await refused.json())["error"]["fields"]] == [field]


async def test_the_page_shows_the_lines_and_the_nodes_a_page_at_a_time(
    make_harness, sim, small_bounds
):
    h = await storm(make_harness, sim)
    runs = {r["node"]: r["id"] for r in await h.runs()}
    page = await (await h.client.get("/runbooks/fleet")).text()
    [line] = re.findall(r'<li class="line">(.*?)</li>', page)
    assert line.startswith("4 steps wait for the disruption budget, oldest first; next: ")
    assert f'href="/runbooks/runs/{runs[NODES[2]]}"' in line
    assert line.endswith(f"step cordon on {NODES[2]}")
    assert len(re.findall(r'<tr class="held">', page)) == 2
    assert "2 of 4 held steps shown, the oldest" in page
    assert '<a href="?state=held" class="state-filter">4 held</a>' in page
    assert '<a href="?state=cordoned" class="state-filter">2 cordoned</a>' in page

    def nodes_of(text: str) -> list[str]:
        return re.findall(r'<tr class="node" id="node-([^"]+)"', text)

    # The most urgent first: the held nodes, then the cordoned ones, two a page.
    assert nodes_of(page) == NODES[2:4]
    assert "6 nodes, 1-2 shown (page 1 of 3, the most urgent first)" in page
    second = await (await h.client.get("/runbooks/fleet?page=2")).text()
    assert nodes_of(second) == NODES[4:6]
    third = await (await h.client.get("/runbooks/fleet?page=3")).text()
    assert nodes_of(third) == NODES[:2]
    assert 'id="next-page"' not in third
    assert 'href="?page=2" id="previous-page"' in third

    cordoned = await (await h.client.get("/runbooks/fleet?state=cordoned")).text()
    assert nodes_of(cordoned) == NODES[:2]
    assert 'id="all-nodes"' in cordoned
    beyond = await (await h.client.get("/runbooks/fleet?state=held&page=9")).text()
    assert nodes_of(beyond) == NODES[4:6]  # the last page

    wrong = await (await h.client.get("/runbooks/fleet?state=bogus&page=x")).text()
    problems = re.findall(r'<p class="error query-problem">(.*?)</p>', wrong)
    assert problems == [
        f"state must be one of {', '.join(fleet.STATES)}: showing every node",
        "page must be a positive integer: showing the first",
    ]
    assert nodes_of(wrong) == NODES[2:4]


async def test_rows_cut_at_the_read_limit_are_named_and_the_count_stays_whole(
    make_harness, sim, small_bounds, monkeypatch
):
    h = await storm(make_harness, sim)
    monkeypatch.setattr(db_fleet, "LIMIT", 3)
    monkeypatch.setattr(db_fleet, "_IN_LINE", db_fleet._IN_LINE.limit(3))
    monkeypatch.setattr(db_fleet, "_ACTIVE_RUNS", db_fleet._ACTIVE_RUNS.limit(3))
    view = await _json(h)
    assert view["truncated"] == ["runs", "held steps"]
    assert view["heldTotal"] == 4
    assert view["lines"][0]["steps"] == 4
    page = await (await h.client.get("/runbooks/fleet")).text()
    assert "More runs, held steps than the view reads: the oldest are shown." in page
