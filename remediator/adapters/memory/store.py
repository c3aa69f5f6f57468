"""The engine's unit of work in memory: ``MemoryStore`` and ``MemoryTx``.

``MemoryStore.run(operation, work)`` gives ``work`` a transaction over a copy-on-write view of
the tables: a table is copied the first time the transaction writes to it, the copies replace
the committed tables when ``work`` returns, and are dropped when it raises, so a transaction
commits all of its writes or none. ``work`` is synchronous and the store awaits nothing while
it runs, so transactions never interleave (they are serialisable, as on SQLite); each one
first yields to the event loop once, as a call into a database would.

Every ``MemoryTx`` method mirrors the ``SqlTx`` method of the same name: the same conditions,
the same order, the same compare-and-set and the same audit events, linked into a hash chain
with ``domain.audit.chain_hash``. What a database constraint would refuse raises
``tables.IntegrityError``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import itertools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar, overload

from remediator.adapters.memory import fleet, queries, tables
from remediator.domain import alerts, audit, errors, playbooks, records, runs, transitions

T = TypeVar("T")


class MemoryStore:
    """Durable state for one process's lifetime. Besides the port it takes alerts in the way
    intake stores them (``receive``) and lets tests read what is committed (``peek``,
    ``events``, ``verify``)."""

    def __init__(self, *, clock: Callable[[], dt.datetime]) -> None:
        self.clock = clock
        self.tables = tables.Tables()
        #: While set, every transaction and probe raises ``StoreUnavailable`` (an outage).
        self.unavailable = False
        #: What ``Tx.should_yield`` answers (a webhook waiting for SQLite's single writer).
        self.writers_waiting = False

    async def run(self, operation: str, work: Callable[[MemoryTx], T]) -> T:
        """Run ``work(tx)`` in one transaction; committed if it returns."""
        now = self.clock()  # as SQL: the transaction's time is taken before it waits its turn
        await asyncio.sleep(0)
        self._check_available(operation)
        tx = MemoryTx(self.tables, now=now, yield_to=self._writers_waiting)
        try:
            result = work(tx)
            committed = tx.tables
        finally:
            tx.close()
        self.tables = committed
        return result

    async def read(self, operation: str, work: Callable[[MemoryTx], T]) -> T:
        """``run``: memory has no locks to avoid."""
        return await self.run(operation, work)

    async def probe(self) -> records.Probe:
        await asyncio.sleep(0)
        self._check_available("probe")
        return queries.probe(self.tables, tables.utc_now(self.clock()))

    async def hint_runs_to_advance(self) -> int:
        """Nothing to do: the runs to advance are found by looking at every running run."""
        await asyncio.sleep(0)
        return 0

    async def wake_first_held(self, prefix: str) -> int:
        def keys() -> set[str]:
            return {
                step.waiting_for
                for step in self.tables.steps.values()
                if step.status is runs.StepStatus.PENDING
                and step.waiting_for is not None
                and step.waiting_for.startswith(prefix)
            }

        def wake(tx: MemoryTx) -> int:
            waiting = keys()
            for key in waiting:
                tx.wake_steps(key, 1)
            return len(waiting)

        return await self.run("recheck held", wake) if keys() else 0

    async def wake_parked_runs(self, slots: Callable[[str], int]) -> int:
        """Nothing to do: no run is parked (``MemoryTx.park_run``)."""
        await asyncio.sleep(0)
        return 0

    def peek(self, work: Callable[[MemoryTx], T]) -> T:
        """Run ``work`` on the committed state without committing anything (for tests)."""
        tx = MemoryTx(self.tables, now=self.clock(), yield_to=self._writers_waiting)
        try:
            return work(tx)
        finally:
            tx.close()

    async def receive(self, payload: alerts.WebhookPayload, *, principal: str | None = None) -> int:
        """Store a delivery's alerts as intake does (``principal`` sent it); returns how many
        episodes changed (new ones, and firing ones a resolved status ended)."""

        def work(tx: MemoryTx) -> int:
            delivery_id = tx.store_delivery(principal)
            changed = {
                (alert.fingerprint, alert.starts_at)
                for alert in payload.alerts
                if tx.store_alert(alert, delivery_id=delivery_id)[1]
            }
            return len(changed)

        return await self.run("intake", work)

    async def upsert_alert(self, alert: alerts.Alert) -> records.Episode:
        """Store one alert as intake does and return its episode as it is now."""
        return await self.run("intake", lambda tx: tx.store_alert(alert, delivery_id=None)[0])

    def events(self, *, run_id: int | None = None) -> list[records.AuditEvent]:
        """Committed audit events in chain order (of one run, if given)."""
        return [
            dataclasses.replace(event, data=tables.copy_json(event.data))
            for event in self.tables.events
            if run_id is None or event.run_id == run_id
        ]

    def verify(self) -> audit.VerifyResult:
        return audit.verify(dataclasses.asdict(event) for event in self.tables.events)

    def _writers_waiting(self) -> bool:
        return self.writers_waiting

    def _check_available(self, operation: str) -> None:
        if self.unavailable:
            raise errors.StoreUnavailable(f"store unavailable ({operation})")


class MemoryTx(fleet.FleetTx):
    # -- episodes --------------------------------------------------------------------------

    def lock_unhandled_episodes(self, limit: int) -> list[records.Episode]:
        found = itertools.islice(queries.unhandled_episodes(self.tables), max(limit, 0))
        return [tables.detached_episode(episode) for episode in found]

    def mark_episode_handled(self, episode: records.Episode) -> None:
        current = self.tables.episodes.get(episode.id)
        if current is not None:
            episodes = self._own("episodes", self.tables.episodes)
            episodes[episode.id] = dataclasses.replace(current, handled_status=episode.status)

    def get_episode(self, episode_id: int) -> records.Episode | None:
        episode = self.tables.episodes.get(episode_id)
        return tables.detached_episode(episode) if episode else None

    def find_episode(self, fingerprint: str, starts_at: dt.datetime) -> records.Episode | None:
        episode_id = self.tables.episode_keys.get((fingerprint, tables.utc_now(starts_at)))
        return self.get_episode(episode_id) if episode_id is not None else None

    def store_delivery(self, principal: str | None) -> int:
        """A new delivery's id; who sent it is kept (its body is not)."""
        delivery_id = self.next_id("deliveries")
        self._own("deliveries", self.tables.deliveries)[delivery_id] = principal
        return delivery_id

    def store_alert(
        self, alert: alerts.Alert, *, delivery_id: int | None
    ) -> tuple[records.Episode, bool]:
        """Intake's upsert on ``(fingerprint, starts_at)``: a new episode, or a firing one a
        resolved status ends; any other repeat changes nothing. Returns the episode and
        whether it changed."""
        key = (alert.fingerprint, tables.utc_now(alert.starts_at))
        episode_id = self.tables.episode_keys.get(key)
        current = self.tables.episodes.get(episode_id) if episode_id is not None else None
        if current is None:
            episode_id = self.next_id("episodes")
            episode = tables.new_episode(episode_id, alert, delivery_id=delivery_id, now=self.now)
            self._own("episode_keys", self.tables.episode_keys)[key] = episode_id
        elif (
            current.status is alerts.AlertStatus.FIRING
            and alert.status is alerts.AlertStatus.RESOLVED
        ):
            episode = tables.resolved_episode(current, alert, now=self.now)
        else:
            return tables.detached_episode(current), False
        self._own("episodes", self.tables.episodes)[episode.id] = episode
        return tables.detached_episode(episode), True

    # -- runs and steps --------------------------------------------------------------------

    def insert_run(self, new: records.NewRun, *, actor: str) -> int | None:
        """Create a run and its steps; ``None`` if this episode already has this run."""
        t = self.tables
        key = (new.episode_id or 0, new.playbook, runs.RunKind(new.kind).value)
        if new.episode_id is not None:
            if new.episode_id not in t.episodes:
                raise tables.IntegrityError(f"no episode {new.episode_id}")
            if key in t.alert_runs:
                return None
        self._check_new_run(new)
        run_id = self.next_id("runs")
        self._own("runs", t.runs)[run_id] = tables.new_run(run_id, new, self.now)
        if new.episode_id is not None:
            self._own("alert_runs", t.alert_runs)[key] = run_id
        step_ids = []
        steps = self._own("steps", t.steps)
        for planned in new.steps:
            step_id = self.next_id("steps")
            steps[step_id] = tables.new_step(step_id, run_id, planned)
            step_ids.append(step_id)
        self._own("run_steps", t.run_steps)[run_id] = tuple(step_ids)
        self.add_event(
            "run.created",
            actor=actor,
            run_id=run_id,
            episode_id=new.episode_id,
            to_status=runs.RunStatus(new.status).value,
            reason=new.reason,
            data={
                "playbook": new.playbook,
                "kind": runs.RunKind(new.kind).value,
                "node": new.node,
                "gpu": new.gpu,
                "dry_run": new.dry_run,
                "steps": [step.key for step in new.steps],
            },
        )
        return run_id

    def _check_new_run(self, new: records.NewRun) -> None:
        t = self.tables
        if new.parent_run_id is not None and new.parent_run_id not in t.runs:
            raise tables.IntegrityError(f"no run {new.parent_run_id}")
        intents = [(step.phase, step.key) for step in new.steps]
        if len(set(intents)) != len(intents):
            raise tables.IntegrityError("two steps of the run have the same phase and key")
        for step in new.steps:
            if step.undo_of is not None and step.undo_of not in t.steps:
                raise tables.IntegrityError(f"no step {step.undo_of}")

    def get_run(self, run_id: int) -> records.Run | None:
        run = self.tables.runs.get(run_id)
        return tables.detached_run(run) if run else None

    def runs_of_episode(self, episode_id: int) -> list[records.Run]:
        return [
            tables.detached_run(run)
            for run in self.tables.runs.values()
            if run.episode_id == episode_id
        ]

    def read_runs(self, run_ids: Iterable[int], *, steps: bool = True) -> None:
        pass  # everything is in memory already

    def steps_of_run(self, run_id: int) -> list[records.Step]:
        return [tables.detached_step(step) for step in queries.steps_of(self.tables, run_id)]

    def get_step(self, step_id: int) -> records.Step | None:
        step = self.tables.steps.get(step_id)
        return tables.detached_step(step) if step else None

    def lock_pending_runs(self, limit: int) -> list[records.Run]:
        found = itertools.islice(queries.startable_runs(self.tables), max(limit, 0))
        return [tables.detached_run(run) for run in found]

    def park_run(self, run_id: int, key: str, *, slots: int | None = None) -> None:
        """Nothing kept: the pending runs are looked at every time (``startable_runs``)."""

    @overload
    def apply(self, change: transitions.StepChange) -> records.Step: ...
    @overload
    def apply(self, change: transitions.RunChange) -> records.Run: ...
    def apply(
        self, change: transitions.StepChange | transitions.RunChange
    ) -> records.Step | records.Run:
        """Compare-and-set a decided change and append its audit event; ``Conflict`` if the
        row moved meanwhile."""
        if isinstance(change, transitions.RunChange):
            return self._apply_run(change)
        return self._apply_step(change)

    def _apply_run(self, change: transitions.RunChange) -> records.Run:
        run, to = change.run, change.to
        current = self.tables.runs.get(run.id)
        # As the SQL update: the row must be in a status ``to`` may be reached from (not
        # necessarily the status it was read in).
        if current is None or current.status not in runs.run_sources(to):
            state = current.status.value if current else "missing"
            raise errors.Conflict(f"run {run.id} is {state}; cannot move it to {to.value}")
        moved = dataclasses.replace(
            current,
            status=to,
            updated_at=self.now,
            finished_at=self.now if to in runs.RUN_TERMINAL else current.finished_at,
        )
        self._own("runs", self.tables.runs)[run.id] = moved
        self.add_event(
            "run.transition",
            actor=change.actor,
            run_id=run.id,
            episode_id=moved.episode_id,
            from_status=run.status.value,
            to_status=to.value,
            reason=change.reason,
            data=dict(change.data) or None,
        )
        return tables.detached_run(moved)

    def _apply_step(self, change: transitions.StepChange) -> records.Step:
        step, to = change.step, change.to
        current = self.tables.steps.get(step.id)
        if (
            current is None
            or current.status is not step.status
            or (change.expect_owner is not None and current.lease_owner != change.expect_owner)
        ):
            raise errors.Conflict(f"step {step.id} is no longer {step.status.value}")
        moved = tables.updated_step(current, {"status": to.value, **change.values})
        self._own("steps", self.tables.steps)[step.id] = moved
        if change.event is not None:
            self.add_event(change.event, **transitions.step_event(change))
        return tables.detached_step(moved)

    def update_step_output(
        self, step_id: int, owner: str, output: dict[str, Any], lease_until: dt.datetime
    ) -> bool:
        """Progress of a running step, and a lease renewal; ``False`` if the lease was lost."""
        current = self.tables.steps.get(step_id)
        if (
            current is None
            or current.status is not runs.StepStatus.RUNNING
            or current.lease_owner != owner
        ):
            return False
        self._own("steps", self.tables.steps)[step_id] = tables.updated_step(
            current, {"output": output, "lease_expires_at": lease_until}
        )
        return True

    def lock_due_steps(self, limit: int) -> list[records.Step]:
        due = queries.due_steps(self.tables, self.now)[: max(limit, 0)]
        return [tables.detached_step(step) for step in due]

    def expired_leases(self, limit: int) -> list[records.Step]:
        expired = queries.expired_leases(self.tables, self.now)[: max(limit, 0)]
        return [tables.detached_step(step) for step in expired]

    def steps_leased_by(self, owner: str) -> list[records.Step]:
        return [
            tables.detached_step(step)
            for step in self.tables.steps.values()
            if step.status is runs.StepStatus.RUNNING and step.lease_owner == owner
        ]

    def active_runs_with_no_active_step(self, limit: int) -> list[records.Run]:
        found = itertools.islice(queries.advanceable_runs(self.tables), max(limit, 0))
        return [tables.detached_run(run) for run in found]

    def effect_ledger(
        self,
        *,
        actions: Iterable[str],
        returning: Iterable[str],
        closed_by: Iterable[str],
        limit: int,
    ) -> list[records.LedgerEntry]:
        t = self.tables
        wanted, back, closing = set(actions), set(returning), set(closed_by)
        closed = {e.step_id for e in t.events if e.kind in closing and e.step_id is not None}
        entries: list[records.LedgerEntry] = []
        for step in t.steps.values():
            if len(entries) >= limit:
                break
            run = t.runs[step.run_id]
            episode = t.episodes.get(run.episode_id) if run.episode_id is not None else None
            if (
                episode is None
                or step.phase is not runs.StepPhase.DO
                or step.effect not in runs.EFFECTS_TO_UNDO
                or step.action not in wanted
                or run.kind is not runs.RunKind.ALERT
                or run.status not in runs.RUN_TERMINAL
                or run.node is None
                or run.dry_run
                or step.id in closed
            ):
                continue
            resolved = (
                episode.status is alerts.AlertStatus.RESOLVED
                and episode.handled_status is alerts.AlertStatus.RESOLVED
            )
            kept = (
                run.on_resolve is playbooks.ResolvePolicy.CONTINUE
                and step.effect is runs.Effect.APPLIED
            )
            if not (kept or (resolved and run.on_resolve is playbooks.ResolvePolicy.UNDO)):
                continue
            returned = any(
                later.node == run.node
                and later.id > run.id
                and any(
                    s.phase is runs.StepPhase.DO
                    and s.action in back
                    and s.status is runs.StepStatus.SUCCEEDED
                    for s in queries.steps_of(t, later.id)
                )
                for later in t.runs.values()
            )
            entries.append(
                records.LedgerEntry(
                    run=tables.detached_run(run),
                    step=tables.detached_step(step),
                    alert_resolved=resolved,
                    undo_runs=tuple(
                        r.status
                        for r in t.runs.values()
                        if r.parent_run_id == run.id and r.kind is runs.RunKind.UNDO
                    ),
                    returned_to_service=returned,
                )
            )
        return entries


if TYPE_CHECKING:  # both satisfy the ports they stand in for
    from remediator.engine import approvals
    from remediator.ports import store

    _store: store.Store = MemoryStore(clock=lambda: dt.datetime.now(dt.UTC))
    _tx: approvals.ApprovalTx = MemoryTx(tables.Tables(), now=dt.datetime.now(dt.UTC))
