"""The reconciler: the effects ledger compared with the live cluster.

The ledger is the steps table: every step of an ended alert run whose action can observe its
effect (cordon, labels, taints, GPU power limit) and whose effect is ``applied`` or
``unknown``, with its output (what it set and what was there before). A pass reads the
entries that still matter, asks each action whether its effect is still in the cluster, and
closes each entry with one audit event when there is something to say:

- a **kept** effect (``on_resolve: continue``: the cordon, label and taint of a lost GPU) that
  is gone or changed is ``effect.vanished`` (the API server lost its state, someone uncordoned
  by hand): reported, never re-applied blindly; gone or changed after a later run returned the
  node to service is ``effect.released`` (nothing to tell);
- an effect of a run whose alert **resolved** (``on_resolve: undo``) that its undo did not
  reverse (the undo failed: the API server was down longer than the undo's retries) is undone
  once more when it is still exactly as remediator set it (``effect.undo_planned``, a second
  undo run); after that, or when someone changed it since, it is ``effect.orphaned``: reported
  and left alone;
- gone after the alert resolved → ``effect.released`` (what the undo would have done).

Reported effects count in ``remediator_orphaned_effects`` and notify on-call once. An entry
closed by an event is never looked at again; one still in place and kept is looked at every
pass. Cluster errors skip the entry until the next pass. The leader runs a pass at start-up
and every ``reconcile_interval`` seconds.
"""

from __future__ import annotations

import dataclasses
import logging

from remediator.domain import errors, playbooks, records, runs
from remediator.engine import executor, lifecycle
from remediator.ports import actions, store

logger = logging.getLogger(__name__)

ORPHANED = "effect.orphaned"
VANISHED = "effect.vanished"
RELEASED = "effect.released"
UNDO_AGAIN = "effect.undo_planned"
CLOSING = (ORPHANED, VANISHED, RELEASED)  # an entry with one of these is never looked at again
ACTOR = "reconciler"
#: Undo runs an effect gets before the reconciler reports it instead: the one planned when
#: the alert resolved, and one more once the cluster answers again.
UNDO_RUNS = 2


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    """What a pass decided about one ledger entry."""

    kind: str  # ORPHANED | VANISHED | RELEASED | UNDO_AGAIN
    resolution: str  # reported | released | undo-planned
    entry: records.LedgerEntry
    observation: actions.Observation

    @property
    def tells(self) -> bool:
        return self.resolution == "reported"


def judge(entry: records.LedgerEntry, seen: actions.Observation) -> Verdict | None:
    """The verdict on one entry given what the cluster shows, or ``None``: nothing to do
    (a kept effect still in place, or an undo still running)."""

    def verdict(kind: str, resolution: str) -> Verdict:
        return Verdict(kind=kind, resolution=resolution, entry=entry, observation=seen)

    undoing = entry.alert_resolved and entry.run.on_resolve is playbooks.ResolvePolicy.UNDO
    if not undoing:  # kept on purpose: the alert fires, or the playbook never undoes it
        if seen.presence is actions.Presence.PRESENT:
            return None
        if entry.returned_to_service:  # a later run put the node back on purpose
            return verdict(RELEASED, "released")
        return verdict(VANISHED, "reported")
    if any(status in runs.RUN_ACTIVE for status in entry.undo_runs):
        return None
    if seen.presence is actions.Presence.GONE:
        return verdict(RELEASED, "released")
    if (
        seen.presence is actions.Presence.PRESENT
        and entry.step.undo is not None
        and len(entry.undo_runs) < UNDO_RUNS
    ):
        return verdict(UNDO_AGAIN, "undo-planned")
    return verdict(ORPHANED, "reported")


@dataclasses.dataclass
class PassReport:
    looked_at: int = 0
    verdicts: list[Verdict] = dataclasses.field(default_factory=list)  # as recorded
    errors: list[str] = dataclasses.field(default_factory=list)


