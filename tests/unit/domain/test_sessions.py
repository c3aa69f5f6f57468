"""Session records and the throttle's decision, on plain values."""

from __future__ import annotations

import dataclasses
import datetime as dt

from remediator.domain import sessions

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def _at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def test_a_key_is_thrown_out_from_the_limit_th_failure_in_the_window_until_it_leaves():
    failures = [_at(0), _at(10), _at(20), _at(30), _at(40)]
    assert sessions.throttle_wait(failures[:4], limit=5, window=60, now=_at(41)) is None
    assert sessions.throttle_wait(failures, limit=5, window=60, now=_at(41)) == 19
    assert sessions.throttle_wait(failures, limit=5, window=60, now=_at(59.5)) == 0.5
    assert sessions.throttle_wait(failures, limit=5, window=60, now=_at(60)) is None


def test_a_session_is_live_until_it_expires_or_ends():
    session = sessions.WebSession(
        key=sessions.key_of("cookie"),
        principal="olivia",
        remote=None,
        created_at=_at(0),
        expires_at=_at(600),
    )
    assert session.live(_at(599))
    assert not session.live(_at(600))
    ended = dataclasses.replace(session, revoked_at=_at(1))
    assert not ended.live(_at(2))
    assert len(session.key) == 64
    assert session.ref == session.key[:12]
    assert sessions.ended_event(session, sessions.EndReason.EXPIRED)["data"] == {
        "session": session.ref,
        "remote": None,
    }
