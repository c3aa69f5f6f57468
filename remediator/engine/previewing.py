"""Plans: what remediator would do for an alert (or what a run's steps will do), computed from
live state, with the guards' verdicts — and nothing changed.

Used by ``POST /api/v1/plan``, ``GET /api/v1/runs/{id}/plan``, ``remediator plan`` and the
runbook page. Each step's action previews itself (a drain lists the pods it would evict and the
budgets that would block it; a power cap lists the GPUs with current and target limits); the
guards are evaluated against the persisted state the same way the engine would.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any

import pydantic

from remediator.domain import alerts, playbooks, records, runs
from remediator.domain import guards as guard_rules
from remediator.domain import targeting as targeting_rules
from remediator.engine import guarding, planning, targeting
from remediator.ports import actions, cluster, notify, store

#: A step as a plan shows it: its key, action and status and, for a step still to run, what
#: its action would do (``preview``, the action's own keys) and the guards' verdict (``guard``).
StepPreview = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """A run a matching playbook would start (``steps`` empty when it could not be planned)."""

    playbook: str
    node: str | None
    gpu: str | None
    dry_run: bool
    on_resolve: playbooks.ResolvePolicy
    status: str
    reason: str
    steps: tuple[StepPreview, ...]


@dataclasses.dataclass(frozen=True)
class AlertPlan:
    """What one alert of a payload would start (``deduplicated``: why it would start nothing)."""

    alert: dict[str, Any]
    resolved: bool
    note: str
    deduplicated: str
    playbooks: tuple[PlannedRun, ...]


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What a run's steps will do: previews of those still to run, the others' status."""

    run: int
    playbook: str
    node: str | None
    steps: tuple[StepPreview, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Previewer:
    index: playbooks.PlaybookIndex
    registry: actions.Registry
    notifier: notify.Notifier
    cluster: cluster.Cluster | None
    store: store.Reads | None
    guards: guard_rules.GuardConfig
    clock: Callable[[], dt.datetime]
    dry_run: bool = False
    node_labels: tuple[str, ...] = targeting_rules.DEFAULT_ORDER

    async def plan_payload(self, payload: alerts.WebhookPayload) -> list[AlertPlan]:
        """Every alert's plan. The guards' verdicts of all of them are read in one transaction
        (one per alert and playbook queued behind every write, and took seconds)."""
        repeats = await self._repeats(payload.alerts)
        drafts = [await self._draft(alert) for alert in payload.alerts if id(alert) not in repeats]
        wanted = {
            (playbook.name, new.node): (playbook.guards.apply(self.guards), new.node)
            for _, matched in drafts
            for playbook, new in matched
            if new.status is not runs.RunStatus.FAILED
        }
        verdicts = await self._verdicts(wanted)
        planned = {
            id(alert): _alert_plan(alert, [], repeat=repeats[id(alert)])
            for alert in payload.alerts
            if id(alert) in repeats
        }
        for alert, matched in drafts:
            plans = [
                await self._plan_run(
                    playbook,
                    new,
                    dict(alert.labels),
                    alert,
                    verdicts.get((playbook.name, new.node)),
                )
                for playbook, new in matched
            ]
            planned[id(alert)] = _alert_plan(alert, plans)
        return [planned[id(alert)] for alert in payload.alerts]

    async def _repeats(self, given: list[alerts.Alert]) -> dict[int, str]:
        """The firing alerts intake would deduplicate (an episode with their fingerprint and
        start exists: a repeat changes nothing and starts no run), each with what exists."""
        firing = [a for a in given if a.status is alerts.AlertStatus.FIRING]
        if self.store is None or not firing:
            return {}

        def find(tx: store.Tx) -> dict[int, str]:
            found = {}
            for alert in firing:
                episode = tx.find_episode(alert.fingerprint, alert.starts_at)
                if episode is not None:
                    found[id(alert)] = _repeat_note(episode, tx.runs_of_episode(episode.id))
            return found

        return await self.store.read("plan.repeats", find)

    async def _draft(
        self, alert: alerts.Alert
    ) -> tuple[alerts.Alert, list[tuple[playbooks.Playbook, records.NewRun]]]:
        """The runs ``alert`` would start, before guards and previews."""
        episode = records.Episode(
            id=0,
            fingerprint=alert.fingerprint,
            starts_at=alert.starts_at,
            alertname=alert.alertname,
            status=alert.status,
            handled_status=None,
            labels=dict(alert.labels),
            annotations=dict(alert.annotations),
            generator_url=alert.generator_url,
            ends_at=None,
            first_delivery_id=None,
            created_at=self.clock(),
            resolved_at=None,
        )
        matched = []
        resolver = targeting.NodeResolver(self.cluster) if self.cluster is not None else None
        for playbook in self.index.match(episode.labels):
            node = await self._node(resolver, playbook, episode.labels)
            new = planning.plan_alert_run(
                playbook, episode, self.registry, dry_run=self.dry_run, node=node
            )
            matched.append((playbook, new))
        return alert, matched

    async def _node(
        self,
        resolver: targeting.NodeResolver | None,
        playbook: playbooks.Playbook,
        labels: dict[str, str],
    ) -> targeting_rules.Choice:
        """The node the engine would choose (the cluster confirms it, as in the engine)."""
        order = planning.node_order(playbook, self.node_labels)
        if resolver is None:
            return targeting_rules.unverified(labels, order)
        try:
            return await resolver.choose(labels, order)
        except targeting.TargetUnavailable as e:
            return targeting_rules.Choice(node=None, reason=f"no node confirmed: {e}")

    async def _plan_run(
        self,
        playbook: playbooks.Playbook,
        new: records.NewRun,
        labels: dict[str, str],
        alert: alerts.Alert | None,
        verdict: guard_rules.Verdict | None,
    ) -> PlannedRun:
        out = PlannedRun(
            playbook=playbook.name,
            node=new.node,
            gpu=new.gpu,
            dry_run=new.dry_run,
            on_resolve=new.on_resolve,
            status=new.status.value,
            reason=new.reason,
            steps=(),
        )
        if new.status is runs.RunStatus.FAILED:
            return out
        steps = []
        for step in new.steps:
            steps.append(
                await self.preview_step(
                    key=step.key,
                    action_name=step.action,
                    params=step.params,
                    enabled=step.enabled,
                    requires_approval=step.requires_approval,
                    node=new.node,
                    gpu=new.gpu,
                    labels=labels,
                    annotations=dict(alert.annotations) if alert else {},
                    verdict=verdict,
                )
            )
        return dataclasses.replace(out, steps=tuple(steps))

    async def plan_run(
        self, run: records.Run, steps: list[records.Step], labels: dict[str, str]
    ) -> RunPlan:
        playbook = self.index.get(run.playbook)
        config = playbook.guards.apply(self.guards) if playbook else self.guards
        verdict = await self._verdict(config, run.node)
        previews = []
        for step in steps:
            preview = {"key": step.key, "action": step.action, "status": step.status.value}
            if step.status in (runs.StepStatus.PENDING, runs.StepStatus.WAITING_APPROVAL):
                preview = await self.preview_step(
                    key=step.key,
                    action_name=step.action,
                    params=step.params,
                    enabled=True,
                    requires_approval=step.requires_approval,
                    node=run.node,
                    gpu=run.gpu,
                    labels=labels,
                    annotations={},
                    verdict=verdict,
                ) | {"status": step.status.value}
            previews.append(preview)
        return RunPlan(run.id, run.playbook, run.node, tuple(previews))

    async def preview_step(
        self,
        *,
        key: str,
        action_name: str,
        params: dict[str, Any],
        enabled: bool,
        requires_approval: bool,
        node: str | None,
        gpu: str | None,
        labels: dict[str, str],
        annotations: dict[str, str],
        verdict: guard_rules.Verdict | None,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {
            "key": key,
            "action": action_name,
            "params": params,
            "enabled": enabled,
            "requires_approval": requires_approval,
        }
        if not enabled or action_name not in self.registry:
            return out
        action = self.registry.get(action_name)
        out["disruptive"] = action.disruptive
        try:
            parsed = action.parse(params)
        except pydantic.ValidationError as e:
            return out | {"error": f"invalid params: {e.error_count()} errors"}
        ctx = actions.ActionContext(
            run_id=0,
            step_id=0,
            step_key=key,
            attempt=0,
            playbook="",
            node=node,
            gpu=gpu,
            labels=labels,
            annotations=annotations,
            dry_run=True,
            now=self.clock,
            notifier=self.notifier,
            cluster=self.cluster,
        )
        out["preview"] = await action.preview(ctx, parsed)
        if action.disruptive and verdict is not None:
            out["guard"] = {"go": verdict.go, "reason": verdict.reason}
        return out

    async def _verdict(
        self, config: guard_rules.GuardConfig, node: str | None
    ) -> guard_rules.Verdict | None:
        return (await self._verdicts({None: (config, node)})).get(None)

    async def _verdicts(
        self, wanted: dict[Any, tuple[guard_rules.GuardConfig, str | None]]
    ) -> dict[Any, guard_rules.Verdict]:
        """The guards' verdict on one more run for each wanted ``(config, node)``, read in one
        transaction; none without a store."""
        if self.store is None or not wanted:
            return {}
        disruptive = frozenset(a.name for a in self.registry.all() if a.disruptive)
        names = guarding.disruptive_playbooks(self.index, disruptive)
        fleet = None
        if self.cluster is not None:
            try:
                watched = await self.cluster.gpu_fleet()
                fleet = None if watched is None else watched.snapshot()
            except Exception:  # the plan still shows everything else
                fleet = None
        gates = {
            key: guarding.Gate(
                base=config, index=self.index, disruptive_actions=disruptive, fleet=fleet
            ).scope(config, node)
            for key, (config, node) in wanted.items()
        }

        def snapshot(
            tx: store.Tx, config: guard_rules.GuardConfig, node: str | None, key: Any
        ) -> guard_rules.Verdict:
            pool, gpu_nodes = gates[key]
            state = tx.guard_snapshot(
                node=node,
                since=tx.now - config.breaker_window,
                disruptive_playbooks=names,
                gpu_nodes=gpu_nodes,
                pool=pool,
            )
            # One more run of this playbook is what the plan is about.
            labels = fleet.get(node) if fleet is not None and node is not None else None
            state = dataclasses.replace(
                state, recent_runs=state.recent_runs + 1, node_labels=labels
            )
            return guard_rules.decide(config, state, node=node, now=tx.now)

        def snapshots(tx: store.Tx) -> dict[Any, guard_rules.Verdict]:
            return {key: snapshot(tx, config, node, key) for key, (config, node) in wanted.items()}

        return await self.store.read("plan", snapshots)


def _repeat_note(episode: records.Episode, existing: list[records.Run]) -> str:
    runs_text = ", ".join(f"#{r.id} {r.playbook} {r.status.value}" for r in existing)
    return (
        f"deduplicated: a repeat of episode {episode.id} (first received "
        f"{episode.created_at:%Y-%m-%d %H:%M:%S} UTC); it changes nothing and starts no run. "
        + (f"The episode's runs: {runs_text}" if runs_text else "The episode has no runs.")
    )


def _alert_plan(alert: alerts.Alert, plans: list[PlannedRun], *, repeat: str = "") -> AlertPlan:
    resolved = alert.status is alerts.AlertStatus.RESOLVED
    return AlertPlan(
        alert=alerts.describe(alert),
        resolved=resolved,
        note="a resolved alert starts nothing" if resolved else "",
        deduplicated=repeat,
        playbooks=tuple(plans),
    )
