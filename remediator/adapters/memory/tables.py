"""The in-memory tables, and rows converted the way the SQL columns convert them.

Rows of runs, steps and episodes are the frozen ``domain.records`` themselves; the other tables
hold small frozen rows. A value goes in as the SQL column would keep it: a JSON column keeps
what survives ``json.dumps``/``json.loads`` (a value JSON cannot hold is refused, as the
database driver refuses it), a timestamp column keeps timezone-aware UTC and refuses a naive
``datetime``. Rows read out carry copies of their JSON values, so a caller changing a dict it
was given changes nothing stored.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Mapping
from typing import Any

from remediator.domain import alerts, playbooks, records, retry, runs


class IntegrityError(Exception):
    """A write a database constraint would refuse (a unique key or a foreign key): a bug of the
    caller, never a conflict to retry."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lock:
    key: str
    run_id: int | None
    acquired_at: dt.datetime
    expires_at: dt.datetime | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Disruption:
    id: int
    run_id: int
    node: str
    pool: str | None
    started_at: dt.datetime
    released_at: dt.datetime | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Approval:
    id: int
    step_id: int
    principal: str
    decision: str
    comment: str
    at: dt.datetime

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GuardRow:
    value: dict[str, Any]
    updated_at: dt.datetime


@dataclasses.dataclass(kw_only=True)
class Tables:
    """Every table, by primary key (dicts keep insertion order, which is id order).

    A transaction works on a shallow copy of this object and copies a table the first time it
    writes to it (``transaction.Transaction._own``); committing swaps the copy in, rolling
    back drops it.
    """

    #: Who sent each delivery (``deliveries.principal``); bodies are not kept.
    deliveries: dict[int, str | None] = dataclasses.field(default_factory=dict)
    episodes: dict[int, records.Episode] = dataclasses.field(default_factory=dict)
    episode_keys: dict[tuple[str, dt.datetime], int] = dataclasses.field(default_factory=dict)
    runs: dict[int, records.Run] = dataclasses.field(default_factory=dict)
    alert_runs: dict[tuple[int, str, str], int] = dataclasses.field(default_factory=dict)
    steps: dict[int, records.Step] = dataclasses.field(default_factory=dict)
    run_steps: dict[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    locks: dict[str, Lock] = dataclasses.field(default_factory=dict)
    approvals: dict[int, Approval] = dataclasses.field(default_factory=dict)
    disruptions: dict[int, Disruption] = dataclasses.field(default_factory=dict)
    guard_state: dict[str, GuardRow] = dataclasses.field(default_factory=dict)
    events: list[records.AuditEvent] = dataclasses.field(default_factory=list)
    sequences: dict[str, int] = dataclasses.field(default_factory=dict)


# -- column conversions ----------------------------------------------------------------------


def utc(value: dt.datetime | None) -> dt.datetime | None:
    """What a ``UTCDateTime`` column keeps."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError("naive datetime")
    return value.astimezone(dt.UTC)


def utc_now(value: dt.datetime) -> dt.datetime:
    stamp = utc(value)
    assert stamp is not None
    return stamp


def as_json(value: Any) -> Any:
    """What a JSON column keeps (and a fresh copy of it)."""
    return json.loads(json.dumps(value))


def copy_json(value: Any) -> Any:
    """A copy of a value already held as JSON (cheaper than another round trip)."""
    if isinstance(value, dict):
        return {key: copy_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [copy_json(item) for item in value]
    return value


def stored_retry(policy: retry.RetryPolicy) -> retry.RetryPolicy:
    return retry.RetryPolicy.model_validate(as_json(policy.model_dump(mode="json")))


def stored_undo(plan: records.UndoPlan | None, action: str) -> records.UndoPlan | None:
    return records.UndoPlan.from_json(as_json(plan.to_json()), action=action) if plan else None


# Step columns a transition may set, and how each is kept (the SQL update takes its SET columns
# from the change's keys; a key that is not a column is refused there too).
_STEP_COLUMNS: Mapping[str, Callable[[Any], Any]] = {
    "status": runs.StepStatus,
    "lease_owner": lambda value: None if value is None else str(value),
    "lease_expires_at": utc,
    "attempt": int,
    "started_at": utc,
    "finished_at": utc,
    "due_at": utc,
    "effect": runs.Effect,
    "output": as_json,
    "error": lambda value: None if value is None else str(value),
    "params": as_json,
    "waiting_for": lambda value: None if value is None else str(value),
}


def updated_step(step: records.Step, values: Mapping[str, Any]) -> records.Step:
    unknown = set(values) - set(_STEP_COLUMNS)
    if unknown:
        raise ValueError(f"not step columns: {', '.join(sorted(unknown))}")
    return dataclasses.replace(
        step, **{column: _STEP_COLUMNS[column](value) for column, value in values.items()}
    )


def detached_step(step: records.Step) -> records.Step:
    return dataclasses.replace(step, params=copy_json(step.params), output=copy_json(step.output))


def detached_run(run: records.Run) -> records.Run:
    return dataclasses.replace(run, params=copy_json(run.params))


def detached_episode(episode: records.Episode) -> records.Episode:
    return dataclasses.replace(
        episode, labels=dict(episode.labels), annotations=dict(episode.annotations)
    )


def new_run(run_id: int, new: records.NewRun, now: dt.datetime) -> records.Run:
    return records.Run(
        id=run_id,
        playbook=new.playbook,
        kind=runs.RunKind(new.kind),
        status=runs.RunStatus(new.status),
        episode_id=new.episode_id,
        parent_run_id=new.parent_run_id,
        node=new.node,
        gpu=new.gpu,
        exclusive=new.exclusive,
        dry_run=new.dry_run,
        principal=new.principal,
        params=as_json(new.params),
        on_resolve=playbooks.ResolvePolicy(new.on_resolve),
        reason=new.reason,
        created_at=now,
        updated_at=now,
        finished_at=now if new.status in runs.RUN_TERMINAL else None,
    )


def new_step(step_id: int, run_id: int, new: records.NewStep) -> records.Step:
    return records.Step(
        id=step_id,
        run_id=run_id,
        seq=new.seq,
        key=new.key,
        phase=runs.StepPhase(new.phase),
        action=new.action,
        params=as_json(new.params),
        status=runs.StepStatus.PENDING if new.enabled else runs.StepStatus.SKIPPED,
        requires_approval=new.requires_approval,
        approvals_required=new.approvals_required,
        attempt=0,
        max_attempts=new.max_attempts,
        timeout_seconds=float(new.timeout_seconds),
        on_failure=playbooks.OnFailure(new.on_failure),
        undo_of=new.undo_of,
        undo=stored_undo(new.undo, new.action),
        retry=stored_retry(new.retry),
        effect=runs.Effect.NONE,
        due_at=None,
        lease_owner=None,
        lease_expires_at=None,
        output={} if new.enabled else {"skipped": "disabled in the playbook"},
        error=None,
        started_at=None,
        finished_at=None,
    )


def new_episode(
    episode_id: int, alert: alerts.Alert, *, delivery_id: int | None, now: dt.datetime
) -> records.Episode:
    """An episode row as intake writes it (``adapters.db.intake``)."""
    resolved = alert.status is alerts.AlertStatus.RESOLVED
    return records.Episode(
        id=episode_id,
        fingerprint=alert.fingerprint,
        starts_at=utc_now(alert.starts_at),
        alertname=alert.alertname,
        status=alert.status,
        handled_status=None,
        labels=as_json(dict(alert.labels)),
        annotations=as_json(dict(alert.annotations)),
        generator_url=alert.generator_url,
        ends_at=None if alert.ends_at == alerts.ZERO_TIME else utc(alert.ends_at),
        first_delivery_id=delivery_id,
        created_at=now,
        resolved_at=now if resolved else None,
    )


def resolved_episode(
    episode: records.Episode, alert: alerts.Alert, *, now: dt.datetime
) -> records.Episode:
    """A firing episode a resolved delivery ends (the only change a repeat makes)."""
    return dataclasses.replace(
        episode,
        status=alerts.AlertStatus.RESOLVED,
        ends_at=None if alert.ends_at == alerts.ZERO_TIME else utc(alert.ends_at),
        resolved_at=now,
        annotations=as_json(dict(alert.annotations)),
    )
