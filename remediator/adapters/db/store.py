"""The engine's unit of work over SQL: guarded transitions, claims, locks and the audit chain.

Every ``SqlTx`` method runs inside the transaction ``SqlStore.run`` opened, so a transition and
its audit event commit together or not at all.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as dt
import enum
import functools
import json
import operator
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, TypeVar, overload

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.visitors import InternalTraversal

from remediator.adapters.db import database, tables
from remediator.domain import (
    alerts,
    audit,
    errors,
    guards,
    playbooks,
    records,
    retry,
    runs,
    transitions,
)

E = tables.alert_episodes
R = tables.runs
S = tables.steps
L = tables.locks
A = tables.audit_events
H = tables.audit_head
D = tables.disruptions
G = tables.guard_state
AP = tables.approvals
AH = tables.advance_hints

T = TypeVar("T")

# Statements built once and executed with parameters: SQLAlchemy memoizes a statement's cache
# key and compiled form on the object, so the per-call cost is binding, not building. (Update
# statements take their SET columns from the parameter names; WHERE parameters are ``w_*``.)
_INSERT_EVENT = sa.insert(A)
_UPDATE_HEAD = sa.update(H).where(H.c.id == 1)
_GET_RUN = sa.select(R).where(R.c.id == sa.bindparam("w_id"))
_GET_STEP = sa.select(S).where(S.c.id == sa.bindparam("w_id"))
_GET_EPISODE = sa.select(E).where(E.c.id == sa.bindparam("w_id"))
_STEPS_OF_RUN = sa.select(S).where(S.c.run_id == sa.bindparam("w_run_id")).order_by(S.c.seq, S.c.id)
_GET_RUNS = sa.select(R).where(R.c.id.in_(sa.bindparam("w_ids", expanding=True)))
_GET_EPISODES = sa.select(E).where(E.c.id.in_(sa.bindparam("w_ids", expanding=True)))
_STEPS_OF_RUNS = (
    sa.select(S)
    .where(S.c.run_id.in_(sa.bindparam("w_run_ids", expanding=True)))
    .order_by(S.c.run_id, S.c.seq, S.c.id)
)
_INSERT_STEPS = sa.insert(S).returning(*S.c)
_ENSURE_GUARD_LOCK = (
    postgresql.insert(G)
    .values(key="lock:guards", value={}, updated_at=sa.bindparam("updated_at"))
    .on_conflict_do_nothing(index_elements=[G.c.key])
)
_LOCK_GUARDS = sa.select(G.c.key).where(G.c.key == "lock:guards").with_for_update()
_COUNT_NODE_RUNS = (
    sa.select(sa.func.count())
    .select_from(R)
    .where(
        R.c.node == sa.bindparam("w_node"),
        R.c.created_at >= sa.bindparam("w_since", type_=tables.UTCDateTime()),
        R.c.kind != "undo",
    )
)
_RELEASE_RUN_LOCKS = (
    sa.delete(L)
    .where(L.c.run_id.in_(sa.bindparam("w_run_ids", expanding=True)), L.c.expires_at.is_(None))
    .returning(L.c.key)
)
# The locks a pending run may wait for by key (``SqlTx.park_run``): its node's, its GPU's. (Or
# one of its playbook's slots: ``slot:<playbook>:<n>``, waited for as ``slot:<playbook>:``.)
_NODE_OR_GPU = ("node:", "gpu:")
# Postgres's append of a transaction's events (``SqlTx.flush``): each event's values but its
# place in the chain (id, prev_hash, hash) quoted by the driver before the chain's head is
# locked, then the rows and the head's move in one statement after it.
_EVENT_COLUMNS = tuple(c.name for c in A.c if c.name not in ("id", "prev_hash", "hash"))
_JSON_EVENT_COLUMNS = frozenset(c.name for c in A.c if isinstance(c.type, sa.JSON))
_EVENT_VALUES = ", ".join(
    "%s::jsonb" if name in _JSON_EVENT_COLUMNS else "%s" for name in _EVENT_COLUMNS
)
_EVENT_NAMES = ", ".join(f'"{name}"' for name in ("id", "prev_hash", "hash", *_EVENT_COLUMNS))
# Table and column names from the schema; the values quoted by the driver (``_quoted_event``),
# ids and hex digests.
_APPEND_EVENTS = (
    f"WITH appended AS (INSERT INTO {A.name} ({_EVENT_NAMES}) VALUES {{rows}}) "  # noqa: S608
    f"UPDATE {H.name} SET last_id = {{last_id}}, last_hash = '{{last_hash}}' WHERE id = 1"
)


def _quoted_event(cursor: Any, content: dict[str, Any]) -> str:
    """An event's values but its place in the chain, quoted by psycopg2 (``mogrify``) as
    SQLAlchemy binds them: JSON (a ``None`` as JSON's null, the type's default), the time in
    UTC."""
    values = tuple(
        json.dumps(content[name])
        if name in _JSON_EVENT_COLUMNS
        else content[name].astimezone(dt.UTC)
        if name == "at"
        else content[name]
        for name in _EVENT_COLUMNS
    )
    quoted: bytes = cursor.mogrify(_EVENT_VALUES, values)
    return quoted.decode()


def _append_events_sql(rows: Sequence[tuple[tuple[int, str, str], str]]) -> str:
    """The events (each its place in the chain: an id and two hex digests, and its quoted
    values) and the head's move to the last of them, as one statement."""
    (last_id, _, last_hash), _ = rows[-1]
    return _APPEND_EVENTS.format(
        rows=", ".join(
            f"({event_id}, '{prev_hash}', '{digest}', {quoted})"
            for (event_id, prev_hash, digest), quoted in rows
        ),
        last_id=last_id,
        last_hash=last_hash,
    )


# The audit chain's head: (SQLite, Postgres, where it is locked until the transaction ends).
_HEAD = (
    sa.select(H.c.last_id, H.c.last_hash).where(H.c.id == 1),
    sa.select(H.c.last_id, H.c.last_hash).where(H.c.id == 1).with_for_update(),
)


def _take_lock(insert: Any) -> Any:
    """Take a lock nobody holds, or one whose holder's time ran out, in one statement (it was
    a delete of the expired holder, then an insert: two statements per key, two keys per
    alert); a live holder keeps it and nothing is returned."""
    statement = insert(L)
    return statement.on_conflict_do_update(
        index_elements=[L.c.key],
        set_={
            "run_id": statement.excluded.run_id,
            "acquired_at": statement.excluded.acquired_at,
            "expires_at": statement.excluded.expires_at,
        },
        where=sa.and_(
            L.c.expires_at.is_not(None), L.c.expires_at <= statement.excluded.acquired_at
        ),
    ).returning(L.c.key)


# Dialect-specific upserts, one per backend: (SQLite, Postgres).
_TAKE_LOCK = (_take_lock(sqlite.insert), _take_lock(postgresql.insert))
_INSERT_RUN = sa.insert(R).returning(*R.c)
# Ids for held rows: Postgres hands out its sequences' next values (one statement for a
# batch); SQLite's single writer goes on from the largest id.
_NEXT_IDS = {
    table.name: sa.text(
        f"SELECT nextval(pg_get_serial_sequence('{table.name}', 'id')) AS id "  # noqa: S608
        "FROM generate_series(1, :count)"
    ).columns(id=sa.BigInteger())
    for table in (R, S)
}
_LAST_ID = {table.name: sa.select(sa.func.coalesce(sa.func.max(table.c.id), 0)) for table in (R, S)}
_COUNT_RUNS_BY_NODE = (
    sa.select(R.c.node, sa.func.count().label("count"))
    .where(
        R.c.node.in_(sa.bindparam("w_nodes", expanding=True)),
        R.c.created_at >= sa.bindparam("w_since", type_=tables.UTCDateTime()),
        R.c.kind != "undo",
    )
    .group_by(R.c.node)
)
_INSERT_ALERT_RUN = tuple(
    insert(R)
    .on_conflict_do_nothing(index_elements=[R.c.episode_id, R.c.playbook, R.c.kind])
    .returning(*R.c)
    for insert in (sqlite.insert, postgresql.insert)
)
_TRANSITION_STEP = {
    owner: sa.update(S)
    .where(
        S.c.id == sa.bindparam("w_id"),
        S.c.status == sa.bindparam("w_status"),
        *([S.c.lease_owner == sa.bindparam("w_owner")] if owner else []),
    )
    .returning(*S.c)
    for owner in (False, True)
}

# A step change ``apply`` may hold back, and write with others of its kind in one statement:
# the columns it sets, as the step record holds them.
_HELD_COLUMNS: dict[str, Callable[[Any], Any]] = {
    "attempt": int,
    "due_at": lambda value: value,
    "lease_owner": lambda value: value,
    "lease_expires_at": lambda value: value,
    "started_at": lambda value: value,
    "finished_at": lambda value: value,
    "error": lambda value: value,
    "effect": runs.Effect,
    "output": dict,
    "waiting_for": lambda value: value,
}
_HELD_BATCH = 128  # rows a statement (SQLite, 12 columns: 1,536 parameters)
# On SQLite a statement is built and compiled for a few row counts only (one for each count
# from 1 to 128 was more compiling than running in a storm): the rest of its rows are
# padding, id 0, which no row has. Postgres takes any number of rows in one statement.
_HELD_SIZES = (1, 2, 4, 8, 16, 32, 64, _HELD_BATCH)
_HELD_TABLES = {table.name: table for table in (S, R, E)}


@dataclasses.dataclass(frozen=True)
class _Kind:
    """Held changes one statement writes: their table, the columns they set and what each
    row must still be (a step: its status, and its lease owner when ``owner``; a run: one
    of ``sources``)."""

    table: str
    columns: tuple[str, ...]
    owner: bool = False
    sources: tuple[str, ...] = ()


@dataclasses.dataclass
class _Held:
    """A row's changes not yet written: what it must still be, and what to set."""

    status: str | None  # a step's status as read
    owner: str | None  # a step's lease owner as read, when the change expects one
    sources: tuple[str, ...]  # a run's statuses it may move from
    values: dict[str, Any]

    def kind(self, table: str) -> _Kind:
        columns = tuple(sorted(self.values))
        return _Kind(table, columns, owner=self.owner is not None, sources=self.sources)


class _Unwritten:
    """Where an event's seal of a held row goes once the row is written (its digest)."""

    __slots__ = ()


_UNWRITTEN = _Unwritten()


_POSTGRES = postgresql.psycopg2.dialect()  # type: ignore[no-untyped-call]


@functools.cache
def _held_names(kind: _Kind) -> tuple[str, ...]:
    """The columns of a held update's rows: the id, what the row must still be, the values."""
    owner = ("w_owner",) if kind.owner else ()
    return ("id", *(("w_status",) if kind.table == S.name else ()), *owner, *kind.columns)


def _held_row(kind: _Kind, row_id: int, held: _Held) -> list[Any]:
    """A held update's row, its values in the order of ``_held_names``."""
    values = {"id": row_id, "w_status": held.status, "w_owner": held.owner, **held.values}
    return [values[name] for name in _held_names(kind)]


def _held_sql(kind: _Kind, source: str, *, before: str = "") -> str:
    """The ``UPDATE`` of held changes of ``kind`` from ``source`` (after ``before``), rows
    named ``v`` with the columns of ``_held_names`` (only the table's column names, fixed
    statuses and placeholders are put in the text)."""
    table = _HELD_TABLES[kind.table]
    where = [f"{table.name}.id = v.id"]
    where += ["steps.status = v.w_status"] if table is S else []
    where += ["steps.lease_owner = v.w_owner"] if kind.owner else []
    if kind.sources:  # statuses of the run state machine, never outside input
        where.append(f"runs.status IN ({', '.join(repr(status) for status in kind.sources)})")
    assignments = ", ".join(f"{name} = v.{name}" for name in kind.columns)
    sql = f"{before}UPDATE {table.name} SET {assignments} FROM {source} WHERE "  # noqa: S608
    sql += " AND ".join(where)
    if table is E:  # unconditional and unsealed: nothing to read back
        return sql
    return f"{sql} RETURNING {', '.join(f'{table.name}.{column.name}' for column in table.c)}"


def _held_types(kind: _Kind) -> dict[str, sa.types.TypeEngine[Any]]:
    table = _HELD_TABLES[kind.table]
    types = {"id": table.c.id.type, "w_status": S.c.status.type, "w_owner": S.c.lease_owner.type}
    return types | {name: table.c[name].type for name in kind.columns}


@functools.cache
def _held_update(kind: _Kind) -> Any:
    """``UPDATE ... FROM``: held changes of one ``kind`` in one statement, each row (of steps
    and runs) returned only if it still was as expected. Postgres only (SQLite's go out as
    plain tuples: ``_raw_held``).

    The rows come as one array a column (``unnest``): the statement is the same whatever
    the number of rows, a parameter a column. As a ``VALUES`` list of a cast placeholder a
    value, padded to one of a few sizes, 50 held step changes cost Postgres 3.3-3.8 ms of CPU
    and the server (bind processing, psycopg2's quoting) 2.95-3.23 ms; as arrays 2.0-2.3 and
    1.22-1.25."""
    table = _HELD_TABLES[kind.table]
    names = _held_names(kind)
    types = _held_types(kind)
    arrays = ", ".join(
        f"CAST(:{name} AS {types[name].compile(dialect=_POSTGRES)}[])" for name in names
    )
    sql = _held_sql(kind, f"unnest({arrays}) AS v({', '.join(names)})")
    binds = [sa.bindparam(name, type_=postgresql.ARRAY(types[name])) for name in names]
    if table is E:
        return sa.text(sql).bindparams(*binds)
    return sa.text(sql).bindparams(*binds).columns(*table.c)


