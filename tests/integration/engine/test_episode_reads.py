"""The runs a stage works on are read with their steps; their episodes only when the stage
asks for one (the claim, which renders a step from the alert's labels; a decision about a
run whose alert resolved). A burst read each alert's episode, labels and annotations decoded,
in three stages of four that never looked at it."""

from __future__ import annotations

from typing import Any

from tests.support.alerts import alert_body
from tests.support.statements import Statements

GOES_ON = """
name: record
match: {alertname: GPUXidError79}
on_resolve: continue
steps:
  - {id: first, action: test.record, params: {label: "{{ labels.node }}"}}
  - {id: second, action: test.record, params: {label: two}}
"""
STOPS = GOES_ON.replace("on_resolve: continue", "on_resolve: cancel")


def _episode_reads(statements: Statements) -> list[str]:
    """Reads of whole episodes (labels and annotations with them)."""
    return statements.starting("SELECT alert_episodes.id, alert_episodes.fingerprint")


async def _planned(h: Any, nodes: list[str]) -> None:
    for n, node in enumerate(nodes):
        await h.post(alert_body(node=node, fingerprint=f"{n:016x}"))
    assert await h.engine.handle_episodes()


async def test_a_stage_that_asks_for_no_episode_reads_none(make_harness: Any) -> None:
    h = await make_harness(GOES_ON)
    await _planned(h, ["gpu-node-01", "gpu-node-02", "gpu-node-03"])
    for stage in (h.engine.start_runs, h.engine.advance_runs):
        with Statements() as statements:
            assert await stage()
        assert _episode_reads(statements) == []  # was one: read with the runs
    with Statements() as statements:
        assert await h.engine.claim_steps()
        await h.engine.wait_in_flight()
    # a read a transaction that claims, of all its runs' episodes: the claim, and the
    # outcomes' that claims the next steps at once (steps are rendered from the alert)
    assert len(_episode_reads(statements)) == 2
    labels = {record["label"] for record in h.records()}  # each step rendered
    assert labels == {"gpu-node-01", "gpu-node-02", "gpu-node-03", "two"}


async def test_a_run_that_stops_when_its_alert_resolves_still_reads_it(
    make_harness: Any,
) -> None:
    h = await make_harness(STOPS)
    await _planned(h, ["gpu-node-01", "gpu-node-02"])
    assert await h.engine.start_runs()
    with Statements() as statements:
        assert await h.engine.advance_runs()
    assert len(_episode_reads(statements)) == 1  # whether it resolved: both in one statement
    assert {run["status"] for run in await h.runs()} == {"running"}
