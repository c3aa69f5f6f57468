"""Alembic, driven from code: ``remediator migrate`` and the SQLite auto-migration at start-up."""

from __future__ import annotations

import pathlib
from typing import Any

import sqlalchemy as sa
from alembic import command, script
from alembic.config import Config
from alembic.runtime import migration

from remediator.adapters.db import database


def migrations_dir() -> pathlib.Path:
    """Installed wheels carry the migrations inside the package; a checkout has them on top."""
    package = pathlib.Path(__file__).resolve().parents[2]
    for candidate in (package / "_migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("the Alembic migrations directory is missing from this install")


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", database.normalise_url(url).replace("%", "%%"))
    return config


def head_revision() -> str | None:
    return script.ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def _with_connection(connection: sa.Connection, action: str, revision: str) -> None:
    config = alembic_config(str(connection.engine.url))
    config.attributes["connection"] = connection
    getattr(command, action)(config, revision)


def _current(connection: sa.Connection) -> str | None:
    return migration.MigrationContext.configure(connection).get_current_revision()


async def upgrade(db: database.Database, revision: str = "head") -> None:
    async with db.engine.connect() as conn:
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
