"""The engine's view of durable state: a unit of work with guarded transitions.

Implemented by ``adapters.db.store`` over SQLite and Postgres. ``Store.run(operation, work)``
calls ``work(tx)`` inside one transaction: it commits when ``work`` returns and rolls back when it
raises. ``work`` is synchronous code (decisions and statements only, no waiting on anything
else), so a transaction is a single call into the database and never holds its locks across
event-loop turns. ``errors.Conflict`` means a compare-and-set lost (another replica got there
first); ``errors.StoreUnavailable`` means the database could not be reached.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Protocol, TypeVar, overload

from remediator.domain import guards, records, transitions

T = TypeVar("T")


class Tx(Protocol):
    now: dt.datetime

    def savepoint(self) -> contextlib.AbstractContextManager[None]:
        """A nested unit of work: when the block raises, its writes (and audit events) are
        rolled back and the exception goes on; the enclosing transaction stays usable."""
        ...

    def should_yield(self) -> bool:
        """Whether a more urgent writer waits for this transaction (SQLite's single writer):
        a batch loop then commits what it has done and leaves the rest for the next pass."""
        ...

    def batch_inserts(self) -> None:
        """From now on new alert runs may be held, with their ids, and written together
        (``write_pending``): an episode that already has the run is then ``errors.Conflict``
        when they are written, not ``None`` from ``insert_run``. For a transaction that runs
        again (with ``insert_run`` as it was) when it meets a conflict."""
        ...

    def write_pending(self) -> None:
        """Write the compare-and-set changes this transaction holds back to write in batch
        (``apply`` and ``mark_episode_handled`` may): ``errors.Conflict`` if a row moved
        meanwhile. Every read and the commit do this first; a caller needs it only to place
        such a conflict."""
        ...

    def add_event(
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
    ) -> None: ...

    def lock_unhandled_episodes(self, limit: int) -> list[records.Episode]: ...
    def mark_episode_handled(self, episode: records.Episode) -> None: ...
    def get_episode(self, episode_id: int) -> records.Episode | None: ...
    def find_episode(self, fingerprint: str, starts_at: dt.datetime) -> records.Episode | None:
        """The episode intake keys on ``(fingerprint, starts_at)``, if it has one."""
        ...

    def insert_run(self, new: records.NewRun, *, actor: str) -> int | None: ...
    def get_run(self, run_id: int) -> records.Run | None: ...
    def runs_of_episode(self, episode_id: int) -> list[records.Run]: ...
    def steps_of_run(self, run_id: int) -> list[records.Step]: ...
    def get_step(self, step_id: int) -> records.Step | None: ...
    def read_runs(self, run_ids: Iterable[int], *, steps: bool = True) -> None:
        """Read these runs, their episodes and (``steps``) their steps at once, for
        ``get_run``, ``get_episode``, ``steps_of_run`` and ``get_step`` later in this
        transaction (a batch of step outcomes asked for each, one statement at a time). A
        store may read the episodes when the first of them is asked for (all of them then)."""

    def lock_pending_runs(self, limit: int) -> list[records.Run]:
        """Pending runs to try to start, oldest first: none whose node (or GPU) another run
        holds, and none parked (``park_run``) behind a key not released since."""
        ...

    def park_run(self, run_id: int, key: str, *, slots: int | None = None) -> None:
        """Pending run ``run_id`` could not start: it waits for lock ``key`` or, with
        ``slots``, for one of the ``slots`` locks whose keys start with ``key`` (a playbook's
        concurrency). A store may leave it out of ``lock_pending_runs`` until one of those is
        released; if none is held when the transaction commits, it must not."""
        ...

    @overload
    def apply(self, change: transitions.StepChange) -> records.Step: ...
    @overload
    def apply(self, change: transitions.RunChange) -> records.Run: ...
    def apply(
        self, change: transitions.StepChange | transitions.RunChange
    ) -> records.Step | records.Run:
        """Write a change decided in ``domain.transitions``: compare-and-set on the status it
        was read in (and the lease owner when given), and its audit event, in this
        transaction. Raises ``errors.Conflict`` when the row moved meanwhile."""
        ...

    def update_step_output(
        self, step_id: int, owner: str, output: dict[str, Any], lease_until: dt.datetime
    ) -> bool: ...

    def lock_due_steps(self, limit: int) -> Iterable[records.Step]:
        """Due steps, locked (Postgres: skipping rows another replica locked); iterate them
        within the transaction."""
        ...

    def guard_snapshot(
        self,
        *,
        node: str | None,
        since: dt.datetime,
        disruptive_playbooks: Iterable[str],
        gpu_nodes: int | None,
        pool: str | None = None,
    ) -> guards.Snapshot: ...

    def get_guard_state(self, key: str) -> dict[str, Any]: ...
    def lock_guards(self) -> None:
        """Fleet guard decisions of concurrent transactions happen one after the other."""
        ...

    def set_guard_state(self, key: str, value: dict[str, Any]) -> None: ...
    def guard_states(self, prefix: str) -> dict[str, dict[str, Any]]: ...
    def delete_guard_state(self, key: str) -> None: ...
    def record_disruption(self, *, run_id: int, node: str, pool: str | None = None) -> None: ...
    def release_disruptions(self, *, node: str | None = None, run_id: int | None = None) -> int:
        """End the active disruptions of ``node`` and/or ``run_id``; for each, the oldest step
        waiting for each budget it frees (``guards.freed_keys``) is woken when the
        transaction commits. The number ended."""
        ...

    def wake_steps(self, key: str | None, count: int | None = None) -> None:
        """Make the oldest ``count`` (None: all) steps a guard holds waiting for ``key``
        (None: for anything) due now, when the transaction commits."""
        ...

    def note_guard_nodes(self, nodes: Iterable[str]) -> None:
        """Nodes this transaction is likely to take guard decisions on: ``guard_snapshot``
        reads their disruptions together, at the first of them (after the guards' lock)."""
        ...

    def count_node_runs(self, node: str, *, since: dt.datetime) -> int: ...
    def count_runs_by_node(self, nodes: Iterable[str], *, since: dt.datetime) -> dict[str, int]:
        """``count_node_runs`` for many nodes in one read; the transaction keeps the counts
        (and its own new runs) for ``count_node_runs`` of the same ``since``."""
        ...

    def expired_leases(self, limit: int) -> list[records.Step]: ...
    def steps_leased_by(self, owner: str) -> list[records.Step]: ...
    def active_runs_with_no_active_step(self, limit: int) -> list[records.Run]: ...

    def try_lock(self, key: str, *, run_id: int | None, expires_at: dt.datetime | None) -> bool: ...
    def try_locks(
        self, keys: Sequence[str], *, run_id: int | None, expires_at: dt.datetime | None
    ) -> set[str]:
        """``try_lock`` of each of ``keys`` (in one statement): the ones taken."""
        ...

    def take_locks(self, wanted: Mapping[str, int]) -> set[str]:
        """``try_lock`` of each key for its own run (key: run id), in one statement whatever
        their number: the keys taken."""
        ...

    def effect_ledger(
        self,
        *,
        actions: Iterable[str],
        returning: Iterable[str],
        closed_by: Iterable[str],
        limit: int,
    ) -> list[records.LedgerEntry]:
        """Do-steps of ``actions`` in ended, non-dry-run alert runs on a node whose effect is
        ``applied`` or ``unknown`` and that no audit event of a kind in ``closed_by`` names,
        which still matter: kept effects (``on_resolve: continue``, effect ``applied``) and
        effects of ``on_resolve: undo`` runs whose alert resolved (and was handled). Oldest
        first. ``returning`` names the actions that return a node to service (for
        ``returned_to_service``)."""
        ...

    def release_run_locks(self, run_id: int) -> None: ...
    def release_locks(self, keys: Iterable[str]) -> None: ...
    def held_keys(self, prefix: str) -> AbstractSet[str]:
        """Live lock keys starting with ``prefix`` (read-only; may change with the
        transaction's own locks and releases)."""
        ...

    def lock_holder(self, key: str) -> int | None:
        """The active run holding the live lock ``key`` (None: free, lapsed, or held by no
        run, such as a cooldown)."""
        ...


class Reads(Protocol):
    async def read(self, operation: str, work: Callable[[Tx], T]) -> T:
        """Run ``work`` that only reads: nothing stays locked for it (guard states are read
        without a row lock), so plans and status pages never queue behind guard decisions."""
        ...


class Store(Reads, Protocol):
    async def run(self, operation: str, work: Callable[[Tx], T]) -> T: ...

    async def probe(self) -> records.Probe:
        """What kinds of work exist, read without taking the write lock."""
        ...

    async def hint_runs_to_advance(self) -> int:
        """A store that finds the runs to advance through hints of what changed hints every
        such run it has no hint for, and says how many (a safety net the engine's leader runs
        now and then); one that finds them otherwise has nothing to do (0)."""
        ...

    async def wake_first_held(self, prefix: str) -> int:
        """Make the oldest step a guard holds waiting for each key starting with ``prefix``
        due now (the first in line for each budget is looked at again every recheck: the
        fleet may have grown, the breaker's count of runs may trip it); how many."""
        ...

    async def wake_parked_runs(self, slots: Callable[[str], int]) -> int:
        """A store that parks runs (``Tx.park_run``) makes every run parked behind a lock key
        no one holds, and for a slot prefix of playbook ``p`` with fewer than ``slots(p)`` keys
        held the oldest runs waiting for as many slots as are free, runs to try again, and says
        how many (a safety net the engine's leader runs now and then); one that does not park
        has nothing to do (0)."""
        ...