@dataclasses.dataclass(frozen=True)
class _RawHeld:
    """Held changes of one kind as SQLite takes them: a ``?`` a value, a few row counts."""

    sql: dict[int, str]  # by row count, one of ``_HELD_SIZES``
    binds: tuple[Callable[[Any], Any] | None, ...]  # a value's conversion, by ``_held_names``
    padding: tuple[Any, ...]  # a row of id 0 (no row has it), converted
    columns: tuple[str, ...]  # the columns returned, in the table's order
    results: tuple[Callable[[Any], Any] | None, ...]  # a returned value's conversion

    def named(self, row: Sequence[Any]) -> dict[str, Any]:
        """A returned row by column name, its values as SQLAlchemy would read them."""
        return {
            name: value if result is None else result(value)
            for name, result, value in zip(self.columns, self.results, row, strict=True)
        }


@functools.lru_cache(maxsize=256)
def _raw_held(kind: _Kind, dialect: sa.Dialect) -> _RawHeld:
    """The statements and conversions of held changes of ``kind`` on SQLite (a statement for
    a few row counts only: one for each count from 1 to 128 was more compiling than running
    in a storm; the rest of a statement's rows are padding)."""
    table = _HELD_TABLES[kind.table]
    names = _held_names(kind)
    types = _held_types(kind)
    binds = tuple(types[name].dialect_impl(dialect).bind_processor(dialect) for name in names)
    empty = _held_row(kind, 0, _Held(None, None, (), dict.fromkeys(kind.columns)))
    padding = tuple(v if bind is None else bind(v) for bind, v in zip(binds, empty, strict=True))
    row = "(" + ", ".join("?" for _ in names) + ")"
    values = f"WITH v({', '.join(names)}) AS (VALUES "
    sql = {
        size: _held_sql(kind, "v", before=f"{values}{', '.join([row] * size)}) ")
        for size in _HELD_SIZES
    }
    return _RawHeld(
        sql=sql,
        binds=binds,
        padding=padding,
        columns=tuple(column.name for column in table.c),
        results=tuple(
            column.type.dialect_impl(dialect).result_processor(dialect, None) for column in table.c
        ),
    )


class _Members(dict[str, Any]):
    """An enum's members by value: ``members[value]`` is ``enum_type(value)`` as one lookup
    (the enum's call is a Python function, and rows hold several). A value of no member
    raises as the call does."""

    def __init__(self, enum_type: type[enum.Enum]) -> None:
        super().__init__((member.value, member) for member in enum_type)
        self.enum_type = enum_type

    def __missing__(self, value: str) -> Any:
        return self.enum_type(value)  # ValueError


_ALERT_STATUS = _Members(alerts.AlertStatus)
_RUN_KIND = _Members(runs.RunKind)
_RUN_STATUS = _Members(runs.RunStatus)
_RESOLVE_POLICY = _Members(playbooks.ResolvePolicy)
_STEP_PHASE = _Members(runs.StepPhase)
_STEP_STATUS = _Members(runs.StepStatus)
_ON_FAILURE = _Members(playbooks.OnFailure)
_EFFECT = _Members(runs.Effect)


def _fields(record: type[Any], table: sa.Table) -> Callable[[Any], dict[str, Any]]:
    """A row of every column of ``table`` in the table's order (what ``select(table)`` and
    ``returning(*table.c)`` give, the only rows the converters below are given) as the
    fields of ``record``, a dataclass whose every field is a column of the same name, values
    as read. Read by position: a row's attributes are looked up in Python (0.9 µs each:
    half of making a step of its 25), its items in compiled code."""
    names = tuple(field.name for field in dataclasses.fields(record))
    order = list(table.c.keys())
    unknown = sorted(set(names) - set(order))
    if unknown:
        raise ValueError(f"{table.name} has no column {', '.join(unknown)}")
    values = operator.itemgetter(*(order.index(name) for name in names))
    return lambda row: dict(zip(names, values(row), strict=True))


_EPISODE_FIELDS = _fields(records.Episode, E)
_RUN_FIELDS = _fields(records.Run, R)
_STEP_FIELDS = _fields(records.Step, S)


def episode_from_row(row: Any) -> records.Episode:
    """An episode from a row of every ``alert_episodes`` column (``_fields``)."""
    fields = _EPISODE_FIELDS(row)
    fields["status"] = _ALERT_STATUS[fields["status"]]
    handled = fields["handled_status"]
    fields["handled_status"] = _ALERT_STATUS[handled] if handled else None
    fields["labels"] = dict(fields["labels"])
    fields["annotations"] = dict(fields["annotations"])
    return records.Episode(**fields)


def run_from_row(row: Any) -> records.Run:
    """A run from a row of every ``runs`` column (``_fields``)."""
    fields = _RUN_FIELDS(row)
    fields["kind"] = _RUN_KIND[fields["kind"]]
    fields["status"] = _RUN_STATUS[fields["status"]]
    fields["params"] = dict(fields["params"])
    fields["on_resolve"] = _RESOLVE_POLICY[fields["on_resolve"]]
    return records.Run(**fields)


def step_from_row(row: Any) -> records.Step:
    """A step from a row of every ``steps`` column (``_fields``)."""
    fields = _STEP_FIELDS(row)
    fields["phase"] = _STEP_PHASE[fields["phase"]]
    fields["params"] = dict(fields["params"])
    fields["status"] = _STEP_STATUS[fields["status"]]
    fields["on_failure"] = _ON_FAILURE[fields["on_failure"]]
    undo = fields["undo"]
    fields["undo"] = records.UndoPlan.from_json(undo, action=fields["action"]) if undo else None
    fields["retry"] = _retry_policy(fields["retry"])
    fields["effect"] = _EFFECT[fields["effect"]]
    fields["output"] = dict(fields["output"])
    return records.Step(**fields)


def _retry_policy(stored: dict[str, Any]) -> retry.RetryPolicy:
    """The step's retry policy. A playbook's few policies are parsed once each (the model is
    frozen): validating one for every step row read was a tenth of reading steps."""
    try:
        return _cached_retry_policy(tuple(sorted((stored or {}).items())))
    except TypeError:  # a value that cannot be a cache key (a list): parsed as it is
        return _parse_retry_policy(stored)


@functools.lru_cache(maxsize=512)
def _cached_retry_policy(key: tuple[tuple[str, Any], ...]) -> retry.RetryPolicy:
    return _parse_retry_policy(dict(key))


def _parse_retry_policy(stored: dict[str, Any]) -> retry.RetryPolicy:
    try:
        return retry.RetryPolicy.model_validate(stored or {"max_attempts": 1})
    except ValueError:  # written by an older version with other fields: keep the attempts
        return retry.RetryPolicy(max_attempts=int((stored or {}).get("max_attempts", 1)))


def _unhandled_episodes() -> Any:
    return sa.or_(E.c.handled_status.is_(None), E.c.handled_status != E.c.status)


def _expired_leases(now: Any) -> Any:
    return sa.and_(S.c.status == runs.StepStatus.RUNNING.value, S.c.lease_expires_at < now)


class _Rare(sa.sql.expression.ColumnElement[Any]):
    """A condition few rows meet (runs still pending or running among a long history). On
    SQLite it is wrapped in ``likelihood(..., 1e-6)`` so the planner searches the status index
    whatever its statistics say: after an ``ANALYZE`` of a history where every run finished,
    it judged ``status = ?`` unselective and scanned every run (80 ms a probe, twice, with 10⁶
    runs). Elsewhere it is the condition itself. The condition is part of the cache key
    (``_traverse_internals``): without it the statements holding one were compiled afresh on
    every execution, the probe before every pass included."""

    inherit_cache = True
    _traverse_internals = [("condition", InternalTraversal.dp_clauseelement)]
    type = sa.types.NullType()

    def __init__(self, condition: sa.ColumnElement[bool]) -> None:
        self.condition = condition


@compiles(_Rare)
def _rare(element: _Rare, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(element.condition, **kw))


@compiles(_Rare, "sqlite")
def _rare_sqlite(element: _Rare, compiler: Any, **kw: Any) -> str:
    return f"likelihood({compiler.process(element.condition, **kw)}, 0.000001)"


class _Filter(_Rare):
    """A condition on a column (``column = value``) that must not choose the index: on
    SQLite the column is written ``+column``, which no index serves, so the rows are found by
    the statement's other conditions (the advance stage's ids). Without statistics SQLite
    otherwise took ``status = 'running'`` over an ``id IN (...)`` and walked every running
    run. Elsewhere the condition itself."""

    inherit_cache = True


@compiles(_Filter, "sqlite")
def _filter_sqlite(element: _Filter, compiler: Any, **kw: Any) -> str:
    return f"+{compiler.process(element.condition, **kw)}"


_PENDING: Any = tables.PENDING  # (a literal: see there)


def _startable_runs(*columns: Any) -> sa.Select[Any]:
    """``columns`` of the pending runs not parked (``SqlTx.park_run``), oldest first: the runs
    to try to start. Read from their own partial index (``ix_runs_startable``), whatever waits
    behind held nodes or full playbooks; SQLite is told to (with statistics it took the status
    index, every pending run, each then filtered out)."""
    return (
        sa.select(*columns)
        .with_hint(R, "INDEXED BY ix_runs_startable", "sqlite")
        .where(R.c.status == _PENDING, R.c.waiting_for.is_(None))
        .order_by(R.c.id)
    )


def _blocking_lock() -> Any:
    """The key of the lock another run holds on a run's node (exclusive runs) or GPU (other
    runs on one GPU), or NULL: the run would not get it (no point trying)."""

    def held(key: Any) -> Any:
        return _one_of(sa.select(L.c.key).where(L.c.key == key, L.c.run_id != R.c.id))

    node_key = sa.literal("node:") + R.c.node
    gpu_key = sa.literal("gpu:") + R.c.node + sa.literal("/") + R.c.gpu
    return sa.case(
        (R.c.node.is_(None), sa.null()),
        (R.c.exclusive.is_(True), held(node_key)),
        (R.c.gpu.is_(None), sa.null()),
        else_=held(gpu_key),
    ).label("w_blocked")


def _one_of(select: sa.Select[Any]) -> Any:
    """The first row's value of a correlated ``select``, or NULL: asked once per row of the
    outer query, from the index the correlation names. Postgres never turns a scalar subquery
    into a join or a hashed subplan, as it may an ``EXISTS``, whose choice follows statistics:
    statistics taken in the middle of a storm (many runs running) made the advance check a hash
    of every step stored, built again in every probe of the quiet spell after it."""
    return select.limit(1).scalar_subquery()


def _resolved_alert_run() -> Any:
    """The run answers an alert that resolved, and its playbook does not say ``continue``."""
    resolved = _one_of(
        sa.select(E.c.id).where(
            E.c.id == R.c.episode_id, E.c.status == alerts.AlertStatus.RESOLVED.value
        )
    ).is_not(None)
    return sa.and_(R.c.kind == runs.RunKind.ALERT.value, R.c.on_resolve != "continue", resolved)


def _advanceable_runs(*, rare: bool = True) -> Any:
    """Running runs whose steps are all finished or not yet due (the engine advances them),
    and running runs whose alert resolved with no step running (the engine cancels what is
    left and ends them: their pending steps will never be claimed). ``rare``: the runs are
    found by their status (``_Rare``); otherwise by the statement's other conditions, the
    status only checked (``_Filter``)."""
    running_step = sa.select(S.c.id).where(
        S.c.run_id == R.c.id, S.c.status == runs.StepStatus.RUNNING.value
    )
    active_step = sa.select(S.c.id).where(
        S.c.run_id == R.c.id,
        sa.or_(
            S.c.status.in_([runs.StepStatus.RUNNING.value, runs.StepStatus.WAITING_APPROVAL.value]),
            sa.and_(S.c.status == runs.StepStatus.PENDING.value, S.c.due_at.is_not(None)),
        ),
    )
    running = R.c.status == runs.RunStatus.RUNNING.value
    return sa.and_(
        _Rare(running) if rare else _Filter(running),
        sa.or_(
            _one_of(active_step).is_(None),
            sa.and_(_resolved_alert_run(), _one_of(running_step).is_(None)),
        ),
    )


def _resolving() -> Any:
    """Resolved episodes whose resolution the engine has not handled yet (few: the engine
    handles them in its next pass)."""
    return sa.and_(_unhandled_episodes(), E.c.status == alerts.AlertStatus.RESOLVED.value)


# The runs the advance stage looks at: the hinted ones (``advance_hints``, and this
# transaction's own) and those of resolutions not yet handled (a run whose alert resolved is
# advanced to cancel what is left, though no step of it changed). Found by primary key and by
# episode, never by walking the running runs: with 10,000 running runs each on a running or
# due step the walk took 10 ms (SQLite) to 19 ms (Postgres), in the probe before every pass and
# again in the pass. The status is only checked here (``_Filter``), never the way to the runs.
_HINTED_IDS: Any = sa.bindparam("w_ids", expanding=True)
_HINTED, _RESOLVING = R.alias("hinted"), R.alias("resolving")
_LOOKED_AT = R.c.id.in_(
    sa.union_all(
        sa.select(_HINTED.c.id).where(_HINTED.c.id.in_(_HINTED_IDS)),
        sa.select(_RESOLVING.c.id).where(
            _RESOLVING.c.episode_id.in_(sa.select(E.c.id).where(_resolving()))
        ),
    )
)


