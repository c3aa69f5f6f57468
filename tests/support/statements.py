"""The SQL statements a block of code sends, as the database driver receives them; the time
the statement-level tests' store stands at, and firing episodes stored at that time."""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa

from remediator.adapters.db import store as sql_store
from remediator.adapters.db import tables

NOW = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)


class Statements:
    """``with Statements() as seen:`` every statement sent in the block (whitespace folded)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.seen.append(" ".join(statement.split()))

    def starting(self, prefix: str) -> list[str]:
        return [s for s in self.seen if s.startswith(prefix)]

    def containing(self, part: str) -> list[str]:
        return [s for s in self.seen if part in s]

    def __enter__(self) -> Statements:
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", self)
        return self

    def __exit__(self, *exc: object) -> None:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", self)


async def episodes(store: sql_store.SqlStore, count: int) -> list[int]:
    """``count`` firing, unhandled episodes stored as they are, their ids in order."""
    E = tables.alert_episodes

    def arrive(tx: sql_store.SqlTx) -> list[int]:
        rows = tx.conn.conn.execute(
            sa.insert(E).returning(E.c.id, sort_by_parameter_order=True),
            [
                {
                    "fingerprint": f"f{n}",
                    "starts_at": NOW,
                    "alertname": "GpuXid79",
                    "status": "firing",
                    "labels": {},
                    "annotations": {},
                    "generator_url": "",
                    "created_at": NOW,
                }
                for n in range(count)
            ],
        )
        return [row.id for row in rows]

    made: list[int] = await store.run("arrive", arrive)
    return made
