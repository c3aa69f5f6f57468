from __future__ import annotations

import datetime as dt

import pydantic
import pytest

from remediator.domain import audit, auth


def _chain(n):
    events, prev = [], audit.GENESIS
    for i in range(1, n + 1):
        event = {
            "id": i,
            "at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i),
            "kind": "step.transition",
            "actor": "engine",
            "run_id": 1,
            "step_id": i,
            "episode_id": None,
            "from_status": "pending",
            "to_status": "running",
            "reason": "",
            "data": {"i": i},
        }
        event["prev_hash"] = prev
        event["hash"] = prev = audit.chain_hash(prev, event)
        events.append(event)
    return events


def test_an_intact_chain_verifies():
    result = audit.verify(_chain(5))
    assert result.ok
    assert result.checked == 5


def test_changed_content_is_reported_at_its_event():
    events = _chain(5)
    events[2]["reason"] = "edited"
    result = audit.verify(events)
    assert not result.ok
    assert result.first_broken_id == 3


def test_a_deleted_event_breaks_the_next_link():
    events = _chain(5)
    del events[1]
    assert audit.verify(events).first_broken_id == 3


def test_reordered_events_break_the_chain():
    events = _chain(4)
    events[1], events[2] = events[2], events[1]
    assert not audit.verify(events).ok


def test_timestamps_hash_the_same_as_datetime_or_iso_text():
    event = _chain(1)[0]
    as_text = dict(event, at=event["at"].isoformat())
    assert audit.chain_hash(audit.GENESIS, as_text) == event["hash"]


def test_tokens_authenticate_by_digest_and_name():
    book = auth.TokenBook(
        [
            auth.TokenEntry(name="am", token="a" * 32, roles=[auth.Role.INGEST]),
            auth.TokenEntry(
                name="ops", token_sha256=auth.hash_token("b" * 32), roles=[auth.Role.OPERATOR]
            ),
        ]
    )
    assert book.authenticate("a" * 32).name == "am"
    assert book.authenticate("b" * 32, name="ops").name == "ops"
    assert book.authenticate("b" * 32, name="am") is None
    assert book.authenticate("c" * 32) is None


def test_roles_grant_exactly_their_permissions():
    ingest = auth.Principal("am", frozenset({auth.Role.INGEST}))
    auditor = auth.Principal("audit", frozenset({auth.Role.AUDITOR}))
    assert ingest.can(auth.Permission.INGEST)
    assert not ingest.can(auth.Permission.READ)
    assert auditor.can(auth.Permission.READ)
    assert not auditor.can(auth.Permission.OPERATE)


def test_a_token_entry_needs_exactly_one_secret():
    with pytest.raises(pydantic.ValidationError):
        auth.TokenEntry(name="x", roles=[auth.Role.ADMIN])
    with pytest.raises(pydantic.ValidationError):
        auth.TokenEntry(name="x", token="a" * 32, token_sha256="0" * 64, roles=[auth.Role.ADMIN])


def test_a_principal_may_what_one_of_its_roles_may():
    roles = list(auth.Role)
    for mask in range(2 ** len(roles)):
        held = frozenset(role for i, role in enumerate(roles) if mask >> i & 1)
        principal = auth.Principal("p", held)
        for permission in auth.Permission:
            expected = any(permission in auth.ROLE_PERMISSIONS[role] for role in held)
            assert principal.can(permission) is expected, (held, permission)
