"""Running one claimed step: check, apply (or undo), record the outcome.

The step was claimed with a lease in its own transaction before anything here runs, so the
attempt is on record. While the action works, a heartbeat renews the lease and saves progress;
if the lease is lost (the sweeper gave the step to another worker after this one stalled), the
action is cancelled and its result discarded — the other worker's ``check`` will find whatever
effect it left. Outcomes are classified, never raised: success, temporary failure (retried at a
persisted time), permanent failure (``on_failure`` decides whether the run stops).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import pydantic

from remediator.domain import alerts, errors, records, retry, runs
from remediator.engine import lifecycle
from remediator.ports import actions, cluster, notify, observe, silences, store

logger = logging.getLogger("remediator.engine")


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


@dataclasses.dataclass
class _Result:
    status: runs.StepStatus
    output: dict[str, Any]
    error: str | None = None
    retry_at: dt.datetime | None = None


class StepRunner:
    def __init__(self, services: Services, *, owner: str, lease_seconds: float) -> None:
        self.services = services
        self.owner = owner
        self.lease_seconds = lease_seconds

    async def run(self, step: records.Step) -> None:
        started = time.perf_counter()
        progress: dict[str, Any] = {}
        lost = asyncio.Event()
        heartbeat = asyncio.create_task(self._heartbeat(step, progress, lost))
        try:
            work = asyncio.create_task(self._execute(step, progress))
            lost_wait = asyncio.create_task(lost.wait())
            done, _ = await asyncio.wait({work, lost_wait}, return_when=asyncio.FIRST_COMPLETED)
            if work not in done:
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await work
                logger.warning("step %s lost its lease; result discarded", step.id)
                return
            lost_wait.cancel()
            result = work.result()
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
        await self._record(step, result)
        self.services.observer.step_finished(
            step.action, result.status.value, time.perf_counter() - started
        )

    async def _heartbeat(
        self, step: records.Step, progress: dict[str, Any], lost: asyncio.Event
    ) -> None:
        # Renew at a third of the lease, and at least every 2 s so live progress (a drain's
        # evicted / blocked / remaining) reaches the API promptly.
        interval = max(min(self.lease_seconds / 3, 2.0), 0.05)
        while True:
            await asyncio.sleep(interval)
            try:
                kept = await self.services.store.run(
                    "heartbeat", functools.partial(self._renew, step.id, dict(progress))
                )
            except errors.StoreUnavailable:
                logger.warning("heartbeat for step %s failed; will retry", step.id)
                continue
            if not kept:
                lost.set()
                return

    def _account_disruption(self, tx: store.Tx, step: records.Step) -> None:
        """Keep the disruption budget truthful: a node returned to service (uncordoned) frees
        its budget; a disruptive step that ended without effect frees what its run took."""
        run = tx.get_run(step.run_id)
        if run is None or run.node is None:
            return
        returned = step.action == "node.uncordon" or (
            step.phase is runs.StepPhase.UNDO and step.action == "node.cordon"
        )
        if step.status is runs.StepStatus.SUCCEEDED and returned:
            tx.release_disruptions(node=run.node)
            return
        registry = self.services.registry
        disruptive = {a.name for a in registry.all() if a.disruptive}
        if step.action not in disruptive or step.status is runs.StepStatus.SUCCEEDED:
            return
        if step.status in runs.STEP_TERMINAL:
            effective = [
                other
                for other in tx.steps_of_run(run.id)
                if other.action in disruptive
                and other.phase is runs.StepPhase.DO
                and other.status in (runs.StepStatus.SUCCEEDED, runs.StepStatus.UNDONE)
            ]
            if not effective:
                tx.release_disruptions(run_id=run.id)

    def _renew(self, step_id: int, progress: dict[str, Any], tx: store.Tx) -> bool:
        until = lifecycle.lease_until(tx.now, self.lease_seconds)
        return tx.update_step_output(step_id, self.owner, progress, until)

    async def _context(
        self, step: records.Step, progress: dict[str, Any]
    ) -> tuple[records.Run, actions.ActionContext, bool]:
        def load(
            tx: store.Tx,
        ) -> tuple[records.Run, records.Episode | None, dict[str, Any]]:
            run = tx.get_run(step.run_id)
            assert run is not None
            episode = tx.get_episode(run.episode_id) if run.episode_id else None
            original = tx.get_step(step.undo_of) if step.undo_of is not None else None
            return run, episode, dict(original.output) if original else {}

        run, episode, applied = await self.services.store.run("load", load)

        async def report(update: dict[str, Any]) -> None:
            progress.clear()
            progress.update(update)

        ctx = actions.ActionContext(
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
            now=self.services.clock,
            notifier=self.services.notifier,
            cluster=self.services.cluster,
            services=self.services.extra,
            progress=report,
            applied_output=applied,
        )
        resolved = (
            run.kind is runs.RunKind.ALERT
            and episode is not None
            and episode.status is alerts.AlertStatus.RESOLVED
        )
        return run, ctx, resolved

    async def _execute(self, step: records.Step, progress: dict[str, Any]) -> _Result:
        run, ctx, resolved = await self._context(step, progress)
        if resolved and step.phase is runs.StepPhase.DO and run.on_resolve != "continue":
            return _Result(runs.StepStatus.CANCELLED, {}, "alert resolved before the step started")
        try:
            action = self.services.registry.get(step.action)
        except KeyError:
            return _Result(runs.StepStatus.FAILED, {}, f"unknown action {step.action!r}")
        try:
            params = action.parse(step.params)
        except pydantic.ValidationError as e:
            return _Result(runs.StepStatus.FAILED, {}, f"invalid params: {e.error_count()} errors")
        undoing = step.phase is runs.StepPhase.UNDO and (step.undo or {}).get("mode") == "undo"
        if run.dry_run:
            verb = "undo" if undoing else "apply"
            return _Result(
                runs.StepStatus.SUCCEEDED,
                {"dry_run": True, "would": f"{verb} {action.describe(params)}"},
            )
        try:
            async with asyncio.timeout(step.timeout_seconds):
                return await self._attempt(action, ctx, params, undoing=undoing)
        except TimeoutError:
            return self._failure(step, f"timed out after {step.timeout_seconds:g}s", True, None, {})
        except errors.ActionFailed as e:
            return self._failure(step, str(e), e.temporary, e.retry_after, e.output)
        except Exception as e:  # an action bug must not kill the worker
            logger.exception("action %s raised", step.action)
            return self._failure(step, f"{type(e).__name__}: {e}", False, None, {})

    async def _attempt(
        self,
        action: actions.Action[Any],
        ctx: actions.ActionContext,
        params: pydantic.BaseModel,
        *,
        undoing: bool,
    ) -> _Result:
        check = await (action.check_undo(ctx, params) if undoing else action.check(ctx, params))
        if check.in_place:
            return _Result(runs.StepStatus.SUCCEEDED, {"already_in_place": True, **check.output})
        output = await (action.undo(ctx, params) if undoing else action.apply(ctx, params))
        return _Result(runs.StepStatus.SUCCEEDED, output)

    def _failure(
        self,
        step: records.Step,
        message: str,
        temporary: bool,
        retry_after: float | None,
        output: dict[str, Any],
    ) -> _Result:
        retry_at = None
        if temporary:
            policy = retry.RetryPolicy.model_validate(step.retry or {"max_attempts": 1})
            policy = policy.model_copy(update={"max_attempts": step.max_attempts})
            retry_at = policy.next_attempt_at(
                attempt=step.attempt, now=self.services.clock(), retry_after=retry_after
            )
        status = runs.StepStatus.PENDING if retry_at else runs.StepStatus.FAILED
        return _Result(status, output, message, retry_at)

    async def _record(self, step: records.Step, result: _Result) -> None:
        finished: list[str] = []

        def work(tx: store.Tx) -> None:
            current = tx.get_step(step.id)
            if current is None or current.lease_owner != self.owner:
                logger.warning("step %s changed hands; result not recorded", step.id)
                return
            values: dict[str, Any] = {"output": result.output, "error": result.error}
            reason = result.error or "done"
            if result.retry_at is not None:
                values |= {"due_at": result.retry_at, "lease_owner": None, "lease_expires_at": None}
                reason = f"{result.error}; retry at {result.retry_at.isoformat()}"
            moved = tx.transition_step(
                current,
                result.status,
                actor=lifecycle.ENGINE,
                reason=reason,
                values=values,
                expect_owner=self.owner,
                event_data={"output": result.output} if result.output else None,
            )
            finished.extend(self._after(tx, moved))

        try:
            await self.services.store.run("step.finish", work)
        except errors.Conflict as e:
            logger.warning("step %s: %s", step.id, e)
        for playbook in finished:
            self.services.observer.run_finished(playbook, runs.RunStatus.FAILED.value)

    def _after(self, tx: store.Tx, step: records.Step) -> list[str]:
        """Consequences of a recorded outcome; returns playbooks of runs it failed."""
        self._account_disruption(tx, step)
        if step.status is runs.StepStatus.SUCCEEDED and step.undo_of is not None:
            original = tx.get_step(step.undo_of)
            if original is not None and original.status is runs.StepStatus.SUCCEEDED:
                tx.transition_step(
                    original,
                    runs.StepStatus.UNDONE,
                    actor=lifecycle.ENGINE,
                    reason=f"undone by step {step.id}",
                )
        if step.status is runs.StepStatus.FAILED and step.on_failure == "stop":
            run = tx.get_run(step.run_id)
            assert run is not None
            lifecycle.stop_after_failure(tx, run, step)
            return [run.playbook]
        return []
