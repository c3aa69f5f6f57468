"""The SQL statements a block of code sends, as the database driver receives them; the time
the statement-level tests' store stands at, and firing episodes stored at that time; how much
of a table a statement reads as the rows it could walk grow."""

from __future__ import annotations

import datetime as dt
import pathlib
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import sqlalchemy as sa

from remediator.adapters.db import database, migrate, tables
from remediator.adapters.db import store as sql_store

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


# How much of a table a statement reads as the rows it could walk grow: its plans, not its time.
Seed = Callable[[database.Database, int, int], Awaitable[None]]


def instructions(url: str, statement: Any) -> int:
    """The SQLite virtual machine's instructions for ``statement`` (a deterministic count)."""
    from sqlalchemy.dialects import sqlite

    sql = str(statement.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}))
    con = sqlite3.connect(url.removeprefix("sqlite+aiosqlite:///"))
    counted = [0]

    def count() -> int:
        counted[0] += 1
        return 0

    con.set_progress_handler(count, 1)
    con.execute(sql).fetchall()
    con.close()
    return counted[0]


async def instructions_as_rows_grow(
    path: pathlib.Path, seed: Seed, statements: Sequence[Any]
) -> list[tuple[int, ...]]:
    """Each statement's instructions on SQLite with 20 rows seeded (``seed(db, 1, 20)``), then
    with 2,000 (``seed(db, 21, 1980)`` more)."""
    url = f"sqlite+aiosqlite:///{path}"
    db = database.Database(url)
    await migrate.upgrade(db)
    counts = []
    for first, count in ((1, 20), (21, 1980)):
        await seed(db, first, count)
        counts.append(tuple(instructions(url, statement) for statement in statements))
    await db.dispose()
    return counts


def sqlite_plan(url: str, statement: Any) -> list[str]:
    """SQLite's plan for ``statement`` as the application sends it: its values bound, not
    written in as ``instructions`` has them."""
    from sqlalchemy.dialects import sqlite

    compiled = statement.compile(
        dialect=sqlite.dialect(), compile_kwargs={"render_postcompile": True}
    )
    values = compiled.construct_params()
    params = [values[name] for name in compiled.positiontup or ()]
    con = sqlite3.connect(url.removeprefix("sqlite+aiosqlite:///"))
    plan = [row[3] for row in con.execute(f"EXPLAIN QUERY PLAN {compiled}", params)]
    con.close()
    return plan


def rows_read(plan: dict[str, Any], table: str) -> int:
    """The rows of ``table`` a Postgres plan (``EXPLAIN (ANALYZE, FORMAT JSON)``) read: those
    it returned and those it read and filtered out, every loop."""
    own = 0
    if plan.get("Relation Name") == table:
        kept, removed = plan["Actual Rows"], plan.get("Rows Removed by Filter", 0)
        own = (kept + removed) * plan["Actual Loops"]
    return own + sum(rows_read(child, table) for child in plan.get("Plans", ()))


async def postgres_rows_read(
    pg_url: str, seed: Seed, statements: Sequence[Any], table: str
) -> list[int]:
    """The rows of ``table`` each statement's plan reads on Postgres with 2,000 rows seeded."""
    from sqlalchemy.dialects import postgresql

    db = database.Database(pg_url)
    await migrate.upgrade(db)
    await seed(db, 1, 2000)
    read = []
    async with db.write("explain") as conn:
        for statement in statements:
            sql = statement.compile(
                dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}
            )
            found = await conn.execute(sa.text(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}"))
            read.append(rows_read(found.scalar_one()[0]["Plan"], table))
    await db.dispose()
    return read
