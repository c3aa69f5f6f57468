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

from remediator.domain import alerts, errors, playbooks, records, runs
from remediator.engine import planning
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
) -> int:
    created = 0
    if episode.status is alerts.AlertStatus.FIRING:
        for playbook in index.match(episode.labels):
            created += _create_alert_run(tx, playbook, episode, registry, dry_run=dry_run)
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
) -> int:
    new = planning.plan_alert_run(playbook, episode, registry, dry_run=dry_run)
    if new.status is runs.RunStatus.PENDING and playbook.cooldown and new.node:
        key = f"cooldown:{playbook.name}:{new.node}"
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
    for slot in range(concurrency):
        key = f"slot:{run.playbook}:{slot}"
        if tx.try_lock(key, run_id=run.id, expires_at=None):
            break
    else:
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
    tx: store.Tx,
    step_id: int,
    *,
    principal: str,
    approve: bool,
    comment: str,
    record: object = None,
) -> records.Step:
    """Approve or reject a waiting step. A second decision on a moved step is a ``Conflict``."""
    step = tx.get_step(step_id)
    if step is None:
        raise errors.NotFound(f"step {step_id} not found")
    if step.status is not runs.StepStatus.WAITING_APPROVAL:
        raise errors.Conflict(f"step {step_id} is {step.status.value}, not waiting for approval")
    run = tx.get_run(step.run_id)
    assert run is not None
    if approve:
        moved = tx.transition_step(
            step,
            runs.StepStatus.PENDING,
            actor=principal,
            reason=comment,
            values={"due_at": tx.now},
            event_data={"decision": "approved"},
        )
        tx.transition_run(run, runs.RunStatus.RUNNING, actor=principal, reason=comment)
        return moved
    moved = tx.transition_step(
        step,
        runs.StepStatus.REJECTED,
        actor=principal,
        reason=comment,
        event_data={"decision": "rejected"},
    )
    for other in tx.steps_of_run(run.id):
        if other.status is runs.StepStatus.PENDING:
            tx.transition_step(
                other, runs.StepStatus.SKIPPED, actor=principal, reason="run rejected"
            )
    finish_run(tx, run, runs.RunStatus.REJECTED, reason=comment)
    return moved


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
