"""The engine's work queries over the in-memory tables, condition for condition the ones of
``adapters.db.store`` (``_unhandled_episodes``, ``_expired_leases``, ``_startable_runs``,
``_advanceable_runs``, ``_due_steps``), so the probe and the claims agree with SQL."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

from remediator.adapters.memory import tables
from remediator.domain import alerts, playbooks, records, runs


def steps_of(t: tables.Tables, run_id: int) -> list[records.Step]:
    """A run's steps by ``seq``, then id."""
    steps = [t.steps[step_id] for step_id in t.run_steps.get(run_id, ())]
    return sorted(steps, key=lambda step: (step.seq, step.id))


def unhandled_episodes(t: tables.Tables) -> Iterator[records.Episode]:
    """Episodes never handled, or handled in another status than they have now (by id)."""
    for episode in t.episodes.values():
        if episode.handled_status is None or episode.handled_status != episode.status:
            yield episode


def expired_leases(t: tables.Tables, now: dt.datetime) -> list[records.Step]:
    """Running steps whose lease ended before ``now``, the longest expired first."""
    expired = [
        step
        for step in t.steps.values()
        if step.status is runs.StepStatus.RUNNING
        and step.lease_expires_at is not None
        and step.lease_expires_at < now
    ]
    return sorted(expired, key=lambda step: (step.lease_expires_at, step.id))


def _node_held_by_another(t: tables.Tables, run: records.Run) -> bool:
    # SQL: EXISTS (a lock "node:" || node whose run_id <> this run). A lock without a run id
    # compares as NULL and does not count; the lock's expiry is not looked at.
    lock = t.locks.get(f"node:{run.node}")
    return lock is not None and lock.run_id is not None and lock.run_id != run.id


def _gpu_held_by_another(t: tables.Tables, run: records.Run) -> bool:
    lock = t.locks.get(f"gpu:{run.node}/{run.gpu}")
    return lock is not None and lock.run_id is not None and lock.run_id != run.id


def startable_runs(t: tables.Tables) -> Iterator[records.Run]:
    """Pending runs whose node (exclusive runs) or GPU (other runs on one GPU) is not held by
    another run (by id)."""
    for run in t.runs.values():
        if run.status is not runs.RunStatus.PENDING:
            continue
        if run.node is None:
            yield run
        elif run.exclusive:
            if not _node_held_by_another(t, run):
                yield run
        elif run.gpu is None or not _gpu_held_by_another(t, run):
            yield run


def resolved_alert_run(t: tables.Tables, run: records.Run) -> bool:
    """The run answers an alert that resolved, and its playbook does not say ``continue``."""
    if run.kind is not runs.RunKind.ALERT or run.on_resolve is playbooks.ResolvePolicy.CONTINUE:
        return False
    episode = t.episodes.get(run.episode_id) if run.episode_id is not None else None
    return episode is not None and episode.status is alerts.AlertStatus.RESOLVED


def advanceable_runs(t: tables.Tables) -> Iterator[records.Run]:
    """Running runs with no active step (running, waiting, or pending with a due time), and
    running runs whose alert resolved with no step running (by id)."""
    for run in t.runs.values():
        if run.status is not runs.RunStatus.RUNNING:
            continue
        steps = [t.steps[step_id] for step_id in t.run_steps.get(run.id, ())]
        idle = not any(runs.under_way(step.status, step.due_at) for step in steps)
        running = any(step.status is runs.StepStatus.RUNNING for step in steps)
        if idle or (resolved_alert_run(t, run) and not running):
            yield run


def due_steps(t: tables.Tables, now: dt.datetime) -> list[records.Step]:
    """Due pending steps of running runs whose alert has not resolved, by due time, then id."""
    due = []
    for step in t.steps.values():
        if step.status is not runs.StepStatus.PENDING or step.due_at is None or step.due_at > now:
            continue
        run = t.runs[step.run_id]
        if run.status is runs.RunStatus.RUNNING and not resolved_alert_run(t, run):
            due.append(step)
    return sorted(due, key=lambda step: (step.due_at, step.id))


def probe(t: tables.Tables, now: dt.datetime) -> records.Probe:
    return records.Probe(
        episodes=next(unhandled_episodes(t), None) is not None,
        expired=bool(expired_leases(t, now)),
        startable=next(startable_runs(t), None) is not None,
        advance=next(advanceable_runs(t), None) is not None,
        due=bool(due_steps(t, now)),
    )
