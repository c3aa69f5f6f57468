"""Run and step lifecycle: every change of state, decided in ``domain.transitions`` and
applied here, inside one store transaction each. This module is the only caller of
``Tx.apply``.

- ``handle_episode``: a firing episode creates one run per matching playbook (the unique key
  ``(episode, playbook, kind)`` makes this idempotent across repeats and replicas); a resolved
  episode applies each run's ``on_resolve`` (cancel what has not started; ``undo`` plans the
  undo run once the run has ended, and ends the playbook's cooldown for the run's target, so
  a new episode after the fix was undone is handled again).
- ``start_run``: a pending run takes its locks (the node, a playbook concurrency slot) and
  starts; without them it stays pending and is tried again later. ``reserve_starts`` takes
  them for a pass's pending runs together first (one statement for all of them).
- ``advance_run``: a running run with no active step either makes its next step due, parks it
  for approval, or finishes the run. A running run whose alert resolved is advanced too: its
  steps that went back to ``pending`` (a lost lease, a retry) are cancelled, never left waiting
  for a claim that skips resolved runs.
- ``finish_step``: the one way a claimed step ends, whoever reports it: its worker, the
  sweeper after lost leases, or a shutdown. Disruption accounting, marking undone originals
  and ``on_failure`` all follow from here.
- ``finish_run``: the one way a run ends. It releases the run's node lock and concurrency slot
  in the same transaction, frees the disruption budget a run without any effect took, and
  plans the undo run when the alert has resolved and the playbook says ``undo``.

Each function records what people should hear about (runs that ended, steps held or parked,
runs suppressed or waiting) in a ``Report``; the worker sends those notifications and metrics
after the transaction commits.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

from remediator.domain import (
    alerts,
    auth,
    errors,
    guards,
    playbooks,
    records,
    runs,
    targeting,
    transitions,
)
from remediator.engine import approvals, planning
from remediator.ports import actions, store

logger = logging.getLogger("remediator.engine")

ENGINE = transitions.ENGINE
#: Every caller without a tokens file: the alert-sender rule cannot tell them apart.
ANONYMOUS = auth.ANONYMOUS_ADMIN.name


@dataclasses.dataclass(frozen=True, kw_only=True)
class Notice:
    """Something on-call should hear once: a held or parked step, a suppressed or waiting run,
    a run that ended badly. ``key`` makes the notification idempotent."""

    kind: str  # held | approval | suppressed | waiting | undo_failed | unplanned
    reason: str
    key: str
    run_id: int | None = None
    playbook: str = ""
    node: str | None = None
    unblock: str = ""


#: The confirmed node choice per playbook name, for one episode.
Targets = Mapping[str, targeting.Choice]


@dataclasses.dataclass
class Report:
    runs_created: int = 0
    finished: list[records.Run] = dataclasses.field(default_factory=list)
    notices: list[Notice] = dataclasses.field(default_factory=list)
    quarantined: list[str] = dataclasses.field(default_factory=list)  # kinds of units
    breaker_opened: list[str] = dataclasses.field(default_factory=list)  # why, once each
    steps_woken: int = 0  # held steps made due for another pass (kept on a rewind: harmless)

    def mark(self) -> tuple[int, int, int, int]:
        return self.runs_created, len(self.finished), len(self.notices), len(self.breaker_opened)

    def rewind(self, mark: tuple[int, int, int, int]) -> None:
        """Forget what a unit whose writes were rolled back reported."""
        self.runs_created = mark[0]
        del self.finished[mark[1] :]
        del self.notices[mark[2] :]
        del self.breaker_opened[mark[3] :]


def handle_episode(
    tx: store.Tx,
    episode: records.Episode,
    *,
    index: playbooks.PlaybookIndex,
    registry: actions.Registry,
    dry_run: bool,
    guard_base: guards.GuardConfig | None = None,
    report: Report | None = None,
    targets: Targets | None = None,
) -> int:
    """``targets``: the node the cluster confirmed for each matching playbook (by name; see
    ``engine.targeting``); without them each playbook takes its first non-empty node label."""
    report = report if report is not None else Report()
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
                report=report,
                node=(targets or {}).get(playbook.name),
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
                created += resolve_run(tx, run, registry=registry, report=report)
                _end_cooldown(tx, run, index.get(run.playbook))
    tx.mark_episode_handled(episode)
    report.runs_created += created
    return created


def _create_alert_run(
    tx: store.Tx,
    playbook: playbooks.Playbook,
    episode: records.Episode,
    registry: actions.Registry,
    *,
    dry_run: bool,
    guard_base: guards.GuardConfig,
    report: Report,
    node: targeting.Choice | None = None,
) -> int:
    new = planning.plan_alert_run(playbook, episode, registry, dry_run=dry_run, node=node)
    if new.status is runs.RunStatus.FAILED:
        # Planned as failed (no confirmed node, a template without a value, a refused param):
        # on-call hears it; the alert is not silently dropped.
        report.notices.append(
            Notice(
                kind="unplanned",
                reason=f"{episode.alertname} could not be acted on: {new.reason}",
                key=f"unplanned-{episode.id}-{playbook.name}",
                playbook=playbook.name,
                node=new.node,
            )
        )
        return 1 if tx.insert_run(new, actor=ENGINE) is not None else 0
    new = _escalate_repeat_offender(tx, new, playbook.guards.apply(guard_base), registry)
    if new.status is runs.RunStatus.PENDING and playbook.cooldown and new.node:
        key = _cooldown_key(playbook, new.node, new.gpu)
        if not tx.try_lock(key, run_id=None, expires_at=tx.now + playbook.cooldown):
            where = f"node {new.node}"
            if playbook.cooldown_per == "gpu":
                where += f", GPU {new.gpu or '(none)'}"
            reason = f"playbook {playbook.name} is cooling down on {where}"
            tx.add_event(
                "run.suppressed",
                actor=ENGINE,
                episode_id=episode.id,
                reason=reason,
                data={"playbook": playbook.name, "node": new.node, "gpu": new.gpu},
            )
            report.notices.append(
                Notice(
                    kind="suppressed",
                    reason=reason,
                    key=f"suppressed-{episode.id}-{playbook.name}",
                    playbook=playbook.name,
                    node=new.node,
                    unblock=f"the cooldown of {playbook.cooldown} ends",
                )
            )
            return 0
    return 1 if tx.insert_run(new, actor=ENGINE) is not None else 0


def _cooldown_key(playbook: playbooks.Playbook, node: str, gpu: str | None) -> str:
    key = f"cooldown:{playbook.name}:{node}"
    return f"{key}:{gpu or '-'}" if playbook.cooldown_per == "gpu" else key


def _end_cooldown(tx: store.Tx, run: records.Run, playbook: playbooks.Playbook | None) -> None:
    """The alert behind ``run`` resolved: end the cooldown it started if the resolution undoes
    its fix (``on_resolve: undo``). A cooldown keeps a condition that is still being handled
    from starting the same run again; once the fix is undone nothing handles it, and a new
    episode (a GPU that overheats again after its cap was restored) must get a new run.
    While the alert fires the cooldown stands: a re-fire whose resolution never reached us
    still starts nothing."""
    if playbook is None or not playbook.cooldown or run.node is None:
        return
    if run.on_resolve is not playbooks.ResolvePolicy.UNDO:
        return
    key = _cooldown_key(playbook, run.node, run.gpu)
    if key not in tx.held_keys(key):
        return
    tx.release_locks([key])
    tx.add_event(
        "run.cooldown_ended",
        actor=ENGINE,
        run_id=run.id,
        episode_id=run.episode_id,
        reason="alert resolved and its fix is undone; a new episode starts a new run",
        data={"key": key},
    )


def repeat_window(tx: store.Tx) -> dt.datetime:
    """Since when a node's runs count toward ``max_per_node_per_day``."""
    return tx.now - dt.timedelta(hours=24)


