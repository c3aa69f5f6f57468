"""Datetimes bound for SQLite are the text SQLAlchemy's DATETIME writes for their UTC time:
stored rows, ranges compared in SQL and what is written now must agree."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

from remediator.adapters.db import tables

DIALECT = sqlite.dialect()
BIND = tables.runs.c.created_at.type.dialect_impl(DIALECT).bind_processor(DIALECT)
SQLALCHEMY = sqlite.DATETIME().bind_processor(DIALECT)
TIMES = [
    dt.datetime(2026, 12, 7, 3, 41, 29, 123456, tzinfo=dt.UTC),
    dt.datetime(2026, 12, 7, 3, 41, 29, tzinfo=dt.UTC),  # no microseconds: still written
    dt.datetime(2026, 12, 7, 5, 41, 29, 5, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    dt.datetime(2026, 1, 1, 0, 30, tzinfo=dt.timezone(dt.timedelta(hours=-11, minutes=-30))),
    dt.datetime(1, 1, 1, tzinfo=dt.UTC),
    dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
]


@pytest.mark.parametrize("value", TIMES, ids=str)
def test_the_text_is_sqlalchemys_for_the_utc_time(value: dt.datetime) -> None:
    assert BIND(value) == SQLALCHEMY(value.astimezone(dt.UTC).replace(tzinfo=None))


def test_nothing_is_none_and_a_naive_time_is_refused() -> None:
    assert BIND(None) is None
    with pytest.raises(ValueError, match="naive"):
        BIND(dt.datetime(2026, 12, 7))


def test_times_read_back_and_compare_as_written() -> None:
    engine = sa.create_engine("sqlite://")
    tables.deliveries.create(engine)
    rows = [
        {"received_at": at, "receiver": "r", "status": "firing", "group_key": "g"}
        | {"alert_count": 1, "body": "{}"}
        for at in TIMES
    ]
    with engine.connect() as conn:
        conn.execute(sa.insert(tables.deliveries), rows)
        read = conn.execute(
            sa.select(tables.deliveries.c.received_at).order_by(tables.deliveries.c.received_at)
        ).scalars()
        assert list(read) == sorted(TIMES)
        since = conn.execute(
            sa.select(sa.func.count()).where(tables.deliveries.c.received_at >= TIMES[1])
        ).scalar_one()
        assert since == sum(at >= TIMES[1] for at in TIMES)
