"""From an alert episode (or a manual trigger) and a playbook to a run with its steps.

Planning happens once, when the run is created: templates are rendered with the alert's labels
and every step's params are validated by its action's own model. A run that cannot be planned
(no node in the labels, a template without a value, a param the action refuses) is recorded as
a failed run with the reason, so the audit trail shows the alert was seen and why nothing ran.

A manual run has one target: the node it locks, the guards count, the audit trail names and its
steps act on (``params.node``) is one value (``manual_target``). A trigger naming two nodes is
refused before anything is stored; a run holding one node while acting on another would slip
past the lock of the run that holds the other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic

from remediator.domain import (
    errors,
    matching,
    playbooks,
    records,
    runs,
    targeting,
    templating,
)
from remediator.ports import actions


@dataclasses.dataclass(frozen=True)
class Target:
    node: str | None
    gpu: str | None


def node_order(playbook: playbooks.Playbook, default: Sequence[str]) -> tuple[str, ...]:
    """The labels a playbook takes its node from: its own ``target.node_labels`` when it sets
    them, else the global order (setting ``target_node_labels``)."""
    if "node_labels" in playbook.target.model_fields_set:
        return tuple(playbook.target.node_labels)
    return tuple(default)


def find_target(
    playbook: playbooks.Playbook,
    labels: Mapping[str, str],
    node: targeting.Choice | None = None,
) -> Target:
    """``node``: the node the cluster confirmed (``engine.targeting``); without it (no
    cluster to ask) the first non-empty label of the playbook's order."""
    if node is None:
        node = targeting.unverified(labels, node_order(playbook, targeting.DEFAULT_ORDER))
    return Target(node=node.node, gpu=matching.first_label(labels, playbook.target.gpu_labels))


def template_context(
    *,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    target: Target,
    alert: Mapping[str, str],
    params: Mapping[str, Any],
    playbook: str,
) -> dict[str, dict[str, str]]:
    return {
        "labels": dict(labels),
        "annotations": dict(annotations),
        "target": {key: value for key, value in dataclasses.asdict(target).items() if value},
        "alert": dict(alert),
        "params": {key: str(value) for key, value in params.items()},
        "run": {"playbook": playbook},
    }


class PlanningError(Exception):
    pass


def plan_steps(
    playbook: playbooks.Playbook,
    registry: actions.Registry,
    context: Mapping[str, Mapping[str, str]],
) -> tuple[records.NewStep, ...]:
    planned = []
    for seq, step in enumerate(playbook.steps):
        if not step.enabled:
            planned.append(
                records.NewStep(
                    seq=seq,
                    key=step.id,
                    phase=runs.StepPhase.DO,
                    action=step.action,
                    params=dict(step.params),
                    enabled=False,
                )
            )
            continue
        if step.action not in registry:
            raise PlanningError(f"step {step.id}: unknown action {step.action!r}")
        try:
            params = templating.render_params(step.params, context)
        except templating.TemplateError as e:
            raise PlanningError(f"step {step.id}: {e}") from None
        action = registry.get(step.action)
        try:
            parsed = action.parse(params)
        except pydantic.ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(map(str, item['loc']))}: {item['msg']}"
                for item in e.errors(include_url=False, include_input=False)
            )
            raise PlanningError(f"step {step.id}: invalid params: {problems}") from None
        undo = step.undo_spec
        planned.append(
            records.NewStep(
                seq=seq,
                key=step.id,
                phase=runs.StepPhase.DO,
                action=step.action,
                params=parsed.model_dump(mode="json"),
                requires_approval=step.requires_approval,
                approvals_required=step.approvals,
                max_attempts=step.retries.max_attempts,
                timeout_seconds=step.timeout.total_seconds(),
                on_failure=step.on_failure,
                undo=(
                    records.UndoPlan(
                        action=undo.action or step.action,
                        mode=records.UndoMode.APPLY if undo.action else records.UndoMode.UNDO,
                        params=templating.render_params(undo.params, context),
                        timeout_seconds=undo.timeout.total_seconds(),
                    )
                    if undo
                    else None
                ),
                retry=step.retries,
            )
        )
    return tuple(planned)


