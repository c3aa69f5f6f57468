"""Run and step state machines.

A *run* is one execution of one playbook for one target (an alert episode or a manual trigger).
A *step* is one action of that run. Both are persisted; every change of status is a guarded
transition: the allowed moves are the tables below, and the store enforces them again with a
compare-and-set ``UPDATE ... WHERE status IN (allowed sources)`` inside the same transaction
that appends the audit event. A lost compare-and-set raises ``Conflict``: somebody else moved
the row first (another replica, a duplicate approval) and nothing is done twice.

The state diagrams are drawn from ``RUN_TRANSITIONS`` and ``STEP_TRANSITIONS`` by
``remediator docs`` into docs/architecture.md ("State machines"), so they cannot drift from
these tables.

Crash safety: a step is claimed (``pending → running``) with a lease *before* its action runs,
so the intent is durable. If the worker dies, the lease expires, a sweeper puts the step back to
``pending`` and the next attempt first asks the action whether its effect is already in place
(``check``) instead of applying it again.
"""

from __future__ import annotations

import datetime as dt
import enum


class RunStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    WAITING_APPROVAL = "waiting_approval"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"


class StepStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    WAITING_APPROVAL = "waiting_approval"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    REJECTED = "rejected"
    UNDONE = "undone"


RUN_ACTIVE = frozenset({RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING_APPROVAL})
RUN_TERMINAL = frozenset(set(RunStatus) - RUN_ACTIVE)
STEP_ACTIVE = frozenset({StepStatus.PENDING, StepStatus.RUNNING, StepStatus.WAITING_APPROVAL})
STEP_TERMINAL = frozenset(set(StepStatus) - STEP_ACTIVE)

RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.PENDING: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.FAILED}),
    RunStatus.RUNNING: frozenset(
        {
            RunStatus.WAITING_APPROVAL,
            RunStatus.SUCCEEDED,
            RunStatus.FAILED,
            RunStatus.CANCELLED,
        }
    ),
    RunStatus.WAITING_APPROVAL: frozenset(
        {RunStatus.RUNNING, RunStatus.REJECTED, RunStatus.CANCELLED, RunStatus.FAILED}
    ),
    RunStatus.SUCCEEDED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
    RunStatus.REJECTED: frozenset(),
}

STEP_TRANSITIONS: dict[StepStatus, frozenset[StepStatus]] = {
    StepStatus.PENDING: frozenset(
        {
            StepStatus.RUNNING,
            StepStatus.WAITING_APPROVAL,
            StepStatus.SKIPPED,
            StepStatus.CANCELLED,
        }
    ),
    StepStatus.RUNNING: frozenset(
        {StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.PENDING, StepStatus.CANCELLED}
    ),
    StepStatus.WAITING_APPROVAL: frozenset(
        {StepStatus.PENDING, StepStatus.REJECTED, StepStatus.CANCELLED, StepStatus.SKIPPED}
    ),
    StepStatus.SUCCEEDED: frozenset({StepStatus.UNDONE}),
    StepStatus.FAILED: frozenset(),
    StepStatus.SKIPPED: frozenset(),
    StepStatus.CANCELLED: frozenset(),
    StepStatus.REJECTED: frozenset(),
    StepStatus.UNDONE: frozenset(),
}


def run_sources(target: RunStatus) -> frozenset[RunStatus]:
    """The statuses a run may move to ``target`` from (for compare-and-set updates)."""
    return frozenset(src for src, dests in RUN_TRANSITIONS.items() if target in dests)


def step_sources(target: StepStatus) -> frozenset[StepStatus]:
    return frozenset(src for src, dests in STEP_TRANSITIONS.items() if target in dests)


_UNDER_WAY = frozenset({StepStatus.RUNNING, StepStatus.WAITING_APPROVAL})


def under_way(status: StepStatus, due_at: dt.datetime | None) -> bool:
    """Running, parked for approval, or due: a step that keeps its run from being advanced
    (a pending step without a due time waits for the run to reach it)."""
    return status in _UNDER_WAY or (status is StepStatus.PENDING and due_at is not None)


class RunKind(enum.StrEnum):
    """Why a run exists: an alert fired, an operator started it, or an alert resolved."""

    ALERT = "alert"
    MANUAL = "manual"
    UNDO = "undo"


class Effect(enum.StrEnum):
    """What remediator knows about a step's effect on the cluster, apart from its status.

    A step's status says how the step ended; its effect says whether the cluster may have
    changed. They differ exactly when it matters: a step cancelled by a resolution after its
    worker died inside ``apply`` is ``cancelled`` with effect ``unknown``, and its undo still
    runs (undo first asks ``check_undo`` whether there is anything to restore).

    ``none``: the action never reached its apply. ``unknown``: it reached apply (or may have:
    the worker died holding the lease) and did not report success. ``applied``: apply (or a
    check that found the effect in place) succeeded. ``undone``: a later undo step reversed it.
    """

    NONE = "none"
    UNKNOWN = "unknown"
    APPLIED = "applied"
    UNDONE = "undone"


#: Effects an undo must reverse (``unknown`` counts: "maybe applied" is never "not applied").
EFFECTS_TO_UNDO = frozenset({Effect.UNKNOWN, Effect.APPLIED})


class StepPhase(enum.StrEnum):
    """A step of the playbook, or the undo of one (runs of kind ``undo`` hold only these)."""

    DO = "do"
    UNDO = "undo"


def final_run_status(step_statuses: list[StepStatus]) -> RunStatus | None:
    """The run's terminal status once no step is active, else ``None``.

    A step that failed with ``on_failure: stop`` makes the engine skip the rest and fail the run
    directly; this covers the ordinary end: rejected beats failed beats cancelled beats
    succeeded. A run never reports success for work that failed: a step that failed with
    ``on_failure: continue`` let the run go on, and still makes it ``failed`` (an undo run whose
    undo failed left the cluster changed, and says so).
    """
    if any(status in STEP_ACTIVE for status in step_statuses):
        return None
    if StepStatus.REJECTED in step_statuses:
        return RunStatus.REJECTED
    if StepStatus.FAILED in step_statuses:
        return RunStatus.FAILED
    if StepStatus.CANCELLED in step_statuses:
        return RunStatus.CANCELLED
    return RunStatus.SUCCEEDED
