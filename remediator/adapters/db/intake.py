"""Durable intake with group commit.

The webhook answers only after its delivery and every alert in it are committed. Concurrent
deliveries are written together: handlers enqueue, one writer task drains the queue into a
single transaction (one fsync for many deliveries) and wakes every waiting handler. Dedupe is one
upsert per batch keyed on ``(fingerprint, starts_at)``: an existing firing episode changes only
when a resolved status arrives; everything else is a repeat and changes nothing.

A batch that fails is written again one delivery at a time, so one bad delivery fails alone. A
delivery whose data the database refuses (SQLSTATE class 22, e.g. a value too long for its
column) fails with ``ValidationFailed``, which the webhook answers with 400: it would be refused
on every retry. Any other failure is ``StoreUnavailable`` (503, retried).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime as dt
import itertools
import logging
import time
import typing
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from remediator.adapters.db import database, tables
from remediator.domain import alerts, audit, errors

logger = logging.getLogger("remediator.intake")
_CHUNK = 200  # fingerprints a query: far below any backend's limit of bound parameters
# SQLite: the batch's ids are chosen in its write transaction (``IntakeWriter._insert``), and
# its rows sent as plain tuples in the table's column order, id first.
_LAST_DELIVERY = "SELECT max(id) FROM deliveries"  # alone: one step down the primary key
_SQLITE = sqlite.dialect()
_INSERT_NUMBERED = str(sa.insert(tables.deliveries).compile(dialect=_SQLITE))


class Delivery(typing.NamedTuple):
    """One webhook request's delivery (a tuple: built for every request, in half the time a
    frozen dataclass takes)."""

    payload: alerts.WebhookPayload
    body: str
    principal: str | None
    remote: str | None


class Stored(typing.NamedTuple):  # a tuple: one per delivery, built in the write transaction
    delivery_id: int
    alerts: int
    changed: int  # new episodes plus firing → resolved changes

    @property
    def deduplicated(self) -> int:
        return self.alerts - self.changed


class Tally(typing.NamedTuple):
    """What one committed batch stored, for the counters (``IntakeWriter.on_stored``)."""

    deliveries: int
    firing: int  # alerts by status
    resolved: int
    deduplicated: int  # alerts that changed nothing


_Key = tuple[str, dt.datetime]


class KnownEpisodes:
    """Episode keys this process knows are stored, whether as resolved, and since when.

    The upsert changes a stored episode only from firing to resolved, so two kinds of repeat
    change nothing: a firing alert of a stored episode, and a resolved alert of an episode
    stored resolved. Repeats are most of what Alertmanager sends (every repeat interval, each
    replica of an HA pair, every retry), so the writer leaves the repeats of known keys out
    of its upsert: serializing their labels and probing the unique index for nothing was a
    third of the webhook's writing. A resolved alert of a key known firing is always written.

    Why a known key may be trusted for ``ttl`` seconds: a stored episode leaves the table only
    through retention, which deletes episodes resolved more than ``alert_retention_days`` (at
    least one day) ago, and nothing turns a resolved episode back to firing. An episode known
    firing at time t was not resolved at t, so it is there at least until t plus a day,
    whatever another replica does to it meanwhile (it may resolve it: a firing repeat changes
    nothing then either). An episode is learned resolved only if it was resolved within the
    last ``recent`` (a day less ``ttl``): it is there for ``ttl`` more at least. A key learned
    again after its ``ttl`` starts a new ``ttl``. ``limit`` bounds the memory; the oldest keys
    go first.
    """

    def __init__(
        self,
        *,
        ttl: float = 3600.0,
        limit: int = 16384,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.limit = limit
        self.monotonic = monotonic
        self._since: dict[_Key, tuple[float, bool]] = {}  # key: (learned at, resolved)

    @property
    def recent(self) -> dt.timedelta:
        """How lately an episode must have been resolved to be learned resolved."""
        return dt.timedelta(days=1) - dt.timedelta(seconds=self.ttl)

    def known_in(self, batch: list[Delivery]) -> dict[_Key, bool]:
        """The batch's keys known to be stored, with whether as resolved."""
        if not self._since:
            return {}
        fresh = self.monotonic() - self.ttl
        since = self._since
        found: dict[_Key, bool] = {}
        for delivery in batch:
            for alert in delivery.payload.alerts:
                key = (alert.fingerprint, alert.starts_at)
                known = since.get(key)
                if known is not None and known[0] > fresh:
                    found[key] = known[1]
        return found

    def learn(self, firing: list[_Key], resolved: list[_Key]) -> None:
        """After a commit: ``firing`` keys are stored firing now, ``resolved`` ones resolved
        (each within ``recent``)."""
        since = self._since
        now = self.monotonic()
        for keys, is_resolved in ((firing, False), (resolved, True)):
            for key in keys:
                since.pop(key, None)  # to the end: the oldest keys stay first
                since[key] = (now, is_resolved)
        if len(since) > self.limit:
            for key in list(itertools.islice(since, len(since) - self.limit * 3 // 4)):
                del since[key]

    def __len__(self) -> int:
        return len(self._since)


@dataclasses.dataclass(frozen=True)
class _Written:
    stored: list[Stored]
    firing: list[_Key]  # keys now stored firing (new, or found so)
    resolved: list[_Key]  # keys resolved by this batch, or found resolved within ``recent``


class IntakeWriter:
    def __init__(
        self,
        db: database.Database,
        *,
        clock: Callable[[], dt.datetime],
        max_batch: int = 512,
        on_change: Callable[[], None] | None = None,
        on_stored: Callable[[Tally], None] | None = None,
        keys: audit.AuditKeys | None = None,
    ) -> None:
        """``on_change``: called after a batch that changed an episode. ``on_stored``: called
        with each committed batch's tally, before its deliveries are answered (counted once a
        batch: counters updated for every request were 3 % of a delivery's instructions)."""
        self.db = db
        self.keys = keys
        self.clock = clock
        self.max_batch = max_batch
        self.on_change = on_change
        self.on_stored = on_stored
        # What the handlers wait on, in order (a deque and an event: an ``asyncio.Queue`` cost
        # four times as much an item, for waits of its own the writer has no use for).
        self._pending: collections.deque[tuple[Delivery, asyncio.Future[Stored]]] = (
            collections.deque()
        )
        self._wake = asyncio.Event()
        # Built once: SQLAlchemy memoizes a statement's cache key and its compiled form on the
        # object, so re-using it skips the construction and keying that dominated a small batch.
        self._insert_deliveries = sa.insert(tables.deliveries).returning(
            tables.deliveries.c.id, sort_by_parameter_order=True
        )
        self._upsert_episodes = self._upsert()
        self.known = KnownEpisodes()

    async def store(self, delivery: Delivery) -> Stored:
        """Enqueue and wait until committed. Raises ``StoreUnavailable`` if it could not be."""
        future: asyncio.Future[Stored] = asyncio.get_running_loop().create_future()
        self._pending.append((delivery, future))  # unbounded: never waits
        self._wake.set()
        return await future

    async def run(self) -> None:
        """The writer loop, owned by the composition root."""
        pending = self._pending
        while True:
            if not pending:
                self._wake.clear()
                await self._wake.wait()
            batch = [pending.popleft() for _ in range(min(len(pending), self.max_batch))]
            await self._write_batch(batch)

    async def _write_batch(self, batch: list[tuple[Delivery, asyncio.Future[Stored]]]) -> None:
        try:
            results = await self._commit([delivery for delivery, _ in batch])
        except Exception as e:
            if len(batch) > 1 and not _unavailable(e):
                # One bad delivery must not fail its neighbours: write them one by one.
                for item in batch:
                    await self._write_batch([item])
                return
            failure = _translate(e)
            for _, future in batch:
                if not future.done():
                    future.set_exception(failure)
            return
        if self.on_stored is not None:
            try:
                self.on_stored(_tally(batch, results))
            except Exception:  # counting must never stop the writer: it answers every delivery
                logger.exception("could not count a stored batch")
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
        if self.on_change is not None and any(result.changed for result in results):
            self.on_change()

    async def _commit(self, batch: list[Delivery]) -> list[Stored]:
        now = self.clock()
        known = self.known.known_in(batch)
        written = await self.db.write_sync(
            "intake", lambda conn: self._write(conn, batch, now, known), urgent=True
        )
        self.known.learn(written.firing, written.resolved)  # committed
        return written.stored

    def _write(
        self,
        conn: sa.Connection,
        batch: list[Delivery],
        now: dt.datetime,
        known: dict[_Key, bool],
    ) -> _Written:
        ids = self._insert(conn, now, batch)
        episodes, first_delivery = _merge_episodes(batch, ids, now, known)
        changed_keys: set[_Key] = set()
        firing: list[_Key] = []
        resolved: list[_Key] = []
        if episodes:
            for changed in conn.execute(self._upsert_episodes, episodes):
                key = (changed.fingerprint, changed.starts_at)
                changed_keys.add(key)
                now_firing = changed.status == alerts.AlertStatus.FIRING.value
                (firing if now_firing else resolved).append(key)
            # Episodes stored before that this batch did not change: how are they stored?
            unchanged = [
                key
                for e in episodes
                if (key := (e["fingerprint"], e["starts_at"])) not in changed_keys
            ]
            if unchanged:
                found_firing, found_resolved = self._stored(
                    conn, unchanged, now - self.known.recent
                )
                firing += found_firing
                resolved += found_resolved
        changes = collections.Counter(first_delivery[key] for key in changed_keys)
        stored = [
            Stored(delivery_id, len(d.payload.alerts), changes.get(delivery_id, 0))
            for d, delivery_id in zip(batch, ids, strict=True)
        ]
        return _Written(stored=stored, firing=firing, resolved=resolved)

    def _stored(
        self, conn: sa.Connection, keys: list[_Key], resolved_since: dt.datetime
    ) -> tuple[list[_Key], list[_Key]]:
        """Those of ``keys`` whose episode is stored firing, and those stored resolved since
        ``resolved_since`` (read by fingerprint: the prefix of the unique index)."""
        wanted = set(keys)
        E = tables.alert_episodes
        firing: list[_Key] = []
        resolved: list[_Key] = []
        fingerprints = sorted({fingerprint for fingerprint, _ in wanted})
        for start in range(0, len(fingerprints), _CHUNK):
            query = sa.select(E.c.fingerprint, E.c.starts_at, E.c.status, E.c.resolved_at).where(
                E.c.fingerprint.in_(fingerprints[start : start + _CHUNK])
            )
            for row in conn.execute(query):
                key = (row.fingerprint, row.starts_at)
                if key not in wanted:
                    continue
                if row.status == alerts.AlertStatus.FIRING.value:
                    firing.append(key)
                elif row.resolved_at is not None and row.resolved_at >= resolved_since:
                    resolved.append(key)
        return firing, resolved

    def _mac(self, row: dict[str, Any]) -> str | None:
        """A named delivery row's MAC with the audit key, or None without a key."""
        return None if self.keys is None else audit.mac(self.keys, audit.delivery_text(row))

    def _insert(self, conn: sa.Connection, now: dt.datetime, batch: list[Delivery]) -> list[int]:
        """Insert the batch's delivery rows, received ``now``, each with its MAC; their ids, in
        order.

        SQLite cannot tie the ids of one multi-row INSERT to its rows, so SQLAlchemy's ordered
        RETURNING falls back to one INSERT a delivery there. This transaction holds SQLite's
        only write lock (``BEGIN IMMEDIATE``), so the ids after the largest one are free until
        it commits: they are numbered here (the numbers SQLite would give: the largest rowid
        plus one; ``deliveries`` has no AUTOINCREMENT) and the rows go in as one executemany
        of plain tuples in the table's column order, each built once, sent as they are (the
        batch shares one ``received_at``, converted once): SQLAlchemy's per-row parameter
        processing cost more than SQLite's insert. Postgres takes ordered RETURNING in one
        statement as it is.
        """
        if not self.db.is_sqlite:
            params = [_named(d, now) for d in batch]
            for row in params:
                row["mac"] = self._mac(row)  # (of the row without it)
            return [row.id for row in conn.execute(self._insert_deliveries, params)]
        # (named rows only for the MACs: SQLite's go out as tuples)
        macs = [self._mac(_named(d, now)) for d in batch] if self.keys is not None else None
        received_at = _SQLITE_RECEIVED_AT(now)
        first = (conn.exec_driver_sql(_LAST_DELIVERY).scalar_one() or 0) + 1
        rows = [
            (
                first + index,
                received_at,
                d.payload.receiver,
                d.payload.status.value,
                d.payload.group_key,
                len(d.payload.alerts),
                d.principal,
                d.remote,
                d.body,
                None if macs is None else macs[index],
            )
            for index, d in enumerate(batch)
        ]
        conn.exec_driver_sql(_INSERT_NUMBERED, rows)
        return list(range(first, first + len(rows)))

    def _upsert(self) -> Any:
        table = tables.alert_episodes
        insert = (postgresql.insert if self.db.is_postgres else sqlite.insert)(table)
        excluded = insert.excluded
        return insert.on_conflict_do_update(
            index_elements=[table.c.fingerprint, table.c.starts_at],
            set_={
                "status": excluded.status,
                "ends_at": excluded.ends_at,
                "resolved_at": excluded.resolved_at,
                "resolved_delivery_id": excluded.resolved_delivery_id,
                "annotations": excluded.annotations,
            },
            where=sa.and_(
                table.c.status == alerts.AlertStatus.FIRING.value,
                excluded.status == alerts.AlertStatus.RESOLVED.value,
            ),
        ).returning(table.c.fingerprint, table.c.starts_at, table.c.status)


def _named(d: Delivery, now: dt.datetime) -> dict[str, Any]:
    """A delivery's row by column name, its id and MAC left out."""
    return {
        "received_at": now,
        "receiver": d.payload.receiver,
        "status": d.payload.status.value,
        "group_key": d.payload.group_key,
        "alert_count": len(d.payload.alerts),
        "principal": d.principal,
        "remote": d.remote,
        "body": d.body,
    }


def _tally(batch: list[tuple[Delivery, asyncio.Future[Stored]]], results: list[Stored]) -> Tally:
    alerts_ = resolved = 0
    RESOLVED = alerts.AlertStatus.RESOLVED
    for delivery, _ in batch:
        for alert in delivery.payload.alerts:
            alerts_ += 1
            resolved += alert.status is RESOLVED
    return Tally(
        deliveries=len(batch),
        firing=alerts_ - resolved,
        resolved=resolved,
        deduplicated=sum(result.deduplicated for result in results),
    )


def _refused_data(error: BaseException | None) -> str | None:
    """What the database said if it refuses the data itself (SQLSTATE class 22), else None.

    The database adapter has usually wrapped the driver's error already (in
    ``ValidationFailed`` when the data is refused).
    """
    if isinstance(error, errors.RemediatorError):
        error = error.__cause__
    return database.refused_value(error)


def _unavailable(error: Exception) -> bool:
    return isinstance(error, errors.StoreUnavailable) and _refused_data(error) is None


def _translate(error: Exception) -> errors.RemediatorError:
    refused = _refused_data(error)
    if refused is not None:
        logger.warning("the database refuses a delivery: %s", refused)
        return errors.ValidationFailed(f"the database refuses a value of this delivery: {refused}")
    if isinstance(error, errors.StoreUnavailable):
        return error
    logger.error("could not store a delivery", exc_info=error)
    return errors.StoreUnavailable(f"could not store the delivery: {type(error).__name__}")


def _merge_episodes(
    batch: list[Delivery],
    ids: list[int],
    now: dt.datetime,
    known: dict[_Key, bool],
) -> tuple[list[dict[str, Any]], dict[_Key, int]]:
    """One row per episode key in the batch (a resolved status wins: resolution is final);
    none for an alert that would change nothing: firing, of a ``known`` key (stored), or
    resolved, of a key ``known`` resolved."""
    rows: dict[_Key, dict[str, Any]] = {}
    first_delivery: dict[_Key, int] = {}
    RESOLVED = alerts.AlertStatus.RESOLVED  # looked up once, not per alert
    for delivery, delivery_id in zip(batch, ids, strict=True):
        for alert in delivery.payload.alerts:
            key = (alert.fingerprint, alert.starts_at)
            resolved = alert.status is RESOLVED
            stored_resolved = known.get(key)
            if stored_resolved is not None and (stored_resolved or not resolved):
                continue
            current = rows.get(key)
            if current is not None and (current["status"] == "resolved" or not resolved):
                continue
            first_delivery.setdefault(key, delivery_id)
            if resolved:
                first_delivery[key] = delivery_id if current is None else first_delivery[key]
            rows[key] = {
                "fingerprint": alert.fingerprint,
                "starts_at": alert.starts_at,
                "alertname": alert.alertname,
                "status": alert.status.value,
                "handled_status": None,
                "labels": dict(alert.labels),
                "annotations": dict(alert.annotations),
                "generator_url": alert.generator_url,
                "ends_at": None if alert.ends_at == alerts.ZERO_TIME else alert.ends_at,
                "first_delivery_id": first_delivery[key],
                "resolved_delivery_id": delivery_id if resolved else None,
                "created_at": now,
                "resolved_at": now if resolved else None,
            }
    return list(rows.values()), first_delivery


def _bind_processor(column: sa.Column[Any], dialect: sa.Dialect) -> Callable[[Any], Any]:
    """How ``column``'s type turns a value into what ``dialect``'s driver is sent (as
    SQLAlchemy sends it: a type's own ``bind_processor`` skips the dialect's, and SQLite's
    driver would then store datetimes in another text format)."""
    process = column.type.dialect_impl(dialect).bind_processor(dialect)
    return process if process is not None else (lambda value: value)


# ``received_at`` as SQLAlchemy sends it to SQLite (its DATETIME text), converted once a batch.
_SQLITE_RECEIVED_AT = _bind_processor(tables.deliveries.c.received_at, _SQLITE)
