"""The webhook's group-commit writer: how many statements a batch costs, and what it skips.

Counted at the driver (``before_cursor_execute``), on both backends: the count is the design
(one statement for a batch's deliveries; none for a firing repeat of a stored episode), not a
timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from remediator.adapters.db import database, intake, migrate, retention, tables
from remediator.domain import alerts
from tests.conftest import am_payload

FIRING = "GPUTemperatureHigh-firing-2alerts"


@contextlib.contextmanager
def statements() -> Iterator[list[tuple[str, int]]]:
    """Every statement sent to a driver meanwhile, as (SQL, parameter sets)."""
    seen: list[tuple[str, int]] = []

    def record(_conn: Any, _cursor: Any, sql: str, params: Any, _ctx: Any, many: bool) -> None:
        seen.append((" ".join(sql.split()), len(params) if many else 1))

    sa.event.listen(sa.Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(sa.Engine, "before_cursor_execute", record)


def touching(seen: list[tuple[str, int]], table: str) -> list[tuple[str, int]]:
    return [s for s in seen if f" {table} " in f" {s[0]} " and "alembic" not in s[0]]


def delivery(payload: dict[str, Any], *, tag: str = "") -> intake.Delivery:
    payload = copy.deepcopy(payload)
    payload["receiver"] = f"webhook{tag}"
    body = json.dumps(payload)
    return intake.Delivery(
        payload=alerts.parse_payload(body.encode()), body=body, principal=None, remote=None
    )


def new_episode(payload: dict[str, Any], n: int) -> dict[str, Any]:
    payload = copy.deepcopy(payload)
    for i, alert in enumerate(payload["alerts"]):
        alert["fingerprint"] = f"{n:015x}{i}"
        alert["startsAt"] = f"2026-11-30T10:{n // 60 % 60:02d}:{n % 60:02d}Z"
    return payload


def resolved(payload: dict[str, Any]) -> dict[str, Any]:
    payload = copy.deepcopy(payload)
    payload["status"] = "resolved"
    for alert in payload["alerts"]:
        alert["status"] = "resolved"
        alert["endsAt"] = "2026-11-30T11:00:00Z"
    return payload


class Writer:
    def __init__(self, db: database.Database, clock: Any) -> None:
        self.db = db
        self.writer = intake.IntakeWriter(db, clock=clock)
        self.writer.known.monotonic = lambda: clock().timestamp()  # both clocks move together
        self.task = asyncio.create_task(self.writer.run())

    async def store_together(self, deliveries: list[intake.Delivery]) -> list[intake.Stored]:
        """Queued before the writer looks: one batch."""
        return list(await asyncio.gather(*(self.writer.store(d) for d in deliveries)))

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[database.Database]:
    made = database.Database(database_url)
    await migrate.upgrade(made)
    try:
        yield made
    finally:
        await made.dispose()


@contextlib.asynccontextmanager
async def writer(db: database.Database, clock: Any) -> AsyncIterator[Writer]:
    made = Writer(db, clock)
    try:
        yield made
    finally:
        await made.close()


async def bodies_by_id(db: database.Database) -> dict[int, str]:
    query = sa.select(tables.deliveries.c.id, tables.deliveries.c.body)
    async with db.read() as conn:
        return {row.id: row.body for row in await conn.execute(query)}


async def test_a_batch_of_deliveries_is_one_insert_and_each_answer_names_its_own_row(db, clock):
    payload = am_payload(FIRING)
    batch = [delivery(payload, tag=str(n)) for n in range(40)]
    async with writer(db, clock) as w:
        await w.store_together(batch[:3])  # rows before: ids go on after them
        with statements() as seen:
            stored = await w.store_together(batch[3:])
    inserts = [s for s in touching(seen, "deliveries") if s[0].startswith("INSERT")]
    assert len(inserts) == 1  # the old writer sent one INSERT a delivery on SQLite
    rows = await bodies_by_id(db)
    assert len(rows) == 40
    assert len({s.delivery_id for s in stored}) == 37
    for d, answer in zip(batch[3:], stored, strict=True):
        assert rows[answer.delivery_id] == d.body


async def test_delivery_rows_are_stored_as_sqlalchemy_stores_them(db, clock):
    """The writer sends SQLite its delivery rows as plain tuples; every column must hold what
    SQLAlchemy's own insert of the same row holds (the text of ``received_at`` included:
    queries compare it as text), at a whole second and between two."""
    payload = am_payload(FIRING)
    D = tables.deliveries
    written: list[tuple[int, int]] = []
    async with writer(db, clock) as w:
        for advance in (0.0, 0.25):
            clock.advance(advance)
            made = delivery(payload, tag=f"-{advance}")._replace(
                principal="alertmanager", remote="10.0.0.7"
            )
            stored = await w.store_together([made])
            row = {
                "received_at": clock(),
                "receiver": made.payload.receiver,
                "status": made.payload.status.value,
                "group_key": made.payload.group_key,
                "alert_count": len(made.payload.alerts),
                "principal": made.principal,
                "remote": made.remote,
                "body": made.body,
            }
            async with db.write() as conn:
                reference = (
                    await conn.execute(sa.insert(D).values(row).returning(D.c.id))
                ).scalar_one()
            written.append((stored[0].delivery_id, reference))
    columns = ", ".join(c.name for c in D.c if c.name != "id")
    async with db.read() as conn:
        for ours, reference in written:
            raw = {
                row[0]: tuple(row[1:])
                for row in await conn.execute(
                    sa.text(f"SELECT id, {columns} FROM deliveries WHERE id IN (:a, :b)"),
                    {"a": ours, "b": reference},
                )
            }
            assert raw[ours] == raw[reference]


async def test_firing_repeats_of_a_stored_episode_send_nothing_to_its_table(db, clock):
    payload = am_payload(FIRING)
    async with writer(db, clock) as w:
        first = await w.store_together([delivery(payload)])
        with statements() as seen:
            repeats = [await w.store_together([delivery(payload, tag=str(n))]) for n in range(5)]
    assert first[0].changed == 2
    assert [r[0].changed for r in repeats] == [0] * 5
    assert touching(seen, "alert_episodes") == []  # the old writer upserted both, five times
    assert len([s for s in touching(seen, "deliveries") if s[0].startswith("INSERT")]) == 5


async def test_a_restarted_writer_learns_stored_firing_episodes_once(db, clock):
    payload = am_payload(FIRING)
    async with writer(db, clock) as w:
        await w.store_together([delivery(payload)])
    async with writer(db, clock) as w:  # a new process: it knows no episode
        with statements() as seen:
            await w.store_together([delivery(payload, tag="a")])
        learned = touching(seen, "alert_episodes")
        with statements() as seen:
            again = await w.store_together([delivery(payload, tag="b")])
    assert [sql.split()[0] for sql, _ in learned] == ["INSERT", "SELECT"]
    assert touching(seen, "alert_episodes") == []
    assert again[0].changed == 0


async def test_a_resolution_is_stored_and_its_repeats_then_send_nothing(db, clock):
    """A resolution of a known firing episode is written; after it, a resolved repeat (the HA
    peer's copy, a retry) and a late firing repeat change nothing, and send nothing."""
    payload = am_payload(FIRING)
    async with writer(db, clock) as w:
        await w.store_together([delivery(payload), delivery(payload, tag="repeat")])
        done = await w.store_together([delivery(resolved(payload))])
        assert done[0].changed == 2
        with statements() as seen:
            again = await w.store_together([delivery(resolved(payload), tag="peer")])
            late = await w.store_together([delivery(payload, tag="late")])
    assert touching(seen, "alert_episodes") == []  # the old writer upserted the first again
    assert again[0].changed == late[0].changed == 0
    E = tables.alert_episodes
    async with db.read() as conn:
        statuses = (await conn.execute(sa.select(E.c.status))).scalars().all()
    assert statuses == ["resolved", "resolved"]


async def test_a_restarted_writer_learns_recently_resolved_episodes_once(db, clock):
    payload = am_payload(FIRING)
    async with writer(db, clock) as w:
        await w.store_together([delivery(payload)])
        await w.store_together([delivery(resolved(payload))])
    clock.advance(3600)
    async with writer(db, clock) as w:  # a new process: it knows no episode
        with statements() as seen:
            await w.store_together([delivery(resolved(payload), tag="a")])
        learned = touching(seen, "alert_episodes")
        with statements() as seen:
            late = await w.store_together([delivery(payload, tag="late")])
            again = await w.store_together([delivery(resolved(payload), tag="b")])
    assert [sql.split()[0] for sql, _ in learned] == ["INSERT", "SELECT"]
    assert touching(seen, "alert_episodes") == []  # the old writer upserted both
    assert late[0].changed == again[0].changed == 0


async def test_an_episode_resolved_a_day_ago_is_not_trusted_to_stay(db, clock):
    """Retention may delete an episode a day after its resolution: one resolved longer ago
    than ``recent`` is not learned, and its repeats are written as before."""
    payload = am_payload(FIRING)
    async with writer(db, clock) as w:
        await w.store_together([delivery(payload)])
        await w.store_together([delivery(resolved(payload))])
    clock.advance(86400 - 1800)  # 23.5 hours: within a day, not within a day less the ttl
    async with writer(db, clock) as w:
        await w.store_together([delivery(resolved(payload), tag="a")])
        with statements() as seen:
            await w.store_together([delivery(resolved(payload), tag="b")])
        assert len(w.writer.known) == 0
    assert [sql.split()[0] for sql, _ in touching(seen, "alert_episodes")] == ["INSERT", "SELECT"]


async def test_an_episode_retention_deleted_is_stored_again_by_a_firing_repeat(db, clock):
    """What the writer did before it knew episodes: a day after the resolution what it knows
    of the episode has expired, so once retention has deleted it, a firing repeat stores it
    anew."""
    payload = am_payload(FIRING)
    E = tables.alert_episodes
    async with writer(db, clock) as w:
        await w.store_together([delivery(payload)])
        await w.store_together([delivery(resolved(payload))])
        async with db.write() as conn:
            await conn.execute(sa.update(E).values(handled_status="resolved"))
        clock.advance(2 * 86400)
        pruned = await retention.prune_alert_episodes(
            db, ended_before=clock() - dt.timedelta(days=1)
        )
        assert pruned.deleted == 2
        again = await w.store_together([delivery(payload, tag="again")])
    assert again[0].changed == 2


async def test_no_delivery_id_is_given_twice_after_retention_deleted_the_newest(db, clock):
    """An episode names the delivery that started it: the approval page shows that body, the
    sender check reads its principal. On SQLite a new row's id is one past the largest, so
    once retention had deleted every delivery, ids started again at 1 and an old episode
    named a delivery it never came from."""
    payload = am_payload(FIRING)
    async with writer(db, clock) as w:
        before = await w.store_together([delivery(payload), delivery(payload, tag="-repeat")])
        clock.advance(200 * 86400)  # a quiet spell longer than any retention
        await retention.delete_old_deliveries(db, older_than=clock())
        after = await w.store_together([delivery(new_episode(payload, 1), tag="-later")])
    assert after[0].delivery_id > max(s.delivery_id for s in before)
    E, D = tables.alert_episodes, tables.deliveries
    query = sa.select(E.c.fingerprint, D.c.receiver).outerjoin(D, D.c.id == E.c.first_delivery_id)
    async with db.read() as conn:
        named = {row.fingerprint: row.receiver for row in await conn.execute(query)}
    old = {alert["fingerprint"] for alert in payload["alerts"]}
    assert {named[f] for f in old} <= {"webhook", None}  # its own delivery, or none left
    assert "webhook-later" in named.values()


async def test_a_batch_of_new_episodes_is_learned_from_its_own_upsert(db, clock):
    payload = am_payload(FIRING)
    batch = [delivery(new_episode(payload, n)) for n in range(30)]
    async with writer(db, clock) as w:
        stored = await w.store_together(batch)
        assert [s.changed for s in stored] == [2] * 30
        with statements() as seen:
            await w.store_together([delivery(new_episode(payload, n), tag="r") for n in range(30)])
    assert len(w.writer.known) == 60
    assert touching(seen, "alert_episodes") == []


class Ticks:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _keys(payload: dict[str, Any]) -> list[tuple[str, dt.datetime]]:
    parsed = alerts.parse_payload(json.dumps(payload).encode())
    return [(a.fingerprint, a.starts_at) for a in parsed.alerts]


async def test_the_counters_are_told_once_a_batch_before_its_deliveries_are_answered(db, clock):
    """Counters updated for every request were 3 % of a delivery's instructions: the writer
    tells them each committed batch's tally, once, before it answers the batch."""
    tallies: list[intake.Tally] = []
    answered: list[int] = []
    made = intake.IntakeWriter(db, clock=clock, on_stored=tallies.append)
    task = asyncio.create_task(made.run())

    async def store(d: intake.Delivery) -> None:
        await made.store(d)
        answered.append(len(tallies))  # the tallies told when this delivery was answered

    partial = am_payload("GPUTemperatureHigh-firing-partial-2alerts")  # one resolved of two
    try:
        await asyncio.gather(*(store(delivery(am_payload(FIRING), tag=str(n))) for n in range(3)))
        await asyncio.gather(store(delivery(partial)), store(delivery(am_payload(FIRING))))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert tallies == [
        # three deliveries of one episode's two alerts: two new, four repeats
        intake.Tally(deliveries=3, firing=6, resolved=0, deduplicated=4),
        # one of them resolved; the other alert and the second delivery change nothing
        intake.Tally(deliveries=2, firing=3, resolved=1, deduplicated=3),
    ]
    assert answered == [1, 1, 1, 2, 2]


async def test_a_failing_count_still_answers_the_batch_and_the_next(db, clock, caplog):
    def fail(_: intake.Tally) -> None:
        raise ValueError("a counter refused")

    made = intake.IntakeWriter(db, clock=clock, on_stored=fail)
    task = asyncio.create_task(made.run())
    try:
        first = await asyncio.wait_for(made.store(delivery(am_payload(FIRING))), 10)
        second = await asyncio.wait_for(made.store(delivery(am_payload(FIRING), tag="2")), 10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert second.delivery_id == first.delivery_id + 1
    assert "could not count a stored batch" in caplog.text


def test_a_known_key_is_trusted_for_its_ttl_only():
    ticks = Ticks()
    known = intake.KnownEpisodes(ttl=60, monotonic=ticks)
    payload = am_payload(FIRING)
    known.learn(_keys(payload), [])
    assert known.known_in([delivery(payload)]) == dict.fromkeys(_keys(payload), False)
    known.learn([], _keys(payload)[:1])
    assert known.known_in([delivery(payload)]) == {
        _keys(payload)[0]: True,
        _keys(payload)[1]: False,
    }
    ticks.now += 61
    assert known.known_in([delivery(payload)]) == {}


def test_only_alerts_that_would_change_nothing_are_left_out():
    payload = am_payload(FIRING)
    keys = _keys(payload)
    now = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)

    def written(sent: dict[str, Any], known: dict[Any, bool]) -> list[str]:
        rows, _ = intake._merge_episodes([delivery(sent)], [1], now, known)
        return [row["status"] for row in rows]

    firing_known = dict.fromkeys(keys, False)
    resolved_known = dict.fromkeys(keys, True)
    assert written(payload, {}) == ["firing", "firing"]
    assert written(payload, firing_known) == []
    assert written(resolved(payload), firing_known) == ["resolved", "resolved"]  # a resolution
    assert written(payload, resolved_known) == []  # resolution is final
    assert written(resolved(payload), resolved_known) == []


def test_known_keys_are_bounded_and_the_oldest_go_first():
    ticks = Ticks()
    known = intake.KnownEpisodes(limit=100, monotonic=ticks)
    payload = am_payload(FIRING)
    keys = [k for n in range(101) for k in _keys(new_episode(payload, n))[:1]]
    known.learn(keys[:1], [])
    known.learn(keys[1:100], [])
    known.learn(keys[:1], [])  # learned again: now the newest
    known.learn(keys[100:], [])
    assert len(known) == 75
    assert known.known_in([delivery(new_episode(payload, 0))])  # kept: learned last but one
    assert not known.known_in([delivery(new_episode(payload, 1))])  # among the oldest: gone


def test_the_ttl_is_shorter_than_the_shortest_retention():
    """A known key may be trusted while its episode cannot have been deleted: retention
    deletes only episodes resolved ``alert_retention_days`` (a whole day at least) ago, and a
    key is learned resolved only within ``recent``, which leaves the ttl before that day."""
    from remediator.app import settings

    field = settings.Settings.model_fields["alert_retention_days"]
    assert field.annotation is int  # whole days: 0 (never delete) or at least one
    known = intake.KnownEpisodes()
    assert known.ttl < 86400
    assert known.recent.total_seconds() + known.ttl <= 86400
    assert known.recent.total_seconds() > 0