class Reconciler:
    def __init__(self, services: executor.Services, *, limit: int = 500) -> None:
        self.services = services
        self.limit = limit

    def _observable(self) -> tuple[list[str], list[str]]:
        every = self.services.registry.all()
        return (
            [a.name for a in every if a.observable],
            [a.name for a in every if a.returns_to_service],
        )

    async def run_once(self) -> tuple[PassReport, lifecycle.Report]:
        """One pass: read the ledger, observe, record the verdicts in one transaction."""
        observable, returning = self._observable()
        found = PassReport()
        outcome = lifecycle.Report()
        if not observable:
            return found, outcome
        entries = await self.services.store.run(
            "reconcile.ledger",
            lambda tx: tx.effect_ledger(
                actions=observable, returning=returning, closed_by=CLOSING, limit=self.limit
            ),
        )
        verdicts = []
        for entry in entries:
            found.looked_at += 1
            try:
                seen = await self._observe(entry)
            except errors.RemediatorError as e:
                logger.warning("reconciler: cannot observe step %s: %s", entry.step.id, e)
                found.errors.append(f"step {entry.step.id}: {e}")
                continue
            verdict = judge(entry, seen)
            if verdict is not None:
                verdicts.append(verdict)
        if verdicts:
            found.verdicts = await self.services.store.run(
                "reconcile.record", lambda tx: self._record(tx, verdicts, outcome)
            )
        for verdict in found.verdicts:
            if verdict.tells:
                self.services.observer.effect_reported(verdict.kind.removeprefix("effect."))
        return found, outcome

    async def _observe(self, entry: records.LedgerEntry) -> actions.Observation:
        action = self.services.registry.get(entry.step.action)
        run, step = entry.run, entry.step
        # Observed as its run saw it; dry_run is false: the ledger holds no dry runs.
        ctx = self.services.context(run, step, episode=None, applied_output=step.output)
        return await action.observe(ctx, action.parse(step.params))

    def _record(
        self, tx: store.Tx, verdicts: list[Verdict], outcome: lifecycle.Report
    ) -> list[Verdict]:
        """Record each verdict whose step is still as it was read (an undo may have ended
        meanwhile). Only the leader reconciles, so no other pass records the same entries."""
        outcome.notices.clear()
        recorded = []
        for verdict in verdicts:
            step = tx.get_step(verdict.entry.step.id)
            if step is None or step.effect not in runs.EFFECTS_TO_UNDO:
                continue
            self._record_one(tx, verdict, outcome)
            recorded.append(verdict)
        return recorded

    def _record_one(self, tx: store.Tx, verdict: Verdict, outcome: lifecycle.Report) -> None:
        entry, seen = verdict.entry, verdict.observation
        run, step = entry.run, entry.step
        undo_run = None
        if verdict.resolution == "undo-planned":
            undo_run = lifecycle.undo_again(tx, run, [step])
        what = f"{step.key} ({step.action}) of run {run.id}"
        reason = {
            "undo-planned": f"{what} is still in place after its undo ended: {seen.detail}; "
            "undoing it again",
            "reported": f"{what}: {seen.detail}; remediator leaves it as it is: check the "
            "node and restore it by hand if needed",
            "released": f"{what}: {seen.detail}",
        }[verdict.resolution]
        tx.add_event(
            verdict.kind,
            actor=ACTOR,
            reason=reason,
            run_id=run.id,
            step_id=step.id,
            data={
                "node": run.node,
                "gpu": run.gpu,
                "playbook": run.playbook,
                "action": step.action,
                "step": step.key,
                "effect": step.effect.value,
                "presence": seen.presence.value,
                "found": seen.detail,
                "resolution": verdict.resolution,
                "alert_resolved": entry.alert_resolved,
                "undo_run": undo_run,
            },
        )
        if verdict.tells:
            outcome.notices.append(
                lifecycle.Notice(
                    kind=verdict.kind.removeprefix("effect."),
                    reason=reason,
                    key=f"{verdict.kind}-{step.id}",
                    run_id=run.id,
                    playbook=run.playbook,
                    node=run.node,
                )
            )
