"""Fleet guards, approvals and locks of an in-memory transaction (``SqlTx`` alike)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from remediator.adapters.memory import tables, transaction
from remediator.domain import guards, records, runs


class FleetTx(transaction.Transaction):
    """The guard, approval and lock methods of ``store.MemoryTx``."""

    # -- guards ----------------------------------------------------------------------------

    def guard_snapshot(
        self,
        *,
        node: str | None,
        since: dt.datetime,
        disruptive_playbooks: Iterable[str],
        gpu_nodes: int | None,
        pool: str | None = None,
    ) -> guards.Snapshot:
        t = self.tables
        disrupted = frozenset(
            row.node
            for row in t.disruptions.values()
            if row.released_at is None and (pool is None or row.pool == pool)
        )
        breaker = self.get_guard_state("breaker")
        window_start = tables.utc_now(since)
        # Runs an operator has seen when resetting the breaker do not count.
        reset_at = tables.utc(
            dt.datetime.fromisoformat(breaker["reset_at"]) if breaker.get("reset_at") else None
        )
        names = set(disruptive_playbooks)
        recent = sum(
            1
            for run in t.runs.values()
            if run.playbook in names
            and run.kind is runs.RunKind.ALERT
            and not run.dry_run
            and run.created_at >= window_start
            and (reset_at is None or run.created_at > reset_at)
        )
        last = None
        if node is not None:
            moments = [
                row.released_at or row.started_at
                for row in t.disruptions.values()
                if row.node == node
            ]
            last = max(moments, default=None)
        return guards.Snapshot(
            disrupted_nodes=disrupted,
            gpu_nodes=gpu_nodes,
            recent_runs=recent,
            breaker_open=bool(breaker.get("open")),
            node_last_disrupted=last,
        )

    def lock_guards(self) -> None:
        return None  # one transaction at a time

    def get_guard_state(self, key: str) -> dict[str, Any]:
        row = self.tables.guard_state.get(key)
        return dict(tables.copy_json(row.value)) if row else {}

    def set_guard_state(self, key: str, value: dict[str, Any]) -> None:
        rows = self._own("guard_state", self.tables.guard_state)
        rows[key] = tables.GuardRow(value=tables.as_json(value), updated_at=self.now)

    def guard_states(self, prefix: str) -> dict[str, dict[str, Any]]:
        return {
            key: dict(tables.copy_json(row.value))
            for key, row in self.tables.guard_state.items()
            if key.startswith(prefix)
        }

    def delete_guard_state(self, key: str) -> None:
        if key in self.tables.guard_state:
            del self._own("guard_state", self.tables.guard_state)[key]

    def record_disruption(self, *, run_id: int, node: str, pool: str | None = None) -> None:
        t = self.tables
        if run_id not in t.runs:
            raise tables.IntegrityError(f"no run {run_id}")
        if any(row.run_id == run_id and row.node == node for row in t.disruptions.values()):
            return
        row_id = self.next_id("disruptions")
        self._own("disruptions", t.disruptions)[row_id] = tables.Disruption(
            id=row_id, run_id=run_id, node=node, pool=pool, started_at=self.now, released_at=None
        )

    def release_disruptions(self, *, node: str | None = None, run_id: int | None = None) -> int:
        released = [
            row
            for row in self.tables.disruptions.values()
            if row.released_at is None
            and (node is None or row.node == node)
            and (run_id is None or row.run_id == run_id)
        ]
        if released:
            rows = self._own("disruptions", self.tables.disruptions)
            for row in released:
                rows[row.id] = dataclasses.replace(row, released_at=self.now)
                for key in guards.freed_keys(row.pool):
                    self.wake_steps(key, 1)
        return len(released)

    def wake_steps(self, key: str | None, count: int | None = None) -> None:
        """At once (the SQL store with the transaction's held changes, after them)."""
        waiting = (
            step
            for step in sorted(self.tables.steps.values(), key=lambda step: step.id)
            if step.status is runs.StepStatus.PENDING
            and step.waiting_for is not None
            and (key is None or step.waiting_for == key)
        )
        steps = None
        for step in itertools.islice(waiting, count):
            steps = steps if steps is not None else self._own("steps", self.tables.steps)
            steps[step.id] = tables.updated_step(step, {"due_at": self.now, "waiting_for": None})

    def count_node_runs(self, node: str, *, since: dt.datetime) -> int:
        start = tables.utc_now(since)
        return sum(
            1
            for run in self.tables.runs.values()
            if run.node == node and run.created_at >= start and run.kind is not runs.RunKind.UNDO
        )

    def note_guard_nodes(self, nodes: Iterable[str]) -> None:
        """Every read is in memory: nothing to read ahead."""

    def count_runs_by_node(self, nodes: Iterable[str], *, since: dt.datetime) -> dict[str, int]:
        return {node: self.count_node_runs(node, since=since) for node in sorted(set(nodes))}

    # -- approvals -------------------------------------------------------------------------

    def add_approval(self, step_id: int, *, principal: str, decision: str, comment: str) -> bool:
        """Record one principal's decision on a step; ``False`` if they already decided."""
        t = self.tables
        if step_id not in t.steps:
            raise tables.IntegrityError(f"no step {step_id}")
        if any(a.step_id == step_id and a.principal == principal for a in t.approvals.values()):
            return False
        approval_id = self.next_id("approvals")
        self._own("approvals", t.approvals)[approval_id] = tables.Approval(
            id=approval_id,
            step_id=step_id,
            principal=principal,
            decision=decision,
            comment=comment,
            at=self.now,
        )
        return True

    def approvals_of(self, step_id: int) -> list[dict[str, Any]]:
        return [a.as_dict() for a in self.tables.approvals.values() if a.step_id == step_id]

    def alert_sender(self, episode_id: int) -> str | None:
        """The principal whose delivery started the episode (None: unknown)."""
        episode = self.tables.episodes.get(episode_id)
        if episode is None or episode.first_delivery_id is None:
            return None
        return self.tables.deliveries.get(episode.first_delivery_id)

    def steps_waiting_since(self, cutoff: dt.datetime, limit: int) -> list[records.Step]:
        """Steps waiting for approval whose run has waited since ``cutoff`` or earlier."""
        t, until = self.tables, tables.utc_now(cutoff)
        waiting = [
            step
            for step in t.steps.values()
            if step.status is runs.StepStatus.WAITING_APPROVAL
            and t.runs[step.run_id].status is runs.RunStatus.WAITING_APPROVAL
            and t.runs[step.run_id].updated_at <= until
        ]
        return [tables.detached_step(step) for step in waiting[: max(limit, 0)]]

    # -- locks -----------------------------------------------------------------------------

    def try_lock(self, key: str, *, run_id: int | None, expires_at: dt.datetime | None) -> bool:
        """Take ``key`` unless someone holds it (an expired holder loses it)."""
        t = self.tables
        held = t.locks.get(key)
        if held is not None and held.expires_at is not None and held.expires_at <= self.now:
            del self._own("locks", t.locks)[key]
            held = None
        if held is not None:
            return False
        if run_id is not None and run_id not in t.runs:
            raise tables.IntegrityError(f"no run {run_id}")
        self._own("locks", t.locks)[key] = tables.Lock(
            key=key, run_id=run_id, acquired_at=self.now, expires_at=tables.utc(expires_at)
        )
        return True

    def try_locks(
        self, keys: Sequence[str], *, run_id: int | None, expires_at: dt.datetime | None
    ) -> set[str]:
        return {key for key in keys if self.try_lock(key, run_id=run_id, expires_at=expires_at)}

    def take_locks(self, wanted: Mapping[str, int]) -> set[str]:
        return {
            key
            for key, run_id in wanted.items()
            if self.try_lock(key, run_id=run_id, expires_at=None)
        }

    def release_run_locks(self, run_id: int) -> None:
        """Release what a finished run held, except expiring locks (cooldowns run their time)."""
        self._delete_locks(
            key
            for key, lock in self.tables.locks.items()
            if lock.run_id == run_id and lock.expires_at is None
        )

    def release_locks(self, keys: Iterable[str]) -> None:
        self._delete_locks(keys)

    def _delete_locks(self, keys: Iterable[str]) -> None:
        gone = [key for key in keys if key in self.tables.locks]
        if gone:
            locks = self._own("locks", self.tables.locks)
            for key in gone:
                locks.pop(key, None)

    def held_keys(self, prefix: str) -> set[str]:
        """Keys of live locks starting with ``prefix``."""
        return {
            key
            for key, lock in self.tables.locks.items()
            if key.startswith(prefix) and (lock.expires_at is None or lock.expires_at > self.now)
        }

    def lock_holder(self, key: str) -> int | None:
        """The active run holding the live lock ``key``."""
        lock = self.tables.locks.get(key)
        if lock is None or lock.run_id is None:
            return None
        if lock.expires_at is not None and lock.expires_at <= self.now:
            return None
        run = self.tables.runs.get(lock.run_id)
        return lock.run_id if run is not None and run.status in runs.RUN_ACTIVE else None
