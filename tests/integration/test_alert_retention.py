"""The retention pass of the real app: alert episodes past ``alert_retention_days`` keep only
what the audit needs, or go; their runs stay; 0 keeps everything."""

from __future__ import annotations

import remediator.app as app_mod
from tests.support.alerts import alert_body

PLAYBOOK = """
name: note
match: {alertname: GPUXidError79}
steps:
  - {id: note, action: test.record, params: {label: note}}
"""
PRIVATE = {"namespace": "team-a", "pod": "train-llm-7f9c"}
DAY = 86400


async def _deliver(h, **kwargs):
    response = await h.post(alert_body(extra_labels=PRIVATE, **kwargs))
    assert response.status == 200, await response.text()
    await h.settle()


async def _episode(h, episode_id):
    return await h.store.run("test", lambda tx: tx.get_episode(episode_id))


async def test_expired_episodes_are_reduced_or_deleted_and_their_runs_kept(make_harness, clock):
    h = await make_harness(PLAYBOOK, alert_retention_days=30)
    await _deliver(h)
    await _deliver(h, status="resolved")
    await _deliver(h, alertname="NoPlaybook", fingerprint="f-unmatched")
    await _deliver(h, alertname="NoPlaybook", fingerprint="f-unmatched", status="resolved")
    [summary] = await h.runs()
    detail = await h.run_detail(summary["id"])
    assert detail["status"] == "succeeded"
    episode_id = (await h.store.run("t", lambda tx: tx.get_run(summary["id"]))).episode_id
    unmatched = episode_id + 1
    while await _episode(h, unmatched) is None:  # Postgres upserts may skip ids
        unmatched += 1
    clock.advance(29 * DAY)
    await app_mod.retention_pass(h.components)
    assert (await _episode(h, episode_id)).labels["pod"] == "train-llm-7f9c"

    clock.advance(2 * DAY)
    await app_mod.retention_pass(h.components)

    episode = await _episode(h, episode_id)
    assert episode.labels == {
        "alertname": "GPUXidError79",
        "node": "gpu-node-03",
        "severity": "critical",
    }
    assert (episode.annotations, episode.generator_url) == ({}, "")
    assert await _episode(h, unmatched) is None
    assert (await h.run_detail(summary["id"]))["status"] == "succeeded"
    verified = await h.client.get("/api/v1/audit/verify")
    assert (await verified.json())["ok"] is True


async def test_zero_keeps_alert_episodes_whole(make_harness, clock):
    h = await make_harness(PLAYBOOK, alert_retention_days=0)
    await _deliver(h)
    await _deliver(h, status="resolved")
    [summary] = await h.runs()
    episode_id = (await h.store.run("t", lambda tx: tx.get_run(summary["id"]))).episode_id
    clock.advance(3650 * DAY)
    await app_mod.retention_pass(h.components)
    assert (await _episode(h, episode_id)).labels["pod"] == "train-llm-7f9c"


async def test_a_retention_pass_gives_way_to_every_other_writer(tmp_path):
    """A first pass over a long history is minutes of writes: each batch waits until no
    webhook commit or engine pass wants SQLite's writer, and goes on after the last id."""
    import asyncio
    import datetime as dt

    import sqlalchemy as sa

    from remediator.adapters.db import database, migrate, retention, tables

    db = database.Database(f"sqlite+aiosqlite:///{tmp_path / 'r.db'}")
    await migrate.upgrade(db)
    old = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    try:

        def arrive(conn):
            conn.execute(
                sa.insert(tables.alert_episodes),
                [
                    {
                        "fingerprint": f"f{n}",
                        "starts_at": old,
                        "alertname": "GPUXidError79",
                        "status": "resolved",
                        "handled_status": "resolved",
                        "labels": {},
                        "annotations": {},
                        "generator_url": "",
                        "created_at": old,
                        "resolved_at": old,
                    }
                    for n in range(10)
                ],
            )

        await db.write_sync("seed", arrive)
        order = []
        batches = []
        write_sync = db.write_sync

        async def noted(operation, work, **kind):
            if operation == "retention":
                batches.append(kind)
            return await write_sync(operation, work, **kind)

        db.write_sync = noted
        assert db._write_lock is not None
        async with db._write_lock.hold():  # an engine pass holds the writer
            pruning = asyncio.create_task(
                retention.prune_alert_episodes(db, ended_before=old + dt.timedelta(days=1), batch=3)
            )
            await asyncio.sleep(0.05)
            engine = asyncio.create_task(
                write_sync("engine", lambda conn: order.append(len(batches)))
            )
            await asyncio.sleep(0.05)
        pruned = await pruning
        await engine
        assert order == [1]  # granted before retention's first batch ran
        assert pruned.deleted == 10
        assert batches == [{"background": True}] * 5  # 3 + 3 + 3 + 1 deleted; none to reduce
    finally:
        await db.dispose()
