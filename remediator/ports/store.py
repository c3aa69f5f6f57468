"""The engine's view of durable state: a unit of work with guarded transitions.

Implemented by ``adapters.db.store`` over SQLite and Postgres. Every method runs in the
transaction opened by ``Store.transaction()``; leaving the block commits, an exception rolls
back. ``errors.Conflict`` means a compare-and-set lost (another replica got there first);
``errors.StoreUnavailable`` means the database could not be reached.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from remediator.domain import records, runs


class Tx(Protocol):
    now: dt.datetime

    async def add_event(
        self,
        kind: str,
        *,
        actor: str,
        reason: str = "",
        run_id: int | None = None,
        step_id: int | None = None,
        episode_id: int | None = None,
        from_status: str | None = None,
        to_status: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> int: ...

    async def lock_unhandled_episodes(self, limit: int) -> list[records.Episode]: ...
    async def mark_episode_handled(self, episode: records.Episode) -> None: ...
    async def get_episode(self, episode_id: int) -> records.Episode | None: ...
    async def insert_run(self, new: records.NewRun, *, actor: str) -> int | None: ...
    async def get_run(self, run_id: int) -> records.Run | None: ...
    async def runs_of_episode(self, episode_id: int) -> list[records.Run]: ...
    async def steps_of_run(self, run_id: int) -> list[records.Step]: ...
    async def get_step(self, step_id: int) -> records.Step | None: ...
    async def lock_pending_runs(self, limit: int) -> list[records.Run]: ...

    async def transition_run(
        self,
        run: records.Run | int,
        to: runs.RunStatus,
        *,
        actor: str,
        reason: str = "",
        data: dict[str, Any] | None = None,
    ) -> records.Run: ...

    async def transition_step(
        self,
        step: records.Step,
        to: runs.StepStatus,
        *,
        actor: str,
        reason: str = "",
        values: dict[str, Any] | None = None,
        expect_owner: str | None = None,
        event_data: dict[str, Any] | None = None,
    ) -> records.Step: ...

    async def set_step_due(self, step: records.Step, due_at: dt.datetime) -> None: ...

    async def update_step_output(
        self, step_id: int, owner: str, output: dict[str, Any], lease_until: dt.datetime
    ) -> bool: ...

    async def claim_due_steps(
        self, *, owner: str, lease_until: dt.datetime, limit: int
    ) -> list[records.Step]: ...

    async def expired_leases(self, limit: int) -> list[records.Step]: ...
    async def steps_leased_by(self, owner: str) -> list[records.Step]: ...
    async def active_runs_with_no_active_step(self, limit: int) -> list[records.Run]: ...

    async def try_lock(
        self, key: str, *, run_id: int | None, expires_at: dt.datetime | None
    ) -> bool: ...

    async def lock_holder(self, key: str) -> int | None: ...
    async def release_run_locks(self, run_id: int) -> None: ...
    async def release_locks(self, keys: Iterable[str]) -> None: ...


class Store(Protocol):
    def transaction(self, operation: str = "engine") -> AbstractAsyncContextManager[Tx]: ...

    async def probe(self) -> records.Probe:
        """What kinds of work exist, read without taking the write lock."""
        ...
