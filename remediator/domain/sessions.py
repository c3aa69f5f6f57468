"""Web sessions and the sign-in throttle, as decisions on records (no I/O, time passed in).

A web session is a random id in the browser's cookie; the server keeps only its SHA-256
(``key``) with the principal, the client address and the expiry, in the database every replica
reads, so a session signed out on one replica is refused by all of them from the next request
on. A session ends once, with one audit event ``session.ended``: on sign-out (``logout``), when
its expiry passes (``expired``, written by the sweeper), or when its principal left the tokens
file (``revoked``). Audit events name the principal and a short prefix of the key, never the
id.

The throttle keeps one timestamp per failed sign-in and key (client address, token name): from
the ``limit``-th failure within ``window`` seconds, attempts under that key are refused until
the oldest of those failures leaves the window.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import hashlib
from collections.abc import Iterable
from typing import Any

STARTED = "session.started"
ENDED = "session.ended"
REF_LENGTH = 12


class EndReason(enum.StrEnum):
    LOGOUT = "logout"
    EXPIRED = "expired"
    REVOKED = "revoked"


@dataclasses.dataclass(frozen=True, kw_only=True)
class WebSession:
    key: str  # SHA-256 (hex) of the cookie's id
    principal: str
    remote: str | None
    created_at: dt.datetime
    expires_at: dt.datetime
    revoked_at: dt.datetime | None = None
    end_reason: EndReason | None = None

    def live(self, now: dt.datetime) -> bool:
        return self.revoked_at is None and now < self.expires_at

    @property
    def ref(self) -> str:
        """What the audit trail names the session by: a prefix of the key's hash."""
        return self.key[:REF_LENGTH]


def key_of(secret: str) -> str:
    """The stored form of a session id or a nonce: its SHA-256, hex."""
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def started_event(session: WebSession) -> dict[str, Any]:
    """Keyword arguments of ``Tx.add_event`` for a sign-in."""
    return {
        "kind": STARTED,
        "actor": session.principal,
        "data": {
            "session": session.ref,
            "remote": session.remote,
            "expires_at": session.expires_at.isoformat(),
        },
    }


def ended_event(session: WebSession, reason: EndReason) -> dict[str, Any]:
    """Keyword arguments of ``Tx.add_event`` for the end of a session."""
    return {
        "kind": ENDED,
        "actor": session.principal,
        "reason": reason.value,
        "data": {"session": session.ref, "remote": session.remote},
    }


def throttle_wait(
    failures: Iterable[dt.datetime], *, limit: int, window: float, now: dt.datetime
) -> float | None:
    """Seconds until a key with these failure times may try again; ``None``: not throttled."""
    recent = sorted(t for t in failures if t > now - dt.timedelta(seconds=window))
    if len(recent) < limit:
        return None
    return (recent[-limit] - now).total_seconds() + window