def _escalate_repeat_offender(
    tx: store.Tx, new: records.NewRun, config: guards.GuardConfig, registry: actions.Registry
) -> records.NewRun:
    """A node remediated too often in 24 h gets its disruptive steps gated by an approval:
    the loop stops at a human instead of cordoning the same node again and again."""
    if new.status is not runs.RunStatus.PENDING or new.dry_run:
        return new
    count = tx.count_node_runs(new.node, since=repeat_window(tx)) if new.node else 0
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


def alert_resolved(tx: store.Tx, run: records.Run) -> bool:
    """Whether ``run`` should stop because its alert resolved (never for ``continue``)."""
    if run.kind is not runs.RunKind.ALERT or run.episode_id is None:
        return False
    if run.on_resolve is playbooks.ResolvePolicy.CONTINUE:
        return False
    episode = tx.get_episode(run.episode_id)
    return episode is not None and episode.status is alerts.AlertStatus.RESOLVED


def resolve_run(
    tx: store.Tx,
    run: records.Run,
    *,
    registry: actions.Registry,
    report: Report | None = None,
) -> int:
    """The alert behind ``run`` resolved: apply the playbook's ``on_resolve`` policy."""
    report = report if report is not None else Report()
    policy = run.on_resolve
    tx.add_event(
        "run.alert_resolved",
        actor=ENGINE,
        run_id=run.id,
        episode_id=run.episode_id,
        reason=f"alert resolved; on_resolve={policy.value}",
    )
    if policy is playbooks.ResolvePolicy.CONTINUE:
        return 0
    if run.status in runs.RUN_ACTIVE:
        _cancel_for_resolution(tx, run, registry=registry, report=report)
        return 0
    if policy is playbooks.ResolvePolicy.UNDO:
        return create_undo_run(tx, run, tx.steps_of_run(run.id))
    return 0


