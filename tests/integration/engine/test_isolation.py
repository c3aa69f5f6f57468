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
