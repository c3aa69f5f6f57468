"""Background transactions on Postgres (retention's batches) give way to the process's other
work, as SQLite's writer grants them only when nobody else waits: each starts in a quiet
moment (or once it has waited its patience), and while the process is busy each is followed
by a pause four times its length. Retention's first pass over 10⁶ expired episodes had run
3.5 minutes of back-to-back batches through whatever storm came meanwhile."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable

import pytest
import sqlalchemy as sa

from remediator.adapters.db import database

pytestmark = pytest.mark.postgres

WAIT = 5.0  # the longest a test waits for anything: a wrong design fails, never hangs


@pytest.fixture
async def db(pg_url: str) -> AsyncIterator[database.Database]:
    db = database.Database(pg_url)
    try:
        yield db
    finally:
        await db.dispose()


def _held_open(release: threading.Event, done: list[str]) -> Callable[[sa.Connection], None]:
    def work(conn: sa.Connection) -> None:
        conn.exec_driver_sql("SELECT 1")
        release.wait(WAIT)  # the transaction stays open meanwhile
        done.append("foreground")

    return work


async def test_a_background_transaction_waits_for_one_in_flight(db: database.Database) -> None:
    release, done = threading.Event(), list[str]()
    foreground = asyncio.create_task(db.write_sync("engine", _held_open(release, done)))
    await asyncio.sleep(0.1)
    background = asyncio.create_task(
        db.write_sync("retention", lambda conn: done.append("background"), background=True)
    )
    await asyncio.sleep(0.4)
    assert done == [], "the background transaction ran beside the engine's"
    release.set()
    await asyncio.wait_for(asyncio.gather(foreground, background), WAIT)
    assert done == ["foreground", "background"]


async def test_a_background_transaction_runs_once_it_has_waited_its_patience(
    db: database.Database,
) -> None:
    """Work that never pauses does not stop housekeeping."""
    db.background_patience = 0.3
    release, done = threading.Event(), list[str]()
    foreground = asyncio.create_task(db.write_sync("engine", _held_open(release, done)))
    try:
        await asyncio.sleep(0.1)
        await asyncio.wait_for(
            db.write_sync("retention", lambda conn: done.append("background"), background=True),
            WAIT,
        )
        assert done == ["background"]  # the engine's transaction is still open
    finally:
        release.set()
        await foreground


async def test_a_busy_process_s_background_transactions_pause_four_times_their_length(
    db: database.Database,
) -> None:
    """Between two background transactions of a process that has other work, at least four
    times the first one's length passes (a fifth of the time at most for housekeeping)."""
    spans: list[tuple[float, float]] = []

    def batch(conn: sa.Connection) -> None:
        began = time.monotonic()
        conn.exec_driver_sql("SELECT pg_sleep(0.05)")
        spans.append((began, time.monotonic()))

    async def engine() -> None:  # a short transaction every 100 ms: busy, with quiet moments
        while True:
            await db.write_sync("engine", lambda conn: conn.exec_driver_sql("SELECT 1"))
            await asyncio.sleep(0.1)

    ticking = asyncio.create_task(engine())
    try:
        await asyncio.sleep(0.05)
        for _ in range(4):
            await asyncio.wait_for(db.write_sync("retention", batch, background=True), WAIT)
    finally:
        ticking.cancel()
    assert len(spans) == 4
    for (began, ended), (next_began, _) in itertools.pairwise(spans):
        assert next_began - ended >= 4 * (ended - began) * 0.9, spans
