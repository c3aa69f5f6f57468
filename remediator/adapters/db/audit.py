"""The auditors' read side: filtered runs and audit events, streamed exports, chain checks.

Filters translate into indexed conditions (migration 0003). Pages are keyset pages on ``id``
(newest first); exports and verification walk the chain in ascending ``id`` in batches, each
batch its own short read, so memory stays flat and no transaction stays open for the whole
walk.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import sqlalchemy as sa

from remediator.adapters import auditfiles
from remediator.adapters.db import database, queries, tables
from remediator.domain import audit

A = tables.audit_events
R = tables.runs
S = tables.steps
E = tables.alert_episodes
H = tables.audit_head
D = tables.deliveries
AP = tables.approvals

EVENT_FILTERS = audit.EVENT_FILTERS
RUN_FILTERS = audit.RUN_FILTERS


@dataclasses.dataclass(frozen=True, kw_only=True)
class Filters:
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    node: str | None = None
    gpu: str | None = None
    alertname: str | None = None
    fingerprint: str | None = None
    playbook: str | None = None
    action: str | None = None
    outcome: str | None = None
    principal: str | None = None
    kind: str | None = None
    run: int | None = None


def _episode_condition(filters: Filters) -> Any:
    """Runs of matching episodes. A fingerprint selects few episodes: an ``IN`` list. An alert
    name selects many: a correlated ``EXISTS``, so the newest-first scan stops after a page."""
    if filters.fingerprint is not None:
        query = sa.select(E.c.id).where(E.c.fingerprint == filters.fingerprint)
        if filters.alertname is not None:
            query = query.where(E.c.alertname == filters.alertname)
        return R.c.episode_id.in_(query)
    if filters.alertname is not None:
        return sa.exists(
            sa.select(E.c.id).where(E.c.id == R.c.episode_id, E.c.alertname == filters.alertname)
        )
    return None


def _run_conditions(filters: Filters) -> list[Any]:
    """Conditions on ``runs`` shared by run queries and by event queries (through run ids)."""
    conditions: list[Any] = []
    for value, column in (
        (filters.node, R.c.node),
        (filters.gpu, R.c.gpu),
        (filters.playbook, R.c.playbook),
    ):
        if value is not None:
            conditions.append(column == value)
    episodes = _episode_condition(filters)
    if episodes is not None:
        conditions.append(episodes)
    return conditions


# Events are appended in id order with the time their transaction started, so ``at`` follows
# ``id`` up to the length of a transaction. A time range becomes an id range found through the
# ``at`` index with this margin (the exact ``at`` condition still applies), so the newest-first
# scan starts and stops near the range instead of walking from the newest event.
INVERSION_MARGIN = dt.timedelta(minutes=5)


def _time_conditions(filters: Filters) -> list[Any]:
    conditions: list[Any] = []
    if filters.since is not None:
        first = (
            sa.select(A.c.id)
            .where(A.c.at >= filters.since - INVERSION_MARGIN)
            .order_by(A.c.at)
            .limit(1)
            .scalar_subquery()
        )
        conditions += [A.c.at >= filters.since, A.c.id >= sa.func.coalesce(first, 0)]
    if filters.until is not None:
        last = (
            sa.select(A.c.id)
            .where(A.c.at < filters.until + INVERSION_MARGIN)
            .order_by(A.c.at.desc())
            .limit(1)
            .scalar_subquery()
        )
        conditions += [A.c.at < filters.until, A.c.id <= sa.func.coalesce(last, 0)]
    return conditions


def event_conditions(filters: Filters) -> list[Any]:
    conditions: list[Any] = _time_conditions(filters)
    if filters.principal is not None:
        conditions.append(A.c.actor == filters.principal)
    if filters.kind is not None:
        conditions.append(A.c.kind == filters.kind)
    if filters.outcome is not None:
        conditions.append(A.c.to_status == filters.outcome)
    if filters.run is not None:
        conditions.append(A.c.run_id == filters.run)
    if filters.action is not None:
        conditions.append(
            sa.exists(sa.select(S.c.id).where(S.c.id == A.c.step_id, S.c.action == filters.action))
        )
    run_conditions = _run_conditions(filters)
    if run_conditions and (filters.node or filters.gpu or filters.fingerprint or filters.playbook):
        conditions.append(A.c.run_id.in_(sa.select(R.c.id).where(*run_conditions)))
    elif run_conditions:  # only an alert name: many runs match, check them one by one
        conditions.append(sa.exists(sa.select(R.c.id).where(R.c.id == A.c.run_id, *run_conditions)))
    return conditions


def run_conditions(filters: Filters) -> list[Any]:
    conditions = _run_conditions(filters)
    if filters.since is not None:
        conditions.append(R.c.created_at >= filters.since)
    if filters.until is not None:
        conditions.append(R.c.created_at < filters.until)
    if filters.outcome is not None:
        conditions.append(R.c.status == filters.outcome)
    if filters.run is not None:
        conditions.append(R.c.id == filters.run)
    if filters.action is not None:
        conditions.append(R.c.id.in_(sa.select(S.c.run_id).where(S.c.action == filters.action)))
    if filters.principal is not None:
        acted = sa.select(A.c.run_id).where(A.c.actor == filters.principal, A.c.run_id.is_not(None))
        conditions.append(sa.or_(R.c.principal == filters.principal, R.c.id.in_(acted)))
    return conditions


@dataclasses.dataclass(frozen=True)
class ChainReport:
    ok: bool
    checked: int
    first_broken_id: int | None
    reason: str
    head_id: int | None
    anchors: int = 0
    rows: int = 0
    unsealed: int = 0
    deliveries: int = 0


SEALED = {"runs": R, "steps": S, "approvals": AP}


class AuditQueries:
    def __init__(
        self,
        db: database.Database,
        *,
        batch: int = 2000,
        keys: audit.AuditKeys | None = None,
        anchors: pathlib.Path | None = None,
    ) -> None:
        self.db = db
        self.batch = batch
        self.keys = keys
        self.anchors = anchors

    async def events(self, filters: Filters, *, limit: int, cursor: int | None) -> queries.Page:
        query = sa.select(A).where(*event_conditions(filters)).order_by(A.c.id.desc())
        if cursor is not None:
            query = query.where(A.c.id < cursor)
        async with self.db.read("audit.events") as conn:
            rows = list(await conn.execute(query.limit(limit + 1)))
        return queries.paged(rows, limit)

    async def runs(self, filters: Filters, *, limit: int, cursor: int | None) -> queries.Page:
        if filters.principal is not None:
            return await self._principal_runs(filters, limit=limit, cursor=cursor)
        query = sa.select(R).where(*run_conditions(filters)).order_by(R.c.id.desc())
        if cursor is not None:
            query = query.where(R.c.id < cursor)
        async with self.db.read("audit.runs") as conn:
            rows = list(await conn.execute(query.limit(limit + 1)))
        return queries.paged(rows, limit)

    async def _principal_runs(
        self, filters: Filters, *, limit: int, cursor: int | None, chunk: int = 500
    ) -> queries.Page:
        """Runs a principal triggered or acted on, newest first. The two sources are walked
        down together in bounded keyset chunks (each from its own index) instead of one
        ``OR``/``IN`` over every run the principal ever touched."""
        principal = filters.principal
        others = run_conditions(dataclasses.replace(filters, principal=None))
        rows: list[Any] = []
        upper = cursor
        async with self.db.read("audit.runs.principal") as conn:
            while len(rows) <= limit:
                triggered = sa.select(R.c.id).where(R.c.principal == principal)
                acted = (
                    sa.select(A.c.run_id)
                    .where(A.c.actor == principal, A.c.run_id.is_not(None))
                    .distinct()
                )
                if upper is not None:
                    triggered = triggered.where(R.c.id < upper)
                    acted = acted.where(A.c.run_id < upper)
                ids = {
                    row[0]
                    for row in await conn.execute(triggered.order_by(R.c.id.desc()).limit(chunk))
                }
                ids |= {
                    row[0]
                    for row in await conn.execute(acted.order_by(A.c.run_id.desc()).limit(chunk))
                }
                window = sorted(ids, reverse=True)[:chunk]
                if not window:
                    break
                found = await conn.execute(
                    sa.select(R).where(R.c.id.in_(window), *others).order_by(R.c.id.desc())
                )
                rows.extend(found)
                upper = window[-1]
                if len(window) < chunk:
                    break
        return queries.paged(rows, limit)

    async def stream_events(self, filters: Filters) -> AsyncIterator[list[dict[str, Any]]]:
        """Matching events in chain order, one keyset batch at a time."""
        conditions = event_conditions(filters)
        after = 0
        while True:
            query = (
                sa.select(A).where(A.c.id > after, *conditions).order_by(A.c.id).limit(self.batch)
            )
            async with self.db.read("audit.export") as conn:
                rows = list(await conn.execute(query))
            if not rows:
                return
            after = rows[-1].id
            yield [queries.event_record(row) for row in rows]
            if len(rows) < self.batch:
                return

    async def verify(self) -> ChainReport:
        """Walk the whole chain and compare it with everything it vouches for: the head row,
        the anchors written outside the database, the sealed runs, steps and approvals, and
        the deliveries' MACs. Reports the first problem found."""
        check = audit.ChainCheck(
            self.keys, auditfiles.read_anchors(self.anchors) if self.anchors else ()
        )
        anchors = len(check.anchors)
        head_id, problem = await self._check_chain(check)
        if problem is None:
            problem = await self._check_rows(check)
        deliveries = 0
        if problem is None and self.keys is not None:
            problem, deliveries = await self._check_deliveries(self.keys)
        if problem is not None:
            reason, at = problem
            return ChainReport(False, check.checked, at, reason, head_id, anchors)
        return ChainReport(
            True,
            check.checked,
            None,
            "",
            head_id,
            anchors,
            check.compared,
            check.unsealed,
            deliveries,
        )

    async def _check_chain(
        self, check: audit.ChainCheck
    ) -> tuple[int | None, tuple[str, int | None] | None]:
        """The head id, and the first broken link, head or anchor."""
        forged = check.bad_anchor()
        if forged is not None:
            return None, (forged, None)
        async for batch in self.stream_events(Filters()):
            for event in batch:
                reason = check.add(event)
                if reason is not None:
                    return None, (reason, event["id"])
        async with self.db.read("audit.head") as conn:
            head = (await conn.execute(sa.select(H.c.last_id, H.c.last_hash))).one_or_none()
        head_id, head_hash = (head.last_id, head.last_hash) if head else (None, audit.GENESIS)
        if (head_id, head_hash) != (check.last_id, check.prev):
            return head_id, ("chain head does not match the last event", (check.last_id or 0) + 1)
        lost = check.missing_anchor()
        if lost is not None:
            reason = (
                f"event {lost.last_id}, anchored at {lost.at}, is not in the chain"
                f" (the chain ends at {check.last_id})"
            )
            return head_id, (reason, lost.last_id)
        return head_id, None

    async def _check_rows(self, check: audit.ChainCheck) -> tuple[str, None] | None:
        """The first sealed row that differs from its digest, was added or was deleted."""
        for name, table in SEALED.items():
            async for rows in self._walk(table, f"audit.verify.{name}"):
                for row in rows:
                    reason = check.compare_row(name, row)
                    if reason is not None:
                        return reason, None
            deleted = check.deleted_row(name)
            if deleted is not None:
                return f"{name} row {deleted} was deleted", None
        return None

    async def head(self) -> tuple[int, str] | None:
        """The chain head (last event id and hash), or ``None`` for an empty chain."""
        async with self.db.read("audit.head") as conn:
            row = (await conn.execute(sa.select(H.c.last_id, H.c.last_hash))).one_or_none()
        if row is None or row.last_id is None:
            return None
        return int(row.last_id), str(row.last_hash)

    async def _walk(self, table: sa.Table, operation: str) -> AsyncIterator[list[dict[str, Any]]]:
        """A table's rows in id order, one keyset batch (its own short read) at a time."""
        after = None
        while True:
            query = sa.select(table).order_by(table.c.id).limit(self.batch)
            if after is not None:
                query = query.where(table.c.id > after)
            async with self.db.read(operation) as conn:
                rows = [dict(row._mapping) for row in await conn.execute(query)]
            if not rows:
                return
            yield rows
            if len(rows) < self.batch:  # the last batch: no read that finds nothing
                return
            after = rows[-1]["id"]

    async def _check_deliveries(self, keys: audit.AuditKeys) -> tuple[tuple[str, None] | None, int]:
        """Deliveries stored with a MAC must still match it; once deliveries carry MACs, one
        without is a row written (or stripped) outside remediator."""
        checked, signed = 0, False
        async for rows in self._walk(D, "audit.verify.deliveries"):
            for row in rows:
                tag = row["mac"]
                if tag is None:
                    if signed:
                        return (f"delivery {row['id']} has no MAC", None), checked
                    continue
                signed = True
                if not audit.check_mac(keys, audit.delivery_text(row), tag):
                    return (f"delivery {row['id']} was changed outside remediator", None), checked
                checked += 1
        return None, checked

    async def delivery(self, delivery_id: int) -> Any | None:
        async with self.db.read("audit.delivery") as conn:
            return (await conn.execute(sa.select(D).where(D.c.id == delivery_id))).one_or_none()
