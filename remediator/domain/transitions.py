"""Every change of a step or a run, as a pure function returning a typed change.

The engine decides; the store persists. A function here takes the record as it was read, what
happened and ``now``, and returns a ``StepChange`` or ``RunChange``: the new status, exactly the
columns that move with it, and what the audit event says. ``Tx.apply(change)`` writes it with a
compare-and-set on the status it was read in (and on the lease owner, for a worker reporting
its own attempt) and appends the event in the same transaction; ``engine.lifecycle`` is its
only caller. So each column a transition owns is written in one place: a lease is cleared by
``requeue`` and ``finish`` alike, a due time set only by ``make_due``, ``hold``, ``approve`` or a
retry.

The step's ``effect`` column moves here too, and never backwards except through an undo:

- a lost lease or a shutdown hands the step back with effect ``unknown`` (the worker may have
  been inside ``apply``);
- an attempt that reached ``apply`` and did not succeed leaves ``unknown``;
- success leaves ``applied``; a successful undo of it leaves ``undone``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from remediator.domain import errors, records, runs

#: The actor named in the audit trail for what the engine decides on its own.
ENGINE = "engine"


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepChange:
    """A step moves from ``step.status`` to ``to`` (possibly the same status: a hold or a due
    time). ``event`` is the audit event's kind, or ``None`` for a change the trail need not
    repeat (a due time, an unchanged hold reason)."""

    step: records.Step
    to: runs.StepStatus
    values: Mapping[str, Any]
    reason: str
    event: str | None = "step.transition"
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    expect_owner: str | None = None
    actor: str = ENGINE


def step_event(change: StepChange) -> dict[str, Any]:
    """What the audit event of a step change says (``Tx.add_event``'s arguments after the
    kind): every store appends the same."""
    step, moved = change.step, change.event == "step.transition"
    return {
        "actor": change.actor,
        "run_id": step.run_id,
        "step_id": step.id,
        "from_status": step.status.value if moved else None,
        "to_status": change.to.value if moved else None,
        "reason": change.reason,
        "data": {"key": step.key, "action": step.action, "phase": step.phase.value}
        | dict(change.data),
    }


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunChange:
    run: records.Run
    to: runs.RunStatus
    reason: str
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    actor: str = ENGINE


@dataclasses.dataclass(frozen=True, kw_only=True)
class Result:
    """How one attempt of a step ended, as the worker saw it.

    ``status`` is ``succeeded``, ``failed``, ``cancelled`` or ``pending`` (a temporary failure
    to retry at ``retry_at``). ``reached_apply`` is whether the attempt called the action's
    ``apply`` (or ``undo``); with anything but success that makes the effect ``unknown``.
    """

    status: runs.StepStatus
    output: Mapping[str, Any]
    error: str | None = None
    retry_at: dt.datetime | None = None
    reached_apply: bool = False


_CLEAR_LEASE: Mapping[str, Any] = {"lease_owner": None, "lease_expires_at": None}


def _not_less_than(current: runs.Effect, floor: runs.Effect) -> runs.Effect:
    """``unknown`` never falls back to ``none``; ``applied`` stays ``applied``."""
    order = (runs.Effect.NONE, runs.Effect.UNKNOWN, runs.Effect.APPLIED, runs.Effect.UNDONE)
    return current if order.index(current) >= order.index(floor) else floor


def _check(step: records.Step, to: runs.StepStatus) -> None:
    if to is not step.status and to not in runs.STEP_TRANSITIONS[step.status]:
        raise errors.Conflict(f"step {step.id}: {step.status.value} → {to.value} not allowed")


def _change(step: records.Step, to: runs.StepStatus, **kwargs: Any) -> StepChange:
    """A checked change; one of a held step that is not a new hold ends its wait."""
    _check(step, to)
    if step.waiting_for is not None and "waiting_for" not in kwargs["values"]:
        kwargs["values"] = {**kwargs["values"], "waiting_for": None}
    return StepChange(step=step, to=to, **kwargs)


# -- steps -----------------------------------------------------------------------------------


def claim(
    step: records.Step, *, owner: str, lease_until: dt.datetime, now: dt.datetime
) -> StepChange:
    """``pending → running`` with a lease: the attempt is on record before the action runs."""
    attempt = step.attempt + 1
    return _change(
        step,
        runs.StepStatus.RUNNING,
        values={
            "lease_owner": owner,
            "lease_expires_at": lease_until,
            "attempt": attempt,
            "started_at": step.started_at or now,
            "due_at": None,
        },
        reason=f"attempt {attempt} of {step.max_attempts}",
        data={"attempt": attempt, "owner": owner},
    )


def requeue(step: records.Step, *, due_at: dt.datetime, reason: str) -> StepChange:
    """``running → pending`` after a lost lease or a shutdown: the worker may have been inside
    ``apply``, so the effect becomes ``unknown`` (the next attempt's ``check`` finds it)."""
    return _change(
        step,
        runs.StepStatus.PENDING,
        values={
            **_CLEAR_LEASE,
            "due_at": due_at,
            "effect": _not_less_than(step.effect, runs.Effect.UNKNOWN).value,
        },
        reason=reason,
    )


def finish(
    step: records.Step, result: Result, *, owner: str | None, now: dt.datetime
) -> StepChange:
    """Record one attempt's end. The only way a running step ends, whoever reports it: the
    worker (``owner`` set: compare-and-set on its lease), the sweeper giving up on a step
    whose workers keep dying, or a resolution cancelling it."""
    effect = step.effect
    if result.status is runs.StepStatus.SUCCEEDED:
        effect = runs.Effect.APPLIED
    elif result.reached_apply:
        effect = _not_less_than(effect, runs.Effect.UNKNOWN)
    values: dict[str, Any] = {
        "output": dict(result.output),
        "error": result.error,
        "effect": effect.value,
        **_CLEAR_LEASE,
    }
    reason = result.error or "done"
    if result.status is runs.StepStatus.PENDING:
        if result.retry_at is None:
            raise ValueError("a step handed back for a retry needs its retry time")
        values["due_at"] = result.retry_at
        reason = f"{result.error}; retry at {result.retry_at.isoformat()}"
    else:
        values |= {"due_at": None, "finished_at": now}
    data: dict[str, Any] = {"effect": effect.value}
    if result.output:
        data["output"] = dict(result.output)
    return _change(step, result.status, values=values, reason=reason, data=data, expect_owner=owner)


def make_due(step: records.Step, *, now: dt.datetime) -> StepChange:
    """A pending step becomes due at once (the run advanced past the steps before it)."""
    return _change(step, runs.StepStatus.PENDING, values={"due_at": now}, reason="", event=None)


def hold(
    step: records.Step,
    *,
    until: dt.datetime,
    reason: str,
    kind: str = "",
    waiting_for: str | None = None,
) -> StepChange:
    """A guard keeps a due step waiting; the trail notes each new reason, not each recheck.
    ``kind`` names the guard (``guards.HOLD_KINDS``); ``waiting_for`` what wakes the step
    before ``until`` (``guards.wait_key``), if anything does."""
    output = {**step.output, "held": reason, "held_kind": kind, "held_until": until.isoformat()}
    return _change(
        step,
        runs.StepStatus.PENDING,
        values={"due_at": until, "output": output, "waiting_for": waiting_for},
        reason=reason,
        event="step.held" if step.output.get("held") != reason else None,
        data={"until": until.isoformat()},
    )


def park(step: records.Step) -> StepChange:
    """A step that needs approval waits for it instead of running."""
    return _change(step, runs.StepStatus.WAITING_APPROVAL, values={}, reason="needs approval")


def approve(
    step: records.Step, *, now: dt.datetime, actor: str, reason: str, data: Mapping[str, Any]
) -> StepChange:
    """Enough approvals: the waiting step is due now."""
    return _change(
        step,
        runs.StepStatus.PENDING,
        values={"due_at": now},
        reason=reason,
        data=data,
        actor=actor,
    )


def end(
    step: records.Step,
    to: runs.StepStatus,
    *,
    now: dt.datetime,
    reason: str,
    data: Mapping[str, Any] | None = None,
    actor: str = ENGINE,
) -> StepChange:
    """A step that is not running ends without an attempt: cancelled, skipped or rejected.
    (A running step ends only through ``finish``.)"""
    if step.status is runs.StepStatus.RUNNING:
        raise ValueError(f"step {step.id} is running; it ends through finish")
    return _change(
        step,
        to,
        values={**_CLEAR_LEASE, "due_at": None, "finished_at": now},
        reason=reason,
        data=data or {},
        actor=actor,
    )


def undone(original: records.Step, *, by: records.Step) -> StepChange:
    """The undo step ``by`` reversed ``original``'s effect. A succeeded original becomes
    ``undone``; any other keeps its status (a cancelled step whose effect was unknown stays
    cancelled) and only its effect moves."""
    to = runs.StepStatus.UNDONE if original.status is runs.StepStatus.SUCCEEDED else original.status
    return _change(
        original,
        to,
        values={"effect": runs.Effect.UNDONE.value},
        reason=f"undone by step {by.id}",
    )


# -- runs ------------------------------------------------------------------------------------


def move_run(
    run: records.Run,
    to: runs.RunStatus,
    *,
    reason: str,
    actor: str = ENGINE,
    data: Mapping[str, Any] | None = None,
) -> RunChange:
    """Move a run to ``to``, if the run state machine allows it from where it is."""
    if to not in runs.RUN_TRANSITIONS[run.status]:
        raise errors.Conflict(f"run {run.id} is {run.status.value}; cannot move it to {to.value}")
    return RunChange(run=run, to=to, reason=reason, data=data or {}, actor=actor)
