"""A migrated SQL store on each backend, for the engine's statement-level tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from remediator.adapters.db import database, migrate
from remediator.adapters.db import store as sql_store
from tests.support.statements import NOW


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[sql_store.SqlStore]:
    """Its clock stands at ``tests.support.statements.NOW``."""
    db = database.Database(database_url)
    await migrate.upgrade(db)
    try:
        yield sql_store.SqlStore(db, clock=lambda: NOW)
    finally:
        await db.dispose()
