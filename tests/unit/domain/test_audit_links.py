"""An event's link prepared before the chain's head is locked (``audit.Link``) hashes exactly
as ``chain_hash`` of the event with its id does, whatever the content: keys that sort on
either side of ``id``, an ``id`` key nested in the data, text outside ASCII, an event with and
without sealed rows or a key."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remediator.domain import audit

KEYS = audit.AuditKeys(keys={"k1": b"s" * 32, "k2": b"t" * 32}, current="k2")
AT = dt.datetime(2026, 12, 6, 12, 0, 0, 123456, tzinfo=dt.UTC)

text = st.text(max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | text,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["id", "a", "z", "hash", "é", "id "]) | text, inner, max_size=4
        )
    ),
    max_leaves=10,
)
contents = st.fixed_dictionaries(
    {
        "at": st.datetimes(timezones=st.just(dt.UTC)),
        "kind": text,
        "actor": text,
        "run_id": st.none() | st.integers(min_value=1),
        "step_id": st.none() | st.integers(min_value=1),
        "episode_id": st.none() | st.integers(min_value=1),
        "from_status": st.none() | text,
        "to_status": st.none() | text,
        "reason": text,
        "data": st.dictionaries(text | st.just("id"), json_values, max_size=4),
        "key_id": st.none() | st.sampled_from(["k1", "k2"]),
        "rows": st.none()
        | st.dictionaries(
            st.sampled_from(["runs", "steps", "approvals"]),
            st.dictionaries(st.integers(1, 10**6).map(str), st.just("ab" * 32), max_size=3),
            max_size=3,
        ),
    }
)


@settings(max_examples=300, deadline=None)
@given(
    content=contents,
    prev=st.sampled_from([audit.GENESIS, "f" * 64]),
    event_id=st.integers(1, 10**12),
)
def test_a_prepared_link_hashes_as_the_chain_does(
    content: dict[str, Any], prev: str, event_id: int
) -> None:
    link = audit.Link.of(content, KEYS)
    assert link.hash(prev, event_id) == audit.chain_hash(prev, {**content, "id": event_id}, KEYS)


def test_the_canonical_text_is_split_at_the_id_of_the_event_not_of_its_data() -> None:
    """``data`` sorts before ``id``: an ``"id":`` inside it is not where the event's id goes."""
    content = {"at": AT, "kind": "run.started", "actor": "engine", "reason": "", "data": {"id": 0}}
    link = audit.Link.of(content)
    text = audit.canonical({**content, "id": 41})
    assert (link.before + b"41" + link.after).decode() == text
    assert text.index('"data":{"id":0}') < text.index('"id":41')


def test_a_link_needs_the_key_its_event_names() -> None:
    content = {"at": AT, "kind": "k", "actor": "a", "reason": "", "data": {}, "key_id": "k9"}
    with pytest.raises(audit.AuditKeyError):
        audit.Link.of(content, KEYS)
    with pytest.raises(audit.AuditKeyError):
        audit.Link.of(content)


# Known answers, computed by the code that wrote the chains stored so far: a change to the
# canonical JSON (key order, separators, text escaping, how a datetime or a whole float is
# written) would fail every stored chain's verification.
_ROW = {
    "id": 13,
    "status": "succeeded",
    "output": {"node": "gpu-node-01", "note": "ümlaut ✓"},
    "timeout_seconds": 300.0,
    "started_at": dt.datetime(2026, 12, 7, 5, 41, 29, 5, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    "due_at": None,
    "lease_owner": "replica-a",
}
_EVENT = {
    "at": dt.datetime(2026, 12, 7, 3, 0, tzinfo=dt.UTC),
    "kind": "step.transition",
    "actor": "engine",
    "run_id": 11,
    "step_id": 13,
    "episode_id": 7,
    "from_status": "running",
    "to_status": "succeeded",
    "reason": "done ✓",
    "data": {"b": 1, "a": [1, 2]},
}
_EVENT_HASH = "caace600bd3addcc38df55abe2a9764bd3146890c15dcf3b56c6f7e6652327df"


def test_a_rows_digest_is_what_it_was() -> None:
    digest = audit.row_digest("steps", _ROW)
    assert digest == "0c9ac35daccc2e01683bd5c2fdb38e29deaea14942b38b9e9b7c10427bc74f93"


def test_an_events_link_is_what_it_was() -> None:
    assert audit.chain_hash("0" * 64, {**_EVENT, "id": 42}) == _EVENT_HASH
    assert audit.Link.of(_EVENT).hash("0" * 64, 42) == _EVENT_HASH


def test_a_deliverys_text_is_what_it_was() -> None:
    row = {
        "id": 1,
        "mac": "k1:00",
        "received_at": dt.datetime(2026, 12, 7, 3, 0, tzinfo=dt.UTC),
        "body": '{"a": "é"}',
        "status": "firing",
    }
    text = (
        '{"body":"{\\"a\\": \\"é\\"}","received_at":"2026-12-07T03:00:00+00:00","status":"firing"}'
    )
    assert audit.delivery_text(row) == text
