"""A playbook's concurrency slots: a start takes one free slot, in O(1) when slots are dense."""

from __future__ import annotations

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

    def add_event(self, *args: Any, **kwargs: Any) -> None:
        pass

    def apply(self, change: Any) -> None:
        self.applied.append(change)


def _run() -> records.Run:
    return records.Run(
        id=7,
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
    """A storm's 500 active runs hold slots 0..499: the next start takes slot 500 at once
    (it looked at every held slot first, for each start: quadratic in the storm)."""
    tx = Tx(_slots(*range(500)))
    Held.looked = 0
    assert lifecycle.start_run(tx, _run(), concurrency=10_000)  # type: ignore[arg-type]
    assert tx.tried == ["slot:storm:500"]
    assert Held.looked == 1


def test_a_start_finds_a_slot_freed_below_the_held_ones() -> None:
    tx = Tx(_slots(1, 2))  # slot 0 was freed; 1 and 2 still held
    assert lifecycle.start_run(tx, _run(), concurrency=3)  # type: ignore[arg-type]
    assert "slot:storm:0" in tx.held
    assert not tx.tried or tx.tried[-1] == "slot:storm:0"


def test_no_start_while_every_slot_is_held() -> None:
    tx = Tx(_slots(0, 1, 2))
    assert not lifecycle.start_run(tx, _run(), concurrency=3)  # type: ignore[arg-type]
    assert [key for key in tx.tried if key.startswith("slot:")] == []
    assert tx.applied == []
