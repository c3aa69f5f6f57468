"""Web sessions, used sign-in nonces and failed sign-ins over SQL (``ports.sessions``).

Starting and ending a session go through ``SqlStore.run``, so the row and its audit event
commit together and the chain stays linear. Ends are compare-and-set (``revoked_at IS NULL``
on sign-out, delete-if-present on expiry): two replicas ending the same session write one
event. Nonces and failures need no audit event and are written outside the chain's lock.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from remediator.adapters.db import database, store, tables
from remediator.domain import sessions

W = tables.web_sessions
N = tables.login_nonces
F = tables.auth_failures

_TIME = tables.UTCDateTime()
_FIND = sa.select(W).where(W.c.id_sha256 == sa.bindparam("w_key"))
_INSERT = sa.insert(W)
_REVOKE = (
    sa.update(W)
    .where(W.c.id_sha256 == sa.bindparam("w_key"), W.c.revoked_at.is_(None))
    .returning(*W.c)
)
_EXPIRED = (
    sa.select(W)
    .where(W.c.revoked_at.is_(None), W.c.expires_at <= sa.bindparam("w_now", type_=_TIME))
    .order_by(W.c.expires_at)
    .limit(sa.bindparam("w_limit"))
)
_DELETE = sa.delete(W).where(W.c.id_sha256 == sa.bindparam("w_key"))
_DELETE_ENDED = sa.delete(W).where(
    W.c.revoked_at.is_not(None), W.c.expires_at <= sa.bindparam("w_now", type_=_TIME)
)
_DELETE_NONCES = sa.delete(N).where(N.c.expires_at <= sa.bindparam("w_now", type_=_TIME))
_DELETE_FAILURES = sa.delete(F).where(F.c.at < sa.bindparam("w_before", type_=_TIME))
_USE_NONCE = tuple(
    insert(N).on_conflict_do_nothing(index_elements=[N.c.nonce_sha256]).returning(N.c.nonce_sha256)
    for insert in (sqlite.insert, postgresql.insert)
)
_FAILURES = sa.select(F.c.key, F.c.at).where(
    F.c.key.in_(sa.bindparam("w_keys", expanding=True)),
    F.c.at > sa.bindparam("w_since", type_=_TIME),
)


def session_from_row(row: Any) -> sessions.WebSession:
    return sessions.WebSession(
        key=row.id_sha256,
        principal=row.principal,
        remote=row.remote,
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        end_reason=sessions.EndReason(row.end_reason) if row.end_reason else None,
    )


class SqlSessions:
    def __init__(
        self, db: database.Database, sql_store: store.SqlStore, *, clock: Callable[[], dt.datetime]
    ) -> None:
        self.db = db
        self.store = sql_store
        self.clock = clock

    async def start(self, session: sessions.WebSession) -> None:
        def work(tx: store.SqlTx) -> None:
            tx.conn.execute(
                _INSERT,
                {
                    "id_sha256": session.key,
                    "principal": session.principal,
                    "remote": session.remote,
                    "created_at": session.created_at,
                    "expires_at": session.expires_at,
                },
            )
            tx.add_event(**sessions.started_event(session))

        await self.store.run("session.start", work)

    async def find(self, key: str) -> sessions.WebSession | None:
        async with self.db.read("session.find") as conn:
            row = (await conn.execute(_FIND, {"w_key": key})).one_or_none()
        return session_from_row(row) if row is not None else None

    async def end(self, key: str, *, reason: sessions.EndReason) -> bool:
        def work(tx: store.SqlTx) -> bool:
            values = {"w_key": key, "revoked_at": tx.now, "end_reason": reason.value}
            row = tx.conn.execute(_REVOKE, values).one_or_none()
            if row is None:
                return False
            tx.add_event(**sessions.ended_event(session_from_row(row), reason))
            return True

        return await self.store.run("session.end", work)

    async def use_nonce(self, key: str, *, expires_at: dt.datetime) -> bool:
        statement = _USE_NONCE[self.db.is_postgres]

        def work(conn: sa.Connection) -> bool:
            values = {"nonce_sha256": key, "expires_at": expires_at}
            return conn.execute(statement, values).one_or_none() is not None

        return await self.db.write_sync("session.nonce", work)

    async def add_failure(self, keys: Sequence[str]) -> None:
        now = self.clock()

        def work(conn: sa.Connection) -> None:
            conn.execute(sa.insert(F), [{"key": key, "at": now} for key in keys])

        if keys:
            await self.db.write_sync("session.failure", work)

    async def failures(
        self, keys: Sequence[str], *, since: dt.datetime
    ) -> dict[str, list[dt.datetime]]:
        found: dict[str, list[dt.datetime]] = {}
        if not keys:
            return found
        async with self.db.read("session.failures") as conn:
            for row in await conn.execute(_FAILURES, {"w_keys": list(keys), "w_since": since}):
                found.setdefault(row.key, []).append(row.at)
        return found

    async def sweep(self, *, failures_before: dt.datetime, limit: int) -> int:
        def work(tx: store.SqlTx) -> int:
            expired = 0
            for row in tx.conn.execute(_EXPIRED, {"w_now": tx.now, "w_limit": limit}).all():
                if tx.conn.execute(_DELETE, {"w_key": row.id_sha256}).rowcount == 1:
                    session = session_from_row(row)
                    tx.add_event(**sessions.ended_event(session, sessions.EndReason.EXPIRED))
                    expired += 1
            tx.conn.execute(_DELETE_ENDED, {"w_now": tx.now})
            tx.conn.execute(_DELETE_NONCES, {"w_now": tx.now})
            tx.conn.execute(_DELETE_FAILURES, {"w_before": failures_before})
            return expired

        return await self.store.run("session.sweep", work)
