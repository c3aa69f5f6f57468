"""The engine loop: handle new episodes, start and advance runs, claim and run steps, sweep.

Each pass is a probe and one transaction. Several replicas can run it against one Postgres: every
piece of work is either claimed (``FOR UPDATE SKIP LOCKED``, step leases) or guarded by a
unique key, so two replicas never create the same run or run the same step. Intake wakes the
loop in-process; other replicas notice new work at the next poll.

Shutdown (SIGTERM): stop claiming, give in-flight steps a grace period, then cancel them and
hand their steps back (``running → pending``) so another replica takes them at once instead of
waiting for the lease to expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import functools
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from remediator.domain import alerts, errors, playbooks, records, runs
from remediator.domain import guards as guards_mod
from remediator.domain import targeting as targeting_rules
from remediator.engine import (
    executor,
    guarding,
    isolation,
    lifecycle,
    planning,
    silencing,
    targeting,
)
from remediator.ports import cluster as cluster_port
from remediator.ports import store

logger = logging.getLogger("remediator.engine")


class RulesSource(Protocol):
    @property
    def index(self) -> playbooks.PlaybookIndex: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineSettings:
    poll_interval: float = 1.0
    min_pass_interval: float = 0.0
    """A pause after each pass before the next, none by default: a pass starts as soon as it
    is woken, and what arrives while one runs is gathered by the next (a busy engine batches
    by itself); a fixed pause only added its length to every alert's reaction."""
    lease_seconds: float = 30.0
    max_concurrent_steps: int = 64
    batch: int = 50
    dry_run: bool = False
    shutdown_grace: float = 20.0
    max_lost_leases: int = 3
    guards: guards_mod.GuardConfig = dataclasses.field(default_factory=guards_mod.GuardConfig)
    guard_channel: str = "default"
    node_labels: tuple[str, ...] = targeting_rules.DEFAULT_ORDER
    """The global order of labels an alert's node is taken from (playbooks may override it)."""
    targeting_ttl: float = 30.0
    """Seconds the cluster's answers about node candidates are reused."""
    targeting_wait: dt.timedelta = dt.timedelta(minutes=2)
    """How long an episode waits for a cluster that cannot say which node it is about."""


#: Seconds between the leader's looks for runs to advance that no hint names
#: (``Store.hint_runs_to_advance``); the first comes with the first pass.
HINT_SWEEP_INTERVAL = 60.0


def _concurrency(index: playbooks.PlaybookIndex, playbook: str) -> int:
    """How many runs of ``playbook`` may be active at once (1 for one no longer loaded)."""
    found = index.get(playbook)
    return found.concurrency if found else 1


@dataclasses.dataclass
class _Pass:
    """What a pass (or one of its stages) did, acted on once its transaction committed."""

    report: lifecycle.Report = dataclasses.field(default_factory=lifecycle.Report)
    now: dt.datetime | None = None
    planned: bool = False
    started: bool = False
    advanced: bool = False
    claimed: list[executor.Claimed] = dataclasses.field(default_factory=list)