def _cancel_for_resolution(
    tx: store.Tx, run: records.Run, *, registry: actions.Registry, report: Report
) -> None:
    """Cancel the steps that have not started; end the run unless a step is still running
    (then its end, through ``finish_step``, lets ``advance_run`` end the run)."""
    steps = tx.steps_of_run(run.id)
    for step in steps:
        if step.status in (runs.StepStatus.PENDING, runs.StepStatus.WAITING_APPROVAL):
            tx.apply(
                transitions.end(
                    step, runs.StepStatus.CANCELLED, now=tx.now, reason="alert resolved"
                )
            )
    if not any(step.status is runs.StepStatus.RUNNING for step in steps):
        current = tx.get_run(run.id)
        if current is not None and current.status in runs.RUN_ACTIVE:
            finish_run(
                tx,
                current,
                runs.RunStatus.CANCELLED,
                reason="alert resolved",
                registry=registry,
                report=report,
            )


def create_undo_run(tx: store.Tx, run: records.Run, steps: list[records.Step]) -> int:
    """Plan the undo of ``run``'s ``steps`` (one undo run per alert episode); 1 if planned."""
    new = planning.plan_undo_run(run, steps)
    if new is None:
        return 0
    return 1 if tx.insert_run(new, actor=ENGINE) is not None else 0


def undo_again(tx: store.Tx, run: records.Run, steps: list[records.Step]) -> int | None:
    """One more undo run for ``steps`` whose first undo ended without reversing them (the
    reconciler found them still in place); the new run's id."""
    new = planning.plan_undo_run(run, steps)
    if new is None:
        return None
    again = dataclasses.replace(
        new, episode_id=None, reason=f"effects still in place: undo run {run.id} again"
    )
    return tx.insert_run(again, actor="reconciler")


def node_lock_key(node: str) -> str:
    """The lock an exclusive run holds on its node while it is active."""
    return f"node:{node}"


def gpu_lock_key(node: str, gpu: str) -> str:
    """The lock a run on one GPU holds while it is active (runs on a GPU never overlap: a
    power cap and the undo of an earlier one would both read the same limit)."""
    return f"gpu:{node}/{gpu}"


def _target_locks(run: records.Run) -> list[str]:
    """The lock a run's target takes: its node (exclusive), its GPU, or none."""
    if run.exclusive and run.node:
        return [node_lock_key(run.node)]
    if run.node and run.gpu:
        return [gpu_lock_key(run.node, run.gpu)]
    return []


def _slots(prefix: str, first: int, concurrency: int) -> Iterable[str]:
    return (f"{prefix}{slot}" for slot in itertools.chain(range(first, concurrency), range(first)))


