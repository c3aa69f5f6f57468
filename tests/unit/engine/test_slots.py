"""A playbook's concurrency slots: a start takes one free slot, looking first at its own (its
run id modulo the concurrency), in O(1) in a storm."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from remediator.domain import playbooks, records, runs
from remediator.engine import lifecycle

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


class Held(set[str]):
    """A held-slot set that counts how often a start looks into it."""

    looked = 0

    def __contains__(self, key: object) -> bool:
        Held.looked += 1
        return super().__contains__(key)


class Tx:
    """The part of ``store.Tx`` a start uses: locks, and what it asked of them."""

    def __init__(self, held: set[str]) -> None:
        self.held = set(held)
        self.tried: list[str] = []
        self.applied: list[Any] = []
        self.parked: dict[int, tuple[str, int | None]] = {}

    def held_keys(self, prefix: str) -> set[str]:
        return Held(key for key in self.held if key.startswith(prefix))

    def try_lock(self, key: str, *, run_id: int | None, expires_at: Any) -> bool:
        self.tried.append(key)
        if key in self.held:
            return False
        self.held.add(key)
        return True

    def try_locks(self, keys: Any, *, run_id: int | None, expires_at: Any) -> set[str]:
        return {key for key in keys if self.try_lock(key, run_id=run_id, expires_at=expires_at)}

    def release_locks(self, keys: Any) -> None:
        self.held.difference_update(keys)

    def park_run(self, run_id: int, key: str, *, slots: int | None = None) -> None:
        self.parked[run_id] = (key, slots)

    def add_event(self, *args: Any, **kwargs: Any) -> None:
        pass

    def apply(self, change: Any) -> None:
        self.applied.append(change)


def _run(run_id: int = 7) -> records.Run:
    return records.Run(
        id=run_id,
        playbook="storm",
        kind=runs.RunKind.ALERT,
        status=runs.RunStatus.PENDING,
        episode_id=1,
        parent_run_id=None,
        node=None,
        gpu=None,
        exclusive=False,
        dry_run=False,
        principal=None,
        params={},
        on_resolve=playbooks.ResolvePolicy.CONTINUE,
        reason="",
        created_at=NOW,
        updated_at=NOW,
        finished_at=None,
    )


def _slots(*numbers: int) -> set[str]:
    return {f"slot:storm:{n}" for n in numbers}


def test_a_start_next_to_many_active_runs_tries_one_slot() -> None:
    """A storm's 500 active runs (ids 1 to 500) hold their slots 1..500: the next run, 501,
    takes slot 501 at once (looking from the lowest slot up looked at every held slot first,
    for each start: quadratic in the storm)."""
    tx = Tx(_slots(*range(1, 501)))
    Held.looked = 0
    assert lifecycle.start_run(tx, _run(501), concurrency=10_000)  # type: ignore[arg-type]
    assert tx.tried == ["slot:storm:501"]
    assert Held.looked == 1


def test_runs_started_from_one_view_of_the_slots_try_different_ones() -> None:
    """Two replicas read the same held slots and start a run each: the runs try different
    slots (the same one would make the second replica's insert wait for the first's commit
    on Postgres)."""
    held = _slots(*range(1, 101))
    first, second = Tx(held), Tx(held)
    assert lifecycle.start_run(first, _run(101), concurrency=10_000)  # type: ignore[arg-type]
    assert lifecycle.start_run(second, _run(102), concurrency=10_000)  # type: ignore[arg-type]
    assert first.tried == ["slot:storm:101"]
    assert second.tried == ["slot:storm:102"]


def test_a_start_whose_own_slot_is_held_takes_the_next_free_one() -> None:
    tx = Tx(_slots(7, 8))  # run 7's own slot and the next held by runs 17 and 18
    assert lifecycle.start_run(tx, _run(7), concurrency=10)  # type: ignore[arg-type]
    assert tx.tried == ["slot:storm:9"]


def test_a_start_finds_a_slot_freed_below_the_held_ones() -> None:
    tx = Tx(_slots(1, 2))  # slot 0 was freed; 1 and 2 still held
    assert lifecycle.start_run(tx, _run(), concurrency=3)  # type: ignore[arg-type]
    assert "slot:storm:0" in tx.held
    assert not tx.tried or tx.tried[-1] == "slot:storm:0"


def test_no_start_while_every_slot_is_held() -> None:
    """Nor is its node taken and given back: two statements a run, for every run woken each
    time a slot of a busy playbook was released."""
    tx = Tx(_slots(0, 1, 2))
    run = dataclasses.replace(_run(), node="gpu-node-1", exclusive=True)
    assert not lifecycle.start_run(tx, run, concurrency=3)  # type: ignore[arg-type]
    assert tx.tried == []
    assert tx.applied == []
    assert tx.parked == {7: ("slot:storm:", 3)}  # until one of the playbook's 3 slots is free


def test_a_run_whose_node_another_run_took_meanwhile_waits_for_that_lock() -> None:
    run = dataclasses.replace(_run(), node="gpu-node-1", exclusive=True)
    tx = Tx({"node:gpu-node-1"})
    assert not lifecycle.start_run(tx, run, concurrency=3)  # type: ignore[arg-type]
    assert tx.parked == {7: ("node:gpu-node-1", None)}
    assert tx.held == {"node:gpu-node-1"}  # the slot it took with it given back
