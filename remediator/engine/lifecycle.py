"""Run lifecycle decisions taken inside one store transaction each.

- ``handle_episode``: a firing episode creates one run per matching playbook (the unique key
  ``(episode, playbook, kind)`` makes this idempotent across repeats and replicas); a resolved
  episode cancels not-started steps of its runs and, where the playbook says ``undo``, creates
  the undo run.
- ``start_run``: a pending run takes its locks (the node, a playbook concurrency slot) and
  starts; without them it stays pending and is tried again later.
- ``advance_run``: a running run with no active step either makes its next step due, parks it
  for approval, or finishes the run and releases its locks.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging

from remediator.domain import alerts, errors, guards, playbooks, records, runs
from remediator.engine import approvals, planning
from remediator.ports import actions, store

logger = logging.getLogger("remediator.engine")

ENGINE = "engine"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a lifecycle step did, for metrics and wake-ups."""

    runs_created: int = 0
    runs_finished: tuple[tuple[str, str], ...] = ()


def handle_episode(
    tx: store.Tx,
    episode: records.Episode,
    *,
    index: playbooks.PlaybookIndex,
    registry: actions.Registry,
    dry_run: bool,
    guard_base: guards.GuardConfig | None = None,
) -> int:
    created = 0
    if episode.status is alerts.AlertStatus.FIRING:
        for playbook in index.match(episode.labels):
            created += _create_alert_run(
                tx,
                playbook,
                episode,
                registry,
                dry_run=dry_run,
                guard_base=guard_base or guards.GuardConfig(),
            )
    elif episode.handled_status is None:
        tx.add_event(
            "episode.resolved_unseen",
            actor=ENGINE,
            episode_id=episode.id,
            reason="first delivery was already resolved; nothing is started",
        )
    else:
        for run in tx.runs_of_episode(episode.id):
            if run.kind is runs.RunKind.ALERT:
                created += resolve_run(tx, run)
    tx.mark_episode_handled(episode)
    return created


def _create_alert_run(
    tx: store.Tx,
    playbook: playbooks.Playbook,
    episode: records.Episode,
    registry: actions.Registry,
    *,
    dry_run: bool,
    guard_base: guards.GuardConfig,
) -> int:
    new = planning.plan_alert_run(playbook, episode, registry, dry_run=dry_run)
    new = _escalate_repeat_offender(tx, new, playbook.guards.apply(guard_base), registry)
    if new.status is runs.RunStatus.PENDING and playbook.cooldown and new.node:
        key = f"cooldown:{playbook.name}:{new.node}"
        if playbook.cooldown_per == "gpu":
            key = f"{key}:{new.gpu or '-'}"
        if not tx.try_lock(key, run_id=None, expires_at=tx.now + playbook.cooldown):
            tx.add_event(
                "run.suppressed",
                actor=ENGINE,
                episode_id=episode.id,
                reason=f"playbook {playbook.name} is cooling down on node {new.node}",
                data={"playbook": playbook.name, "node": new.node},
            )
            return 0
    return 1 if tx.insert_run(new, actor=ENGINE) is not None else 0


def _escalate_repeat_offender(
    tx: store.Tx, new: records.NewRun, config: guards.GuardConfig, registry: actions.Registry
) -> records.NewRun:
    """A node remediated too often in 24 h gets its disruptive steps gated by an approval:
    the loop stops at a human instead of cordoning the same node again and again."""
    if new.status is not runs.RunStatus.PENDING or new.dry_run:
        return new
    count = tx.count_node_runs(new.node, since=tx.now - dt.timedelta(hours=24)) if new.node else 0
    if count < config.max_per_node_per_day:
        return new
    gated = tuple(
        dataclasses.replace(step, requires_approval=True)
        if step.action in registry and registry.get(step.action).disruptive
        else step
        for step in new.steps
    )
    if gated == new.steps:
        return new
    reason = (
        f"{new.reason}; node {new.node} had {count} runs in 24 h "
        f"(limit {config.max_per_node_per_day}): disruptive steps need approval"
    )
    return dataclasses.replace(new, steps=gated, reason=reason)