def reserve_starts(
    tx: store.Tx, pending: Sequence[records.Run], concurrency: Callable[[records.Run], int]
) -> dict[int, frozenset[str]]:
    """The locks each of ``pending`` would take first to start (its node or GPU, and the
    first free slot of its playbook, as ``start_run`` picks them), taken for all of them in
    one statement: by run id, the keys each now holds (``start_run``'s ``reserved``). A run
    whose node another run of the batch wants, or whose playbook has no free slot, is left
    out: it starts, or waits, the way a run alone does.

    A start took its locks in a statement of its own: on Postgres a round trip a run, the
    largest part of a pass over new alerts (1,338 statements for 1,500 alerts at 100/s,
    1.4 ms each). The caller releases what a run it does not start holds
    (``release_reserved``)."""
    wanted: dict[str, int] = {}
    slots_wanted: dict[str, int] = {}  # by playbook prefix: slots of the batch
    for run in pending:
        taken = _target_locks(run)
        if any(key in wanted for key in taken):
            continue
        prefix = f"slot:{run.playbook}:"
        held = tx.held_keys(prefix)
        limit = concurrency(run)
        if len(held) + slots_wanted.get(prefix, 0) >= limit:
            continue
        free = (key for key in _slots(prefix, run.id % limit, limit) if key not in held)
        slot = next((key for key in free if key not in wanted), None)
        if slot is None:
            continue
        for key in [*taken, slot]:
            wanted[key] = run.id
        slots_wanted[prefix] = slots_wanted.get(prefix, 0) + 1
    got = tx.take_locks(wanted)
    reserved: dict[int, set[str]] = {}
    for key, run_id in wanted.items():
        reserved.setdefault(run_id, set())
        if key in got:
            reserved[run_id].add(key)
    return {run_id: frozenset(keys) for run_id, keys in reserved.items()}


def release_reserved(tx: store.Tx, reserved: Iterable[str]) -> None:
    """Give up locks ``reserve_starts`` took for a run that did not start with them."""
    keys = list(reserved)
    if keys:
        tx.release_locks(keys)


def start_run(
    tx: store.Tx,
    run: records.Run,
    *,
    concurrency: int,
    report: Report | None = None,
    reserved: frozenset[str] | None = None,
) -> bool:
    """Take the run's locks and start it; ``reserved``: the locks ``reserve_starts`` took for
    it (it starts with them if they are all it needs; else they are given up first)."""
    taken = _target_locks(run)
    prefix = f"slot:{run.playbook}:"
    if reserved is not None:
        if all(key in reserved for key in taken) and any(
            key.startswith(prefix) for key in reserved
        ):
            tx.apply(transitions.move_run(run, runs.RunStatus.RUNNING, reason="locks acquired"))
            return True
        release_reserved(tx, reserved)
    held = tx.held_keys(prefix)
    # A run looks for a slot from its own (its id modulo the concurrency) up. Runs started
    # at the same time by two replicas, which read the same held slots, look from different
    # ones: had they picked the same, the second insert of the key would wait for the first
    # transaction's end (Postgres waits on a uniqueness conflict with an uncommitted row),
    # and one replica's starts would queue behind the other's. A storm's runs, whose ids
    # follow each other, find theirs free at once, not after every held one (quadratic in
    # its active runs).
    free = (key for key in _slots(prefix, run.id % concurrency, concurrency) if key not in held)
    if len(held) >= concurrency:  # no slot: its node is not even tried (and let go again)
        _wait_for_slot(tx, run, prefix, concurrency, report)
        return False
    # The node (or GPU) and the first free slot in one statement; a slot someone else took
    # meanwhile, the next one (a run is only tried while its node looks free: the startable
    # runs are those whose node no other run holds).
    slot = next(free)
    got = tx.try_locks([*taken, slot], run_id=run.id, expires_at=None)
    if not all(key in got for key in taken):
        if got:
            tx.release_locks(got)
        # Not tried again until that lock is released (the store checks it is still held).
        tx.park_run(run.id, next(key for key in taken if key not in got))
        return False
    if slot not in got and not any(
        tx.try_lock(key, run_id=run.id, expires_at=None) for key in free
    ):
        tx.release_locks(taken)
        _wait_for_slot(tx, run, prefix, concurrency, report)
        return False
    tx.apply(transitions.move_run(run, runs.RunStatus.RUNNING, reason="locks acquired"))
    return True


def _wait_for_slot(
    tx: store.Tx, run: records.Run, prefix: str, concurrency: int, report: Report | None
) -> None:
    """Every slot of the run's playbook is taken: it waits for one (parked until a slot is
    released), and on-call hears of it once."""
    tx.park_run(run.id, prefix, slots=concurrency)
    # Said once per run: the marker is a lock of the run's, released when it ends.
    if report is not None and tx.try_lock(f"noted:{run.id}", run_id=run.id, expires_at=None):
        reason = f"playbook {run.playbook} already has {concurrency} active runs"
        tx.add_event("run.waiting", actor=ENGINE, run_id=run.id, reason=reason)
        report.notices.append(
            Notice(
                kind="waiting",
                reason=reason,
                key=f"waiting-{run.id}",
                run_id=run.id,
                playbook=run.playbook,
                node=run.node,
                unblock="one of the playbook's active runs ends",
            )
        )


