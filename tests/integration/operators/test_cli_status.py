"""``remediator status`` against a real server: the fleet view it answers, as a table."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json

from remediator import cli
from remediator.domain import transitions
from remediator.engine import guarding
from tests.integration.operators.conftest import GATED, TOKENS, alert_body, bearer, waiting_step


async def _status(h, *extra: str) -> tuple[int, str]:
    server = str(h.client.make_url("/")).rstrip("/")
    argv = ["status", "--server", server, "--token", TOKENS["ada"][0], *extra]
    out = io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out):
            return cli.main(argv)

    return await asyncio.to_thread(run), out.getvalue()


async def test_status_shows_the_held_node_its_run_the_budget_and_the_open_breaker(
    make_harness, tokens_path
):
    h = await make_harness(GATED, tokens=tokens_path)
    assert (await h.post(alert_body(), **bearer("alertmanager"))).status == 200
    await h.settle()
    run_id, step_id = await waiting_step(h, bearer("root"))

    def work(tx):
        tx.record_disruption(run_id=run_id, node="gpu-node-03")
        guarding.open_breaker(tx, "6 disruptive runs within 0:10:00")
        step = tx.apply(
            transitions.approve(tx.get_step(step_id), now=tx.now, actor="t", reason="t", data={})
        )
        tx.apply(transitions.hold(step, until=tx.now, reason="circuit breaker is open", kind="x"))

    await h.store.run("test", work)
    code, table = await _status(h, "--output", "table")
    assert code == 0
    lines = table.splitlines()
    node = next(line for line in lines if line.startswith("gpu-node-03"))
    assert node.split()[:2] == ["gpu-node-03", "-"]  # no pool label configured
    assert "held" in node.split()
    assert f"#{run_id}" in node.split()
    assert any(line.split()[:4] == ["(whole", "fleet)", "1", "2"] for line in lines)
    assert "breaker: OPEN — 6 disruptive runs within 0:10:00" in table
    held = next(line for line in lines if line.startswith(f"{run_id} "))
    assert held.split()[1:2] == ["drain"]
    assert held.endswith("circuit breaker is open")

    code, text = await _status(h)  # not a terminal: JSON, the API's answer
    assert code == 0
    assert json.loads(text)["nodes"][0]["name"] == "gpu-node-03"