def _due_steps(now: Any) -> Any:
    """Due pending steps of running runs. A resolved alert never starts a step of its run
    (unless the playbook says continue), even between storing the resolution and handling it.

    The run is looked up per due step (a scalar subquery, which Postgres never turns into a
    join), not joined: joined, the planner's guess of how many runs are running (from
    statistics taken when few were: a fresh database, a long quiet history) decided the plan,
    and in a storm it took each running run in turn and scanned every due step for it, the
    run's id a filter: 402 runs by 359 due steps, 144,000 rows and 70 ms a claim, growing with
    the square of the storm. Per due step it is one lookup by primary key, whatever the
    statistics say."""
    eligible = (
        sa.select(sa.literal(1))
        .where(
            R.c.id == S.c.run_id,
            R.c.status == runs.RunStatus.RUNNING.value,
            ~_resolved_alert_run(),
        )
        .scalar_subquery()
    )
    return sa.and_(
        S.c.status == runs.StepStatus.PENDING.value,
        S.c.due_at.is_not(None),
        S.c.due_at <= now,
        eligible.is_not(None),
    )


_NOW = sa.bindparam("now", type_=tables.UTCDateTime())


# What kinds of engine work exist, in one read (built once: the engine asks many times a second).
# Each "is there any?" is the first row in the order of the partial index that holds exactly
# those rows (for runs ``ix_runs_active``), which is then the only cheap way to it. As
# ``EXISTS``, Postgres chose by its statistics, and where they said such rows were common it
# scanned the table expecting to meet one at once: with none there, every episode, run or step
# stored, before every pass and once a second when idle (18 ms a probe with 10⁵ episodes). It
# takes ``handled_status <> status`` (two columns) to hold for 99.5 % of rows whatever ANALYZE
# found; and statistics taken during a storm (most runs running, most steps due) stay through
# the quiet spell after it, which changes too little to have them taken again.
def _any(name: str, column: Any, where: Any, order: Any) -> Any:
    """Whether a row meets ``where``: the first one's ``column`` in ``order``, or NULL."""
    return _first(column, where, order).label(name)


def _first(column: Any, where: Any, order: Any) -> Any:
    return _one_of(sa.select(column).where(where).order_by(order)).is_not(None)


def _advanceable(which: Any) -> Any:
    """Whether a run ``which`` names is one to advance (looked up by the key it names)."""
    return _one_of(sa.select(R.c.id).where(which, _advanceable_runs(rare=False))).is_not(None)


_PROBE = sa.select(
    _any("episodes", E.c.id, _unhandled_episodes(), E.c.id),
    _any("expired", S.c.id, _expired_leases(_NOW), S.c.lease_expires_at),
    _one_of(_startable_runs(R.c.id)).is_not(None).label("startable"),
    sa.or_(
        _first(AH.c.id, _advanceable(R.c.id == AH.c.run_id), AH.c.id),
        _first(E.c.id, sa.and_(_resolving(), _advanceable(R.c.episode_id == E.c.id)), E.c.id),
    ).label("advance"),
    _any("due", S.c.id, _due_steps(_NOW), S.c.due_at),
)


#: How long an engine transaction may go on while the webhook waits for SQLite's writer
#: (``SqlTx.should_yield``), doubled for each transaction in a row that gave way, up to
#: ``2 ** YIELD_DOUBLINGS`` times, and back once one did not.
YIELD_AFTER = 0.015
YIELD_DOUBLINGS = 2
_LIMIT = sa.bindparam("w_limit", type_=sa.Integer)


def _both(select: sa.Select[Any], **for_update: Any) -> tuple[sa.Select[Any], sa.Select[Any]]:
    """A statement the engine runs many times a second, built once (building it, and its
    cache key, cost more than running it): (SQLite, Postgres with its rows locked)."""
    return select, select.with_for_update(skip_locked=True, **for_update)


_LOCK_UNHANDLED = _both(sa.select(E).where(_unhandled_episodes()).order_by(E.c.id).limit(_LIMIT))
_LOCK_STARTABLE = _both(_startable_runs(R, _blocking_lock()).limit(_LIMIT), of=R)
# Parking (``SqlTx.park_run``), written when the transaction commits: the keys parked behind
# that are still held then, read ``FOR SHARE SKIP LOCKED`` on Postgres: a row this reads stays
# until the commit (a release waits for it, then wakes what was parked), and one another
# transaction is deleting is left out (the run is not parked: it is tried again).
_LIVE = sa.or_(L.c.expires_at.is_(None), L.c.expires_at > _NOW)
_STILL_HELD = _both(
    sa.select(L.c.key).where(L.c.key.in_(sa.bindparam("w_keys", expanding=True)), _LIVE),
    read=True,
)
_SLOTS_STILL_HELD = _both(
    sa.select(L.c.key).where(L.c.key.startswith(sa.bindparam("w_prefix")), _LIVE), read=True
)
_PARK = (
    sa.update(R)
    .where(R.c.id == sa.bindparam("w_id"), R.c.status == runs.RunStatus.PENDING.value)
    .values(waiting_for=sa.bindparam("w_key"))
)
# A release wakes the runs parked behind its node and GPU keys, found on ``ix_runs_waiting``,
# and for each slot it frees the oldest run waiting for one of its playbook (``_WAKE_OLDEST``).
_WAKE = (
    sa.update(R)
    .where(
        R.c.status == runs.RunStatus.PENDING.value,
        R.c.waiting_for.in_(sa.bindparam("w_keys", expanding=True)),
    )
    .values(waiting_for=None)
)


def _oldest_waiting(table: sa.Table) -> Any:
    """The oldest ``w_count`` rows of ``table`` (runs, steps) pending and waiting for ``w_key``,
    in id order on the table's waiting index."""
    return (
        sa.select(table.c.id)
        .where(table.c.status == _PENDING, table.c.waiting_for == sa.bindparam("w_key"))
        .order_by(table.c.id)
        .limit(sa.bindparam("w_count", type_=sa.Integer()))
    )


# Each ``[is_postgres]``: on Postgres none another transaction holds is taken (an operator
# cancelling a run, another replica waking or claiming it): one that then left the pending
# rows would take the wake with it.
_WAKE_OLDEST = tuple(
    sa.update(R).where(R.c.id.in_(oldest)).values(waiting_for=None)
    for oldest in (_oldest_waiting(R), _oldest_waiting(R).with_for_update(skip_locked=True))
)
# Steps a guard holds, woken (due now) by what they wait for (``Tx.wake_steps``), on
# ``ix_steps_waiting``: the oldest ``w_count`` waiting for ``w_key`` (as the runs above), all
# waiting for it, or all held.
_OLDEST_HELD = _oldest_waiting(S)


def _wake_steps(where: Any) -> Any:
    return sa.update(S).where(where).values(due_at=_NOW, waiting_for=None).returning(S.c.id)


_WAKE_OLDEST_STEPS = tuple(  # [is_postgres]
    _wake_steps(S.c.id.in_(oldest))
    for oldest in (_OLDEST_HELD, _OLDEST_HELD.with_for_update(skip_locked=True))
)
_WAKE_ALL_STEPS = _wake_steps(
    sa.and_(tables.STEPS_IN_LINE, S.c.waiting_for == sa.bindparam("w_key"))
)
_WAKE_ANY_STEPS = _wake_steps(tables.STEPS_IN_LINE)
# The next key steps wait for after ``w_after``, in the index's order (a seek a key: a storm's
# thousands of held steps wait for a handful of keys).
_NEXT_HELD_KEY = sa.select(sa.func.min(S.c.waiting_for)).where(
    tables.STEPS_IN_LINE, S.c.waiting_for > sa.bindparam("w_after")
)
# The leader's safety net (``SqlStore.wake_parked_runs``): what the parked runs wait for.
_PARKED_FOR = (
    sa.select(R.c.playbook, R.c.waiting_for)
    .where(R.c.status == runs.RunStatus.PENDING.value, R.c.waiting_for.is_not(None))
    .distinct()
)
_LIVE_KEYS = sa.select(L.c.key).where(_LIVE)
_LOCK_ADVANCEABLE = _both(
    sa.select(R).where(_LOOKED_AT, _advanceable_runs(rare=False)).order_by(R.c.id).limit(_LIMIT)
)
# Of the hinted runs the advance stage did not take, those still to advance (locked by another
# transaction, or beyond its limit): their hints stay.
_STILL_ADVANCEABLE = sa.select(R.c.id).where(R.c.id.in_(_HINTED_IDS), _advanceable_runs(rare=False))
# The leader's safety net (``SqlStore.hint_runs_to_advance``): every run to advance, found
# by walking the running runs (what every probe did before the hints), and every hinted run.
_TO_ADVANCE = sa.select(R.c.id).where(_advanceable_runs())
_HINTED_RUNS = sa.select(AH.c.run_id).distinct()
_READ_HINTS = _both(sa.select(AH.c.id, AH.c.run_id).order_by(AH.c.id).limit(_LIMIT))
_DELETE_HINTS = sa.delete(AH).where(AH.c.id.in_(sa.bindparam("w_hint_ids", expanding=True)))
_INSERT_HINTS = sa.insert(AH)
_LOCK_DUE = _both(
    sa.select(S).where(_due_steps(_NOW)).order_by(S.c.due_at, S.c.id).limit(_LIMIT),
    of=S,
)
_ACTIVE = D.c.released_at.is_(None)
_IN_POOL = D.c.pool == sa.bindparam("w_pool")
# The disrupted nodes (all, or one pool's), each read in the three ways a decision needs.
_DISRUPTED = {
    (in_pool, what): statement
    for in_pool, where in ((False, (_ACTIVE,)), (True, (_ACTIVE, _IN_POOL)))
    for what, statement in (
        ("all", sa.select(D.c.node).where(*where).distinct()),
        ("count", sa.select(sa.func.count(D.c.node.distinct())).where(*where)),
        ("one", sa.select(sa.exists().where(*where, D.c.node == sa.bindparam("w_node")))),
    )
}
_RECENT_RUNS = (
    sa.select(sa.func.count())
    .select_from(R)
    .where(
        R.c.playbook.in_(sa.bindparam("w_playbooks", expanding=True)),
        R.c.kind == runs.RunKind.ALERT.value,
        R.c.dry_run.is_(False),
        R.c.created_at >= sa.bindparam("w_since", type_=tables.UTCDateTime()),
        R.c.created_at > sa.bindparam("w_reset", type_=tables.UTCDateTime()),
    )
)
_GUARD_STATE = (
    sa.select(G.c.value).where(G.c.key == sa.bindparam("w_key")),
    sa.select(G.c.value).where(G.c.key == sa.bindparam("w_key")).with_for_update(),
)
# (Postgres: RETURNING, which nothing reads, makes it one multi-row INSERT. SQLAlchemy sends
# an INSERT ... ON CONFLICT without RETURNING through psycopg2's executemany, which is one
# statement and one round trip a row: a storm's pass sent a thousand.)
_RECORD_DISRUPTION = (
    sqlite.insert(D).on_conflict_do_nothing(index_elements=[D.c.run_id, D.c.node]),
    postgresql.insert(D)
    .on_conflict_do_nothing(index_elements=[D.c.run_id, D.c.node])
    .returning(D.c.run_id),
)
_HELD_KEYS = sa.select(L.c.key).where(
    L.c.key.startswith(sa.bindparam("w_prefix")),
    sa.or_(L.c.expires_at.is_(None), L.c.expires_at > _NOW),
)


# Nodes' disruptions in one read, a row per node and pool: when each was last disrupted (the
# cooldown), and how many of its disruptions are active (the budget's "already counted", in all
# pools and in the decision's). Read for a claim batch's noted nodes at once (``note_guard_nodes``).
_NODE_DISRUPTIONS = (
    sa.select(
        D.c.node,
        D.c.pool,
        sa.type_coerce(
            sa.func.max(sa.func.coalesce(D.c.released_at, D.c.started_at)), tables.UTCDateTime()
        ).label("last"),
        sa.func.coalesce(sa.func.sum(sa.case((_ACTIVE, 1), else_=0)), 0).label("active"),
    )
    .where(D.c.node.in_(sa.bindparam("w_nodes", expanding=True)))
    .group_by(D.c.node, D.c.pool)
)
#: Before any reset of the breaker: every run in the window counts.
_NEVER = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _statements(*found: Any) -> Iterator[Any]:
    for item in found:
        if isinstance(item, dict):
            yield from _statements(*item.values())
        elif isinstance(item, tuple):
            yield from _statements(*item)
        else:
            yield item


def _ids(*statements: Any) -> frozenset[int]:
    return frozenset(map(id, _statements(*statements)))


_ELSEWHERE = (
    _INSERT_EVENT, _UPDATE_HEAD, _HEAD, _ENSURE_GUARD_LOCK, _LOCK_GUARDS, _RELEASE_RUN_LOCKS,
    _TAKE_LOCK, _DISRUPTED, _GUARD_STATE, _RECORD_DISRUPTION, _HELD_KEYS, _NODE_DISRUPTIONS,
    _INSERT_STEPS, _INSERT_RUN, _INSERT_ALERT_RUN, _COUNT_NODE_RUNS, _COUNT_RUNS_BY_NODE,
    _RECENT_RUNS, _READ_HINTS, _DELETE_HINTS,
)  # fmt: skip
# Statements that never read a table's held columns, by table: they pass its held changes
# (``_Barrier``). All of ``_ELSEWHERE`` read other tables, insert new rows or count runs by
# node or age (columns no change sets).
_PASSING = {
    table: _ids(*_ELSEWHERE, *also)
    for table, also in (
        ("steps", (_GET_RUN, _GET_RUNS, _GET_EPISODE, _GET_EPISODES, _LOCK_UNHANDLED)),
        ("runs", (_GET_STEP, _STEPS_OF_RUN, _STEPS_OF_RUNS, _TRANSITION_STEP, _GET_EPISODE,
                  _GET_EPISODES, _LOCK_UNHANDLED)),
        ("alert_episodes", (_GET_STEP, _STEPS_OF_RUN, _STEPS_OF_RUNS, _TRANSITION_STEP,
                            _GET_RUN, _GET_RUNS)),
    )
}  # fmt: skip