def advance_run(
    tx: store.Tx,
    run: records.Run,
    *,
    registry: actions.Registry,
    report: Report | None = None,
) -> tuple[str, str] | None:
    """Make the next step due, park it for approval, or finish. Returns a finished run's
    (playbook, status)."""
    report = report if report is not None else Report()
    if alert_resolved(tx, run):
        _cancel_for_resolution(tx, run, registry=registry, report=report)
        current = tx.get_run(run.id)
        if current is not None and current.status in runs.RUN_TERMINAL:
            return (current.playbook, current.status.value)
        return None
    steps = tx.steps_of_run(run.id)
    for step in steps:
        if step.status is not runs.StepStatus.PENDING:
            continue
        if step.requires_approval and step.phase is runs.StepPhase.DO:
            tx.apply(transitions.park(step))
            tx.apply(
                transitions.move_run(
                    run, runs.RunStatus.WAITING_APPROVAL, reason=f"step {step.key}"
                )
            )
            report.notices.append(
                Notice(
                    kind="approval",
                    reason=f"step {step.key} ({step.action}) needs approval",
                    key=f"approval-{step.id}",
                    run_id=run.id,
                    playbook=run.playbook,
                    node=run.node,
                    unblock=f"an operator approves step {step.id} of run {run.id}",
                )
            )
        else:
            tx.apply(transitions.make_due(step, now=tx.now))
        return None
    final = runs.final_run_status([step.status for step in steps])
    if final is None:
        return None
    finish_run(tx, run, final, reason="all steps finished", registry=registry, report=report)
    return (run.playbook, final.value)


def finish_run(
    tx: store.Tx,
    run: records.Run,
    status: runs.RunStatus,
    *,
    reason: str,
    registry: actions.Registry | None = None,
    report: Report | None = None,
) -> records.Run:
    """End a run: its locks and slot go with it, the disruption budget it took without any
    effect is freed, and a resolved alert's undo is planned."""
    finished = tx.apply(transitions.move_run(run, status, reason=reason))
    tx.release_run_locks(run.id)
    steps = tx.steps_of_run(run.id)
    if registry is not None and not _has_disruptive_effect(steps, registry):
        tx.release_disruptions(run_id=run.id)
    if (
        run.kind is runs.RunKind.ALERT
        and run.episode_id is not None
        and run.on_resolve is playbooks.ResolvePolicy.UNDO
    ):
        episode = tx.get_episode(run.episode_id)
        if episode is not None and episode.status is alerts.AlertStatus.RESOLVED:
            create_undo_run(tx, finished, steps)
    if report is not None:
        report.finished.append(finished)
        if run.kind is runs.RunKind.UNDO and status is not runs.RunStatus.SUCCEEDED:
            failed = [s.key for s in steps if s.status is runs.StepStatus.FAILED]
            report.notices.append(
                Notice(
                    kind="undo_failed",
                    reason=f"undo run {run.id} ended {status.value}"
                    + (f": {', '.join(failed)} failed" if failed else ""),
                    key=f"undo-failed-{run.id}",
                    run_id=run.id,
                    playbook=run.playbook,
                    node=run.node,
                    unblock="an operator restores the node by hand (see the run's steps)",
                )
            )
    return finished


def _has_disruptive_effect(steps: Iterable[records.Step], registry: actions.Registry) -> bool:
    return any(
        step.phase is runs.StepPhase.DO
        and step.action in registry
        and registry.get(step.action).disruptive
        and step.effect in runs.EFFECTS_TO_UNDO
        for step in steps
    )


def stop_after_failure(
    tx: store.Tx,
    run: records.Run,
    failed: records.Step,
    *,
    registry: actions.Registry | None = None,
    report: Report | None = None,
) -> None:
    for step in tx.steps_of_run(run.id):
        if step.status is runs.StepStatus.PENDING:
            tx.apply(
                transitions.end(
                    step, runs.StepStatus.SKIPPED, now=tx.now, reason=f"step {failed.key} failed"
                )
            )
    current = tx.get_run(run.id)
    if current is not None and current.status in runs.RUN_ACTIVE:
        finish_run(
            tx,
            current,
            runs.RunStatus.FAILED,
            reason=f"step {failed.key} failed",
            registry=registry,
            report=report,
        )


