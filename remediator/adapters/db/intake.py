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
import dataclasses
import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from remediator.adapters.db import database, tables
from remediator.domain import alerts, audit, errors

logger = logging.getLogger("remediator.intake")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Delivery:
    payload: alerts.WebhookPayload
    body: str
    principal: str | None
    remote: str | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stored:
    delivery_id: int
    alerts: int
    changed: int  # new episodes plus firing → resolved changes

    @property
    def deduplicated(self) -> int:
        return self.alerts - self.changed


_Key = tuple[str, dt.datetime]


class IntakeWriter:
    def __init__(
        self,
        db: database.Database,
        *,
        clock: Callable[[], dt.datetime],
        max_batch: int = 512,
        on_change: Callable[[], None] | None = None,
        keys: audit.AuditKeys | None = None,
    ) -> None:
        self.db = db
        self.keys = keys
        self.clock = clock
        self.max_batch = max_batch
        self.on_change = on_change
        self._queue: asyncio.Queue[tuple[Delivery, asyncio.Future[Stored]]] = asyncio.Queue()
        # Built once: SQLAlchemy memoizes a statement's cache key and its compiled form on the
        # object, so re-using it skips the construction and keying that dominated a small batch.
        self._insert_deliveries = sa.insert(tables.deliveries).returning(
            tables.deliveries.c.id, sort_by_parameter_order=True
        )
        self._upsert_episodes = self._upsert()

    async def store(self, delivery: Delivery) -> Stored:
        """Enqueue and wait until committed. Raises ``StoreUnavailable`` if it could not be."""
        future: asyncio.Future[Stored] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((delivery, future))  # unbounded: never waits
        return await future

    async def run(self) -> None:
        """The writer loop, owned by the composition root."""
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
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
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
        if self.on_change is not None and any(result.changed for result in results):
            self.on_change()

    async def _commit(self, batch: list[Delivery]) -> list[Stored]:
        now = self.clock()
        return await self.db.write_sync(
            "intake", lambda conn: self._write(conn, batch, now), urgent=True
        )

    def _write(self, conn: sa.Connection, batch: list[Delivery], now: dt.datetime) -> list[Stored]:
        delivery_rows = [
            {
                "received_at": now,
                "receiver": d.payload.receiver,
                "status": d.payload.status.value,
                "group_key": d.payload.group_key,
                "alert_count": len(d.payload.alerts),
                "principal": d.principal,
                "remote": d.remote,
                "body": d.body,
            }
            for d in batch
        ]
        if self.keys is not None:
            for row in delivery_rows:
                row["mac"] = audit.mac(self.keys, audit.delivery_text(row))
        inserted = conn.execute(self._insert_deliveries, delivery_rows)
        ids = [row.id for row in inserted]
        episodes, first_delivery = _merge_episodes(batch, ids, now)
        changed_keys: set[_Key] = set()
        if episodes:
            result = conn.execute(self._upsert_episodes, episodes)
            changed_keys = {(row.fingerprint, row.starts_at) for row in result}
        return [
            Stored(
                delivery_id=delivery_id,
                alerts=len(d.payload.alerts),
                changed=sum(1 for key in changed_keys if first_delivery.get(key) == delivery_id),
            )
            for d, delivery_id in zip(batch, ids, strict=True)
        ]

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
        ).returning(table.c.fingerprint, table.c.starts_at)


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
    batch: list[Delivery], ids: list[int], now: dt.datetime
) -> tuple[list[dict[str, Any]], dict[_Key, int]]:
    """One row per episode key in the batch (a resolved status wins: resolution is final)."""
    rows: dict[_Key, dict[str, Any]] = {}
    first_delivery: dict[_Key, int] = {}
    for delivery, delivery_id in zip(batch, ids, strict=True):
        for alert in delivery.payload.alerts:
            key = (alert.fingerprint, alert.starts_at)
            resolved = alert.status is alerts.AlertStatus.RESOLVED
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
