"""The engine loop: handle new episodes, start and advance runs, claim and run steps, sweep.

Each pass is a few short transactions. Several replicas can run it against one Postgres: every
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
import logging
import time
import uuid
from collections.abc import Callable
from typing import Protocol

from remediator.domain import alerts, errors, playbooks, records
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
from remediator.ports import store

logger = logging.getLogger("remediator.engine")


class RulesSource(Protocol):
    @property
    def index(self) -> playbooks.PlaybookIndex: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineSettings:
    poll_interval: float = 1.0
    min_pass_interval: float = 0.02
    lease_seconds: float = 30.0
    max_concurrent_steps: int = 16
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
        self._wake = asyncio.Event()
        self._in_flight: dict[int, asyncio.Task[None]] = {}
        self._gpu_nodes: tuple[dt.datetime, dict[str, dict[str, str]]] | None = None
        self._resolver: targeting.NodeResolver | None = None
        self._silence_check = 0.0
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
        while not self._stopping:
            try:
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
            # Gather what arrives meanwhile into the next pass instead of one pass per delivery.
            await asyncio.sleep(self.settings.min_pass_interval)

    async def tick(self) -> bool:
        """One pass over the kinds of work that exist. Returns whether anything happened.

        A read-only probe comes first, so an idle pass takes no write lock (on SQLite the
        webhook's commits would otherwise queue behind empty engine transactions).
        """
        work = await self.services.store.probe()
        planned = work.episodes and await self.handle_episodes()
        swept = work.expired and self.is_leader() and await self.sweep()
        # Each kind of work feeds the next within the same pass: a new episode's run starts,
        # gets its first step and has it claimed now, not one poll interval per stage later.
        started = (work.startable or planned) and await self.start_runs()
        advanced = (work.advance or started) and await self.advance_runs()
        claimed = (work.due or advanced) and await self.claim_steps()
        await self._expire_silences()
        return bool(planned or swept or started or advanced or claimed)

    async def handle_episodes(self) -> bool:
        index, registry, dry_run = self.rules.index, self.services.registry, self.settings.dry_run
        targets = await self._targets(index)

        report = lifecycle.Report()

        def work(tx: store.Tx) -> int:
            handled = 0
            for episode in tx.lock_unhandled_episodes(self.settings.batch):
                if handled and tx.should_yield():
                    break  # the rest stay unhandled for the next pass
                if targets is not None and episode.id not in targets:
                    continue  # arrived after the targets were read, or the cluster was silent
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
                        report=report,
                        targets=self._episode_targets(targets, episode, index),
                    ),
                    quarantine=functools.partial(lifecycle.quarantine_episode, tx, episode),
                    report=report,
                )
                handled += 1
            return handled

        handled = await self.services.store.run("episodes", work)
        await self.publish(report)
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
        episodes = await self.services.store.run(
            "episodes.peek", lambda tx: tx.lock_unhandled_episodes(self.settings.batch)
        )
        now = self.services.clock()
        found: dict[int, lifecycle.Targets] = {}
        for episode in episodes:
            if episode.status is not alerts.AlertStatus.FIRING:
                found[episode.id] = {}
                continue
            try:
                found[episode.id] = await self._choose(episode, index, self._resolver)
            except targeting.TargetUnavailable as e:
                if now - episode.created_at < self.settings.targeting_wait:
                    logger.warning("episode %s waits for its node: %s", episode.id, e)
                    continue
                failed = targeting_rules.Choice(node=None, reason=f"no node confirmed: {e}")
                found[episode.id] = {p.name: failed for p in index.match(episode.labels)}
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
        index = self.rules.index

        report = lifecycle.Report()

        def work(tx: store.Tx) -> bool:
            started = False
            for n, run in enumerate(tx.lock_pending_runs(self.settings.batch)):
                if n and tx.should_yield():
                    return True  # come back for the rest
                playbook = index.get(run.playbook)
                concurrency = playbook.concurrency if playbook else 1
                started |= bool(
                    isolation.run_unit(
                        tx,
                        f"start:{run.id}",
                        functools.partial(
                            lifecycle.start_run, tx, run, concurrency=concurrency, report=report
                        ),
                        quarantine=self._quarantine_run(tx, run.id, report),
                        report=report,
                    )
                )
            return started

        started = await self.services.store.run("start", work)
        await self.publish(report)
        return started

    async def advance_runs(self) -> bool:
        report = lifecycle.Report()
        registry = self.services.registry

        def work(tx: store.Tx) -> bool:
            candidates = tx.active_runs_with_no_active_step(self.settings.batch)
            for n, run in enumerate(candidates):
                if n and tx.should_yield():
                    break
                isolation.run_unit(
                    tx,
                    f"advance:{run.id}",
                    functools.partial(
                        lifecycle.advance_run, tx, run, registry=registry, report=report
                    ),
                    quarantine=self._quarantine_run(tx, run.id, report),
                    report=report,
                )
            return bool(candidates)

        busy = await self.services.store.run("advance", work)
        await self.publish(report)
        return busy

    async def claim_steps(self) -> bool:
        if self._stopping:
            return False
        room = self.settings.max_concurrent_steps - len(self._in_flight)
        if room <= 0:
            return False
        gate = guarding.Gate(
            base=self.settings.guards,
            index=self.rules.index,
            disruptive_actions=self.disruptive_actions,
            fleet=await self._fleet(),
        )
        report = lifecycle.Report()

        def work(tx: store.Tx) -> tuple[list[records.Step], dt.datetime, list[str]]:
            until = lifecycle.lease_until(tx.now, self.settings.lease_seconds)
            claimed = []
            for n, step in enumerate(tx.lock_due_steps(room)):
                if n and tx.should_yield():
                    break  # still due: the next pass claims it
                moved = isolation.run_unit(
                    tx,
                    f"claim:{step.run_id}",
                    functools.partial(self._admit_and_claim, tx, gate, step, until, report),
                    quarantine=self._quarantine_run(tx, step.run_id, report),
                    report=report,
                )
                if moved is not None:
                    claimed.append(moved)
            return claimed, tx.now, gate.tripped

        claimed, now, tripped = await self.services.store.run("claim", work)
        await self.publish(report)
        for reason in tripped:
            await self._announce_breaker(reason)
        await self._silence(claimed)
        for step in claimed:
            if step.due_at is not None:
                self.services.observer.claim_lag((now - step.due_at).total_seconds())
            task = asyncio.create_task(self._run_step(step), name=f"step-{step.id}")
            self._in_flight[step.id] = task
        return bool(claimed)

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

    async def _fleet(self) -> dict[str, dict[str, str]] | None:
        """The GPU nodes and their labels (for percentage and per-pool budgets and the
        driver-upgrade hold), refreshed every ``guarding.FLEET_REFRESH``; ``None``
        without a cluster or while it cannot be listed."""
        cluster = self.services.cluster
        if cluster is None:
            return None
        now = self.services.clock()
        if self._gpu_nodes is None or now - self._gpu_nodes[0] > guarding.FLEET_REFRESH:
            try:
                nodes = await cluster.list_nodes(getattr(cluster, "gpu_node_selector", ""))
            except errors.RemediatorError as e:
                logger.warning("cannot list GPU nodes (%s); percentage budget not applied", e)
                return None if self._gpu_nodes is None else self._gpu_nodes[1]
            self._gpu_nodes = (now, {node.name: dict(node.labels) for node in nodes})
        return self._gpu_nodes[1]

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

    async def _run_step(self, step: records.Step) -> None:
        try:
            await self.runner.run(step)
        except errors.StoreUnavailable as e:
            logger.warning("step %s outcome not recorded (%s); its lease will expire", step.id, e)
        except Exception:
            logger.exception("step %s crashed the runner; its lease will expire", step.id)
        finally:
            self._in_flight.pop(step.id, None)
            self.wake()

    async def wait_in_flight(self) -> None:
        """Wait for the steps this worker is running (tests and shutdown use it)."""
        while self._in_flight:
            await asyncio.gather(*self._in_flight.values(), return_exceptions=True)

    async def settle(self, max_passes: int = 200) -> None:
        """Run passes until nothing is left to do now (for tests and the demo)."""
        for _ in range(max_passes):
            busy = await self.tick()
            if self._in_flight:
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
