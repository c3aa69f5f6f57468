"""Web sessions, used sign-in nonces and failed sign-ins, shared by every replica.

Implemented by ``adapters.db.sessions`` (SQLite and Postgres) and ``adapters.memory.sessions``.
Starting and ending a session append their audit event (``domain.sessions``) in the same
transaction as the row they write. ``find`` is the hot path of every request that carries a
session cookie: one read by primary key, no write.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Protocol

from remediator.domain import sessions


class SessionStore(Protocol):
    async def start(self, session: sessions.WebSession) -> None:
        """Store a new session and append ``session.started``."""
        ...

    async def find(self, key: str) -> sessions.WebSession | None:
        """The session stored under ``key`` (ended or not; the caller checks ``live``)."""
        ...

    async def end(self, key: str, *, reason: sessions.EndReason) -> bool:
        """End a session that has not ended yet and append ``session.ended``; ``False`` if
        there was none (unknown, or already ended)."""
        ...

    async def use_nonce(self, key: str, *, expires_at: dt.datetime) -> bool:
        """Whether the nonce stored under ``key`` was unused (it is used from now on)."""
        ...

    async def add_failure(self, keys: Sequence[str]) -> None:
        """A failed sign-in, now, under each throttle key."""
        ...

    async def failures(
        self, keys: Sequence[str], *, since: dt.datetime
    ) -> dict[str, list[dt.datetime]]:
        """When sign-ins failed after ``since`` under each of ``keys`` (keys without any
        are left out)."""
        ...

    async def sweep(self, *, failures_before: dt.datetime, limit: int) -> int:
        """End up to ``limit`` sessions whose expiry passed (``session.ended``, reason
        ``expired``) and delete them, sessions ended earlier whose expiry passed, expired
        nonces and failures from before ``failures_before``. Returns how many sessions
        expired."""
        ...
