"""Stored history for the cost-growth and memory benchmarks, inserted in bulk into a fresh
database: alert episodes, each with the finished two-step cordon run it started.

``open_count`` of them are still firing (handled: their run finished, the alert has not
resolved), the rest resolved. Ids are given explicitly, which SQLite's rowid allocation
continues from (on Postgres each table's sequence is moved past them); the server's own
episodes and runs then follow the seeded ones. Statistics are taken at the end, as
autovacuum would have after a long history.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import sqlalchemy as sa

from remediator.adapters.db import database, migrate, tables

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
BATCH = 5000


def _batch(first: int, last: int, open_from: int) -> tuple[list[Any], list[Any], list[Any]]:
    episodes, runs, steps = [], [], []
    for i in range(first, last + 1):
        at = START + dt.timedelta(seconds=i)
        node = f"seed-node-{i % 1000:04d}"
        firing = i >= open_from
        status = "firing" if firing else "resolved"
        episodes.append(
            {
                "id": i,
                "fingerprint": f"5eed{i:012x}",
                "starts_at": at,
                "alertname": "GPUXidError79",
                "status": status,
                "handled_status": status,
                "labels": {"alertname": "GPUXidError79", "node": node, "severity": "critical"},
                "annotations": {"summary": f"Xid 79 on {node}"},
                "generator_url": "http://prometheus/graph",
                "created_at": at,
                "resolved_at": None if firing else at + dt.timedelta(minutes=5),
            }
        )
        runs.append(
            {
                "id": i,
                "playbook": "bench-cordon",
                "kind": "alert",
                "status": "succeeded",
                "episode_id": i,
                "node": node,
                "exclusive": True,
                "dry_run": False,
                "params": {},
                "on_resolve": "continue",
                "reason": "",
                "created_at": at,
                "updated_at": at,
                "finished_at": at + dt.timedelta(seconds=1),
            }
        )
        for seq, (key, action) in enumerate((("cordon", "node.cordon"), ("label", "node.label"))):
            steps.append(
                {
                    "id": 2 * i - 1 + seq,
                    "run_id": i,
                    "seq": seq,
                    "key": key,
                    "phase": "do",
                    "action": action,
                    "params": {},
                    "status": "succeeded",
                    "requires_approval": False,
                    "approvals_required": 1,
                    "attempt": 1,
                    "max_attempts": 3,
                    "timeout_seconds": 300.0,
                    "on_failure": "stop",
                    "retry": {},
                    "output": {},
                    "started_at": at,
                    "finished_at": at,
                }
            )
    return episodes, runs, steps


async def _seed(url: str, count: int, open_count: int) -> None:
    db = database.Database(url)
    await migrate.upgrade(db)
    open_from = count - open_count + 1
    for first in range(1, count + 1, BATCH):
        episodes, runs, steps = _batch(first, min(first + BATCH - 1, count), open_from)
        async with db.write("bench.seed") as conn:
            await conn.execute(sa.insert(tables.alert_episodes), episodes)
            await conn.execute(sa.insert(tables.runs), runs)
            await conn.execute(sa.insert(tables.steps), steps)
    async with db.write("bench.analyze") as conn:
        if db.is_postgres:
            for table in (tables.alert_episodes, tables.runs, tables.steps):
                await conn.execute(
                    sa.select(
                        sa.func.setval(
                            sa.func.pg_get_serial_sequence(table.name, "id"),
                            sa.select(sa.func.max(table.c.id)).scalar_subquery(),
                        )
                    )
                )
        await conn.execute(sa.text("ANALYZE"))
    await db.dispose()


def seed(url: str, count: int, *, open_count: int = 0) -> None:
    """``count`` episodes with their runs, the last ``open_count`` still firing."""
    asyncio.run(_seed(url, count, open_count))
