"""Reading guard state (the breaker's status, a plan's guard verdicts) locks nothing: it
answers while a guard decision or a breaker reset holds the breaker's row.

Only Postgres locks rows; SQLite readers never waited for its writer either."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from remediator.adapters.db import tables
from tests.conftest import am_fixture

POSTGRES_ONLY = pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
PLAYBOOK = """
name: note
match: {alertname: GPUXidError79}
steps:
  - {id: note, action: log, params: {message: "xid"}}
"""


@POSTGRES_ONLY
async def test_breaker_status_and_plans_answer_while_the_breaker_row_is_locked(make_harness):
    h = await make_harness(PLAYBOOK)
    reset = await h.client.post("/api/v1/breaker/reset", json={"comment": "start"})
    assert reset.status == 200, await reset.text()
    breaker = tables.guard_state.c.key == "breaker"
    async with h.components.db.engine.connect() as holder:
        await holder.begin()  # a guard decision in progress: the row stays locked
        await holder.execute(sa.select(tables.guard_state).where(breaker).with_for_update())
        status = await asyncio.wait_for(h.client.get("/api/v1/breaker"), 5)
        assert status.status == 200, await status.text()
        plan = await asyncio.wait_for(
            h.client.post(
                "/api/v1/plan",
                data=am_fixture("GPUXidError79-firing-1alerts"),
                headers={"Content-Type": "application/json"},
            ),
            5,
        )
        assert plan.status == 200, await plan.text()
        [alert] = (await plan.json())["alerts"]
        assert [playbook["playbook"] for playbook in alert["playbooks"]] == ["note"]
        await holder.rollback()
