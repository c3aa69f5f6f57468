"""One store contract, every backend: the in-memory store, SQLite and Postgres.

``backend`` is parametrised over the three. Each gives the store under test, the fake clock it
reads, and the two things the port does not cover but the contract needs: a way in for alerts
(intake) and a way to read the audit trail.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import pathlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from remediator.adapters.db import audit as db_audit
from remediator.adapters.db import database, intake, migrate, tables
from remediator.adapters.db import retention as db_retention
from remediator.adapters.db import store as sql_store
from remediator.adapters.memory import retention as memory_retention
from remediator.adapters.memory import store as memory_store
from remediator.domain import alerts, retention
from tests.conftest import FakeClock, _psql, backends, fresh_pg_database


@dataclasses.dataclass
class Backend:
    name: str
    store: Any  # MemoryStore or SqlStore: both implement ports.store.Store
    clock: FakeClock

    async def receive(self, body: bytes, *, principal: str | None = None) -> None:
        raise NotImplementedError

    async def events(self) -> list[dict[str, Any]]:
        """The audit trail in chain order, as plain dicts of its columns."""
        raise NotImplementedError

    async def chain_ok(self) -> bool:
        raise NotImplementedError

    async def prune_alerts(self, *, ended_before: dt.datetime, batch: int) -> retention.Pruned:
        """One alert retention pass (retention is not part of the port: it runs on the SQL
        database directly)."""
        raise NotImplementedError

    async def close(self) -> None:
        return None


class MemoryBackend(Backend):
    async def receive(self, body: bytes, *, principal: str | None = None) -> None:
        await self.store.receive(alerts.parse_payload(body), principal=principal)

    async def events(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(event) for event in self.store.events()]

    async def chain_ok(self) -> bool:
        return bool(self.store.verify().ok)

    async def prune_alerts(self, *, ended_before: dt.datetime, batch: int) -> retention.Pruned:
        return await self.store.run(
            "retention",
            lambda tx: memory_retention.prune_alert_episodes(tx, ended_before=ended_before),
        )


@dataclasses.dataclass
class SqlBackend(Backend):
    db: database.Database = dataclasses.field(kw_only=True)
    writer: intake.IntakeWriter = dataclasses.field(kw_only=True)
    writing: asyncio.Task[None] = dataclasses.field(kw_only=True)

    async def receive(self, body: bytes, *, principal: str | None = None) -> None:
        delivery = intake.Delivery(
            payload=alerts.parse_payload(body),
            body=body.decode(),
            principal=principal,
            remote=None,
        )
        await self.writer.store(delivery)

    async def events(self) -> list[dict[str, Any]]:
        query = sa.select(tables.audit_events).order_by(tables.audit_events.c.id)
        async with self.db.read() as conn:
            return [dict(row._mapping) for row in await conn.execute(query)]

    async def chain_ok(self) -> bool:
        return (await db_audit.AuditQueries(self.db).verify()).ok

    async def prune_alerts(self, *, ended_before: dt.datetime, batch: int) -> retention.Pruned:
        return await db_retention.prune_alert_episodes(
            self.db, ended_before=ended_before, batch=batch
        )

    async def close(self) -> None:
        self.writing.cancel()
        await asyncio.gather(self.writing, return_exceptions=True)
        await self.db.dispose()


def _params() -> list[Any]:
    marks = {"postgres": [pytest.mark.postgres]}
    return [
        pytest.param(name, marks=marks.get(name, []), id=name) for name in ["memory", *backends()]
    ]


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """A migrated Postgres database that each test's database is copied from (copying is
    several times faster than migrating)."""
    for url in fresh_pg_database():
        asyncio.run(_migrate(url))
        yield url.rsplit("/", 1)[1]


async def _migrate(url: str) -> None:
    db = database.Database(url)
    try:
        await migrate.upgrade(db)
    finally:
        await db.dispose()


@pytest.fixture(params=_params())
def backend_url(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[str | None]:
    if request.param == "memory":
        yield None
    elif request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'remediator.db'}"
    else:
        template = request.getfixturevalue("pg_template")
        name = f"rmtest_{uuid.uuid4().hex[:12]}"
        _psql(f"CREATE DATABASE {name} TEMPLATE {template}")
        try:
            yield f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
        finally:
            _psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
async def backend(backend_url: str | None, clock: FakeClock) -> AsyncIterator[Backend]:
    if backend_url is None:
        made: Backend = MemoryBackend("memory", memory_store.MemoryStore(clock=clock), clock)
    else:
        db = database.Database(backend_url)
        if db.is_sqlite:
            await migrate.upgrade(db)
        writer = intake.IntakeWriter(db, clock=clock)
        made = SqlBackend(
            db.dialect,
            sql_store.SqlStore(db, clock=clock),
            clock,
            db=db,
            writer=writer,
            writing=asyncio.create_task(writer.run()),
        )
    try:
        yield made
    finally:
        await made.close()