# Statements that pass held new runs: counts of runs by node, to which the transaction adds
# its held ones itself, a lock for no run (a cooldown), and the advance hints' reads and
# deletes (that table alone). Any other statement, one that reads runs or steps or names a
# run, writes them first.
_PASSING_INSERTS = _ids(_COUNT_NODE_RUNS, _COUNT_RUNS_BY_NODE, _READ_HINTS, _DELETE_HINTS)
_TAKE_LOCKS = _ids(_TAKE_LOCK)
# Statements on runs, steps, episodes, the audit chain and guard state only.
_NEITHER_LOCKS_NOR_DISRUPTIONS = (
    _INSERT_EVENT, _UPDATE_HEAD, _HEAD, _ENSURE_GUARD_LOCK, _LOCK_GUARDS, _GUARD_STATE,
    _INSERT_STEPS, _INSERT_RUN, _INSERT_ALERT_RUN, _COUNT_NODE_RUNS, _COUNT_RUNS_BY_NODE,
    _RECENT_RUNS, _GET_RUN, _GET_RUNS, _GET_STEP, _STEPS_OF_RUN, _STEPS_OF_RUNS, _GET_EPISODE,
    _GET_EPISODES, _TRANSITION_STEP, _LOCK_UNHANDLED, _LOCK_ADVANCEABLE, _LOCK_DUE,
    _STILL_ADVANCEABLE, _READ_HINTS, _DELETE_HINTS,
)  # fmt: skip
# Statements that pass held lock releases (none reads the locks table) and held disruptions
# (none reads the disruptions table).
_PASSING_RELEASES = _ids(
    *_NEITHER_LOCKS_NOR_DISRUPTIONS, _DISRUPTED, _RECORD_DISRUPTION, _NODE_DISRUPTIONS,
)  # fmt: skip
_PASSING_DISRUPTIONS = _ids(
    *_NEITHER_LOCKS_NOR_DISRUPTIONS, _LOCK_STARTABLE, _TAKE_LOCK, _HELD_KEYS, _RELEASE_RUN_LOCKS
)


class _DisruptedNodes(AbstractSet[str]):
    """The nodes disrupted now (in one pool, or in all), as guard decisions read them: how
    many, and whether a given node is one, each a query the database answers from its index;
    every node only when iterated (a status page). Reading every row for each pass was its
    largest cost once a storm had left a thousand nodes cordoned. Kept current by the
    transaction's own disruptions (``record_disruption``). Read only inside that
    transaction: afterwards it refuses (it would ask a connection that moved on)."""

    def __init__(self, tx: SqlTx, pool: str | None) -> None:
        self._tx = tx
        self._params = {"w_pool": pool}
        self._pool = pool
        self._in_pool = pool is not None
        self._count: int | None = None
        self._known: dict[str, bool] = {}

    def _run(self, what: str, *, held: bool = True, **params: Any) -> Any:
        """``held=False``: without writing the transaction's held disruptions first."""
        if self._tx.closed:
            raise RuntimeError("a guard snapshot's disrupted nodes are read in its transaction")
        conn = self._tx.conn if held else self._tx.conn.conn
        return conn.execute(_DISRUPTED[self._in_pool, what], self._params | params)

    def __len__(self) -> int:
        if self._count is None:
            self._count = int(self._run("count").scalar_one())
        return self._count

    def __contains__(self, node: object) -> bool:
        if not isinstance(node, str):
            return False
        known = self._known.get(node)
        if known is None:
            # (the transaction's held disruptions of other nodes do not change the answer:
            # this node's, if any, answer it without a read, and the read need not wait)
            known = self._known[node] = self._tx.holds_disruption(node, self._pool) or bool(
                self._run("one", w_node=node, held=False).scalar_one()
            )
        return known

    def __iter__(self) -> Iterator[str]:
        return iter([row.node for row in self._run("all")])

    def learn(self, node: str, disrupted: bool) -> None:
        """Whether ``node`` is one, read with its other disruption facts (no query of its own)."""
        self._known.setdefault(node, disrupted)

    def adding(self, node: str) -> Callable[[], None]:
        """Before ``node``'s disruption is written: what to do once it is."""
        was = node in self

        def added() -> None:
            if not was and self._count is not None:
                self._count += 1
            self._known[node] = True

        return added


class SqlStore:
    """Runs the engine's transactions. Each transaction is synchronous code run as one call
    into the database (a worker thread: SQLite's writer, or one of Postgres's over psycopg2),
    so no statement waits for a turn of the event loop and the write lock is never held
    across one."""

    def __init__(
        self,
        db: database.Database,
        *,
        clock: Callable[[], dt.datetime],
        keys: audit.AuditKeys | None = None,
    ) -> None:
        self.db = db
        self.clock = clock
        self.keys = keys
        self.gave_way_in_a_row = 0  # transactions that gave way to the webhook, in a row

    async def run(self, operation: str, work: Callable[[SqlTx], T]) -> T:
        """Run ``work(tx)`` in one write transaction; committed if it returns."""
        now = self.clock()

        def in_transaction(conn: sa.Connection) -> T:
            budget = YIELD_AFTER * 2 ** min(self.gave_way_in_a_row, YIELD_DOUBLINGS)
            tx = SqlTx(conn, db=self.db, now=now, keys=self.keys, yield_after=budget)
            try:
                result = work(tx)
                tx.flush()
            finally:
                tx.closed = True
            if tx.asked_to_yield:  # (SQLite: one transaction at a time, on the writer's thread)
                self.gave_way_in_a_row = self.gave_way_in_a_row + 1 if tx.gave_way else 0
            return result

        return await self.db.write_sync(operation, in_transaction)

    async def read(self, operation: str, work: Callable[[SqlTx], T]) -> T:
        """Run ``work(tx)`` without locking any Postgres row: a read of guard state (a plan,
        the breaker's status) held the breaker row until it ended and queued behind every
        guard decision and every other reader. On SQLite (no row locks) it is one call to
        the writer's thread, as ``run``: over aiosqlite each statement is a trip through the
        event loop, and a plan's hundred statements took seconds on a busy server."""
        now = self.clock()

        def in_transaction(conn: sa.Connection) -> T:
            tx = SqlTx(conn, db=self.db, now=now, keys=self.keys, locking=False)
            try:
                return work(tx)
            finally:
                tx.closed = True

        return await self.db.read_sync(operation, in_transaction)

    async def hint_runs_to_advance(self) -> int:
        """Hint every run to advance that has no hint; how many. The engine's leader runs it
        now and then (``worker.HINT_SWEEP_INTERVAL``): a run left unhinted (a replica of an
        older version changed it during a rolling upgrade; a fault this code did not foresee)
        is advanced within that interval rather than never. It walks the running runs, as
        every probe did before the hints, and takes the write lock only when it finds one."""

        def unhinted(conn: sa.Connection) -> list[int]:
            hinted = set(conn.execute(_HINTED_RUNS).scalars())
            return [
                run_id for run_id in conn.execute(_TO_ADVANCE).scalars() if run_id not in hinted
            ]

        if not await self.db.read_sync("hint sweep", unhinted):
            return 0

        def hint(tx: SqlTx) -> int:
            found = unhinted(tx.conn.conn)
            if found:
                tx.conn.execute(_INSERT_HINTS, [{"run_id": run_id} for run_id in found])
            return len(found)

        return await self.run("hint sweep", hint)

    async def wake_first_held(self, prefix: str) -> int:
        """Make the oldest step waiting for each key starting with ``prefix`` due now; how
        many. Read first, and written only if a step waits (the leader asks every recheck)."""

        def keys(conn: sa.Connection) -> list[str]:
            found, after = [], ""
            while (key := conn.execute(_NEXT_HELD_KEY, {"w_after": after}).scalar()) is not None:
                found.append(key)
                after = key
            return [key for key in found if key.startswith(prefix)]

        if not await self.db.read_sync("held steps", keys):
            return 0

        def wake(tx: SqlTx) -> int:
            oldest = _WAKE_OLDEST_STEPS[self.db.is_postgres]
            return sum(
                len(tx.conn.execute(oldest, {"now": tx.now, "w_key": key, "w_count": 1}).all())
                for key in keys(tx.conn.conn)
            )

        return await self.run("recheck held", wake)

    async def wake_parked_runs(self, slots: Callable[[str], int]) -> int:
        """Wake every parked run whose key is free; how many. The engine's leader runs it now
        and then (``worker.HINT_SWEEP_INTERVAL``): a run left parked (a replica of an older
        version released its key during a rolling upgrade; a fault this code did not foresee)
        is tried again within that interval rather than never. It reads what the parked runs
        wait for and the live locks, and takes the write lock only when a wait is stale."""
        now = self.clock()

        def stale(conn: sa.Connection) -> tuple[list[str], dict[str, int]]:
            """Node and GPU keys no one holds that runs wait for; for each playbook with
            slots free and runs waiting for one, how many are free."""
            waits = conn.execute(_PARKED_FOR).all()
            if not waits:
                return [], {}
            live = set(conn.execute(_LIVE_KEYS, {"now": now}).scalars())
            taken = collections.Counter(
                key[: key.rindex(":") + 1] for key in live if key.startswith("slot:")
            )
            keys = sorted({key for _, key in waits if not key.startswith("slot:")} - live)
            free = {
                key: slots(playbook) - taken[key]
                for playbook, key in waits
                if key.startswith("slot:") and taken[key] < slots(playbook)
            }
            return keys, free

        if not any(await self.db.read_sync("wake sweep", stale)):
            return 0

        def wake(tx: SqlTx) -> int:
            keys, free = stale(tx.conn.conn)
            conn, woken = tx.conn.conn, 0
            if keys:
                woken += conn.execute(_WAKE, {"w_keys": keys}).rowcount
            for key, count in sorted(free.items()):
                wanted = {"w_key": key, "w_count": count}
                woken += conn.execute(_WAKE_OLDEST[self.db.is_postgres], wanted).rowcount
            return woken

        return await self.run("wake sweep", wake)

    async def probe(self) -> records.Probe:
        """What kinds of engine work exist, in one statement. On SQLite it runs on the
        writer's thread, as ``read`` does: through aiosqlite the same statement cost 0.9 ms
        of CPU (a thread hop per cursor operation), once before every engine pass."""
        now = self.clock()
        row = await self.db.read_sync(
            "probe", lambda conn: conn.execute(_PROBE, {"now": now}).one()
        )
        return records.Probe(**{key: bool(value) for key, value in row._mapping.items()})


def _step_values(step: records.NewStep) -> dict[str, Any]:
    return {
        "seq": step.seq,
        "key": step.key,
        "phase": step.phase.value,
        "action": step.action,
        "params": step.params,
        "status": (runs.StepStatus.PENDING if step.enabled else runs.StepStatus.SKIPPED).value,
        "requires_approval": step.requires_approval,
        "approvals_required": step.approvals_required,
        "attempt": 0,
        "max_attempts": step.max_attempts,
        "timeout_seconds": step.timeout_seconds,
        "on_failure": step.on_failure.value,
        "undo_of": step.undo_of,
        "undo": step.undo.to_json() if step.undo else None,
        "retry": step.retry.model_dump(mode="json"),
        "effect": runs.Effect.NONE.value,
        "due_at": None,
        "output": {} if step.enabled else {"skipped": "disabled in the playbook"},
    }


