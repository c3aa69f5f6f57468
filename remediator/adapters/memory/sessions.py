"""Web sessions, used sign-in nonces and failed sign-ins in memory (``ports.sessions``).

The rows live beside the ``MemoryStore`` whose audit chain receives the session events: a row
changes only inside the store transaction that appends its event, after the event, so a
transaction that raises leaves both as they were. Every method mirrors ``SqlSessions``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

from remediator.adapters.memory import store, tables
from remediator.domain import errors, sessions


class MemorySessions:
    def __init__(self, memory_store: store.MemoryStore) -> None:
        self.store = memory_store
        self.sessions: dict[str, sessions.WebSession] = {}
        self.nonces: dict[str, dt.datetime] = {}
        self.failure_log: list[tuple[str, dt.datetime]] = []

    async def start(self, session: sessions.WebSession) -> None:
        def work(tx: store.MemoryTx) -> None:
            if session.key in self.sessions:
                raise tables.IntegrityError(f"session {session.ref} exists")
            tx.add_event(**sessions.started_event(session))
            self.sessions[session.key] = session

        await self.store.run("session.start", work)

    async def find(self, key: str) -> sessions.WebSession | None:
        self._check_available("session.find")
        return self.sessions.get(key)

    async def end(self, key: str, *, reason: sessions.EndReason) -> bool:
        def work(tx: store.MemoryTx) -> bool:
            found = self.sessions.get(key)
            if found is None or found.revoked_at is not None:
                return False
            ended = dataclasses.replace(found, revoked_at=tx.now, end_reason=reason)
            tx.add_event(**sessions.ended_event(ended, reason))
            self.sessions[key] = ended
            return True

        return await self.store.run("session.end", work)

    async def use_nonce(self, key: str, *, expires_at: dt.datetime) -> bool:
        self._check_available("session.nonce")
        if key in self.nonces:
            return False
        self.nonces[key] = tables.utc_now(expires_at)
        return True

    async def add_failure(self, keys: Sequence[str]) -> None:
        self._check_available("session.failure")
        now = tables.utc_now(self.store.clock())
        self.failure_log.extend((key, now) for key in keys)

    async def failures(
        self, keys: Sequence[str], *, since: dt.datetime
    ) -> dict[str, list[dt.datetime]]:
        self._check_available("session.failures")
        found: dict[str, list[dt.datetime]] = {}
        for key, at in self.failure_log:
            if key in keys and at > since:
                found.setdefault(key, []).append(at)
        return found

    async def sweep(self, *, failures_before: dt.datetime, limit: int) -> int:
        def work(tx: store.MemoryTx) -> int:
            unended = [s for s in self.sessions.values() if s.revoked_at is None]
            expired = sorted((s for s in unended if s.expires_at <= tx.now), key=_expiry)
            expired = expired[: max(limit, 0)]
            for session in expired:
                tx.add_event(**sessions.ended_event(session, sessions.EndReason.EXPIRED))
            gone = {session.key for session in expired}
            self.sessions = {
                key: s
                for key, s in self.sessions.items()
                if key not in gone and (s.revoked_at is None or s.expires_at > tx.now)
            }
            self.nonces = {k: until for k, until in self.nonces.items() if until > tx.now}
            self.failure_log = [(k, at) for k, at in self.failure_log if at >= failures_before]
            return len(expired)

        return await self.store.run("session.sweep", work)

    def _check_available(self, operation: str) -> None:
        if self.store.unavailable:
            raise errors.StoreUnavailable(f"store unavailable ({operation})")


def _expiry(session: sessions.WebSession) -> dt.datetime:
    return session.expires_at
