"""Alembic, driven from code: ``remediator migrate`` and the SQLite auto-migration at start-up.

Alembic is imported only when there is something to migrate: a server whose database is at
the newest revision (read from ``alembic_version`` and the revision files) starts without it,
which keeps restarts fast. A server that has to migrate does it in a child process
(``upgrade_apart``): once imported, Alembic, Mako and (where installed) Pygments stay
resident, 10 MB of a process that lives for weeks and migrates once.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import re
import sys
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from remediator.adapters.db import database

if TYPE_CHECKING:
    from alembic.config import Config

logger = logging.getLogger("remediator.db")

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


class MigrationFailed(RuntimeError):
    """The child process migrating the database failed (its error output is in the message)."""


async def upgrade_apart(db: database.Database) -> None:
    """``upgrade`` to the newest revision, in a child process (``python -m`` this module, the
    database URL on its standard input, never in its arguments or environment), unless the
    database is there already."""
    async with db.engine.connect() as conn:
        if await conn.run_sync(_at_head):
            return
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        __name__,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await child.communicate(db.url.encode() + b"\n")
    if child.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        raise MigrationFailed(
            f"migrating the database failed (exit status {child.returncode}): "
            + "\n".join(lines[-20:])
        )
    logger.info("database migrated to revision %s", out.decode(errors="replace").strip())


async def downgrade(db: database.Database, revision: str) -> None:
    async with db.engine.connect() as conn:
        await conn.run_sync(_with_connection, "downgrade", revision)
        await conn.commit()


async def current_revision(db: database.Database) -> str | None:
    async with db.engine.connect() as conn:
        result: Any = await conn.run_sync(_current)
        return result if isinstance(result, str) else None


def _child() -> None:
    """``upgrade_apart``'s child: the URL from standard input; the revision reached printed."""

    async def run(url: str) -> str | None:
        db = database.Database(url)
        try:
            await upgrade(db)
            return await current_revision(db)
        finally:
            await db.dispose()

    print(asyncio.run(run(sys.stdin.readline().strip())))


if __name__ == "__main__":
    _child()
