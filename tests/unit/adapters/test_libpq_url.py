"""The Postgres URL as psycopg2 (libpq) takes it, from the asyncpg URL operators configure."""

from __future__ import annotations

import pytest

from remediator.adapters.db.database import libpq_url


@pytest.mark.parametrize(
    ("url", "query"),
    [
        ("postgresql+asyncpg://u:p@db:5432/r", {}),
        ("postgresql+asyncpg://u:p@db/r?ssl=require", {"sslmode": "require"}),
        ("postgresql+asyncpg://u:p@db/r?ssl=true", {"sslmode": "require"}),
        ("postgresql+asyncpg://u:p@db/r?ssl=verify-full", {"sslmode": "verify-full"}),
        ("postgresql+asyncpg://u:p@db/r?sslmode=disable&ssl=require", {"sslmode": "disable"}),
        (
            "postgresql+asyncpg://u:p@db/r?prepared_statement_cache_size=0&application_name=x",
            {"application_name": "x"},
        ),
    ],
)
def test_asyncpg_options_become_libpq_options(url: str, query: dict[str, str]) -> None:
    converted = libpq_url(url)
    assert converted.drivername == "postgresql+psycopg2"
    assert (converted.username, converted.password, converted.host) == ("u", "p", "db")
    assert converted.database == "r"
    assert dict(converted.query) == query
