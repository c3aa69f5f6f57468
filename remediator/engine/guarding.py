"""Applying the fleet guards when steps are claimed (decisions in ``domain.guards``).

A disruptive step of a live run passes the gate only if the guards allow it; then the node is
recorded as disrupted in the same transaction, so two replicas cannot both take the last unit
of budget: every such decision first takes the guards lock (``Tx.lock_guards``, one narrow row
on Postgres, held to commit), counts, and adds its node before anyone else counts. Nothing
else takes that lock, so engine work that admits no disruptive step (episodes, starts,
advances, claims of other steps, outcomes) runs side by side across replicas. A
held step stays pending with a later due time and its reason in its output; a new reason is
reported once, so on-call hears which guard holds it.

The node labels the driver-upgrade guard reads, and the fleet the percentage and per-pool
budgets count, come from the cluster's GPU node watch (``Cluster.gpu_fleet``), so a hold
starts or ends as soon as the watch reports the label change and a held step is next
rechecked (every ``recheck``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from remediator.domain import guards, playbooks, records, runs
from remediator.engine import lifecycle
from remediator.ports import cluster as cluster_port
from remediator.ports import store


def guard_config(
    base: guards.GuardConfig, playbook: playbooks.Playbook | None
) -> guards.GuardConfig:
    return playbook.guards.apply(base) if playbook is not None else base


def disruptive_playbooks(
    index: playbooks.PlaybookIndex, disruptive_actions: frozenset[str]
) -> list[str]:
    return [
        playbook.name
        for playbook in index.playbooks.values()
        if not playbook.manual
        and any(step.enabled and step.action in disruptive_actions for step in playbook.steps)
    ]


# Holds that keep every disruptive step waiting, not one: a step woken by the budget and held
# by one of these hands nothing on (the next would be held by it too).
_EVERYONE_WAITS = frozenset({"budget", "breaker", "change_window"})


@dataclasses.dataclass
class Gate:
    base: guards.GuardConfig
    index: playbooks.PlaybookIndex
    disruptive_actions: frozenset[str]
    fleet: cluster_port.FleetSnapshot | None  # GPU node name → labels; None when unknown

    def scope(self, config: guards.GuardConfig, node: str | None) -> tuple[str | None, int | None]:
        """The node's pool (when the budget is per pool) and how many GPU nodes it holds."""
        if self.fleet is None:
            return None, None
        label = config.pool_label
        if label is None or node is None:
            return None, len(self.fleet)
        # the fleet keeps pool sizes counted change by change: a decision is O(1), not O(fleet)
        pool = self.fleet.get(node, {}).get(label)
        return pool, self.fleet.pool_sizes(label)[pool]

    def labels(self, node: str | None) -> Mapping[str, str] | None:
        """The node's labels as the node watch last saw them (a driver upgrade in progress
        holds it)."""
        if self.fleet is None or node is None:
            return None
        return self.fleet.get(node)

    def admit(
        self, tx: store.Tx, step: records.Step, *, report: lifecycle.Report | None = None
    ) -> bool:
        if step.phase is not runs.StepPhase.DO or step.action not in self.disruptive_actions:
            return True
        run = tx.get_run(step.run_id)
        assert run is not None
        if run.dry_run:
            return True
        config = guard_config(self.base, self.index.get(run.playbook))
        pool, gpu_nodes = self.scope(config, run.node)
        tx.lock_guards()  # the snapshot below is counted and added to as one decision
        snapshot = tx.guard_snapshot(
            node=run.node,
            since=tx.now - config.breaker_window,
            disruptive_playbooks=disruptive_playbooks(self.index, self.disruptive_actions),
            gpu_nodes=gpu_nodes,
            pool=pool,
        )
        snapshot = dataclasses.replace(snapshot, node_labels=self.labels(run.node))
        verdict = guards.decide(config, snapshot, node=run.node, now=tx.now)
        if verdict.trips_breaker and not snapshot.breaker_open:
            open_breaker(tx, verdict.reason)
            if report is not None:  # announced once the decision is committed
                report.breaker_opened.append(verdict.reason)
        if step.output.get("held_kind") == "budget" and verdict.kind not in _EVERYONE_WAITS:
            # Held by the budget until now and no longer: the next step in line for it is
            # looked at too, for the place this one did not take (held by something else, or
            # its node counted already) or for more room (the fleet grew, rules changed).
            # Not when the breaker or a change window holds it, which hold them all: the line
            # stays as it is (the first in line is looked at every recheck).
            tx.wake_steps(guards.wait_key("budget", pool), 1)
            if report is not None:
                report.steps_woken += 1
        if not verdict.go:
            lifecycle.hold_step(
                tx,
                step,
                until=verdict.until or tx.now + config.recheck,
                reason=verdict.reason,
                kind=verdict.kind,
                waiting_for=guards.wait_key(verdict.kind, pool),
                report=report,
            )
            return False
        if run.node is not None:
            tx.record_disruption(run_id=run.id, node=run.node, pool=pool)
        return True


