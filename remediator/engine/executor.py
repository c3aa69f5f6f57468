"""Running one claimed step: check, apply (or undo), record the outcome.

The step was claimed with a lease in its own transaction before anything here runs, so the
attempt is on record. While the action works, a heartbeat renews the lease and saves progress;
if the lease is lost (the sweeper gave the step to another worker after this one stalled), the
action is cancelled and its result discarded — the other worker's ``check`` will find whatever
effect it left. Outcomes are classified, never raised: success, temporary failure (retried at a
persisted time, for as long as the step's retry policy allows), permanent failure
(``on_failure`` decides whether the run stops). A ``ClusterError`` the action let escape is
classified by its own ``temporary`` flag. Whether the attempt reached ``apply`` is part of the
outcome: a failure after that point leaves the effect ``unknown``, and undo counts it.

An attempt that failed with ``maybe_applied`` recorded what its undo needs (previous values).
Later attempts must not lose it: until an attempt succeeds, the step's output keeps those keys
under whatever a later attempt reports (its progress, its failure, a cancellation when the alert
resolved), and the action gets that output as ``ctx.applied_output``, so an attempt that finds
the effect in place, or completes it, records the values from before the first write instead
of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic

from remediator.domain import alerts, errors, playbooks, records, runs, transitions
from remediator.engine import isolation, lifecycle
from remediator.ports import actions, cluster, notify, observe, silences, store

logger = logging.getLogger("remediator.engine")

MAYBE_APPLIED = "maybe_applied"


@dataclasses.dataclass(kw_only=True)
class Services:
    """What steps may use. The composition root fills ``cluster`` once it has connected."""

    store: store.Store
    registry: actions.Registry
    notifier: notify.Notifier
    cluster: cluster.Cluster | None
    clock: Callable[[], dt.datetime]
    observer: observe.Observer
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    silencer: silences.Silencer | None = None

    async def node_holders(self, node: str) -> list[int]:
        """The runs holding ``node``'s lock, read when an action asks (``node_holders``)."""
        key = lifecycle.node_lock_key(node)
        holder = await self.store.run("node.holders", lambda tx: tx.lock_holder(key))
        return [] if holder is None else [holder]

    def for_actions(self) -> dict[str, Any]:
        """What ``ActionContext.services`` holds: the root's ``extra`` and the engine's own
        ``node_holders`` (the uncordon action refuses a node another run holds)."""
        return {**self.extra, "node_holders": self.node_holders}

    def context(
        self,
        run: records.Run,
        step: records.Step,
        *,
        episode: records.Episode | None,
        applied_output: dict[str, Any],
        progress: actions.ProgressFn = actions.no_progress,
    ) -> actions.ActionContext:
        """The context ``step`` of ``run`` acts in (the executor's, and the reconciler's to
        observe a step's effect)."""
        return actions.ActionContext(
            run_id=run.id,
            step_id=step.id,
            step_key=step.key,
            attempt=step.attempt,
            playbook=run.playbook,
            node=run.node,
            gpu=run.gpu,
            labels=episode.labels if episode else {},
            annotations=episode.annotations if episode else {},
            dry_run=run.dry_run,
            now=self.clock,
            notifier=self.notifier,
            cluster=self.cluster,
            services=self.for_actions(),
            applied_output=applied_output,
            progress=progress,
        )


_Result = transitions.Result


def kept_output(step: records.Step) -> dict[str, Any]:
    """The output of an earlier attempt whose effect may be in place, else nothing."""
    return dict(step.output) if step.output.get(MAYBE_APPLIED) else {}


@dataclasses.dataclass
class _Outcome:
    step: records.Step
    result: _Result
    done: asyncio.Future[_Recorded | None]


@dataclasses.dataclass(frozen=True)
class _Recorded:
    report: lifecycle.Report
    next: Claimed | None  # the run's next step, claimed by the same transaction


#: What follows a recorded outcome in its transaction: the run's next step made due and,
#: when it may start now, claimed (the engine's guards decide), else ``None``.
FollowUp = Callable[[store.Tx, records.Step, lifecycle.Report], "Claimed | None"]


@dataclasses.dataclass(frozen=True)
class Claimed:
    """A step just claimed and what it acts on, read in the transaction that claimed it."""

    step: records.Step
    run: records.Run
    episode: records.Episode | None
    applied_output: dict[str, Any]


def load_claimed(tx: store.Tx, step: records.Step) -> Claimed:
    """``step``'s run, its alert and the output its undo (or a retry) starts from."""
    run = tx.get_run(step.run_id)
    assert run is not None
    episode = tx.get_episode(run.episode_id) if run.episode_id else None
    if step.undo_of is None:
        return Claimed(step, run, episode, kept_output(step))
    original = tx.get_step(step.undo_of)
    return Claimed(step, run, episode, dict(original.output) if original else {})


