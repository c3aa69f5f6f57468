"""What the in-memory store does beyond the shared contract: refusing what a database would
refuse, outages, and the ways tests read and feed it."""

from __future__ import annotations

import datetime as dt

import pytest

from remediator.adapters.memory import store as memory_store
from remediator.adapters.memory import tables
from remediator.domain import alerts, errors, records, runs
from tests.conftest import FakeClock
from tests.support.alerts import alert_body


@pytest.fixture
def store(clock: FakeClock) -> memory_store.MemoryStore:
    return memory_store.MemoryStore(clock=clock)


def _run(episode_id: int | None = None, **params: object) -> records.NewRun:
    return records.NewRun(
        playbook="reboot",
        kind=runs.RunKind.MANUAL if episode_id is None else runs.RunKind.ALERT,
        episode_id=episode_id,
        node="gpu-node-03",
        gpu=None,
        params=dict(params),
    )


async def test_a_value_json_cannot_hold_is_refused_and_nothing_is_written(store):
    with pytest.raises(TypeError):
        await store.run("t", lambda tx: tx.insert_run(_run(at=dt.datetime.now(dt.UTC)), actor="a"))
    assert store.tables.runs == {}
    assert store.events() == []


async def test_json_values_are_kept_as_json_keeps_them(store):
    run_id = await store.run("t", lambda tx: tx.insert_run(_run(pair=(1, 2)), actor="a"))
    assert store.peek(lambda tx: tx.get_run(run_id)).params == {"pair": [1, 2]}


async def test_a_naive_timestamp_is_refused(store):
    naive = dt.datetime(2026, 11, 30, 12, 0)
    with pytest.raises(ValueError, match="naive"):
        await store.run("t", lambda tx: tx.try_lock("k", run_id=None, expires_at=naive))


async def test_writes_a_constraint_would_refuse_raise_integrity_errors(store):
    with pytest.raises(tables.IntegrityError, match="no episode 7"):
        await store.run("t", lambda tx: tx.insert_run(_run(episode_id=7), actor="a"))
    with pytest.raises(tables.IntegrityError, match="no run 3"):
        await store.run("t", lambda tx: tx.try_lock("node:x", run_id=3, expires_at=None))
    with pytest.raises(tables.IntegrityError, match="no step 5"):
        await store.run(
            "t", lambda tx: tx.add_approval(5, principal="p", decision="approved", comment="")
        )


async def test_an_outage_makes_transactions_and_probes_unavailable(store):
    store.unavailable = True
    with pytest.raises(errors.StoreUnavailable):
        await store.probe()
    with pytest.raises(errors.StoreUnavailable):
        await store.run("t", lambda tx: tx.add_event("x", actor="a"))
    store.unavailable = False
    assert not (await store.probe()).any


async def test_a_record_read_out_is_a_copy(store):
    run_id = await store.run("t", lambda tx: tx.insert_run(_run(nested={"a": 1}), actor="a"))
    read = store.peek(lambda tx: tx.get_run(run_id))
    read.params["nested"]["a"] = 2
    assert store.peek(lambda tx: tx.get_run(run_id)).params == {"nested": {"a": 1}}


async def test_peek_commits_nothing_and_a_finished_transaction_cannot_be_used(store):
    kept = []
    store.peek(lambda tx: kept.append(tx) or tx.add_event("x", actor="a"))
    assert store.events() == []
    with pytest.raises(RuntimeError, match="transaction is over"):
        kept[0].add_event("late", actor="a")


async def test_receive_stores_a_delivery_as_intake_does(store, clock):
    payload = alerts.parse_payload(alert_body(fingerprint="f1"))
    assert await store.receive(payload) == 1
    assert await store.receive(payload) == 0
    clock.advance(30)
    resolved = alerts.parse_payload(alert_body(fingerprint="f1", status="resolved"))
    assert await store.receive(resolved) == 1
    [episode] = store.tables.episodes.values()
    assert (episode.status, episode.first_delivery_id, episode.resolved_at) == (
        alerts.AlertStatus.RESOLVED,
        1,
        clock.now,
    )
    assert episode.ends_at == dt.datetime(2026, 11, 30, 0, 5, tzinfo=dt.UTC)


async def test_upsert_alert_returns_the_episode_as_stored(store):
    [alert] = alerts.parse_payload(alert_body(fingerprint="f2")).alerts
    first = await store.upsert_alert(alert)
    again = await store.upsert_alert(alert)
    assert first == again
    assert (first.fingerprint, first.handled_status) == ("f2", None)


async def test_should_yield_follows_a_waiting_writer(store):
    store.writers_waiting = True
    assert store.peek(lambda tx: tx.should_yield()) is True