class _Barrier:
    """The transaction's connection: a statement that could read a held change (any but the
    ``_PASSING`` ones of each table with held changes) first writes them all."""

    def __init__(self, conn: sa.Connection, write: Callable[[], None]) -> None:
        self.conn = conn
        self._write = write
        self.holding: set[str] = set()
        self.inserting = False  # new runs are held
        self.releasing = False  # lock releases are held
        self.disrupting = False  # new disruptions are held

    def execute(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        if (
            (self.inserting and not _passes_inserts(statement, args))
            or (self.releasing and id(statement) not in _PASSING_RELEASES)
            or (self.disrupting and id(statement) not in _PASSING_DISRUPTIONS)
            or (self.holding and any(id(statement) not in _PASSING[t] for t in self.holding))
        ):
            self._write()
        return self.conn.execute(statement, *args, **kwargs)

    def begin_nested(self) -> sa.NestedTransaction:
        return self.conn.begin_nested()


def _passes_inserts(statement: Any, args: tuple[Any, ...]) -> bool:
    if id(statement) in _PASSING_INSERTS:
        return True
    params = args[0] if args else None
    return id(statement) in _TAKE_LOCKS and isinstance(params, dict) and params["run_id"] is None


@dataclasses.dataclass
class _NewRun:
    """An alert run (and its steps) decided, with ids of its own, not yet written."""

    run: dict[str, Any]
    steps: list[dict[str, Any]]


class SqlTx:
    def __init__(
        self,
        conn: sa.Connection,
        *,
        db: database.Database,
        now: dt.datetime,
        keys: audit.AuditKeys | None = None,
        locking: bool = True,
        yield_after: float | None = None,
    ) -> None:
        self.conn = _Barrier(conn, self.write_pending)
        self.db = db
        self.now = now
        self.keys = keys
        self.locking = locking  # False: a read that must not hold guard rows (``read``)
        self._started = time.perf_counter()
        self.yield_after = YIELD_AFTER if yield_after is None else yield_after
        self.asked_to_yield = False  # whether the work asked ``should_yield``
        self.gave_way = False  # and was told to
        self.closed = False
        self._fleet_guards: dict[Any, tuple[_DisruptedNodes, dict[str, Any], int]] = {}
        # Events wait here until ``flush``: the chain head is locked (Postgres ``FOR UPDATE``)
        # only for the few statements that link and insert them at the end of the
        # transaction, so replicas run their engine work side by side and meet only there.
        # Nothing is locked after the head, so waiting for it cannot close a deadlock cycle.
        self._pending: list[dict[str, Any]] = []
        # Digests of the rows this transaction wrote since its last event: the next event
        # seals them (``flush`` appends one if none follows).
        self._unsealed: dict[str, dict[str, str]] = {}
        # Rows this transaction read or wrote, kept current by its own writes (the engine reads
        # a run, its episode and its steps several times while deciding about them; each read
        # was a statement, parsed again). Other transactions' changes still meet the
        # compare-and-set of every transition.
        self._runs: dict[int, records.Run] = {}
        self._episodes: dict[int, records.Episode] = {}
        # Episodes of the runs read (``read_runs``), read when the first of them is asked for
        self._episodes_wanted: set[int] = set()
        self._steps: dict[int, records.Step] = {}
        self._steps_of: dict[int, list[records.Step]] = {}
        self._held: dict[str, set[str]] = {}  # live lock keys by prefix, read once
        self._guards_locked = False
        # Step and run transitions and episode marks decided but not yet written, by table and
        # id (``apply``, ``mark_episode_handled``): a stage's changes are written together, a
        # statement per kind of change, not one per row. Written before any other statement
        # could read them and before the commit; the compare-and-set holds as before (the row
        # must still be as it was read).
        self._holding: dict[tuple[str, int], _Held] = {}
        # New alert runs held the same way (``batch_inserts``), with the ids they will have.
        self._batching = False
        self._inserting: list[_NewRun] = []
        self._releasing: list[int] = []  # runs whose locks go (``release_run_locks``)
        self._disrupting: list[dict[str, Any]] = []  # disruptions (``record_disruption``)
        self._free_ids: dict[str, list[int]] = {}  # Postgres: handed out, not yet used
        self._last_id: dict[str, int] = {}  # SQLite: the largest id, as this writer knows it
        self._expected_runs = 0  # the episodes locked to plan: how many ids to ask for
        # Runs by node since a time (the repeat-offender count), read for a batch of nodes at
        # once and kept current by this transaction's own new runs.
        self._node_runs: tuple[dt.datetime, dict[str, int]] | None = None
        # Nodes whose guard decisions are likely (``note_guard_nodes``), and their disruption
        # rows once read (by pool: when last disrupted, how many active), all at the first
        # decision, after the guards' lock.
        self._guard_nodes: set[str] = set()
        # Runs this transaction may have left with a next step to decide (``_hint_step``),
        # written to ``advance_hints`` when it commits; a run it then gave a step under way
        # (or ended) needs none.
        self._hints: set[int] = set()
        self._under_way: set[int] = set()  # runs given (or kept) an active step by it
        # Pending runs that could not start, by id: what each waits for (a key, or a slot
        # prefix and the playbook's concurrency), parked when the transaction commits if that
        # is still held then (``park_run``); and the keys it released, whose parked runs it
        # wakes (``_write_wakes``).
        self._parking: dict[int, tuple[str, int | None, str | None]] = {}  # (.., playbook)
        self._waking: set[str] = set()
        # Steps to wake by what they wait for (None: anything): how many, None for all.
        self._waking_steps: dict[str | None, int | None] = {}
        self._node_disruptions: dict[str, list[tuple[str | None, dt.datetime | None, int]]] = {}

    # -- helpers ---------------------------------------------------------------------------

    def _lock_rows(self, select: sa.Select[Any]) -> sa.Select[Any]:
        if self.db.is_postgres:
            return select.with_for_update(skip_locked=True)
        return select

    def _insert(self, table: sa.Table) -> Any:
        return (postgresql.insert if self.db.is_postgres else sqlite.insert)(table)

    # -- audit -----------------------------------------------------------------------------

    def add_event(
        self,
        kind: str,
        *,
        actor: str,
        reason: str = "",
        run_id: int | None = None,
        step_id: int | None = None,
        episode_id: int | None = None,
        from_status: str | None = None,
        to_status: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        """Append one audit event to the hash chain (linked when the transaction flushes); it
        seals the rows written since the previous event."""
        self._pending.append(
            {
                "key_id": self.keys.current if self.keys else None,
                "rows": self._unsealed or None,
                "at": self.now,
                "kind": kind,
                "actor": actor,
                "run_id": run_id,
                "step_id": step_id,
                "episode_id": episode_id,
                "from_status": from_status,
                "to_status": to_status,
                "reason": reason,
                "data": data or {},
            }
        )
        self._unsealed = {}

    def _seal(self, table: str, row: Any) -> None:
        """Note a row this transaction wrote (its full, just-written values)."""
        values = dict(row._mapping)
        self._unsealed.setdefault(table, {})[str(values["id"])] = audit.row_digest(table, values)

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        self.write_pending()  # what was decided before it is not the savepoint's to undo
        pending = len(self._pending)
        unsealed = {table: dict(rows) for table, rows in self._unsealed.items()}
        hints, under_way = set(self._hints), set(self._under_way)
        parking = dict(self._parking)
        nested = self.conn.begin_nested()
        try:
            yield
            self.write_pending()  # a conflict is the savepoint's own
        except BaseException:
            nested.rollback()
            # its events and row writes are gone too, and what was counted or kept from them
            self._holding.clear()
            self.conn.holding.clear()
            self._inserting.clear()
            self.conn.inserting = False
            self._releasing.clear()
            self.conn.releasing = False
            self._disrupting.clear()
            self.conn.disrupting = False
            del self._pending[pending:]
            self._unsealed = unsealed
            self._hints, self._under_way = hints, under_way
            self._parking, self._waking = parking, set()  # (its releases are undone)
            self._waking_steps = {}
            self._forget()
            raise
        nested.commit()

    def _forget(self) -> None:
        self._guards_locked = False  # a lock taken in a savepoint rolled back is released
        self._fleet_guards.clear()
        self._node_runs = None
        self._last_id.clear()
        self._node_disruptions.clear()
        self._held.clear()
        self._runs.clear()
        self._episodes.clear()
        self._episodes_wanted.clear()
        self._steps.clear()
        self._steps_of.clear()

    def _kept_step(self, step: records.Step) -> records.Step:
        self._steps[step.id] = step
        siblings = self._steps_of.get(step.run_id)
        if siblings is not None:
            self._steps_of[step.run_id] = [step if s.id == step.id else s for s in siblings]
        return step

    def should_yield(self) -> bool:
        """A webhook commit waits for SQLite's one writer and this transaction has held it
        for ``YIELD_AFTER`` already. Giving way at once, after a single item, made a pass
        under steady webhook traffic plan one episode or claim one step (after reading the
        64 due ones) and commit: the engine fell behind at 100 alerts/s while idle most of
        each pass. 15 ms lets a pass finish a batch (100 alerts/s: reaction p50 24 ms, was
        2 s) while a webhook commit still waits less than that (intake p99 at half load
        14 ms).

        A transaction that gives way lengthens the next one's time (``SqlStore.run``): under
        more webhook traffic than 15 ms passes keep up with, every pass gave way, and each
        cut pass cost the next a probe, a read of the new episodes and a transaction of its
        own, so the engine's CPU an alert rose as it fell behind and it fell further. At 130
        alerts/s in a slow hour the server spent 11.9-13.0 ms of CPU an alert and the
        reaction p50 was 14-17 s; with the doubling, 8.1-8.3 ms and 2.1-2.4 s, in a quarter of
        the passes. While the engine catches up a webhook commit may wait up to 60 ms."""
        self.asked_to_yield = True
        if self.db.writers_waiting() and time.perf_counter() - self._started >= self.yield_after:
            self.gave_way = True
        return self.gave_way

    def flush(self) -> None:
        """Write held changes, seal rows no event sealed, then link the transaction's
        events into the chain, insert them and move the head (``SqlStore.run`` calls this
        last)."""
        self.write_pending()
        if self._parking:
            self._write_parks()
        if self._hints:
            hints, self._hints = sorted(self._hints), set()
            self.conn.execute(_INSERT_HINTS, [{"run_id": run_id} for run_id in hints])
        if self._unsealed:
            self.add_event("audit.sealed", actor=transitions.ENGINE, reason="rows written")
        if not self._pending:
            return
        # Everything an event's row and link need but its place in the chain, prepared before
        # the head is locked: on Postgres every other writer's flush waits for the head until
        # this transaction commits.
        pending, self._pending = self._pending, []
        links = [audit.Link.of(content, self.keys) for content in pending]
        if self.db.is_postgres:
            with contextlib.closing(self.conn.conn.connection.cursor()) as cursor:
                quoted = [_quoted_event(cursor, content) for content in pending]
        last_id, last_hash = self._head()
        first_id = (last_id or 0) + 1
        chain = []
        for event_id, link in enumerate(links, first_id):
            digest = link.hash(last_hash, event_id)
            chain.append((event_id, last_hash, digest))
            last_hash = digest
        last_id = first_id + len(links) - 1
        if self.db.is_postgres:
            # the events and the new head in one statement: one round trip under the lock
            statement = _append_events_sql(list(zip(chain, quoted, strict=True)))
            # sent without parameters, so that psycopg2 reads no "%" in the values as one
            self.conn.conn.exec_driver_sql(statement, execution_options={"no_parameters": True})
            return
        rows = [
            {"id": event_id, "prev_hash": prev_hash, "hash": digest, **content}
            for (event_id, prev_hash, digest), content in zip(chain, pending, strict=True)
        ]
        self.conn.execute(_INSERT_EVENT, rows)
        self.conn.execute(_UPDATE_HEAD, {"last_id": last_id, "last_hash": last_hash})

    def _head(self) -> tuple[int | None, str]:
        """The chain head, locked on Postgres until the transaction ends (created if none)."""
        row = self.conn.execute(_HEAD[self.db.is_postgres]).one_or_none()
        if row is None:
            self.conn.execute(sa.insert(H).values(id=1, last_id=None, last_hash=audit.GENESIS))
            return None, audit.GENESIS
        return row.last_id, row.last_hash

    # -- episodes --------------------------------------------------------------------------

    def lock_unhandled_episodes(self, limit: int) -> list[records.Episode]:
        query = _LOCK_UNHANDLED[self.db.is_postgres]
        found = [episode_from_row(row) for row in self.conn.execute(query, {"w_limit": limit})]
        self._episodes.update((episode.id, episode) for episode in found)
        self._expected_runs = len(found)
        return found

    def mark_episode_handled(self, episode: records.Episode) -> None:
        self._hold("alert_episodes", episode.id, {"handled_status": episode.status.value})
        self._episodes[episode.id] = dataclasses.replace(episode, handled_status=episode.status)

    def get_episode(self, episode_id: int) -> records.Episode | None:
        if episode_id in self._episodes:
            return self._episodes[episode_id]
        if episode_id in self._episodes_wanted:
            self._read_wanted_episodes()
            if episode_id in self._episodes:
                return self._episodes[episode_id]
        row = self.conn.execute(_GET_EPISODE, {"w_id": episode_id}).one_or_none()
        if row is None:
            return None
        episode = self._episodes[episode_id] = episode_from_row(row)
        return episode

    def find_episode(self, fingerprint: str, starts_at: dt.datetime) -> records.Episode | None:
        query = sa.select(E).where(E.c.fingerprint == fingerprint, E.c.starts_at == starts_at)
        row = self.conn.execute(query).one_or_none()
        return episode_from_row(row) if row else None

    # -- runs and steps --------------------------------------------------------------------

    def insert_run(self, new: records.NewRun, *, actor: str) -> int | None:
        """Create a run and its steps; ``None`` if this episode already has this run (held
        alert runs, ``batch_inserts``: ``errors.Conflict`` when written)."""
        self._fleet_guards.clear()  # it may count among the breaker's recent runs
        values = {
            "playbook": new.playbook,
            "kind": new.kind.value,
            "status": new.status.value,
            "episode_id": new.episode_id,
            "parent_run_id": new.parent_run_id,
            "node": new.node,
            "gpu": new.gpu,
            "exclusive": new.exclusive,
            "dry_run": new.dry_run,
            "principal": new.principal,
            "params": new.params,
            "on_resolve": new.on_resolve.value,
            "reason": new.reason,
            "created_at": self.now,
            "updated_at": self.now,
            "finished_at": self.now if new.status in runs.RUN_TERMINAL else None,
        }
        steps = [_step_values(step) for step in new.steps]
        if self._batching and new.episode_id is not None:
            run_id = self._hold_insert(values, steps)
        else:
            found = self._insert_now(values, steps)
            if found is None:
                return None
            run_id = found
        if new.status is runs.RunStatus.RUNNING:
            self._hints.add(run_id)
        if self._node_runs is not None and new.node and new.kind is not runs.RunKind.UNDO:
            counts = self._node_runs[1]
            if new.node in counts:  # (a node not read is counted when it is)
                counts[new.node] += 1
        self.add_event(
            "run.created",
            actor=actor,
            run_id=run_id,
            episode_id=new.episode_id,
            to_status=new.status.value,
            reason=new.reason,
            data={
                "playbook": new.playbook,
                "kind": new.kind.value,
                "node": new.node,
                "gpu": new.gpu,
                "dry_run": new.dry_run,
                "steps": [step.key for step in new.steps],
            },
        )
        return run_id

    def _insert_now(self, values: dict[str, Any], steps: list[dict[str, Any]]) -> int | None:
        statement = (
            _INSERT_RUN if values["episode_id"] is None else _INSERT_ALERT_RUN[self.db.is_postgres]
        )
        row = self.conn.execute(statement, values).one_or_none()
        self._last_id.clear()  # (SQLite chose the ids)
        if row is None:
            return None
        self._seal("runs", row)
        run_id = int(row.id)
        # What was just written is what the rest of this transaction reads (the run is started
        # and its first step made due at once): kept from RETURNING, not read again.
        self._runs[run_id] = run_from_row(row)
        self._steps_of[run_id] = []
        if steps:
            inserted = self.conn.execute(_INSERT_STEPS, [{"run_id": run_id, **s} for s in steps])
            for step_row in inserted:
                self._seal("steps", step_row)
                self._keep_new_step(step_from_row(step_row))
        return run_id

    def _keep_new_step(self, step: records.Step) -> None:
        self._steps[step.id] = step
        siblings = self._steps_of[step.run_id]
        siblings.append(step)
        siblings.sort(key=lambda step: (step.seq, step.id))

    def batch_inserts(self) -> None:
        self._batching = True

    def _hold_insert(self, values: dict[str, Any], steps: list[dict[str, Any]]) -> int:
        """Give a new run and its steps their ids now; write them with the others later
        (``write_pending``). Its event seals the rows as written."""
        run_id = values["id"] = self._new_ids(R.name, 1, max(1, self._expected_runs))[0]
        self._expected_runs -= 1
        step_ids = self._new_ids(S.name, len(steps), len(steps) * max(1, self._expected_runs))
        unsealed = self._unsealed.setdefault(R.name, {})
        unsealed[str(run_id)] = _UNWRITTEN  # type: ignore[assignment]
        unsealed = self._unsealed.setdefault(S.name, {}) if steps else {}
        for step, step_id in zip(steps, step_ids, strict=True):
            step |= {"id": step_id, "run_id": run_id}
            unsealed[str(step_id)] = _UNWRITTEN  # type: ignore[assignment]
        self._inserting.append(_NewRun(values, steps))
        self.conn.inserting = True
        return int(run_id)

    def _new_ids(self, table: str, count: int, ahead: int) -> list[int]:
        """``count`` ids no row of ``table`` has; on Postgres ``ahead`` are asked for at
        once (what the rest of the batch is likely to need)."""
        if not count:
            return []
        if not self.db.is_postgres:
            last = self._last_id.get(table)
            if last is None:
                last = int(self.conn.conn.execute(_LAST_ID[table]).scalar_one())
            self._last_id[table] = last + count
            return list(range(last + 1, last + count + 1))
        free = self._free_ids.setdefault(table, [])
        if len(free) < count:
            asked = {"count": max(count - len(free), ahead)}
            free += [int(row.id) for row in self.conn.conn.execute(_NEXT_IDS[table], asked)]
        taken, self._free_ids[table] = free[:count], free[count:]
        return taken

    def get_run(self, run_id: int) -> records.Run | None:
        if run_id in self._runs:
            return self._runs[run_id]
        row = self.conn.execute(_GET_RUN, {"w_id": run_id}).one_or_none()
        if row is None:
            return None
        run = self._runs[run_id] = run_from_row(row)
        return run

    def runs_of_episode(self, episode_id: int) -> list[records.Run]:
        query = sa.select(R).where(R.c.episode_id == episode_id).order_by(R.c.id)
        return [run_from_row(row) for row in self.conn.execute(query)]

    def read_runs(self, run_ids: Iterable[int], *, steps: bool = True) -> None:
        wanted = set(run_ids)
        missing = sorted(wanted - self._runs.keys())
        if missing:
            for row in self.conn.execute(_GET_RUNS, {"w_ids": missing}):
                self._runs[row.id] = run_from_row(row)
        unread = sorted(wanted - self._steps_of.keys()) if steps else []
        if unread:
            of: dict[int, list[records.Step]] = {run_id: [] for run_id in unread}
            for row in self.conn.execute(_STEPS_OF_RUNS, {"w_run_ids": unread}):
                of[row.run_id].append(self._steps.get(row.id) or step_from_row(row))
            for run_id, found in of.items():
                self._steps_of[run_id] = found
                self._steps.update((step.id, step) for step in found)
        self._episodes_wanted.update(
            run.episode_id
            for run_id in wanted
            if (run := self._runs.get(run_id)) is not None
            and run.episode_id is not None
            and run.episode_id not in self._episodes
        )

    def _read_wanted_episodes(self) -> None:
        """The episodes of the runs read, in one statement, when the first is asked for: a
        stage that decides without them (their runs go on when the alert resolves) reads
        none; a burst read each alert's three times, labels and annotations decoded each
        time, for the one stage of four that renders a step from them."""
        wanted = sorted(self._episodes_wanted - self._episodes.keys())
        self._episodes_wanted.clear()
        if wanted:
            for row in self.conn.execute(_GET_EPISODES, {"w_ids": wanted}):
                episode = episode_from_row(row)
                self._episodes[episode.id] = episode

    def steps_of_run(self, run_id: int) -> list[records.Step]:
        steps = self._steps_of.get(run_id)
        if steps is None:
            rows = self.conn.execute(_STEPS_OF_RUN, {"w_run_id": run_id})
            steps = self._steps_of[run_id] = [step_from_row(row) for row in rows]
            self._steps.update((step.id, step) for step in steps)
        return list(steps)

    def get_step(self, step_id: int) -> records.Step | None:
        if step_id in self._steps:
            return self._steps[step_id]
        row = self.conn.execute(_GET_STEP, {"w_id": step_id}).one_or_none()
        return self._kept_step(step_from_row(row)) if row else None

    def lock_pending_runs(self, limit: int) -> list[records.Run]:
        """The first unparked pending runs; one whose node (or GPU) another run holds is
        parked behind that lock (``park_run``) rather than returned."""
        query = _LOCK_STARTABLE[self.db.is_postgres]
        found: list[records.Run] = []
        for row in self.conn.execute(query, {"w_limit": limit}):
            if row.w_blocked is not None:
                self._parking[row.id] = (row.w_blocked, None, row.playbook)
            else:
                found.append(run_from_row(row))
        self._runs.update((run.id, run) for run in found)
        return found

    def park_run(self, run_id: int, key: str, *, slots: int | None = None) -> None:
        """Held, and written when the transaction commits if ``key`` (with ``slots``: that
        many keys starting with it) is still held then (``_write_parks``)."""
        run = self._runs.get(run_id)
        self._parking[run_id] = (key, slots, run.playbook if run is not None else None)

    def _write_parks(self) -> None:
        """Park the runs whose wait is still held now, after every release of this
        transaction; the others stay to be tried again. On Postgres the keys read are held
        until the commit (``_STILL_HELD``), so a release of one in another transaction
        commits after this one and wakes the run parked here: no run waits for a key that
        is free."""
        parking, self._parking = self._parking, {}
        conn, pg, now = self.conn.conn, self.db.is_postgres, self.now
        keys = sorted({key for key, slots, _ in parking.values() if slots is None})
        held = (
            set(conn.execute(_STILL_HELD[pg], {"w_keys": keys, "now": now}).scalars())
            if keys
            else set()
        )
        full: set[str] = set()
        for prefix, slots in {(key, slots) for key, slots, _ in parking.values() if slots}:
            taken = conn.execute(_SLOTS_STILL_HELD[pg], {"w_prefix": prefix, "now": now}).all()
            if len(taken) >= slots:
                full.add(prefix)
        parked = [
            (run_id, key, slots, playbook)
            for run_id, (key, slots, playbook) in parking.items()
            if key in (held if slots is None else full)
        ]
        if not parked:
            return
        conn.execute(_PARK, [{"w_id": run_id, "w_key": key} for run_id, key, _, _ in parked])
        # A run that waits for its node may have been woken for a free slot it now does not
        # take: the next run waiting for one of its playbook's slots is woken in its place
        # (it parks again at once if there is no room after all).
        handed = collections.Counter(
            f"slot:{playbook}:" for _, _, slots, playbook in parked if slots is None and playbook
        )
        self._wake_oldest(handed)

    @overload
    def apply(self, change: transitions.StepChange) -> records.Step: ...
    @overload
    def apply(self, change: transitions.RunChange) -> records.Run: ...
    def apply(
        self, change: transitions.StepChange | transitions.RunChange
    ) -> records.Step | records.Run:
        """Compare-and-set a decided change and append its audit event; ``Conflict`` if the
        row moved meanwhile."""
        if isinstance(change, transitions.RunChange):
            return self._apply_run(change)
        return self._apply_step(change)

    def _apply_run(self, change: transitions.RunChange) -> records.Run:
        """Decided now, written with others later (``write_pending``), as a held step."""
        run, to = change.run, change.to
        sources = tuple(sorted(status.value for status in runs.run_sources(to)))
        current = self._runs.get(run.id, run)
        if current.status.value not in sources:
            state = current.status.value
            raise errors.Conflict(f"run {run.id} is {state}; cannot move it to {to.value}")
        values: dict[str, Any] = {"status": to.value, "updated_at": self.now}
        if to in runs.RUN_TERMINAL:
            values["finished_at"] = self.now
        self._hold("runs", run.id, values, sources=sources)
        if to is runs.RunStatus.RUNNING:
            if run.id not in self._under_way:  # (started; an approval made its step due)
                self._hints.add(run.id)
        else:
            self._hints.discard(run.id)  # only running runs are advanced
        self._unsealed.setdefault("runs", {})[str(run.id)] = _UNWRITTEN  # type: ignore[assignment]
        moved = self._runs[run.id] = dataclasses.replace(
            current,
            status=to,
            updated_at=self.now,
            finished_at=values.get("finished_at", current.finished_at),
        )
        self.add_event(
            "run.transition",
            actor=change.actor,
            run_id=run.id,
            episode_id=run.episode_id,
            from_status=run.status.value,
            to_status=to.value,
            reason=change.reason,
            data=dict(change.data) or None,
        )
        return moved

    def _apply_step(self, change: transitions.StepChange) -> records.Step:
        self._hint_step(change)
        if change.values.keys() <= _HELD_COLUMNS.keys():
            return self._hold_step(change)
        self.write_pending()
        step, to = change.step, change.to
        where = {"w_id": step.id, "w_status": step.status.value}
        if change.expect_owner is not None:
            where["w_owner"] = change.expect_owner
        update = {"status": to.value, **change.values}
        result = self.conn.execute(
            _TRANSITION_STEP[change.expect_owner is not None], update | where
        )
        row = result.one_or_none()
        if row is None:
            self._steps.pop(step.id, None)
            self._steps_of.pop(step.run_id, None)
            raise errors.Conflict(f"step {step.id} is no longer {step.status.value}")
        if change.event is not None:
            # (a change without an event moves only unaudited columns: ``audit.VOLATILE``)
            self._seal("steps", row)
            self.add_event(change.event, **transitions.step_event(change))
        return self._kept_step(step_from_row(row))

    def _hint_step(self, change: transitions.StepChange) -> None:
        """Note the step's run for the advance stage when the change may leave it with a next
        step to decide: a step stopped being active (finished, cancelled, rejected), or
        stopped running (a resolved alert's run is ended once no step runs). A step made or
        kept active (due, parked, running, approved) means the run has one under way:
        whatever this transaction noted before is moot, and the step's own end will note it
        again (a change in another transaction notes its own)."""
        step, to = change.step, change.to
        due_at = change.values.get("due_at", step.due_at)
        was, active = runs.under_way(step.status, step.due_at), runs.under_way(to, due_at)
        running = runs.StepStatus.RUNNING
        if (was and not active) or (step.status is running and to is not running):
            self._hints.add(step.run_id)
            self._under_way.discard(step.run_id)
        elif active:
            self._hints.discard(step.run_id)
            self._under_way.add(step.run_id)

    def _hold_step(self, change: transitions.StepChange) -> records.Step:
        """Decide a step change now and write it with others later (``write_pending``): the
        compare-and-set is checked here against what this transaction knows of the row, and
        against the row itself when written."""
        step, to = change.step, change.to
        current = self._steps.get(step.id)  # as held, when a change of it is
        if current is not None:
            moved = current.status is not step.status
            if moved or (change.expect_owner and current.lease_owner != change.expect_owner):
                raise errors.Conflict(f"step {step.id} is no longer {step.status.value}")
        values = {**change.values, "status": to.value}
        self._hold("steps", step.id, values, status=step.status.value, owner=change.expect_owner)
        fields = {name: _HELD_COLUMNS[name](value) for name, value in change.values.items()}
        moved_step = dataclasses.replace(step, status=to, **fields)
        if change.event is not None:
            self._unsealed.setdefault("steps", {})[str(step.id)] = _UNWRITTEN  # type: ignore[assignment]
            self.add_event(change.event, **transitions.step_event(change))
        return self._kept_step(moved_step)

    def _hold(
        self,
        table: str,
        row_id: int,
        values: dict[str, Any],
        *,
        status: str | None = None,
        owner: str | None = None,
        sources: tuple[str, ...] = (),
    ) -> None:
        """Hold ``values`` for a row; what it must still be is what the first change of this
        transaction expected (later ones were checked against the held state)."""
        held = self._holding.get((table, row_id))
        if held is None:
            held = self._holding[table, row_id] = _Held(status, owner, sources, {})
            self.conn.holding.add(table)
        held.values |= values

    def write_pending(self) -> None:
        """Write the held changes, a statement per kind (table, columns set, condition);
        ``errors.Conflict`` for the first row that moved meanwhile. New runs first (one
        statement for the runs, one for their steps): ``errors.Conflict`` if one was already
        there."""
        if not (
            self._holding
            or self._inserting
            or self._releasing
            or self._disrupting
            or self._waking
            or self._waking_steps
        ):
            return
        if self._releasing:
            self._write_releases()
        if self._waking:
            self._write_wakes()
        inserted: dict[str, dict[str, str]] = {R.name: {}, S.name: {}}
        existing = self._write_inserts(inserted) if self._inserting else []
        if self._disrupting:
            disrupting, self._disrupting = self._disrupting, []
            self.conn.disrupting = False
            self.conn.conn.execute(_RECORD_DISRUPTION[self.db.is_postgres], disrupting).close()
        holding, self._holding = self._holding, {}
        self.conn.holding.clear()
        kinds: dict[_Kind, list[tuple[int, _Held]]] = {}
        for (table, row_id), held in holding.items():
            kinds.setdefault(held.kind(table), []).append((row_id, held))
        written: dict[str, dict[str, str]] = {}
        for kind, changes in kinds.items():
            for start in range(0, len(changes), _HELD_BATCH):
                batch = changes[start : start + _HELD_BATCH]
                written.setdefault(kind.table, {}).update(self._write_held(kind, batch))
        for table, digests in written.items():
            inserted.setdefault(table, {}).update(digests)
        self._seal_written(inserted)
        if self._waking_steps:  # (after the held changes: a step held again is woken)
            self._write_step_wakes()
        lost = [
            (table, row_id, held)
            for (table, row_id), held in holding.items()
            if table != E.name and str(row_id) not in written.get(table, {})
        ]
        if lost:
            self._lost(lost)
        if existing:
            new = existing[0].run
            raise errors.Conflict(
                f"episode {new['episode_id']} already has a {new['kind']} run of playbook "
                f"{new['playbook']}"
            )

    def _write_inserts(self, written: dict[str, dict[str, str]]) -> list[_NewRun]:
        """Write the held new runs and their steps (their digests into ``written``); the
        ones not written (the episode had the run already)."""
        inserting, self._inserting = self._inserting, []
        self.conn.inserting = False
        rows = self.conn.conn.execute(
            _INSERT_ALERT_RUN[self.db.is_postgres], [new.run for new in inserting]
        ).all()
        for row in rows:
            written[R.name][str(row.id)] = audit.row_digest(R.name, dict(row._mapping))
            self._runs[row.id] = run_from_row(row)
            self._steps_of[row.id] = []
        ids = {row.id for row in rows}
        steps = [step for new in inserting if new.run["id"] in ids for step in new.steps]
        if steps:
            for row in self.conn.conn.execute(_INSERT_STEPS, steps):
                written[S.name][str(row.id)] = audit.row_digest(S.name, dict(row._mapping))
                self._keep_new_step(step_from_row(row))
        return [new for new in inserting if new.run["id"] not in ids]

    def _write_held(self, kind: _Kind, changes: list[tuple[int, _Held]]) -> dict[str, str]:
        """One statement for ``changes``: the digests of the rows it wrote, by id."""
        rows = [_held_row(kind, row_id, held) for row_id, held in changes]
        if not self.db.is_postgres:
            return self._write_held_sqlite(kind, rows)
        # a list a column
        names = _held_names(kind)
        columns = zip(*rows, strict=True)
        params = {name: list(column) for name, column in zip(names, columns, strict=True)}
        result = self.conn.conn.execute(_held_update(kind), params)
        if kind.table == E.name:
            return {}
        return {str(row.id): audit.row_digest(kind.table, dict(row._mapping)) for row in result}

    def _write_held_sqlite(self, kind: _Kind, rows: list[list[Any]]) -> dict[str, str]:
        """``_write_held`` on SQLite: a placeholder a value, padded with rows of id 0, sent
        as one plain tuple; each value converted by its column's type once, as SQLAlchemy
        would, and the rows written read back the same way. Through SQLAlchemy, the bind
        parameters a row (named, padding included) and the rows' typed results were half of
        the statement's cost (a held claim: 100 µs of CPU a step)."""
        raw = _raw_held(kind, self.conn.conn.dialect)
        size = next(size for size in _HELD_SIZES if size >= len(rows))
        params: list[Any] = []
        for row in rows:
            params += [
                value if bind is None else bind(value)
                for bind, value in zip(raw.binds, row, strict=True)
            ]
        params += raw.padding * (size - len(rows))
        result = self.conn.conn.exec_driver_sql(raw.sql[size], tuple(params))
        if kind.table == E.name:
            return {}
        written = map(raw.named, result)
        return {str(row["id"]): audit.row_digest(kind.table, row) for row in written}

    def _seal_written(self, written: dict[str, dict[str, str]]) -> None:
        """The events that sealed held rows get their digests, as written."""
        for rows in [self._unsealed, *(event["rows"] for event in self._pending)]:
            for table, sealed in (rows or {}).items():
                digests = written.get(table)
                if not digests:
                    continue
                for key, digest in sealed.items():
                    if digest is _UNWRITTEN and key in digests:
                        sealed[key] = digests[key]

    def _lost(self, lost: list[tuple[str, int, _Held]]) -> None:
        """Held changes whose rows had moved: forget what was kept of them, and say why."""
        for table, row_id, _ in lost:
            if table == S.name:
                step = self._steps.pop(row_id, None)
                if step is not None:
                    self._steps_of.pop(step.run_id, None)
            else:
                self._runs.pop(row_id, None)
        table, row_id, held = lost[0]
        if table == S.name:
            raise errors.Conflict(f"step {row_id} is no longer {held.status}")
        current = self.get_run(row_id)
        state = current.status.value if current else "missing"
        to = held.values["status"]
        raise errors.Conflict(f"run {row_id} is {state}; cannot move it to {to}")

    def update_step_output(
        self, step_id: int, owner: str, output: dict[str, Any], lease_until: dt.datetime
    ) -> bool:
        """Progress of a running step, and a lease renewal; ``False`` if the lease was lost."""
        self._forget()
        result = self.conn.execute(
            sa.update(S)
            .where(
                S.c.id == step_id,
                S.c.status == runs.StepStatus.RUNNING.value,
                S.c.lease_owner == owner,
            )
            .values(output=output, lease_expires_at=lease_until)
        )
        return bool(result.rowcount)

    def lock_due_steps(self, limit: int) -> Iterator[records.Step]:
        """Due pending steps of running runs, locked for this transaction."""
        due = _LOCK_DUE[self.db.is_postgres]
        rows = self.conn.execute(due, {"now": self.now, "w_limit": limit}).all()
        # read at once, made into steps as the claim loop takes them (a loop giving way to
        # the webhook takes a few of the ``limit`` read)
        return (step_from_row(row) for row in rows)

    # -- guards ----------------------------------------------------------------------------

    def guard_snapshot(
        self,
        *,
        node: str | None,
        since: dt.datetime,
        disruptive_playbooks: Iterable[str],
        gpu_nodes: int | None,
        pool: str | None = None,
    ) -> guards.Snapshot:
        playbook_names = tuple(sorted(disruptive_playbooks))
        key = (pool, since, playbook_names)
        fleet = self._fleet_guards.get(key)
        if fleet is None:
            # Read once per transaction and kept up to date by this transaction's own writes
            # (``record_disruption`` adds to it; other guard writes drop it): a claim pass
            # admitting a burst of steps reads the fleet's state once, not once per step.
            fleet = self._fleet_guard_state(pool, since, playbook_names)
            self._fleet_guards[key] = fleet
        disrupted, breaker, recent = fleet
        last = None
        if node is not None:
            last, active, active_in_pool = self._node_disruption(node, pool)
            disrupted.learn(node, bool(active_in_pool if pool is not None else active))
        return guards.Snapshot(
            disrupted_nodes=disrupted,
            gpu_nodes=gpu_nodes,
            recent_runs=int(recent),
            breaker_open=bool(breaker.get("open")),
            node_last_disrupted=last,
        )

    def holds_disruption(self, node: str, pool: str | None) -> bool:
        """Whether a disruption of ``node`` (in ``pool``, when one is given) is held."""
        return any(
            held["node"] == node and (pool is None or held["pool"] == pool)
            for held in self._disrupting
        )

    def note_guard_nodes(self, nodes: Iterable[str]) -> None:
        self._guard_nodes.update(nodes)

    def _node_disruption(self, node: str, pool: str | None) -> tuple[dt.datetime | None, int, int]:
        """When ``node`` was last disrupted, and its active disruptions (in all pools, in
        ``pool``): with the other noted nodes in one read, the first time one is asked (a
        node not noted is read alone, each time)."""
        rows = self._node_disruptions.get(node)
        if rows is None:
            noted = node in self._guard_nodes
            unread = sorted(self._guard_nodes - self._node_disruptions.keys()) if noted else [node]
            found: dict[str, list[tuple[str | None, dt.datetime | None, int]]] = {
                name: [] for name in unread
            }
            for row in self.conn.execute(_NODE_DISRUPTIONS, {"w_nodes": unread}):
                found[row.node].append((row.pool, row.last, int(row.active)))
            if noted:
                self._node_disruptions |= found
            rows = found[node]
        times = [last for _, last, _ in rows if last is not None]
        return (
            max(times) if times else None,
            sum(active for _, _, active in rows),
            sum(active for row_pool, _, active in rows if pool is not None and row_pool == pool),
        )

    def _fleet_guard_state(
        self, pool: str | None, since: dt.datetime, playbook_names: tuple[str, ...]
    ) -> tuple[_DisruptedNodes, dict[str, Any], int]:
        """What every node's guard verdict shares: disrupted nodes, the breaker, recent runs."""
        disrupted = _DisruptedNodes(self, pool)
        breaker = self.get_guard_state("breaker")
        # runs an operator has seen when resetting the breaker do not count
        reset = breaker.get("reset_at")
        recent = self.conn.execute(
            _RECENT_RUNS,
            {
                "w_playbooks": list(playbook_names),
                "w_since": since,
                "w_reset": dt.datetime.fromisoformat(reset) if reset else _NEVER,
            },
        ).scalar_one()
        return disrupted, breaker, int(recent)

    def get_guard_state(self, key: str) -> dict[str, Any]:
        """A guard state; on Postgres its row stays locked until the transaction ends, so a
        read-modify-write of it by two replicas happens one after the other."""
        query = _GUARD_STATE[self.db.is_postgres and self.locking]
        row = self.conn.execute(query, {"w_key": key}).one_or_none()
        return dict(row.value) if row else {}

    def lock_guards(self) -> None:
        """Serialize fleet guard decisions (budget, breaker, per-node limits) across replicas
        until the transaction ends: they count rows and then add one, which two replicas
        must not do at once. SQLite has one writer at a time already."""
        if not self.db.is_postgres or self._guards_locked:
            return  # (held until the transaction ends: two statements once, not per decision)
        self.conn.execute(_ENSURE_GUARD_LOCK, {"updated_at": self.now})
        self.conn.execute(_LOCK_GUARDS).one()
        self._guards_locked = True

    def set_guard_state(self, key: str, value: dict[str, Any]) -> None:
        self._fleet_guards.clear()
        statement = self._insert(G).values(key=key, value=value, updated_at=self.now)
        self.conn.execute(
            statement.on_conflict_do_update(
                index_elements=[G.c.key], set_={"value": value, "updated_at": self.now}
            )
        )

    def guard_states(self, prefix: str) -> dict[str, dict[str, Any]]:
        rows = self.conn.execute(sa.select(G.c.key, G.c.value).where(G.c.key.startswith(prefix)))
        return {row.key: dict(row.value) for row in rows}

    def delete_guard_state(self, key: str) -> None:
        self._fleet_guards.clear()
        self.conn.execute(sa.delete(G).where(G.c.key == key))

    def record_disruption(self, *, run_id: int, node: str, pool: str | None = None) -> None:
        added = [
            disrupted.adding(node)
            for (counted_pool, _, _), (disrupted, _, _) in self._fleet_guards.items()
            if counted_pool is None or counted_pool == pool
        ]
        # held, and written with the others (``write_pending``) before anything reads them
        self._disrupting.append(
            {"run_id": run_id, "node": node, "pool": pool, "started_at": self.now}
        )
        self.conn.disrupting = True
        self._node_disruptions.pop(node, None)  # read again if asked again
        self._guard_nodes.discard(node)
        for then in added:
            then()

    def release_disruptions(self, *, node: str | None = None, run_id: int | None = None) -> int:
        self._fleet_guards.clear()
        self._node_disruptions.clear()
        conditions: list[sa.ColumnElement[bool]] = [D.c.released_at.is_(None)]
        if node is not None:
            conditions.append(D.c.node == node)
        if run_id is not None:
            conditions.append(D.c.run_id == run_id)
        released = self.conn.execute(
            sa.update(D).where(*conditions).values(released_at=self.now).returning(D.c.pool)
        ).all()
        for row in released:
            for key in guards.freed_keys(row.pool):
                self.wake_steps(key, 1)
        return len(released)

    def wake_steps(self, key: str | None, count: int | None = None) -> None:
        if key in self._waking_steps:
            before = self._waking_steps[key]
            count = None if before is None or count is None else before + count
        self._waking_steps[key] = count

    def _write_step_wakes(self) -> None:
        """Make the steps ``wake_steps`` asked for due now (forgetting what was read of them)."""
        waking, self._waking_steps = self._waking_steps, {}
        woken: list[int] = []
        for key, count in sorted(waking.items(), key=lambda item: item[0] or ""):
            if key is None:
                statement = _WAKE_ANY_STEPS
            elif count is None:
                statement = _WAKE_ALL_STEPS
            else:
                statement = _WAKE_OLDEST_STEPS[self.db.is_postgres]
            params = {"now": self.now, "w_key": key, "w_count": count}
            woken += self.conn.conn.execute(statement, params).scalars()
        for step_id in woken:
            step = self._steps.pop(step_id, None)
            if step is not None:
                self._steps_of.pop(step.run_id, None)

    def count_node_runs(self, node: str, *, since: dt.datetime) -> int:
        if self._node_runs is not None and self._node_runs[0] == since:
            known = self._node_runs[1].get(node)
            if known is not None:
                return known
        found = self.conn.execute(_COUNT_NODE_RUNS, {"w_node": node, "w_since": since})
        return int(found.scalar_one()) + self._held_runs_on(node)

    def count_runs_by_node(self, nodes: Iterable[str], *, since: dt.datetime) -> dict[str, int]:
        counts = dict.fromkeys(sorted(set(nodes)), 0)
        if counts:
            params = {"w_nodes": list(counts), "w_since": since}
            counts |= {
                row.node: int(row.count) for row in self.conn.execute(_COUNT_RUNS_BY_NODE, params)
            }
            counts = {node: count + self._held_runs_on(node) for node, count in counts.items()}
        self._node_runs = (since, counts)
        return dict(counts)

    def _held_runs_on(self, node: str) -> int:
        """Held new runs on ``node`` that count as its runs (not undo runs; all are new)."""
        kind = runs.RunKind.UNDO.value
        return sum(
            1 for new in self._inserting if new.run["node"] == node and new.run["kind"] != kind
        )

    def expired_leases(self, limit: int) -> list[records.Step]:
        query = self._lock_rows(
            sa.select(S)
            .where(_expired_leases(self.now))
            .order_by(S.c.lease_expires_at)
            .limit(limit)
        )
        return [step_from_row(row) for row in self.conn.execute(query)]

    def steps_leased_by(self, owner: str) -> list[records.Step]:
        query = sa.select(S).where(
            S.c.status == runs.StepStatus.RUNNING.value, S.c.lease_owner == owner
        )
        return [step_from_row(row) for row in self.conn.execute(query)]

    def active_runs_with_no_active_step(self, limit: int) -> list[records.Run]:
        """The hinted runs (``advance_hints``, this transaction's own) and those of
        resolutions not yet handled, that are to advance; at most ``limit``, locked. The
        hints read are deleted but those of runs still to advance that were not taken
        (another transaction holds them, or beyond ``limit``). A run taken keeps its hint in
        this transaction until advancing it gives it a step under way or ends it: one left
        to advance (its advance failed) is hinted again when it commits."""
        pg = self.db.is_postgres
        hints = self.conn.execute(_READ_HINTS[pg], {"w_limit": limit}).all()
        wanted = self._hints.union(run_id for _, run_id in hints)
        found = [
            run_from_row(row)
            for row in self.conn.execute(
                _LOCK_ADVANCEABLE[pg], {"w_ids": sorted(wanted), "w_limit": limit}
            )
        ]
        self._runs.update((run.id, run) for run in found)
        taken = {run.id for run in found}
        rest = wanted - taken
        kept = (
            set(self.conn.execute(_STILL_ADVANCEABLE, {"w_ids": sorted(rest)}).scalars())
            if rest
            else set()
        )
        done = [hint_id for hint_id, run_id in hints if run_id not in kept]
        if done:
            self.conn.execute(_DELETE_HINTS, {"w_hint_ids": done})
        self._hints = (self._hints & kept) | taken
        return found

    # -- effects ledger --------------------------------------------------------------------

    def effect_ledger(
        self,
        *,
        actions: Iterable[str],
        returning: Iterable[str],
        closed_by: Iterable[str],
        limit: int,
    ) -> list[records.LedgerEntry]:
        # Resolved and handled: the engine has applied the playbook's on_resolve already.
        resolved = sa.and_(
            E.c.status == alerts.AlertStatus.RESOLVED.value,
            E.c.handled_status == alerts.AlertStatus.RESOLVED.value,
        )
        closed = (
            sa.select(A.c.id).where(A.c.step_id == S.c.id, A.c.kind.in_(list(closed_by))).exists()
        )
        undo = playbooks.ResolvePolicy.UNDO.value
        kept = sa.and_(
            R.c.on_resolve == playbooks.ResolvePolicy.CONTINUE.value,
            S.c.effect == runs.Effect.APPLIED.value,
        )
        query = (
            sa.select(S.c.id, resolved.label("resolved"))
            .select_from(S.join(R, R.c.id == S.c.run_id).join(E, E.c.id == R.c.episode_id))
            .where(
                S.c.phase == runs.StepPhase.DO.value,
                S.c.effect.in_([e.value for e in runs.EFFECTS_TO_UNDO]),
                S.c.action.in_(list(actions)),
                R.c.kind == runs.RunKind.ALERT.value,
                R.c.status.in_([s.value for s in runs.RUN_TERMINAL]),
                R.c.node.is_not(None),
                R.c.dry_run.is_(False),
                sa.or_(kept, sa.and_(resolved, R.c.on_resolve == undo)),
                ~closed,
            )
            .order_by(S.c.id)
            .limit(limit)
        )
        found = self.conn.execute(query).all()
        later = S.alias("later")
        later_run = R.alias("later_run")
        entries = []
        for step_id, is_resolved in found:
            step = self.get_step(step_id)
            assert step is not None
            run = self.get_run(step.run_id)
            assert run is not None
            undo_runs = self.conn.execute(
                sa.select(R.c.status)
                .where(R.c.parent_run_id == run.id, R.c.kind == runs.RunKind.UNDO.value)
                .order_by(R.c.id)
            ).scalars()
            returned = self.conn.execute(
                sa.select(later.c.id)
                .select_from(later.join(later_run, later_run.c.id == later.c.run_id))
                .where(
                    later_run.c.node == run.node,
                    later_run.c.id > run.id,
                    later.c.phase == runs.StepPhase.DO.value,
                    later.c.action.in_(list(returning)),
                    later.c.status == runs.StepStatus.SUCCEEDED.value,
                )
                .limit(1)
            ).first()
            entries.append(
                records.LedgerEntry(
                    run=run,
                    step=step,
                    alert_resolved=bool(is_resolved),
                    undo_runs=tuple(runs.RunStatus(status) for status in undo_runs),
                    returned_to_service=returned is not None,
                )
            )
        return entries

    # -- approvals -------------------------------------------------------------------------

    def add_approval(self, step_id: int, *, principal: str, decision: str, comment: str) -> bool:
        """Record one principal's decision on a step; ``False`` if they already decided."""
        statement = (
            self._insert(AP)
            .values(
                step_id=step_id,
                principal=principal,
                decision=decision,
                comment=comment,
                at=self.now,
            )
            .on_conflict_do_nothing(index_elements=[AP.c.step_id, AP.c.principal])
            .returning(*AP.c)
        )
        row = self.conn.execute(statement).one_or_none()
        if row is None:
            return False
        self._seal("approvals", row)
        return True

    def approvals_of(self, step_id: int) -> list[dict[str, Any]]:
        query = sa.select(AP).where(AP.c.step_id == step_id).order_by(AP.c.id)
        return [dict(row._mapping) for row in self.conn.execute(query)]

    def alert_sender(self, episode_id: int) -> str | None:
        """The principal whose delivery started the episode (None: unknown or deleted)."""
        query = (
            sa.select(tables.deliveries.c.principal)
            .join(E, E.c.first_delivery_id == tables.deliveries.c.id)
            .where(E.c.id == episode_id)
        )
        sender: str | None = self.conn.execute(query).scalar_one_or_none()
        return sender

    def steps_waiting_since(self, cutoff: dt.datetime, limit: int) -> list[records.Step]:
        """Steps waiting for approval whose run has waited since ``cutoff`` or earlier (the
        run's ``updated_at`` is the moment it parked: nothing else moves a waiting run)."""
        query = self._lock_rows(
            sa.select(S)
            .join(R, R.c.id == S.c.run_id)
            .where(
                S.c.status == runs.StepStatus.WAITING_APPROVAL.value,
                R.c.status == runs.RunStatus.WAITING_APPROVAL.value,
                R.c.updated_at <= cutoff,
            )
            .order_by(S.c.id)
            .limit(limit)
        )
        if self.db.is_postgres:
            query = query.with_for_update(skip_locked=True, of=S)
        return [step_from_row(row) for row in self.conn.execute(query)]

    # -- locks -----------------------------------------------------------------------------

    def try_lock(self, key: str, *, run_id: int | None, expires_at: dt.datetime | None) -> bool:
        """Take ``key`` unless someone holds it (an expired holder loses it)."""
        taken = self.conn.execute(
            _TAKE_LOCK[self.db.is_postgres],
            {"key": key, "run_id": run_id, "acquired_at": self.now, "expires_at": expires_at},
        )
        for prefix, held in self._held.items():  # taken now, or by someone else: held
            if key.startswith(prefix):
                held.add(key)
        return taken.one_or_none() is not None

    def try_locks(
        self, keys: Sequence[str], *, run_id: int | None, expires_at: dt.datetime | None
    ) -> set[str]:
        """``try_lock`` of each key, in one statement: the keys taken."""
        if len(keys) < 2:
            return {key for key in keys if self.try_lock(key, run_id=run_id, expires_at=expires_at)}
        return self._take([(key, run_id) for key in keys], expires_at=expires_at)

    def take_locks(self, wanted: Mapping[str, int]) -> set[str]:
        """``try_lock`` of each key for its own run, in one statement: the keys taken. In
        the keys' order: two replicas taking overlapping keys each wait for the other's
        (Postgres waits on a uniqueness conflict with an uncommitted row) in the same order,
        never in a cycle."""
        return self._take(sorted(wanted.items()), expires_at=None)

    def _take(
        self, rows: list[tuple[str, int | None]], *, expires_at: dt.datetime | None
    ) -> set[str]:
        """One upsert taking each ``(key, run id)`` as ``try_lock`` does: the keys taken."""
        if not rows:
            return set()
        taken = self.conn.execute(
            _TAKE_LOCK[self.db.is_postgres],
            [
                {"key": key, "run_id": run_id, "acquired_at": self.now, "expires_at": expires_at}
                for key, run_id in rows
            ],
        )
        for prefix, held in self._held.items():  # taken now, or by someone else: held
            held.update(key for key, _ in rows if key.startswith(prefix))
        return {row.key for row in taken}

    def release_run_locks(self, run_id: int) -> None:
        """Release what a finished run held, except expiring locks (cooldowns run their time).
        Held, and written with the other finished runs' (``write_pending``): the keys read
        so far are read again when next asked for."""
        self._releasing.append(run_id)
        self.conn.releasing = True
        self._held.clear()

    def _write_releases(self) -> None:
        releasing, self._releasing = self._releasing, []
        self.conn.releasing = False
        released = self.conn.conn.execute(_RELEASE_RUN_LOCKS, {"w_run_ids": releasing})
        self._waking.update(released.scalars())

    def release_locks(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        for held in self._held.values():
            held.difference_update(keys)
        self.conn.execute(sa.delete(L).where(L.c.key.in_(keys)))
        self._waking.update(keys)

    def _write_wakes(self) -> None:
        """Wake the runs parked behind the node and GPU keys released, and for each slot
        released the oldest run waiting for a slot of its playbook. (Every run waiting for a
        slot, woken at each release, parked again but one: a storm through a playbook of
        concurrency 10 rewrote its 990 waiting runs at each of its thousand releases.)"""
        waking, self._waking = self._waking, set()
        exact = sorted(key for key in waking if key.startswith(_NODE_OR_GPU))
        if exact:
            self.conn.conn.execute(_WAKE, {"w_keys": exact})
        self._wake_oldest(
            collections.Counter(
                key[: key.rindex(":") + 1] for key in waking if key.startswith("slot:")
            )
        )

    def _wake_oldest(self, wanted: Mapping[str, int]) -> None:
        """Wake the oldest ``count`` runs waiting for ``key``, for each of ``wanted``."""
        statement = _WAKE_OLDEST[self.db.is_postgres]
        for key, count in sorted(wanted.items()):
            self.conn.conn.execute(statement, {"w_key": key, "w_count": count})

    def held_keys(self, prefix: str) -> AbstractSet[str]:
        """Keys of live locks starting with ``prefix``: one query per transaction, whatever
        their number (a storm starting hundreds of runs of one playbook read every slot
        again for each), kept current by this transaction's own locks and releases (the set
        itself, not a copy: a start reads it in O(1))."""
        held = self._held.get(prefix)
        if held is None:
            rows = self.conn.execute(_HELD_KEYS, {"w_prefix": prefix, "now": self.now})
            held = self._held[prefix] = set(rows.scalars().all())
        return held

    def lock_holder(self, key: str) -> int | None:
        """The active run holding the live lock ``key``."""
        query = (
            sa.select(L.c.run_id)
            .join(R, R.c.id == L.c.run_id)
            .where(
                L.c.key == key,
                sa.or_(L.c.expires_at.is_(None), L.c.expires_at > self.now),
                R.c.status.in_([status.value for status in runs.RUN_ACTIVE]),
            )
        )
        holder: int | None = self.conn.execute(query).scalar_one_or_none()
        return holder
