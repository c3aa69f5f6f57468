"""Alembic, driven from code: ``remediator migrate`` and the SQLite auto-migration at start-up.

Alembic is imported only when there is something to migrate: a server whose database is at
the newest revision (read from ``alembic_version`` and the revision files) starts without it,
which keeps restarts fast.
"""

from __future__ import annotations

import pathlib
import re
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from remediator.adapters.db import database

if TYPE_CHECKING:
    from alembic.config import Config

_REVISION = re.compile(r'^revision\s*=\s*["\']([^"\']+)["\']', re.MULTILINE)
_DOWN = re.compile(r'^down_revision\s*=\s*["\']([^"\']+)["\']', re.MULTILINE)


def migrations_dir() -> pathlib.Path:
    """Installed wheels carry the migrations inside the package; a checkout has them on top."""
    package = pathlib.Path(__file__).resolve().parents[2]
    for candidate in (package / "_migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("the Alembic migrations directory is missing from this install")


def alembic_config(url: str) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", database.normalise_url(url).replace("%", "%%"))
    return config


def head_revision() -> str | None:
    from alembic import script

    return script.ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def quick_head() -> str | None:
    """The newest revision, read from the revision files without Alembic (a linear history:
    the one revision no other revises)."""
    revisions, revised = set(), set()
    for path in (migrations_dir() / "versions").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        if found := _REVISION.search(text):
            revisions.add(found.group(1))
        if down := _DOWN.search(text):
            revised.add(down.group(1))
    heads = revisions - revised
    return heads.pop() if len(heads) == 1 else None


def _with_connection(connection: sa.Connection, action: str, revision: str) -> None:
    from alembic import command

    config = alembic_config(str(connection.engine.url))
    config.attributes["connection"] = connection
    getattr(command, action)(config, revision)


def _current(connection: sa.Connection) -> str | None:
    from alembic.runtime import migration

    return migration.MigrationContext.configure(connection).get_current_revision()


def _at_head(connection: sa.Connection) -> bool:
    head = quick_head()
    if head is None or not sa.inspect(connection).has_table("alembic_version"):
        return False
    found = connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalars()
    return list(found) == [head]


async def upgrade(db: database.Database, revision: str = "head") -> None:
    async with db.engine.connect() as conn:
        if revision == "head" and await conn.run_sync(_at_head):
            return
        await conn.run_sync(_with_connection, "upgrade", revision)
        await conn.commit()


async def downgrade(db: database.Database, revision: str) -> None:
    async with db.engine.connect() as conn:
        await conn.run_sync(_with_connection, "downgrade", revision)
        await conn.commit()


async def current_revision(db: database.Database) -> str | None:
    async with db.engine.connect() as conn:
        result: Any = await conn.run_sync(_current)
        return result if isinstance(result, str) else None