def resolve_run(tx: store.Tx, run: records.Run) -> int:
    """The alert behind ``run`` resolved: apply the playbook's ``on_resolve`` policy."""
    policy = playbooks.ResolvePolicy(run.on_resolve)
    tx.add_event(
        "run.alert_resolved",
        actor=ENGINE,
        run_id=run.id,
        episode_id=run.episode_id,
        reason=f"alert resolved; on_resolve={policy.value}",
    )
    if policy is playbooks.ResolvePolicy.CONTINUE:
        return 0
    steps = tx.steps_of_run(run.id)
    if run.status in runs.RUN_ACTIVE:
        for step in steps:
            if step.status in (runs.StepStatus.PENDING, runs.StepStatus.WAITING_APPROVAL):
                tx.transition_step(
                    step, runs.StepStatus.CANCELLED, actor=ENGINE, reason="alert resolved"
                )
        if not any(step.status is runs.StepStatus.RUNNING for step in steps):
            finish_run(tx, run, runs.RunStatus.CANCELLED, reason="alert resolved")
        return 0
    if policy is playbooks.ResolvePolicy.UNDO:
        return create_undo_run(tx, run, steps)
    return 0


def create_undo_run(tx: store.Tx, run: records.Run, steps: list[records.Step]) -> int:
    new = planning.plan_undo_run(run, steps)
    if new is None:
        return 0
    return 1 if tx.insert_run(new, actor=ENGINE) is not None else 0


def start_run(tx: store.Tx, run: records.Run, *, concurrency: int) -> bool:
    taken: list[str] = []
    if run.exclusive and run.node:
        key = f"node:{run.node}"
        if not tx.try_lock(key, run_id=run.id, expires_at=None):
            return False
        taken.append(key)
    prefix = f"slot:{run.playbook}:"
    held = tx.held_keys(prefix)
    free = (f"{prefix}{slot}" for slot in range(concurrency) if f"{prefix}{slot}" not in held)
    if not any(tx.try_lock(key, run_id=run.id, expires_at=None) for key in free):
        tx.release_locks(taken)
        return False
    tx.transition_run(run, runs.RunStatus.RUNNING, actor=ENGINE, reason="locks acquired")
    return True


def advance_run(tx: store.Tx, run: records.Run) -> tuple[str, str] | None:
    """Make the next step due, park for approval, or finish. Returns a finished run's status."""
    steps = tx.steps_of_run(run.id)
    for step in steps:
        if step.status is not runs.StepStatus.PENDING:
            continue
        if step.requires_approval and step.phase is runs.StepPhase.DO:
            tx.transition_step(
                step, runs.StepStatus.WAITING_APPROVAL, actor=ENGINE, reason="needs approval"
            )
            tx.transition_run(
                run, runs.RunStatus.WAITING_APPROVAL, actor=ENGINE, reason=f"step {step.key}"
            )
        else:
            tx.set_step_due(step, tx.now)
        return None
    final = runs.final_run_status([step.status for step in steps])
    if final is None:
        return None
    finish_run(tx, run, final, reason="all steps finished")
    return (run.playbook, final.value)


def finish_run(
    tx: store.Tx, run: records.Run, status: runs.RunStatus, *, reason: str
) -> records.Run:
    finished = tx.transition_run(run, status, actor=ENGINE, reason=reason)
    tx.release_run_locks(run.id)
    if (
        run.kind is runs.RunKind.ALERT
        and run.episode_id is not None
        and run.on_resolve == playbooks.ResolvePolicy.UNDO.value
    ):
        episode = tx.get_episode(run.episode_id)
        if episode is not None and episode.status is alerts.AlertStatus.RESOLVED:
            create_undo_run(tx, finished, tx.steps_of_run(run.id))
    return finished


def stop_after_failure(tx: store.Tx, run: records.Run, failed: records.Step) -> None:
    for step in tx.steps_of_run(run.id):
        if step.status is runs.StepStatus.PENDING:
            tx.transition_step(
                step, runs.StepStatus.SKIPPED, actor=ENGINE, reason=f"step {failed.key} failed"
            )
    current = tx.get_run(run.id)
    if current is not None and current.status in runs.RUN_ACTIVE:
        finish_run(tx, current, runs.RunStatus.FAILED, reason=f"step {failed.key} failed")