def plan_alert_run(
    playbook: playbooks.Playbook,
    episode: records.Episode,
    registry: actions.Registry,
    *,
    dry_run: bool = False,
    node: targeting.Choice | None = None,
) -> records.NewRun:
    """``node``: the choice among the alert's node candidates (``engine.targeting``); a run
    whose playbook needs a node and got none fails with the choice's reason."""
    node = node or targeting.unverified(
        episode.labels, node_order(playbook, targeting.DEFAULT_ORDER)
    )
    target = find_target(playbook, episode.labels, node)
    base = records.NewRun(
        playbook=playbook.name,
        kind=runs.RunKind.ALERT,
        episode_id=episode.id,
        node=target.node,
        gpu=target.gpu,
        exclusive=playbook.exclusive,
        dry_run=dry_run or playbook.dry_run,
        on_resolve=playbook.on_resolve,
        reason=f"{episode.alertname} fired",
    )
    if playbook.target.require_node and not target.node:
        return dataclasses.replace(base, status=runs.RunStatus.FAILED, reason=node.reason)
    context = template_context(
        labels=episode.labels,
        annotations=episode.annotations,
        target=target,
        alert={
            "alertname": episode.alertname,
            "fingerprint": episode.fingerprint,
            "status": episode.status.value,
            "startsAt": episode.starts_at.isoformat(),
            "generatorURL": episode.generator_url,
        },
        params={},
        playbook=playbook.name,
    )
    try:
        steps = plan_steps(playbook, registry, context)
    except PlanningError as e:
        return dataclasses.replace(base, status=runs.RunStatus.FAILED, reason=str(e))
    return dataclasses.replace(base, steps=steps)


def plan_undo_run(run: records.Run, steps: list[records.Step]) -> records.NewRun | None:
    """The undo of every step that declared one and whose effect may be in place, newest first.

    "May be in place" is the step's recorded effect, not its status: a step that reached its
    apply and then failed, timed out, lost its worker or was cancelled by the resolution is
    undone too (the undo's ``check_undo`` finds out whether anything is left to restore).
    """
    undoable = [
        step
        for step in steps
        if step.phase is runs.StepPhase.DO
        and step.effect in runs.EFFECTS_TO_UNDO
        and step.undo is not None
        and not step.output.get("dry_run")
    ]
    if not undoable:
        return None
    planned = tuple(
        _undo_step(seq, step, step.undo)
        for seq, step in enumerate(reversed(undoable))
        if step.undo is not None
    )
    return records.NewRun(
        playbook=run.playbook,
        kind=runs.RunKind.UNDO,
        episode_id=run.episode_id,
        parent_run_id=run.id,
        node=run.node,
        gpu=run.gpu,
        exclusive=run.exclusive,
        dry_run=run.dry_run,
        on_resolve=playbooks.ResolvePolicy.CONTINUE,
        reason=f"alert resolved: undo run {run.id}",
        steps=planned,
    )


def _undo_step(seq: int, step: records.Step, undo: records.UndoPlan) -> records.NewStep:
    """An undo step: every undo is attempted (``on_failure: continue``) and retried for at
    least as long as its original; a failed one makes the undo run ``failed``."""
    attempts = max(step.max_attempts, 3)
    return records.NewStep(
        seq=seq,
        key=f"undo-{step.key}",
        phase=runs.StepPhase.UNDO,
        action=undo.action,
        params=dict(undo.params or step.params),
        max_attempts=attempts,
        timeout_seconds=undo.timeout_seconds,
        on_failure=playbooks.OnFailure.CONTINUE,
        undo_of=step.id,
        undo=undo,
        retry=step.retry.model_copy(update={"max_attempts": attempts}),
    )


def plan_manual_run(
    playbook: playbooks.Playbook,
    registry: actions.Registry,
    *,
    params: Mapping[str, Any],
    node: str | None,
    principal: str,
    dry_run: bool = False,
) -> records.NewRun:
    """A run an operator started by hand; ``params`` are already validated by the playbook."""
    node = manual_target(node, params)
    target = Target(node=node, gpu=None)
    base = records.NewRun(
        playbook=playbook.name,
        kind=runs.RunKind.MANUAL,
        episode_id=None,
        node=node,
        gpu=None,
        exclusive=playbook.exclusive and node is not None,
        dry_run=dry_run or playbook.dry_run,
        principal=principal,
        params=dict(params),
        on_resolve=playbooks.ResolvePolicy.CONTINUE,
        reason=f"triggered by {principal}",
    )
    context = template_context(
        labels={}, annotations={}, target=target, alert={}, params=params, playbook=playbook.name
    )
    try:
        steps = plan_steps(playbook, registry, context)
    except PlanningError as e:
        return dataclasses.replace(base, status=runs.RunStatus.FAILED, reason=str(e))
    return dataclasses.replace(base, steps=steps)


def manual_target(node: str | None, params: Mapping[str, Any]) -> str | None:
    """The node a manual run locks, is audited on and acts on: the trigger's ``node`` and the
    runbook's ``node`` parameter, which must agree when both are given."""
    given = params.get("node")
    if given is None:
        return node
    if not isinstance(given, str):
        message = "params.node must be a node name"
        raise errors.ValidationFailed(
            message, fields=[{"field": "params.node", "message": message}]
        )
    if node is not None and given != node:
        message = (
            f"node {node[:80]!r} and params.node {given[:80]!r} name different nodes: "
            "give the node once, or the same node in both"
        )
        raise errors.ValidationFailed(
            message,
            fields=[
                {"field": "node", "message": message},
                {"field": "params.node", "message": message},
            ],
        )
    return given
