"""Retention of raw webhook bodies (episodes, runs and the audit log are kept)."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from remediator.adapters.db import database, tables


async def delete_old_deliveries(
    db: database.Database, *, older_than: dt.datetime, batch: int = 5000
) -> int:
    deleted = 0
    while True:
        async with db.write("retention") as conn:
            ids = (
                sa.select(tables.deliveries.c.id)
                .where(tables.deliveries.c.received_at < older_than)
                .limit(batch)
            )
            result = await conn.execute(
                sa.delete(tables.deliveries).where(tables.deliveries.c.id.in_(ids))
            )
        deleted += result.rowcount or 0
        if not result.rowcount or result.rowcount < batch:
            return deleted
