"""The session store (``ports.sessions``) on every backend: sessions start and end once, with
their audit events in the chain; nonces are used once; failures are read back per key; the
sweeper ends expired sessions once and keeps the tables bounded."""

from __future__ import annotations

import datetime as dt

import pytest

from remediator.adapters.db import sessions as db_sessions
from remediator.adapters.memory import sessions as memory_sessions
from remediator.domain import sessions

HOUR = dt.timedelta(hours=1)


@pytest.fixture
def store(backend):
    if backend.name == "memory":
        return memory_sessions.MemorySessions(backend.store)
    return db_sessions.SqlSessions(backend.db, backend.store, clock=backend.clock)


def _session(backend, secret: str = "cookie-one", *, ttl: dt.timedelta = HOUR):
    now = backend.clock()
    return sessions.WebSession(
        key=sessions.key_of(secret),
        principal="olivia",
        remote="10.0.0.7",
        created_at=now,
        expires_at=now + ttl,
    )


async def _session_events(backend):
    return [e for e in await backend.events() if e["kind"].startswith("session.")]


async def test_a_session_starts_and_ends_once_with_its_audit_events(backend, store):
    session = _session(backend)
    await store.start(session)
    found = await store.find(session.key)
    assert found == session
    assert found.live(backend.clock())
    backend.clock.advance(5)
    assert await store.end(session.key, reason=sessions.EndReason.LOGOUT) is True
    assert await store.end(session.key, reason=sessions.EndReason.LOGOUT) is False
    ended = await store.find(session.key)
    assert ended.end_reason is sessions.EndReason.LOGOUT
    assert not ended.live(backend.clock())
    assert await store.find(sessions.key_of("never-issued")) is None
    started, ended_event = await _session_events(backend)
    assert (started["kind"], started["actor"]) == ("session.started", "olivia")
    assert (ended_event["kind"], ended_event["reason"]) == ("session.ended", "logout")
    assert started["data"]["session"] == ended_event["data"]["session"] == session.key[:12]
    assert session.key not in repr([started, ended_event])
    assert await backend.chain_ok()


async def test_a_nonce_is_used_once(backend, store):
    expires = backend.clock() + dt.timedelta(minutes=10)
    key = sessions.key_of("a-nonce")
    assert await store.use_nonce(key, expires_at=expires) is True
    assert await store.use_nonce(key, expires_at=expires) is False
    assert await store.use_nonce(sessions.key_of("another"), expires_at=expires) is True


async def test_failures_are_read_back_per_key_within_the_window(backend, store):
    await store.add_failure(["address=10.0.0.7", "name=olivia"])
    backend.clock.advance(30)
    await store.add_failure(["address=10.0.0.7"])
    since = backend.clock() - dt.timedelta(seconds=60)
    found = await store.failures(["address=10.0.0.7", "name=olivia", "name=oscar"], since=since)
    assert {key: len(times) for key, times in found.items()} == {
        "address=10.0.0.7": 2,
        "name=olivia": 1,
    }
    later = await store.failures(
        ["address=10.0.0.7"], since=backend.clock() - dt.timedelta(seconds=1)
    )
    assert [len(times) for times in later.values()] == [1]


async def test_the_sweeper_ends_expired_sessions_once_and_keeps_tables_bounded(backend, store):
    short = _session(backend, "short", ttl=dt.timedelta(minutes=5))
    signed_out = _session(backend, "signed-out", ttl=dt.timedelta(minutes=5))
    long = _session(backend, "long")
    for session in (short, signed_out, long):
        await store.start(session)
    await store.end(signed_out.key, reason=sessions.EndReason.LOGOUT)
    await store.add_failure(["address=10.0.0.7"])
    nonce = sessions.key_of("a-nonce")
    await store.use_nonce(nonce, expires_at=backend.clock() + dt.timedelta(minutes=1))
    backend.clock.advance(6 * 60)
    assert await store.sweep(failures_before=backend.clock(), limit=100) == 1
    assert await store.sweep(failures_before=backend.clock(), limit=100) == 0
    assert await store.find(short.key) is None
    assert await store.find(signed_out.key) is None
    assert (await store.find(long.key)).live(backend.clock())
    assert await store.failures(["address=10.0.0.7"], since=backend.clock() - HOUR) == {}
    assert await store.use_nonce(nonce, expires_at=backend.clock() + HOUR) is True
    ends = [e for e in await _session_events(backend) if e["kind"] == "session.ended"]
    assert [(e["reason"], e["data"]["session"]) for e in ends] == [
        ("logout", signed_out.key[:12]),
        ("expired", short.key[:12]),
    ]
    assert await backend.chain_ok()