def decide_approval(
    tx: approvals.ApprovalTx,
    step_id: int,
    *,
    principal: str,
    approve: bool,
    comment: str,
) -> records.Step:
    """Record ``principal``'s decision on a waiting step (see ``engine.approvals``).

    Returns the step as it is afterwards: ``pending`` once enough distinct principals approved,
    still ``waiting_approval`` while more approvals are needed, ``rejected`` on a rejection.
    """
    step = tx.get_step(step_id)
    if step is None:
        raise errors.NotFound(f"step {step_id} not found")
    if step.status is not runs.StepStatus.WAITING_APPROVAL:
        raise errors.Conflict(f"step {step_id} is {step.status.value}, not waiting for approval")
    run = tx.get_run(step.run_id)
    assert run is not None
    if approve and run.kind is runs.RunKind.MANUAL and run.principal == principal:
        raise errors.Forbidden(f"{principal} triggered run {run.id} and cannot approve it")
    decision = approvals.Decision.APPROVED if approve else approvals.Decision.REJECTED
    if not tx.add_approval(step_id, principal=principal, decision=decision, comment=comment):
        raise errors.Conflict(f"{principal} already decided on step {step_id}")
    if not approve:
        return _reject(tx, step, run, actor=principal, reason=comment, data={"decision": decision})
    approved = approvals.approvers(tx.approvals_of(step_id))
    data = {
        "decision": decision.value,
        "approvals": len(approved),
        "required": step.approvals_required,
        "approvers": approved,
    }
    if len(approved) < step.approvals_required:
        tx.add_event(
            "step.approval",
            actor=principal,
            run_id=run.id,
            step_id=step.id,
            reason=comment,
            data={"key": step.key, "action": step.action} | data,
        )
        return step
    moved = tx.transition_step(
        step,
        runs.StepStatus.PENDING,
        actor=principal,
        reason=comment,
        values={"due_at": tx.now},
        event_data=data,
    )
    tx.transition_run(run, runs.RunStatus.RUNNING, actor=principal, reason=comment)
    return moved


def _reject(
    tx: store.Tx,
    step: records.Step,
    run: records.Run,
    *,
    actor: str,
    reason: str,
    data: dict[str, object],
    to: runs.StepStatus = runs.StepStatus.REJECTED,
) -> records.Step:
    moved = tx.transition_step(step, to, actor=actor, reason=reason, event_data=dict(data))
    for other in tx.steps_of_run(run.id):
        if other.status is runs.StepStatus.PENDING:
            tx.transition_step(
                other, runs.StepStatus.SKIPPED, actor=actor, reason=f"run {to.value}"
            )
    final = runs.RunStatus.REJECTED if to is runs.StepStatus.REJECTED else runs.RunStatus.CANCELLED
    finish_run(tx, run, final, reason=reason)
    return moved


def expire_approvals(
    tx: approvals.ApprovalTx,
    *,
    older_than: dt.datetime,
    outcome: approvals.ExpiryOutcome,
    limit: int = 100,
) -> int:
    """Expire steps that have waited for approval since ``older_than``; returns how many."""
    expired = 0
    to = (
        runs.StepStatus.REJECTED
        if outcome is approvals.ExpiryOutcome.REJECT
        else runs.StepStatus.CANCELLED
    )
    for step in tx.steps_waiting_since(older_than, limit):
        run = tx.get_run(step.run_id)
        assert run is not None
        waited = tx.now - run.updated_at
        _reject(
            tx,
            step,
            run,
            actor=ENGINE,
            reason=f"approval expired after {int(waited.total_seconds())} s",
            data={"decision": "expired", "outcome": outcome.value},
            to=to,
        )
        expired += 1
    return expired


def lease_until(now: dt.datetime, seconds: float) -> dt.datetime:
    return now + dt.timedelta(seconds=seconds)


def create_manual_run(
    tx: store.Tx,
    playbook: playbooks.Playbook,
    registry: actions.Registry,
    *,
    params: dict[str, object],
    node: str | None,
    principal: str,
    dry_run: bool,
) -> int:
    """Record an operator's trigger as a run (the trigger event names the principal)."""
    new = planning.plan_manual_run(
        playbook, registry, params=params, node=node, principal=principal, dry_run=dry_run
    )
    run_id = tx.insert_run(new, actor=principal)
    assert run_id is not None
    return run_id