def quarantine_episode(tx: store.Tx, episode: records.Episode, error: str) -> None:
    """An episode that keeps failing to become runs is taken out of the queue."""
    tx.mark_episode_handled(episode)


def quarantine_run(
    tx: store.Tx, run_id: int, error: str, *, registry: actions.Registry, report: Report
) -> None:
    """A run that keeps failing to start, advance or claim its step ends ``failed``."""
    run = tx.get_run(run_id)
    if run is None or run.status in runs.RUN_TERMINAL:
        return
    for step in tx.steps_of_run(run.id):
        if step.status in (runs.StepStatus.PENDING, runs.StepStatus.WAITING_APPROVAL):
            tx.apply(
                transitions.end(
                    step, runs.StepStatus.CANCELLED, now=tx.now, reason="run quarantined"
                )
            )
    reason = f"quarantined after repeated engine failures: {error}"
    finish_run(tx, run, runs.RunStatus.FAILED, reason=reason, registry=registry, report=report)


# -- steps -----------------------------------------------------------------------------------


def claim_step(
    tx: store.Tx, step: records.Step, *, owner: str, lease_until: dt.datetime
) -> records.Step:
    return tx.apply(transitions.claim(step, owner=owner, lease_until=lease_until, now=tx.now))


def hold_step(
    tx: store.Tx,
    step: records.Step,
    *,
    until: dt.datetime,
    reason: str,
    kind: str = "",
    waiting_for: str | None = None,
    report: Report | None = None,
) -> None:
    change = transitions.hold(step, until=until, reason=reason, kind=kind, waiting_for=waiting_for)
    tx.apply(change)
    if change.event is not None and report is not None:
        run = tx.get_run(step.run_id)
        report.notices.append(
            Notice(
                kind="held",
                reason=f"step {step.key} ({step.action}) held: {reason}",
                key=f"held-{step.id}-{reason}",
                run_id=step.run_id,
                playbook=run.playbook if run else "",
                node=run.node if run else None,
                unblock=_unblock(waiting_for, until),
            )
        )


def _unblock(waiting_for: str | None, until: dt.datetime) -> str:
    """When a held step goes on (a notice reads "It goes on when ...")."""
    at = f"rechecked at {until.isoformat()}"
    if waiting_for is None:
        return at
    if waiting_for.startswith("breaker:"):
        return f"the breaker is reset (the step {at} at the latest)"
    return f"a node leaves the budget and its turn in line comes (the step {at} at the latest)"


def finish_step(
    tx: store.Tx,
    step: records.Step,
    result: transitions.Result,
    *,
    owner: str | None,
    registry: actions.Registry,
    report: Report | None = None,
) -> records.Step:
    """Record how an attempt ended and what follows from it. A retry of a run whose alert
    resolved is a cancellation instead (nothing would ever claim it)."""
    report = report if report is not None else Report()
    run = tx.get_run(step.run_id)
    assert run is not None
    if (
        result.status is runs.StepStatus.PENDING
        and step.phase is runs.StepPhase.DO
        and alert_resolved(tx, run)
    ):
        result = dataclasses.replace(
            result,
            status=runs.StepStatus.CANCELLED,
            retry_at=None,
            error=f"{result.error}; alert resolved, not retried",
        )
    moved = tx.apply(transitions.finish(step, result, owner=owner, now=tx.now))
    _account_disruption(tx, moved, run, registry)
    if moved.status is runs.StepStatus.SUCCEEDED and moved.undo_of is not None:
        original = tx.get_step(moved.undo_of)
        if original is not None and original.effect in runs.EFFECTS_TO_UNDO:
            tx.apply(transitions.undone(original, by=moved))
    if moved.status is runs.StepStatus.FAILED and moved.on_failure is playbooks.OnFailure.STOP:
        stop_after_failure(tx, run, moved, registry=registry, report=report)
    return moved


