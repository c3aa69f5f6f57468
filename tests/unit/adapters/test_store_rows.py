"""Records made from stored rows: every field from its own column, read by position (a row's
attributes are looked up in Python, a step's 25 of them half of making it), and a value no
member of its enum has refused as before."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from remediator.adapters.db import store, tables

AT = dt.datetime(2026, 12, 7, 3, 0, tzinfo=dt.UTC)
ROWS: dict[str, dict[str, Any]] = {
    "alert_episodes": {
        "id": 7,
        "fingerprint": "00000000000000a1",
        "starts_at": AT,
        "alertname": "GPUXidError79",
        "status": "resolved",
        "handled_status": "firing",
        "labels": {"alertname": "GPUXidError79", "node": "gpu-node-01"},
        "annotations": {"summary": "fell off the bus"},
        "generator_url": "http://prometheus/graph",
        "ends_at": AT + dt.timedelta(minutes=5),
        "first_delivery_id": 3,
        "resolved_delivery_id": 4,
        "created_at": AT + dt.timedelta(seconds=1),
        "resolved_at": AT + dt.timedelta(minutes=6),
    },
    "runs": {
        "id": 11,
        "playbook": "xid-79",
        "kind": "alert",
        "status": "running",
        "episode_id": 7,
        "parent_run_id": 5,
        "node": "gpu-node-01",
        "gpu": "3",
        "exclusive": True,
        "dry_run": False,
        "principal": "oncall",
        "params": {"reason": "storm"},
        "on_resolve": "undo",
        "reason": "alert firing",
        "created_at": AT,
        "updated_at": AT + dt.timedelta(seconds=2),
        "finished_at": AT + dt.timedelta(seconds=3),
    },
    "steps": {
        "id": 13,
        "run_id": 11,
        "seq": 2,
        "key": "label",
        "phase": "undo",
        "action": "node.label",
        "params": {"labels": {"gpu-status": "faulty"}},
        "status": "succeeded",
        "requires_approval": True,
        "approvals_required": 2,
        "attempt": 3,
        "max_attempts": 4,
        "timeout_seconds": 30.5,
        "on_failure": "continue",
        "undo_of": 12,
        "undo": {"action": "node.label", "mode": "apply", "params": {}, "timeout_seconds": 9.0},
        "retry": {"max_attempts": 4, "backoff": 1.0},
        "effect": "applied",
        "due_at": AT + dt.timedelta(seconds=4),
        "lease_owner": "replica-a",
        "lease_expires_at": AT + dt.timedelta(seconds=5),
        "output": {"node": "gpu-node-01", "set": {"gpu-status": "faulty"}},
        "error": "once refused",
        "started_at": AT + dt.timedelta(seconds=6),
        "finished_at": AT + dt.timedelta(seconds=7),
        "waiting_for": "budget:rack-7",
    },
}
CONVERT = {
    "alert_episodes": store.episode_from_row,
    "runs": store.run_from_row,
    "steps": store.step_from_row,
}


@pytest.fixture(scope="module")
def conn() -> Iterator[sa.Connection]:
    engine = sa.create_engine("sqlite://")
    tables.metadata.create_all(engine)
    with engine.connect() as connection:
        for name, row in ROWS.items():
            connection.execute(sa.insert(tables.metadata.tables[name]), row)
        yield connection


def _stored(conn: sa.Connection, name: str) -> sa.Row[Any]:
    return conn.execute(sa.select(tables.metadata.tables[name])).one()


class _ByPosition(tuple[Any, ...]):
    """A row's values that cannot be read by column name."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"read {name!r} by name")


def _fields(record: Any) -> dict[str, Any]:
    fields = {name: getattr(record, name) for name in record.__dataclass_fields__}
    for name in ("kind", "status", "handled_status", "on_resolve", "phase", "on_failure"):
        if hasattr(fields.get(name), "value"):
            fields[name] = fields[name].value
    if "effect" in fields:
        fields["effect"] = fields["effect"].value
    return fields


@pytest.mark.parametrize("name", list(ROWS))
def test_every_field_comes_from_its_own_column(conn: sa.Connection, name: str) -> None:
    record = CONVERT[name](_stored(conn, name))
    fields = _fields(record)
    expected = {key: value for key, value in ROWS[name].items() if key in fields}
    if name == "steps":  # typed when read
        assert fields.pop("undo").to_json() == expected.pop("undo")
        retry = fields.pop("retry")
        assert (retry.max_attempts, retry.backoff.total_seconds()) == (4, 1.0)
        del expected["retry"]
    assert fields == expected


@pytest.mark.parametrize("name", list(ROWS))
def test_a_row_is_read_by_position(conn: sa.Connection, name: str) -> None:
    row = _stored(conn, name)
    assert CONVERT[name](_ByPosition(row)) == CONVERT[name](row)


@pytest.mark.parametrize(("name", "column"), [("runs", "status"), ("steps", "phase")])
def test_a_value_no_member_has_is_refused(name: str, column: str) -> None:
    engine = sa.create_engine("sqlite://")
    table = tables.metadata.tables[name]
    table.create(engine)
    with engine.connect() as conn:
        conn.execute(sa.insert(table), {**ROWS[name], column: "sideways"})
        row = conn.execute(sa.select(table)).one()
    with pytest.raises(ValueError, match="sideways"):
        CONVERT[name](row)


@dataclasses.dataclass
class _Painted:
    id: int
    colour: str


def test_a_converter_names_only_columns_its_table_has() -> None:
    with pytest.raises(ValueError, match="no column colour"):
        store._fields(_Painted, tables.runs)
