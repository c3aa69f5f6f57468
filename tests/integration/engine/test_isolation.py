"""Poison input never stops the engine: a unit of work that fails is isolated, retried a few
times and quarantined, and every other alert still gets its run."""

from __future__ import annotations

import sqlalchemy as sa

from remediator.adapters.db import tables
from tests.support.alerts import alert_body

PLAYBOOK = """
name: record
match: {alertname: GPUXidError79}
steps:
  - {id: a, action: test.record, params: {label: "{{ target.node }}"}}
"""


async def poison_episode_labels(h, node: str, labels: dict[str, str]) -> None:
    """Rewrite a stored episode's labels as if they had arrived that way (intake refuses
    them today): the engine must survive whatever a row holds."""
    episodes = tables.alert_episodes

    def work(conn: sa.Connection) -> None:
        row = conn.execute(
            sa.select(episodes.c.id, episodes.c.labels).where(
                episodes.c.labels["node"].as_string() == node
            )
        ).one()
        conn.execute(
            sa.update(episodes).where(episodes.c.id == row.id).values(labels=row.labels | labels)
        )

    await h.store.db.write_sync("test", work)


async def test_an_episode_the_engine_cannot_store_is_quarantined_and_others_still_run(
    make_harness, clock
):
    h = await make_harness(PLAYBOOK)
    assert (await h.post(alert_body(node="gpu-node-01"))).status == 200
    # On Postgres a 300-character node cannot be stored in runs.node ("value too long").
    await poison_episode_labels(h, "gpu-node-01", {"node": "n" * 300})
    assert (await h.post(alert_body(node="gpu-node-02"))).status == 200
    await h.settle()
    runs = {r["node"]: r for r in await h.runs()}
    assert runs["gpu-node-02"]["status"] == "succeeded"
    # A later, normal alert still gets its run at once.
    assert (await h.post(alert_body(node="gpu-node-04"))).status == 200
    await h.settle()
    runs = {r["node"]: r for r in await h.runs()}
    assert runs["gpu-node-04"]["status"] == "succeeded"
    if h.store.db.is_postgres:  # (SQLite stores any length: that run simply runs)
        events = (
            await (await h.client.get("/api/v1/audit/events", params={"limit": "500"})).json()
        )["items"]
        [quarantined] = [e for e in events if e["kind"] == "engine.quarantined"]
        assert quarantined["data"]["failures"] == 3
        assert "too long" in quarantined["reason"]
        metrics = await (await h.client.get("/metrics")).text()
        assert 'remediator_engine_quarantined_total{unit="episode"} 1.0' in metrics


async def test_a_unit_that_raises_is_rolled_back_alone(make_harness):
    h = await make_harness(
        """
        name: explodes
        match: {alertname: GPUXidError79}
        steps:
          - {id: a, action: test.record, params: {label: '{{ labels.kind or "ok" }}'}}
        """
    )
    for node, kind in (("gpu-node-01", "explode"), ("gpu-node-02", "ok")):
        body = alert_body(node=node, extra_labels={"kind": kind})
        assert (await h.post(body)).status == 200
    await h.settle()
    runs = {r["node"]: r for r in await h.runs()}
    assert runs["gpu-node-02"]["status"] == "succeeded"
    assert "gpu-node-01" not in runs  # its run creation was rolled back, then quarantined
    events = (await (await h.client.get("/api/v1/audit/events", params={"limit": "500"})).json())[
        "items"
    ]
    [quarantined] = [e for e in events if e["kind"] == "engine.quarantined"]
    assert quarantined["data"]["unit"].startswith("episode:")
    assert "RuntimeError" in quarantined["reason"]


async def test_units_run_without_savepoints_until_one_fails_and_a_failure_counts_once(
    make_harness,
):
    """Savepoints were a third of a pass's statements: a pass runs its units without them,
    and only when a unit fails is it rolled back and run again with a savepoint per unit. The
    failing unit is then counted once, and the healthy ones are planned by that same pass."""
    h = await make_harness(
        """
        name: explodes
        match: {alertname: GPUXidError79}
        steps:
          - {id: a, action: test.record, params: {label: '{{ labels.kind or "ok" }}'}}
        """
    )
    statements: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement.split()[0].upper())

    async def one_pass() -> list[str]:
        statements.clear()
        sa.event.listen(sa.Engine, "before_cursor_execute", count)
        try:
            assert await h.engine.tick()
        finally:
            sa.event.remove(sa.Engine, "before_cursor_execute", count)
        await h.engine.wait_in_flight()
        return list(statements)

    for node in ("gpu-node-01", "gpu-node-02", "gpu-node-03"):
        assert (await h.post(alert_body(node=node, extra_labels={"kind": "ok"}))).status == 200
    healthy = await one_pass()
    assert "INSERT" in healthy
    assert "SAVEPOINT" not in healthy
    assert len(await h.runs()) == 3

    for node, kind in (("gpu-node-04", "explode"), ("gpu-node-05", "ok")):
        assert (await h.post(alert_body(node=node, extra_labels={"kind": kind}))).status == 200
    poisoned = await one_pass()
    assert "SAVEPOINT" in poisoned
    runs = {r["node"]: r for r in await h.runs()}
    assert "gpu-node-05" in runs
    assert "gpu-node-04" not in runs
    failures = await h.store.run("test", lambda tx: tx.guard_states("engine-failures:episode:"))
    assert [state["failures"] for state in failures.values()] == [1]