class _Recorder:
    """Records finished steps' outcomes with group commit: outcomes that arrive while one
    transaction records earlier ones go together into the next, each in a savepoint of its
    own. Steps of a burst finish side by side; one transaction (one commit, one link of the
    audit chain) per batch instead of per step keeps the engine ahead of a storm.

    Each outcome still stands alone: a step that changed hands is skipped, a lost
    compare-and-set or a bug fails that step's record only, and a database that is away
    fails every outcome of the batch, each raising to its own step as before."""

    def __init__(self, services: Services, *, owner: str) -> None:
        self.services = services
        self.owner = owner
        self.follow_up: FollowUp | None = None
        self._queue: list[_Outcome] = []
        self._writer: asyncio.Task[None] | None = None

    async def record(self, step: records.Step, result: _Result) -> _Recorded | None:
        """``step``'s recorded outcome; ``None`` if another worker owns it now."""
        outcome = _Outcome(step, result, asyncio.get_running_loop().create_future())
        self._queue.append(outcome)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write(), name="steps-finished")
        return await outcome.done

    async def _write(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                results = await isolation.transaction(
                    self.services.store, "step.finish", functools.partial(self._finish_all, batch)
                )
            except Exception as e:
                results = [e] * len(batch)
            except BaseException:
                for outcome in batch:
                    outcome.done.cancel()
                raise
            for outcome, result in zip(batch, results, strict=True):
                if outcome.done.done():  # its step was cancelled meanwhile
                    continue
                if isinstance(result, Exception):
                    outcome.done.set_exception(result)
                else:
                    outcome.done.set_result(result)

    def _finish_all(
        self, batch: list[_Outcome], tx: store.Tx
    ) -> list[_Recorded | Exception | None]:
        results: list[_Recorded | Exception | None] = []
        tx.read_runs(outcome.step.run_id for outcome in batch)
        for outcome in batch:
            try:
                with isolation.unit(tx):
                    finished = self._finish(tx, outcome)
            except isolation.Isolate:
                raise  # the batch again, each outcome in a savepoint
            except Exception as e:
                results.append(e)
                continue
            if finished is None:
                results.append(None)
                continue
            moved, report = finished
            # The outcome stands whatever follows (the follow-up isolates its own failures).
            follow = self.follow_up(tx, moved, report) if self.follow_up else None
            results.append(_Recorded(report, follow))
        return results

    def _finish(
        self, tx: store.Tx, outcome: _Outcome
    ) -> tuple[records.Step, lifecycle.Report] | None:
        current = tx.get_step(outcome.step.id)
        if current is None or current.lease_owner != self.owner:
            logger.warning("step %s changed hands; result not recorded", outcome.step.id)
            return None
        report = lifecycle.Report()
        moved = lifecycle.finish_step(
            tx,
            current,
            outcome.result,
            owner=self.owner,
            registry=self.services.registry,
            report=report,
        )
        return moved, report


class StepRunner:
    def __init__(self, services: Services, *, owner: str, lease_seconds: float) -> None:
        self.services = services
        self.owner = owner
        self.lease_seconds = lease_seconds
        # What a recorded outcome means for people (runs ended, notices): the engine sets it.
        self.on_report: Callable[[lifecycle.Report], Awaitable[None]] | None = None
        self._recorder = _Recorder(services, owner=owner)

    @property
    def follow_up(self) -> FollowUp | None:
        """Called in the transaction recording each outcome (the engine sets it)."""
        return self._recorder.follow_up

    @follow_up.setter
    def follow_up(self, value: FollowUp | None) -> None:
        self._recorder.follow_up = value

    async def run(self, step: records.Step, claimed: Claimed | None = None) -> Claimed | None:
        """Run a claimed step; ``claimed`` is what the claim read for it (else read here).
        Returns the run's next step if the transaction recording this one claimed it."""
        started = time.perf_counter()
        progress: dict[str, Any] = {}
        lost = asyncio.Event()
        heartbeat = asyncio.create_task(self._heartbeat(step, progress, lost))
        try:
            work = asyncio.create_task(self._execute(step, progress, claimed))
            lost_wait = asyncio.create_task(lost.wait())
            done, _ = await asyncio.wait({work, lost_wait}, return_when=asyncio.FIRST_COMPLETED)
            if work not in done:
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await work
                logger.warning("step %s lost its lease; result discarded", step.id)
                return None
            lost_wait.cancel()
            result = work.result()
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
        follow = await self._record(step, result)
        self.services.observer.step_finished(
            step.action, result.status.value, time.perf_counter() - started
        )
        return follow

    async def _heartbeat(
        self, step: records.Step, progress: dict[str, Any], lost: asyncio.Event
    ) -> None:
        # Renew at a third of the lease, and at least every 2 s so live progress (a drain's
        # evicted / blocked / remaining) reaches the API promptly.
        interval = max(min(self.lease_seconds / 3, 2.0), 0.05)
        while True:
            await asyncio.sleep(interval)
            try:
                output = kept_output(step) | progress
                kept = await self.services.store.run(
                    "heartbeat", functools.partial(self._renew, step.id, output)
                )
            except errors.StoreUnavailable:
                logger.warning("heartbeat for step %s failed; will retry", step.id)
                continue
            if not kept:
                lost.set()
                return

    def _renew(self, step_id: int, progress: dict[str, Any], tx: store.Tx) -> bool:
        until = lifecycle.lease_until(tx.now, self.lease_seconds)
        return tx.update_step_output(step_id, self.owner, progress, until)

    async def _context(
        self, step: records.Step, progress: dict[str, Any], claimed: Claimed | None
    ) -> tuple[records.Run, actions.ActionContext, bool]:
        if claimed is None:
            claimed = await self.services.store.read("load", lambda tx: load_claimed(tx, step))
        run, episode, applied = claimed.run, claimed.episode, claimed.applied_output

        async def report(update: dict[str, Any]) -> None:
            progress.clear()
            progress.update(update)

        ctx = self.services.context(
            run, step, episode=episode, applied_output=applied, progress=report
        )
        resolved = (
            run.kind is runs.RunKind.ALERT
            and episode is not None
            and episode.status is alerts.AlertStatus.RESOLVED
        )
        return run, ctx, resolved

    async def _execute(
        self, step: records.Step, progress: dict[str, Any], claimed: Claimed | None
    ) -> _Result:
        run, ctx, resolved = await self._context(step, progress, claimed)
        if (
            resolved
            and step.phase is runs.StepPhase.DO
            and run.on_resolve is not playbooks.ResolvePolicy.CONTINUE
        ):
            return _Result(
                status=runs.StepStatus.CANCELLED,
                output=kept_output(step),
                error="alert resolved before the step started",
            )
        try:
            action = self.services.registry.get(step.action)
        except KeyError:
            return self._failed(f"unknown action {step.action!r}")
        try:
            params = action.parse(step.params)
        except pydantic.ValidationError as e:
            return self._failed(f"invalid params: {e.error_count()} errors")
        undoing = (
            step.phase is runs.StepPhase.UNDO
            and step.undo is not None
            and step.undo.mode is records.UndoMode.UNDO
        )
        if run.dry_run:
            verb = "undo" if undoing else "apply"
            return _Result(
                status=runs.StepStatus.SUCCEEDED,
                output={"dry_run": True, "would": f"{verb} {action.describe(params)}"},
            )
        reached: list[bool] = []
        try:
            async with asyncio.timeout(step.timeout_seconds):
                return await self._attempt(action, ctx, params, undoing=undoing, reached=reached)
        except TimeoutError:
            message = f"timed out after {step.timeout_seconds:g}s"
            return self._failure(step, message, temporary=True, reached=bool(reached))
        except errors.ActionFailed as e:
            maybe = bool(reached) or bool(e.output.get(MAYBE_APPLIED))
            return self._failure(
                step,
                str(e),
                temporary=e.temporary,
                retry_after=e.retry_after,
                output=e.output,
                reached=maybe,
            )
        except cluster.ClusterError as e:  # escaped the action: its own flag classifies it
            return self._failure(step, str(e), temporary=e.temporary, reached=bool(reached))
        except Exception as e:  # an action bug must not kill the worker
            logger.exception("action %s raised", step.action)
            message = f"{type(e).__name__}: {e}"
            return self._failure(step, message, temporary=False, reached=bool(reached))

    async def _attempt(
        self,
        action: actions.Action[Any],
        ctx: actions.ActionContext,
        params: pydantic.BaseModel,
        *,
        undoing: bool,
        reached: list[bool],
    ) -> _Result:
        check = await (action.check_undo(ctx, params) if undoing else action.check(ctx, params))
        if check.in_place:
            return _Result(
                status=runs.StepStatus.SUCCEEDED,
                output={"already_in_place": True, **check.output},
            )
        reached.append(True)
        output = await (action.undo(ctx, params) if undoing else action.apply(ctx, params))
        return _Result(status=runs.StepStatus.SUCCEEDED, output=output, reached_apply=True)

    @staticmethod
    def _failed(message: str) -> _Result:
        return _Result(status=runs.StepStatus.FAILED, output={}, error=message)

    def _failure(
        self,
        step: records.Step,
        message: str,
        *,
        temporary: bool,
        reached: bool,
        retry_after: float | None = None,
        output: dict[str, Any] | None = None,
    ) -> _Result:
        retry_at = None
        if temporary:
            retry_at = step.retry.next_attempt_at(
                attempt=step.attempt,
                now=self.services.clock(),
                first_attempt_at=step.started_at,
                retry_after=retry_after,
            )
        return _Result(
            status=runs.StepStatus.PENDING if retry_at else runs.StepStatus.FAILED,
            output=kept_output(step) | (output or {}),
            error=message,
            retry_at=retry_at,
            reached_apply=reached,
        )

    async def _record(self, step: records.Step, result: _Result) -> Claimed | None:
        try:
            recorded = await self._recorder.record(step, result)
        except errors.Conflict as e:
            logger.warning("step %s: %s", step.id, e)
            return None
        if recorded is None:
            return None
        if self.on_report is not None:
            await self.on_report(recorded.report)
        return recorded.next
