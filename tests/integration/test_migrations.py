"""Every revision upgrades, downgrades and upgrades again; the result matches the models."""

from __future__ import annotations

from alembic import autogenerate, script
from alembic.runtime import migration

from remediator.adapters.db import database, migrate, tables


def _revisions() -> list[str]:
    directory = script.ScriptDirectory.from_config(migrate.alembic_config("sqlite://"))
    return [rev.revision for rev in reversed(list(directory.walk_revisions()))]


def _diff(connection):
    context = migration.MigrationContext.configure(
        connection, opts={"compare_type": True, "compare_server_default": False}
    )
    return autogenerate.compare_metadata(context, tables.metadata)


async def test_stairway_upgrade_downgrade_upgrade_for_every_revision(database_url):
    db = database.Database(database_url)
    try:
        previous = "base"
        for revision in _revisions():
            await migrate.upgrade(db, revision)
            assert await migrate.current_revision(db) == revision
            await migrate.downgrade(db, previous)
            assert await migrate.current_revision(db) == (None if previous == "base" else previous)
            await migrate.upgrade(db, revision)
            previous = revision
        assert await migrate.current_revision(db) == migrate.head_revision()
    finally:
        await db.dispose()


async def test_migrations_and_models_agree(database_url):
    db = database.Database(database_url)
    try:
        await migrate.upgrade(db)
        async with db.engine.connect() as conn:
            diff = await conn.run_sync(_diff)
        assert diff == []
    finally:
        await db.dispose()


async def test_the_audit_chain_starts_from_a_seeded_head(database_url):
    import sqlalchemy as sa

    db = database.Database(database_url)
    try:
        await migrate.upgrade(db)
        async with db.read() as conn:
            row = (await conn.execute(sa.select(tables.audit_head))).one()
        assert (row.id, row.last_id, row.last_hash) == (1, None, "0" * 64)
    finally:
        await db.dispose()
