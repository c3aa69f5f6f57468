"""Every revision upgrades, downgrades and upgrades again; the result matches the models."""

from __future__ import annotations

import asyncio
import sys

import pytest
import sqlalchemy as sa
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


async def test_retention_deletes_only_old_raw_deliveries(database_url):
    import datetime as dt

    import sqlalchemy as sa

    from remediator.adapters.db import retention

    db = database.Database(database_url)
    try:
        await migrate.upgrade(db)
        now = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
        async with db.write() as conn:
            await conn.execute(
                sa.insert(tables.deliveries),
                [
                    {
                        "received_at": now - dt.timedelta(days=age),
                        "receiver": "r",
                        "status": "firing",
                        "group_key": "g",
                        "alert_count": 0,
                        "body": "{}",
                    }
                    for age in (400, 91, 89, 1)  # in the order they arrived
                ],
            )
        deleted = await retention.delete_old_deliveries(
            db, older_than=now - dt.timedelta(days=90), batch=1
        )
        assert deleted == 2
        async with db.read() as conn:
            left = (
                await conn.execute(sa.select(sa.func.count()).select_from(tables.deliveries))
            ).scalar_one()
        assert left == 2
    finally:
        await db.dispose()


async def test_a_database_at_the_newest_revision_is_recognised_without_alembic(database_url):
    assert migrate.quick_head() == migrate.head_revision()
    db = database.Database(database_url)
    try:
        async with db.engine.connect() as conn:
            assert not await conn.run_sync(migrate._at_head)  # empty database
        await migrate.upgrade(db)
        async with db.engine.connect() as conn:
            assert await conn.run_sync(migrate._at_head)
        await migrate.upgrade(db)  # the fast path: nothing to do
        assert await migrate.current_revision(db) == migrate.head_revision()
    finally:
        await db.dispose()


async def test_a_server_migrates_in_a_child_process_and_never_holds_alembic(database_url):
    """``remediator serve`` migrates apart: Alembic, Mako and Pygments, once imported, stayed
    resident in the server (10 MB of its 97 MB idle)."""
    code = (
        "import asyncio, sys\n"
        "from remediator.adapters.db import database, migrate\n"
        "db = database.Database(sys.stdin.readline().strip())\n"
        "asyncio.run(migrate.upgrade_apart(db))\n"
        "asyncio.run(db.dispose())\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'alembic', 'mako', 'pygments'}))\n"
    )
    for _ in range(2):  # the second start finds the database at the newest revision
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await child.communicate(database_url.encode() + b"\n")
        assert child.returncode == 0, err.decode()
        assert out.decode().strip() == "[]"
    db = database.Database(database_url)
    try:
        assert await migrate.current_revision(db) == migrate.head_revision()
    finally:
        await db.dispose()


async def test_a_failed_migration_apart_says_why(database_url):
    db = database.Database(database_url)
    try:
        async with db.engine.begin() as conn:
            await conn.execute(sa.text("CREATE TABLE alembic_version (version_num VARCHAR(32))"))
            await conn.execute(sa.text("INSERT INTO alembic_version VALUES ('f00dfeedbeef')"))
        with pytest.raises(migrate.MigrationFailed, match="f00dfeedbeef"):
            await migrate.upgrade_apart(db)
    finally:
        await db.dispose()


async def test_the_runs_under_way_are_hinted_to_the_advance_stage_by_revision_0010(database_url):
    """Before 0010 the advance stage found its runs by walking every running run; after it, by
    hints. The upgrade hints every running run once, so none is left waiting unseen."""
    db = database.Database(database_url)
    try:
        await migrate.upgrade(db, "0009")
        import datetime as dt

        at = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)
        async with db.write("test") as conn:
            for run_id, status in (
                (1, "running"),
                (2, "succeeded"),
                (3, "pending"),
                (4, "running"),
            ):
                await conn.execute(
                    sa.text(
                        "INSERT INTO runs (id, playbook, kind, status, exclusive, dry_run, params,"
                        " on_resolve, reason, created_at, updated_at) VALUES (:id, 'reboot',"
                        " 'manual', :status, true, false, '{}', 'cancel', '', :at, :at)"
                    ).bindparams(sa.bindparam("at", type_=tables.UTCDateTime())),
                    {"id": run_id, "status": status, "at": at},
                )
        await migrate.upgrade(db)
        async with db.read() as conn:
            hints = tables.advance_hints
            found = await conn.execute(sa.select(hints.c.run_id).order_by(hints.c.run_id))
            assert list(found.scalars()) == [1, 4]
    finally:
        await db.dispose()