def release_step(
    tx: store.Tx,
    step: records.Step,
    *,
    reason: str,
    give_up: bool,
    registry: actions.Registry,
    report: Report | None = None,
) -> records.Step:
    """A running step whose worker is gone (lease expired) or stopping (shutdown): hand it
    back for another attempt, or end it through ``finish_step`` when its workers keep dying
    (``give_up``) or its alert resolved. Either way its effect is ``unknown`` from now on."""
    run = tx.get_run(step.run_id)
    resolved = run is not None and step.phase is runs.StepPhase.DO and alert_resolved(tx, run)
    if give_up or resolved:
        status = runs.StepStatus.CANCELLED if resolved else runs.StepStatus.FAILED
        why = f"{reason}; alert resolved" if resolved else reason
        return finish_step(
            tx,
            step,
            transitions.Result(status=status, output=step.output, error=why, reached_apply=True),
            owner=None,
            registry=registry,
            report=report,
        )
    return tx.apply(transitions.requeue(step, due_at=tx.now, reason=reason))


def _account_disruption(
    tx: store.Tx, step: records.Step, run: records.Run, registry: actions.Registry
) -> None:
    """A node returned to service (uncordoned, or a cordon undone) frees its budget."""
    if run.node is None or step.status is not runs.StepStatus.SUCCEEDED:
        return
    if step.action not in registry:
        return
    action = registry.get(step.action)
    undoing = step.phase is runs.StepPhase.UNDO and (
        step.undo is None or step.undo.mode is records.UndoMode.UNDO
    )
    if action.undo_returns_to_service if undoing else action.returns_to_service:
        tx.release_disruptions(node=run.node)


def decide_approval(
    tx: approvals.ApprovalTx,
    step_id: int,
    *,
    principal: str,
    approve: bool,
    comment: str,
    registry: actions.Registry | None = None,
    report: Report | None = None,
    forbid_alert_sender: bool = True,
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
    if approve:
        _check_separation(tx, run, principal, forbid_alert_sender=forbid_alert_sender)
    decision = approvals.Decision.APPROVED if approve else approvals.Decision.REJECTED
    if not tx.add_approval(step_id, principal=principal, decision=decision, comment=comment):
        raise errors.Conflict(f"{principal} already decided on step {step_id}")
    if not approve:
        return _reject(
            tx,
            step,
            run,
            actor=principal,
            reason=comment,
            data={"decision": decision},
            registry=registry,
            report=report,
        )
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
    moved = tx.apply(
        transitions.approve(step, now=tx.now, actor=principal, reason=comment, data=data)
    )
    tx.apply(transitions.move_run(run, runs.RunStatus.RUNNING, actor=principal, reason=comment))
    return moved


def _check_separation(
    tx: approvals.ApprovalTx, run: records.Run, principal: str, *, forbid_alert_sender: bool
) -> None:
    """Who started a run does not approve it: the operator who triggered a manual run, and
    (``forbid_alert_sender``) the principal whose token delivered the alert behind it."""
    if run.kind is runs.RunKind.MANUAL and run.principal == principal:
        raise errors.Forbidden(f"{principal} triggered run {run.id} and cannot approve it")
    if not forbid_alert_sender or run.episode_id is None or principal == ANONYMOUS:
        return
    if tx.alert_sender(run.episode_id) == principal:
        raise errors.Forbidden(
            f"{principal} delivered the alert that started run {run.id} and cannot approve "
            "its steps (separation of duties: another operator approves)"
        )


def _reject(
    tx: store.Tx,
    step: records.Step,
    run: records.Run,
    *,
    actor: str,
    reason: str,
    data: dict[str, object],
    to: runs.StepStatus = runs.StepStatus.REJECTED,
    registry: actions.Registry | None = None,
    report: Report | None = None,
) -> records.Step:
    """End a step waiting for approval (rejected or expired) and with it its run."""
    moved = tx.apply(
        transitions.end(step, to, now=tx.now, reason=reason, data=dict(data), actor=actor)
    )
    for other in tx.steps_of_run(run.id):
        if other.status is runs.StepStatus.PENDING:
            tx.apply(
                transitions.end(
                    other,
                    runs.StepStatus.SKIPPED,
                    now=tx.now,
                    reason=f"run {to.value}",
                    actor=actor,
                )
            )
    final = runs.RunStatus.REJECTED if to is runs.StepStatus.REJECTED else runs.RunStatus.CANCELLED
    finish_run(tx, run, final, reason=reason, registry=registry, report=report)
    return moved


def expire_approvals(
    tx: approvals.ApprovalTx,
    *,
    older_than: dt.datetime,
    outcome: approvals.ExpiryOutcome,
    limit: int = 100,
    registry: actions.Registry | None = None,
    report: Report | None = None,
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
            registry=registry,
            report=report,
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
