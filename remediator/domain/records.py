"""Plain records the store returns and the engine decides on (no I/O, no ORM objects)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Mapping
from typing import Any

from remediator.domain import alerts, playbooks, runs
from remediator.domain import retry as retry_mod


class UndoMode(enum.StrEnum):
    """How an undo step reverses its original: the action's own ``undo``, or ``apply`` of
    another action (a playbook's explicit undo step)."""

    UNDO = "undo"
    APPLY = "apply"


@dataclasses.dataclass(frozen=True, kw_only=True)
class UndoPlan:
    """The declared undo of a step, rendered when its run was planned."""

    action: str
    mode: UndoMode = UndoMode.UNDO
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    timeout_seconds: float = 300.0

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "mode": self.mode.value,
            "params": self.params,
            "timeout_seconds": self.timeout_seconds,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any], *, action: str) -> UndoPlan:
        """From its stored form (rows written before the plan was typed may hold only a mode;
        ``action`` is the step's own action then)."""
        return cls(
            action=str(value.get("action") or action),
            mode=UndoMode(value.get("mode", UndoMode.UNDO.value)),
            params=dict(value.get("params") or {}),
            timeout_seconds=float(value.get("timeout_seconds", 300.0)),
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Episode:
    id: int
    fingerprint: str
    starts_at: dt.datetime
    alertname: str
    status: alerts.AlertStatus
    handled_status: alerts.AlertStatus | None
    labels: dict[str, str]
    annotations: dict[str, str]
    generator_url: str
    ends_at: dt.datetime | None
    first_delivery_id: int | None
    created_at: dt.datetime
    resolved_at: dt.datetime | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    id: int
    playbook: str
    kind: runs.RunKind
    status: runs.RunStatus
    episode_id: int | None
    parent_run_id: int | None
    node: str | None
    gpu: str | None
    exclusive: bool
    dry_run: bool
    principal: str | None
    params: dict[str, Any]
    on_resolve: playbooks.ResolvePolicy
    reason: str
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step:
    id: int
    run_id: int
    seq: int
    key: str
    phase: runs.StepPhase
    action: str
    params: dict[str, Any]
    status: runs.StepStatus
    requires_approval: bool
    approvals_required: int
    attempt: int
    max_attempts: int
    timeout_seconds: float
    on_failure: playbooks.OnFailure
    undo_of: int | None
    undo: UndoPlan | None
    retry: retry_mod.RetryPolicy
    effect: runs.Effect
    due_at: dt.datetime | None
    lease_owner: str | None
    lease_expires_at: dt.datetime | None
    output: dict[str, Any]
    error: str | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    # What a step a guard holds waits for (``transitions.hold``): ``budget:<pool>`` and
    # ``breaker:`` are woken by what frees them; other holds end at their due time.
    waiting_for: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class NewStep:
    seq: int
    key: str
    phase: runs.StepPhase
    action: str
    params: dict[str, Any]
    requires_approval: bool = False
    approvals_required: int = 1
    max_attempts: int = 1
    timeout_seconds: float = 300.0
    on_failure: playbooks.OnFailure = playbooks.OnFailure.STOP
    undo_of: int | None = None
    undo: UndoPlan | None = None
    retry: retry_mod.RetryPolicy = dataclasses.field(
        default_factory=lambda: retry_mod.RetryPolicy(max_attempts=1)
    )
    enabled: bool = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class NewRun:
    playbook: str
    kind: runs.RunKind
    episode_id: int | None
    parent_run_id: int | None = None
    node: str | None
    gpu: str | None
    exclusive: bool = True
    dry_run: bool = False
    principal: str | None = None
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    on_resolve: playbooks.ResolvePolicy = playbooks.ResolvePolicy.CANCEL
    reason: str = ""
    status: runs.RunStatus = runs.RunStatus.PENDING
    steps: tuple[NewStep, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class AuditEvent:
    id: int
    at: dt.datetime
    kind: str
    actor: str
    run_id: int | None
    step_id: int | None
    episode_id: int | None
    from_status: str | None
    to_status: str | None
    reason: str
    data: dict[str, Any]
    prev_hash: str
    hash: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class LedgerEntry:
    """An effect a step of an ended alert run applied (or may have applied) and no undo
    reversed: the effects ledger is the steps table read this way, with what the reconciler
    needs to judge it."""

    run: Run
    step: Step
    alert_resolved: bool
    undo_runs: tuple[runs.RunStatus, ...]  # the runs undoing ``run``, if any
    returned_to_service: bool  # a later step returned the node to service


@dataclasses.dataclass(frozen=True)
class Probe:
    """Which kinds of engine work exist right now (one cheap read, without the write lock)."""

    episodes: bool
    expired: bool
    startable: bool
    advance: bool
    due: bool

    @property
    def any(self) -> bool:
        return self.episodes or self.expired or self.startable or self.advance or self.due
