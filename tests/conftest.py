"""Shared fixtures: database backends (SQLite and Postgres), fixtures, a fake clock."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import pathlib
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
AM_FIXTURES = FIXTURES / "alertmanager-0.25"
PG_ADMIN_URL = os.environ.get("REMEDIATOR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def backends() -> list[str]:
    return [
        b for b in os.environ.get("REMEDIATOR_TEST_BACKENDS", "sqlite,postgres").split(",") if b
    ]


def am_fixture_paths() -> list[pathlib.Path]:
    return sorted(AM_FIXTURES.glob("*.json"))


def am_fixture(name: str) -> bytes:
    return (AM_FIXTURES / f"{name}.json").read_bytes()


def am_payload(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(am_fixture(name))
    return loaded


class FakeClock:
    """A clock tests move by hand; starts at a fixed instant."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self.now = start or dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _psql(sql: str) -> None:
    subprocess.run(
        [
            "psql",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-v",
            "ON_ERROR_STOP=1",
            "-q",
            "-c",
            sql,
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )


def fresh_pg_database() -> Iterator[str]:
    """A fresh, empty Postgres database; dropped afterwards."""
    name = f"rmtest_{uuid.uuid4().hex[:12]}"
    _psql(f"CREATE DATABASE {name}")
    try:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
    finally:
        _psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(params=backends())
def database_url(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[str]:
    """An empty database on each backend (parametrised: sqlite, postgres)."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'remediator.db'}"
    else:
        yield from fresh_pg_database()


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from fresh_pg_database()


def run_coroutine(coro: Any) -> Any:
    return asyncio.run(coro)