class Engine:
    def __init__(
        self,
        services: executor.Services,
        rules: RulesSource,
        settings: EngineSettings,
        *,
        owner: str | None = None,
    ) -> None:
        self.services = services
        self.rules = rules
        self.settings = settings
        self.owner = owner or f"worker-{uuid.uuid4().hex[:12]}"
        self.runner = executor.StepRunner(
            services, owner=self.owner, lease_seconds=settings.lease_seconds
        )
        self.runner.on_report = self.publish
        self.runner.follow_up = self._follow_up
        self._wake = asyncio.Event()
        self._in_flight: dict[int, asyncio.Task[None]] = {}
        self._gpu_fleet: cluster_port.GpuFleet | None = None
        self._resolver: targeting.NodeResolver | None = None
        self._silence_check = 0.0
        self._hint_sweep_at = float("-inf")  # (monotonic)
        self._held_recheck_at: dt.datetime | None = None  # (the clock's)
        self._swept_rules: playbooks.PlaybookIndex | None = None  # the rules at the last sweep
        self._woken = False
        self._stopping = False
        # Sweeping expired leases is a singleton loop: the app points this at leadership.
        self.is_leader: Callable[[], bool] = lambda: True

    def wake(self) -> None:
        self._woken = True
        self._wake.set()

    async def run_forever(self) -> None:
        """Passes until ``stop``. A pass that raises never ends the loop: the next poll tries
        again, and the observer counts the failures (``/readyz`` turns not-ready on a streak)."""
        failures = 0  # in a row: the first logs its traceback, the rest one line each
        # The GPU nodes listed (and their watch started) before the first alert, not in front
        # of it (a large fleet's list took the first pass half a second).
        with contextlib.suppress(Exception):
            await self._fleet()
        while not self._stopping:
            try:
                await self._sweep_hints()
                busy = await self.tick()
            except Exception as e:
                failures += 1
                if isinstance(e, errors.StoreUnavailable):
                    logger.warning("engine pass skipped: %s", e)
                else:
                    logger.error(
                        "engine pass failed (%d in a row): %r", failures, e, exc_info=failures == 1
                    )
                self.services.observer.pass_finished(at=self.services.clock(), error=e)
                busy = False
            else:
                failures = 0
                self.services.observer.pass_finished(at=self.services.clock())
            if not busy:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.settings.poll_interval)
            self._wake.clear()
            await asyncio.sleep(self.settings.min_pass_interval)

    async def _sweep_hints(self) -> None:
        """The leader, every ``HINT_SWEEP_INTERVAL`` seconds: hint the runs to advance that
        no hint names, and wake the parked runs whose wait is over. The advance stage reads
        only hinted runs (and unhandled resolutions), the start stage only unparked ones;
        every transaction that may leave a run to advance hints it, and every release wakes
        the runs parked behind it, so this finds none, but a replica of an older version
        during a rolling upgrade does neither, and a run left unseen would never converge.
        Also at once after the rules are reloaded: a playbook whose concurrency was raised
        has runs waiting for slots it now has, and one whose budget grew has held steps
        that may go (every step a guard holds is looked at again)."""
        index = self.rules.index
        reloaded = self._swept_rules is not None and index is not self._swept_rules
        if not self.is_leader() or (time.monotonic() < self._hint_sweep_at and not reloaded):
            return
        self._hint_sweep_at = time.monotonic() + HINT_SWEEP_INTERVAL
        self._swept_rules = index
        hinted = await self.services.store.hint_runs_to_advance()
        if hinted:
            logger.warning("%d runs to advance had no hint; hinted now", hinted)
        woken = await self.services.store.wake_parked_runs(functools.partial(_concurrency, index))
        if woken and reloaded:
            logger.info("%d runs waiting for a slot may start under the reloaded rules", woken)
        elif woken:
            logger.warning("%d runs waited for a lock no one held; woken now", woken)
        if reloaded:  # a playbook's budget may have grown: its held steps are looked at again
            await self.services.store.run("wake held steps", lambda tx: tx.wake_steps(None))

    async def _recheck_held(self) -> None:
        """The leader, every ``guards.recheck``: the first step in line for each disruption
        budget is looked at again. The others wait to be woken, each by a node leaving the
        budget or by the step before it going on (``guarding.Gate.admit``), or for their
        ``guards.budget_recheck``: rechecking every held step every few seconds cost a storm
        held by its budget a recheck a held step each time. The first one's recheck finds
        room the fleet's growth made, and trips the breaker once the storm's runs exceed it."""
        now = self.services.clock()
        if not self.is_leader() or (self._held_recheck_at and now < self._held_recheck_at):
            return
        self._held_recheck_at = now + self.settings.guards.recheck
        await self.services.store.wake_first_held("budget:")

    async def tick(self) -> bool:
        """One pass over the kinds of work that exist. Returns whether anything happened.

        A read-only probe comes first, so an idle pass takes no write lock (on SQLite the
        webhook's commits would otherwise queue behind empty engine transactions). Then the
        cluster is asked what it must be asked (which node each new episode is about, the GPU
        node list the guards count), and everything else happens in ONE transaction: each
        kind of work feeds the next, so a new episode's run is created, started, given its
        first due step and has it claimed, with the step's context loaded, by one commit.
        The leader first makes the first held step in line for each budget due when its
        recheck is (``_recheck_held``).
        """
        await self._recheck_held()
        work = await self.services.store.probe()
        swept = work.expired and self.is_leader() and await self.sweep()
        busy = bool(swept)
        if work.episodes or work.startable or work.advance or work.due:
            index = self.rules.index
            targets = await self._targets(index) if work.episodes else None
            room = self._room()
            gate = await self._gate(index) if room > 0 else None

            def one_pass(tx: store.Tx, done: _Pass) -> None:
                done.planned = bool(work.episodes) and self._plan(tx, index, targets, done)
                if done.planned and tx.should_yield():
                    return  # the webhook waits: the rest follows in the next pass
                started = (work.startable or done.planned) and self._start(tx, index, done)
                done.started = bool(started)
                if done.started and tx.should_yield():
                    return
                done.advanced = bool(work.advance or started) and self._advance(tx, done)
                if gate is not None and (work.due or done.advanced) and not tx.should_yield():
                    self._claim(tx, gate, room, done)

            done = await self._transaction("pass", one_pass)
            await self._after(done)
            busy |= done.planned or done.started or done.advanced or bool(done.claimed)
            busy |= bool(done.report.steps_woken)  # (due now: the next pass claims them)
        await self._expire_silences()
        return busy

    async def handle_episodes(self) -> bool:
        """Plan runs for unhandled episodes (one stage of ``tick``, in its own transaction)."""
        index = self.rules.index
        targets = await self._targets(index)

        def work(tx: store.Tx, done: _Pass) -> None:
            done.planned = self._plan(tx, index, targets, done)

        done = await self._transaction("episodes", work)
        await self._after(done)
        return done.planned

    async def _transaction(self, operation: str, work: Callable[[store.Tx, _Pass], None]) -> _Pass:
        """``work`` in one transaction, its units without savepoints unless one fails (then
        again, each in its own: ``isolation.transaction``); what it did, once committed."""

        def attempt(tx: store.Tx) -> _Pass:
            done = _Pass(now=tx.now)
            work(tx, done)
            return done

        return await isolation.transaction(self.services.store, operation, attempt)

    def _plan(
        self,
        tx: store.Tx,
        index: playbooks.PlaybookIndex,
        targets: dict[int, lifecycle.Targets] | None,
        done: _Pass,
    ) -> bool:
        registry, dry_run = self.services.registry, self.settings.dry_run
        handled = 0
        episodes = tx.lock_unhandled_episodes(self.settings.batch)
        # (not in ``targets``: arrived after they were read, or the cluster was silent)
        chosen = {
            episode.id: self._episode_targets(targets, episode, index)
            for episode in episodes
            if targets is None or episode.id in targets
        }
        nodes = {
            choice.node
            for episode in episodes
            if episode.status is alerts.AlertStatus.FIRING and episode.id in chosen
            for choice in chosen[episode.id].values()
            if choice.node
        }
        if nodes:  # each new run's repeat-offender count, read for the batch at once
            tx.count_runs_by_node(nodes, since=lifecycle.repeat_window(tx))
        for episode in episodes:
            if handled and tx.should_yield():
                break  # the rest stay unhandled for the next pass
            if episode.id not in chosen:
                continue
            isolation.run_unit(
                tx,
                f"episode:{episode.id}",
                functools.partial(
                    lifecycle.handle_episode,
                    tx,
                    episode,
                    index=index,
                    registry=registry,
                    dry_run=dry_run,
                    guard_base=self.settings.guards,
                    report=done.report,
                    targets=chosen[episode.id],
                ),
                quarantine=functools.partial(lifecycle.quarantine_episode, tx, episode),
                report=done.report,
            )
            handled += 1
        return bool(handled)

    def _episode_targets(
        self,
        targets: dict[int, lifecycle.Targets] | None,
        episode: records.Episode,
        index: playbooks.PlaybookIndex,
    ) -> lifecycle.Targets:
        if targets is not None:
            return targets[episode.id]
        order = self.settings.node_labels  # no cluster to ask: the labels, unconfirmed
        return {
            p.name: targeting_rules.unverified(episode.labels, planning.node_order(p, order))
            for p in index.match(episode.labels)
        }

    async def _targets(self, index: playbooks.PlaybookIndex) -> dict[int, lifecycle.Targets] | None:
        """The confirmed node of every unhandled firing episode, per matching playbook, read
        before the transaction that plans their runs (the cluster is never asked inside one).
        ``None`` without a cluster. An episode the cluster cannot answer for is left out, so
        it waits for a later pass; past ``targeting_wait`` it is planned as failed."""
        cluster = self.services.cluster
        if cluster is None:
            return None
        if self._resolver is None or self._resolver.cluster is not cluster:
            self._resolver = targeting.NodeResolver(cluster, ttl=self.settings.targeting_ttl)
        episodes = await self.services.store.read(
            "episodes.peek", lambda tx: tx.lock_unhandled_episodes(self.settings.batch)
        )
        now = self.services.clock()
        resolver = self._resolver
        firing = [e for e in episodes if e.status is alerts.AlertStatus.FIRING]
        # The cluster is asked about every episode of the batch at once (a storm's new nodes
        # are each a read: one after the other, they were most of a pass's time).
        answers = await asyncio.gather(
            *(self._choose(episode, index, resolver) for episode in firing),
            return_exceptions=True,
        )
        found: dict[int, lifecycle.Targets] = {
            e.id: {} for e in episodes if e.status is not alerts.AlertStatus.FIRING
        }
        for episode, answer in zip(firing, answers, strict=True):
            if isinstance(answer, targeting.TargetUnavailable):
                if now - episode.created_at < self.settings.targeting_wait:
                    logger.warning("episode %s waits for its node: %s", episode.id, answer)
                    continue
                failed = targeting_rules.Choice(node=None, reason=f"no node confirmed: {answer}")
                found[episode.id] = {p.name: failed for p in index.match(episode.labels)}
            elif isinstance(answer, BaseException):
                raise answer
            else:
                found[episode.id] = answer
        return found

    async def _choose(
        self,
        episode: records.Episode,
        index: playbooks.PlaybookIndex,
        resolver: targeting.NodeResolver,
    ) -> lifecycle.Targets:
        chosen: dict[str, targeting_rules.Choice] = {}
        for playbook in index.match(episode.labels):
            order = planning.node_order(playbook, self.settings.node_labels)
            chosen[playbook.name] = await resolver.choose(episode.labels, order)
        return chosen

    async def start_runs(self) -> bool:
        """Start pending runs (one stage of ``tick``, in its own transaction)."""
        index = self.rules.index

        def work(tx: store.Tx, done: _Pass) -> None:
            done.started = self._start(tx, index, done)

        done = await self._transaction("start", work)
        await self._after(done)
        return done.started

    def _start(self, tx: store.Tx, index: playbooks.PlaybookIndex, done: _Pass) -> bool:
        started = False
        pending = tx.lock_pending_runs(self.settings.batch)
        tx.read_runs(run.id for run in pending)  # their steps (episodes when asked for)

        def concurrency(run: records.Run) -> int:
            return _concurrency(index, run.playbook)

        # Every run's locks in one statement; a run that does not start gives its up. If that
        # fails, each run takes its own in its unit (where a failure is that run's alone).
        try:
            with isolation.unit(tx):
                reserved = lifecycle.reserve_starts(tx, pending, concurrency)
        except (isolation.Isolate, errors.StoreUnavailable):
            raise
        except Exception:
            logger.exception("the starts' locks could not be taken together; one by one")
            reserved = {}
        for n, run in enumerate(pending):
            if n and tx.should_yield():  # come back for the rest; their locks in one go
                left = [key for later in pending[n:] for key in reserved.get(later.id, ())]
                lifecycle.release_reserved(tx, left)
                return True
            began = isolation.run_unit(
                tx,
                f"start:{run.id}",
                functools.partial(
                    lifecycle.start_run,
                    tx,
                    run,
                    concurrency=concurrency(run),
                    report=done.report,
                    reserved=reserved.get(run.id),
                ),
                quarantine=self._quarantine_run(tx, run.id, done.report),
                report=done.report,
            )
            if began is None:  # failed: its unit's changes are undone, not the reservation
                lifecycle.release_reserved(tx, reserved.get(run.id, ()))
            started |= bool(began)
        return started

    async def advance_runs(self) -> bool:
        """Make the next steps of running runs due (one stage of ``tick``, on its own)."""

        def work(tx: store.Tx, done: _Pass) -> None:
            done.advanced = self._advance(tx, done)

        done = await self._transaction("advance", work)
        await self._after(done)
        return done.advanced

    def _advance(self, tx: store.Tx, done: _Pass) -> bool:
        registry = self.services.registry
        candidates = tx.active_runs_with_no_active_step(self.settings.batch)
        tx.read_runs(run.id for run in candidates)
        for n, run in enumerate(candidates):
            if n and tx.should_yield():
                break
            isolation.run_unit(
                tx,
                f"advance:{run.id}",
                functools.partial(
                    lifecycle.advance_run, tx, run, registry=registry, report=done.report
                ),
                quarantine=self._quarantine_run(tx, run.id, done.report),
                report=done.report,
            )
        return bool(candidates)

    def _room(self) -> int:
        if self._stopping:
            return 0
        return self.settings.max_concurrent_steps - len(self._in_flight)

    async def _gate(self, index: playbooks.PlaybookIndex) -> guarding.Gate:
        return guarding.Gate(
            base=self.settings.guards,
            index=index,
            disruptive_actions=self.disruptive_actions,
            fleet=await self._fleet(),
        )

    async def claim_steps(self) -> bool:
        """Claim due steps and start them (one stage of ``tick``, in its own transaction)."""
        room = self._room()
        if room <= 0:
            return False
        gate = await self._gate(self.rules.index)
        done = await self._transaction("claim", lambda tx, done: self._claim(tx, gate, room, done))
        await self._after(done)
        return bool(done.claimed)

    def _claim(self, tx: store.Tx, gate: guarding.Gate, room: int, done: _Pass) -> None:
        """Claim due steps (the guards admit disruptive ones) and load what each one acts
        on, so its runner starts at once, with no transaction of its own to read it."""
        until = lifecycle.lease_until(tx.now, self.settings.lease_seconds)
        for n, step in enumerate(self._reading_ahead(tx, tx.lock_due_steps(room))):
            if n and tx.should_yield():
                break  # still due: the next pass claims it
            moved = isolation.run_unit(
                tx,
                f"claim:{step.run_id}",
                functools.partial(self._admit_and_claim, tx, gate, step, until, done.report),
                quarantine=self._quarantine_run(tx, step.run_id, done.report),
                report=done.report,
            )
            if moved is not None:
                done.claimed.append(executor.load_claimed(tx, moved))

    @staticmethod
    def _reading_ahead(
        tx: store.Tx, steps: Iterable[records.Step], ahead: int = 16
    ) -> Iterator[records.Step]:
        """``steps``, with the runs and episodes of the next ``ahead`` read in two statements
        before they are claimed (each claim read its run and its episode, one statement each,
        when an earlier pass had started the run), and their nodes noted for the guards."""
        source = iter(steps)
        while chunk := list(itertools.islice(source, ahead)):
            tx.read_runs((step.run_id for step in chunk), steps=False)
            # their guard decisions' node disruptions, read together at the first of them
            tx.note_guard_nodes(
                run.node
                for step in chunk
                if (run := tx.get_run(step.run_id)) is not None and run.node is not None
            )
            yield from chunk

    async def _after(self, done: _Pass) -> None:
        """What follows a committed pass: metrics and notices, then the claimed steps run."""
        await self.publish(done.report)
        await self._silence([claimed.step for claimed in done.claimed])
        for claimed in done.claimed:
            step = claimed.step
            if step.due_at is not None and done.now is not None:
                self.services.observer.claim_lag((done.now - step.due_at).total_seconds())
            task = asyncio.create_task(self._run_step(claimed), name=f"step-{step.id}")
            self._in_flight[step.id] = task

    def _admit_and_claim(
        self,
        tx: store.Tx,
        gate: guarding.Gate,
        step: records.Step,
        until: dt.datetime,
        report: lifecycle.Report,
    ) -> records.Step | None:
        if not gate.admit(tx, step, report=report):
            return None
        return lifecycle.claim_step(tx, step, owner=self.owner, lease_until=until)

    def _quarantine_run(
        self, tx: store.Tx, run_id: int, report: lifecycle.Report
    ) -> Callable[[str], None]:
        return functools.partial(
            lifecycle.quarantine_run, tx, run_id, registry=self.services.registry, report=report
        )

    async def _silence(self, claimed: list[records.Step]) -> None:
        silencer = self.services.silencer
        if silencer is None:
            return
        disruptive = self.disruptive_actions
        for run_id in {s.run_id for s in claimed if s.action in disruptive}:
            await silencing.start(silencer, self.services.store, self.rules.index, run_id)

    async def _expire_silences(self) -> None:
        """After a wake-up (a run may have ended) or every few seconds, not on every pass."""
        silencer = self.services.silencer
        if silencer is None:
            return
        now = time.monotonic()
        if not self._woken and now < self._silence_check:
            return
        self._woken = False
        self._silence_check = now + 5.0
        await silencing.finish_ended(silencer, self.services.store)

    @property
    def disruptive_actions(self) -> frozenset[str]:
        return frozenset(a.name for a in self.services.registry.all() if a.disruptive)

    async def _fleet(self) -> cluster_port.FleetSnapshot | None:
        """The GPU nodes and their labels (for percentage and per-pool budgets and the
        driver-upgrade hold) as the cluster's node watch keeps them: listed once when the
        engine starts, then changed as the watch reports, never listed per pass (listing
        5,800 nodes every 15 s held a pass, and every alert behind it, 150 ms). ``None``
        without a cluster or while its nodes could never be listed."""
        cluster = self.services.cluster
        if cluster is None:
            return None
        if self._gpu_fleet is None:  # the adapter logs a list that failed, once a streak
            self._gpu_fleet = await cluster.gpu_fleet()
        return None if self._gpu_fleet is None else self._gpu_fleet.snapshot()

    async def publish(self, report: lifecycle.Report) -> None:
        """After a transaction committed: metrics, and what on-call should hear about."""
        observer = self.services.observer
        if report.runs_created:
            observer.runs_created(report.runs_created)
        for run in report.finished:
            observer.run_finished(run.playbook, run.status.value)
        for unit in report.quarantined:
            observer.quarantined(unit)
        for notice in report.notices:
            observer.notice(notice.kind)
            await self._tell(notice)
        for reason in report.breaker_opened:
            await self._announce_breaker(reason)

    async def _tell(self, notice: lifecycle.Notice) -> None:
        where = f" on node {notice.node}" if notice.node else ""
        run = f"run {notice.run_id} ({notice.playbook})" if notice.run_id else notice.playbook
        message = f"remediator: {run}{where}: {notice.reason}."
        if notice.unblock:
            message += f" It goes on when {notice.unblock}."
        try:
            await self.services.notifier.send(
                channel=self.settings.guard_channel,
                message=message,
                data={
                    "event": notice.kind,
                    "reason": notice.reason,
                    "run_id": notice.run_id,
                    "playbook": notice.playbook,
                    "node": notice.node,
                },
                idempotency_key=notice.key,
            )
        except errors.RemediatorError as e:
            logger.error("could not send the %s notice for %s: %s", notice.kind, run, e)

    async def _announce_breaker(self, reason: str) -> None:
        try:
            await self.services.notifier.send(
                channel=self.settings.guard_channel,
                message=f"remediator circuit breaker opened: {reason}. Disruptive steps wait "
                "until an operator resets it (remediator breaker reset).",
                data={"event": "breaker_opened", "reason": reason},
                idempotency_key=f"breaker-{reason}",
            )
        except errors.RemediatorError as e:
            logger.error("could not announce the open breaker: %s", e)

    async def _run_step(self, claimed: executor.Claimed) -> None:
        """Run a claimed step, then each next step of its run that the transaction recording
        the one before claimed (in this task and its slot: no engine pass in between)."""
        current: executor.Claimed | None = claimed
        step = claimed.step
        try:
            while current is not None:
                step = current.step
                current = await self.runner.run(step, current)
                if current is not None:
                    task = self._in_flight.pop(step.id, None)
                    if task is not None:
                        self._in_flight[current.step.id] = task
                    await self._silence([current.step])
        except errors.StoreUnavailable as e:
            logger.warning("step %s outcome not recorded (%s); its lease will expire", step.id, e)
        except Exception:
            logger.exception("step %s crashed the runner; its lease will expire", step.id)
        finally:
            self._in_flight.pop(step.id, None)
            self.wake()

    def _follow_up(
        self, tx: store.Tx, finished: records.Step, report: lifecycle.Report
    ) -> executor.Claimed | None:
        """In the transaction that recorded ``finished``: advance its run and claim the next
        step when it may start now, as a pass would (the same guards, isolation and
        quarantine). A step of a multi-step playbook starts as soon as the one before it is
        recorded, not after another probe and pass."""
        if self._stopping or finished.status not in runs.STEP_TERMINAL:
            return None  # a retry stays with its due time; a stopping worker claims nothing
        fleet = None
        if self.services.cluster is not None:
            if self._gpu_fleet is None:
                return None  # the guards cannot count the fleet yet: the next pass does it
            fleet = self._gpu_fleet.snapshot()
        run = tx.get_run(finished.run_id)
        if run is None or run.status is not runs.RunStatus.RUNNING:
            return None
        gate = guarding.Gate(
            base=self.settings.guards,
            index=self.rules.index,
            disruptive_actions=self.disruptive_actions,
            fleet=fleet,
        )
        return isolation.run_unit(
            tx,
            f"advance:{run.id}",
            functools.partial(self._next_step, tx, run, gate, report),
            quarantine=self._quarantine_run(tx, run.id, report),
            report=report,
        )

    def _next_step(
        self, tx: store.Tx, run: records.Run, gate: guarding.Gate, report: lifecycle.Report
    ) -> executor.Claimed | None:
        if any(runs.under_way(step.status, step.due_at) for step in tx.steps_of_run(run.id)):
            return None  # another step of the run is under way (or parked for approval)
        lifecycle.advance_run(tx, run, registry=self.services.registry, report=report)
        due = [
            step
            for step in tx.steps_of_run(run.id)
            if step.status is runs.StepStatus.PENDING
            and step.due_at is not None
            and step.due_at <= tx.now
        ]
        if not due:
            return None
        until = lifecycle.lease_until(tx.now, self.settings.lease_seconds)
        moved = self._admit_and_claim(tx, gate, due[0], until, report)
        return executor.load_claimed(tx, moved) if moved is not None else None

    async def wait_in_flight(self) -> None:
        """Wait for the steps this worker is running (tests and shutdown use it)."""
        while self._in_flight:
            await asyncio.gather(*self._in_flight.values(), return_exceptions=True)

    async def settle(self, max_passes: int = 200) -> None:
        """Run passes until nothing is left to do now (for tests and the demo)."""
        for _ in range(max_passes):
            # Steps that were running when the pass began may have finished during it, after
            # its probe: their outcomes are work for another pass.
            flying = bool(self._in_flight)
            busy = await self.tick()
            if self._in_flight or flying:
                await self.wait_in_flight()
                continue
            if not busy:
                return
        raise RuntimeError(f"engine still busy after {max_passes} passes")

    async def sweep(self) -> bool:
        """Hand back steps whose worker stopped renewing its lease (crashed or partitioned);
        after ``max_lost_leases`` beyond the step's attempts, and once its retry time is
        spent, end it as failed instead (a step that kills its workers)."""
        mine = set(self._in_flight)
        registry = self.services.registry
        report = lifecycle.Report()

        def work(tx: store.Tx) -> bool:
            expired = tx.expired_leases(self.settings.batch)
            for step in expired:
                if step.id in mine:
                    continue
                retry_at = step.retry.next_attempt_at(
                    attempt=max(step.attempt - self.settings.max_lost_leases, 0),
                    now=tx.now,
                    first_attempt_at=step.started_at,
                )
                give_up = retry_at is None
                reason = (
                    f"worker {step.lease_owner} lost; gave up after {step.attempt} attempts"
                    if give_up
                    else f"lease of {step.lease_owner} expired; re-queued (effect re-checked)"
                )
                lifecycle.release_step(
                    tx, step, reason=reason, give_up=give_up, registry=registry, report=report
                )
            return bool(expired)

        swept = await self.services.store.run("sweep", work)
        await self.publish(report)
        return swept

    async def stop(self) -> None:
        """Stop claiming; let in-flight steps finish within the grace period; hand back the rest."""
        self._stopping = True
        self.wake()
        if not self._in_flight:
            return
        tasks = list(self._in_flight.values())
        _, pending = await asyncio.wait(tasks, timeout=self.settings.shutdown_grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self._release_own_leases()

    async def _release_own_leases(self) -> None:
        registry = self.services.registry

        def work(tx: store.Tx) -> None:
            for step in tx.steps_leased_by(self.owner):
                lifecycle.release_step(
                    tx,
                    step,
                    reason="worker shutting down; handed back (effect re-checked)",
                    give_up=False,
                    registry=registry,
                )

        with contextlib.suppress(errors.StoreUnavailable):
            await self.services.store.run("release", work)