class StoreBudget:
    """``ports.budget.Budget`` over the store, with the gate's own decision and accounting:
    the node is recorded as disrupted by the run in the transaction that decided it, under
    the guards lock, so a runbook's nodes and alert-driven runs share one budget."""

    def __init__(
        self,
        store_: store.Store,
        *,
        base: guards.GuardConfig,
        index: Callable[[], playbooks.PlaybookIndex],
        cluster: Callable[[], cluster_port.Cluster | None],
    ) -> None:
        self.store = store_
        self.base = base
        self.index = index
        self.cluster = cluster

    async def _fleet(self) -> cluster_port.FleetSnapshot | None:
        cluster = self.cluster()
        if cluster is None:
            return None
        fleet = await cluster.gpu_fleet()  # as the gate: None, the percentage cap not applied
        return None if fleet is None else fleet.snapshot()

    async def take(self, node: str, *, run_id: int, playbook: str) -> guards.Verdict:
        index = self.index()
        config = guard_config(self.base, index.get(playbook))
        gate = Gate(self.base, index, frozenset(), await self._fleet())
        pool, gpu_nodes = gate.scope(config, node)

        def work(tx: store.Tx) -> guards.Verdict:
            tx.lock_guards()
            snapshot = tx.guard_snapshot(
                node=node, since=tx.now, disruptive_playbooks=(), gpu_nodes=gpu_nodes, pool=pool
            )
            verdict = guards.within_budget(config, snapshot, node=node, now=tx.now)
            if not verdict.go:  # the rollout's step is retried then (nothing wakes it)
                verdict = dataclasses.replace(verdict, until=tx.now + config.recheck)
            if verdict.go:
                tx.record_disruption(run_id=run_id, node=node, pool=pool)
                tx.add_event(
                    "budget.taken",
                    actor="engine",
                    run_id=run_id,
                    reason=verdict.reason,
                    data={"node": node, "pool": pool},
                )
            return verdict

        return await self.store.run("budget.take", work)

    async def release(self, node: str, *, run_id: int) -> None:
        def work(tx: store.Tx) -> None:
            if tx.release_disruptions(node=node, run_id=run_id):
                tx.add_event(
                    "budget.released",
                    actor="engine",
                    run_id=run_id,
                    reason=f"node {node} back in service",
                    data={"node": node},
                )

        await self.store.run("budget.release", work)


def open_breaker(tx: store.Tx, reason: str) -> None:
    state = tx.get_guard_state("breaker")
    tx.set_guard_state(
        "breaker", {**state, "open": True, "opened_at": tx.now.isoformat(), "reason": reason}
    )
    tx.add_event("breaker.opened", actor="engine", reason=reason, to_status="open")


def reset_breaker(tx: store.Tx, *, principal: str, comment: str) -> dict[str, object]:
    state = tx.get_guard_state("breaker")
    was_open = bool(state.get("open"))
    new = {
        **state,
        "open": False,
        "reset_at": tx.now.isoformat(),
        "reset_by": principal,
        "reset_comment": comment,
    }
    tx.set_guard_state("breaker", new)
    tx.wake_steps("breaker:")  # the steps it held are looked at again at once
    tx.add_event(
        "breaker.reset",
        actor=principal,
        reason=comment,
        from_status="open" if was_open else "closed",
        to_status="closed",
    )
    return new


def breaker_status(tx: store.Tx) -> dict[str, object]:
    state = tx.get_guard_state("breaker")
    return {"open": bool(state.get("open")), **state}
