"""Operations: the typed use cases the HTTP API and the console call (and, through the API,
the CLI), between them and the engine's state. Each returns a frozen result; rendering it
(JSON, a page) is the caller's business.

- ``decide`` records an approval or a rejection of a waiting step. The step must belong to
  the run named (a step id of another run is ``NotFound``, so a URL cannot decide a step it
  does not show). The decision and its audit event are one transaction; runs it ends are
  published (metrics, notices) after the commit and the engine is woken to go on at once.
- ``trigger`` starts a manual runbook on one node: the playbook must be manual, its
  parameters valid, and the trigger's ``node`` and the ``node`` parameter name one node (the
  run locks, is audited on and acts on it). ``trigger_selected`` starts one run per GPU node a
  label selector matches. The run and its ``run.created`` event name the principal.
- ``plan_payload`` and ``plan_run`` preview, changing nothing (``previewing``).
- ``breaker_status`` is the breaker as stored with the nodes the disruption budget counts
  now; ``reset_breaker`` closes it with the principal and comment in the audit trail and wakes
  the engine so held steps are looked at again at once.
- ``fleet_status`` joins what the cluster lists (GPU nodes, their labels, taints and cordons)
  with what the store records (runs, disruptions, held steps, power caps, the breaker); without
  a cluster, or when listing fails, the store's view is shown alone and the failure named.

Nothing here holds state between calls: a crash between a commit and the wake-up loses only
the wake-up, and the engine's next poll finds the work.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from remediator.domain import alerts, errors, fleet, guards, playbooks, records, runs
from remediator.domain import targeting as targeting_rules
from remediator.engine import approvals, guarding, lifecycle, planning, previewing
from remediator.ports import actions, cluster, notify, store
from remediator.ports import fleet as fleet_port
from remediator.ports.cluster import NodeInfo

T = TypeVar("T")

#: A Kubernetes node name (a DNS-1123 subdomain).
NODE_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"


class OperationsStore(Protocol):
    """The store as the use cases need it (``store.Store`` whose writes get approvals' unit
    of work)."""

    async def run(self, operation: str, work: Callable[[approvals.ApprovalTx], T]) -> T: ...

    async def read(self, operation: str, work: Callable[[store.Tx], T]) -> T: ...

    async def probe(self) -> records.Probe: ...


@dataclasses.dataclass(frozen=True)
class Decision:
    """A step after a decision: ``pending`` once approved by enough principals, still
    ``waiting_approval`` while more are needed, ``rejected`` after a rejection."""

    run_id: int
    step_id: int
    status: runs.StepStatus
    approvals_required: int


@dataclasses.dataclass(frozen=True)
class Triggered:
    """A manual run started by ``principal`` (``node``: its one target, if any)."""

    run_id: int
    playbook: str
    node: str | None
    principal: str


@dataclasses.dataclass(frozen=True)
class Selected:
    """One run per GPU node ``selector`` matched, in node-name order."""

    selector: str
    runs: tuple[Triggered, ...]


@dataclasses.dataclass(frozen=True)
class BreakerStatus:
    """The circuit breaker as stored, and the nodes the disruption budget counts now."""

    open: bool
    reason: str | None
    opened_at: str | None
    reset_at: str | None
    reset_by: str | None
    reset_comment: str | None
    disrupted_nodes: tuple[str, ...]


async def _nothing_to_publish(report: lifecycle.Report) -> None:
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Operations:
    store: OperationsStore
    records: fleet_port.FleetRecords
    registry: actions.Registry
    index: Callable[[], playbooks.PlaybookIndex]  # the playbooks as loaded now (reloadable)
    cluster: Callable[[], cluster.Cluster | None]  # connected at start-up: asked each time
    notifier: notify.Notifier
    guards: guards.GuardConfig
    clock: Callable[[], dt.datetime]
    dry_run: bool = False
    forbid_alert_sender: bool = True
    node_labels: tuple[str, ...] = targeting_rules.DEFAULT_ORDER
    wake: Callable[[], None] = lambda: None
    publish: Callable[[lifecycle.Report], Awaitable[None]] = _nothing_to_publish

    # -- approvals ---------------------------------------------------------------------------

    async def decide(
        self, *, run_id: int, step_id: int, principal: str, approve: bool, comment: str
    ) -> Decision:
        report = lifecycle.Report()

        def work(tx: approvals.ApprovalTx) -> records.Step:
            step = tx.get_step(step_id)
            if step is None or step.run_id != run_id:
                raise errors.NotFound(f"step {step_id} of run {run_id} not found")
            report.finished.clear()  # a retried transaction starts over
            report.notices.clear()
            return lifecycle.decide_approval(
                tx,
                step_id,
                principal=principal,
                approve=approve,
                comment=comment,
                registry=self.registry,
                report=report,
                forbid_alert_sender=self.forbid_alert_sender,
            )

        moved = await self.store.run("approval", work)
        await self.publish(report)
        self.wake()
        return Decision(run_id, step_id, moved.status, moved.approvals_required)

    # -- manual runbooks ---------------------------------------------------------------------

    def manual_playbook(self, name: str) -> playbooks.Playbook:
        playbook = self.index().get(name)
        if playbook is None or not playbook.manual:
            raise errors.NotFound(f"no manual runbook {name[:80]!r}")
        return playbook

    async def trigger(
        self,
        *,
        playbook: str,
        node: str | None,
        params: Mapping[str, Any],
        principal: str,
        dry_run: bool = False,
    ) -> Triggered:
        """Start the manual runbook ``playbook`` on ``node`` (or ``params.node``; both given
        must agree). Its parameters are validated by the playbook."""
        found = self.manual_playbook(playbook)
        if node is not None:  # a form's node is free text
            check_node_name(node, field="node")
        planning.manual_target(node, params)  # refuses two different nodes
        if node is not None and "node" in found.parameters:
            params = {**params, "node": node}
        values, problems = playbooks.validate_parameters(found.parameters, dict(params))
        if problems:
            raise errors.ValidationFailed("invalid parameters", fields=problems)
        target = values.get("node", node) if "node" in found.parameters else node
        if target is not None:
            check_node_name(target, field="params.node" if node is None else "node")
        target = planning.manual_target(target, values)

        def work(tx: approvals.ApprovalTx) -> int:
            return lifecycle.create_manual_run(
                tx,
                found,
                self.registry,
                params=values,
                node=target,
                principal=principal,
                dry_run=dry_run or self.dry_run,
            )

        run_id = await self.store.run("runbook.trigger", work)
        self.wake()
        return Triggered(run_id, found.name, target, principal)

    async def trigger_selected(
        self,
        *,
        playbook: str,
        selector: str,
        params: Mapping[str, Any],
        principal: str,
        dry_run: bool = False,
    ) -> Selected:
        """Start ``playbook`` once on every GPU node ``selector`` matches."""
        self.manual_playbook(playbook)  # not found before any node is selected
        if "node" in params:
            raise errors.ValidationFailed("give node (or params.node) or selector, not both")
        nodes = await self.select_nodes(selector)
        if not nodes:
            raise errors.ValidationFailed(f"no GPU node matches {selector!r}")
        started = [
            await self.trigger(
                playbook=playbook,
                node=node,
                params={**params, "node": node},
                principal=principal,
                dry_run=dry_run,
            )
            for node in nodes
        ]
        return Selected(selector, tuple(started))

    async def select_nodes(self, selector: str) -> list[str]:
        """GPU nodes matching ``selector`` (for a runbook started on many nodes)."""
        found = self.cluster()
        if found is None:
            raise errors.ValidationFailed("no Kubernetes cluster is configured to select nodes")
        gpu_selector = getattr(found, "gpu_node_selector", "")
        combined = ",".join(part for part in (gpu_selector, selector) if part)
        try:
            nodes = await found.list_nodes(combined)
        except errors.RemediatorError as e:
            raise errors.ValidationFailed(f"cannot select nodes with {selector!r}: {e}") from e
        return sorted(node.name for node in nodes)

    # -- plans -------------------------------------------------------------------------------

    def previewer(self) -> previewing.Previewer:
        return previewing.Previewer(
            index=self.index(),
            registry=self.registry,
            notifier=self.notifier,
            cluster=self.cluster(),
            store=self.store,
            guards=self.guards,
            clock=self.clock,
            dry_run=self.dry_run,
            node_labels=self.node_labels,
        )

    async def plan_payload(self, payload: alerts.WebhookPayload) -> list[previewing.AlertPlan]:
        """Every alert's plan (``Previewer.plan_payload``)."""
        return await self.previewer().plan_payload(payload)

    async def plan_run(self, run_id: int) -> previewing.RunPlan | None:
        """What the run's remaining steps will do (``None``: no such run)."""

        def load(
            tx: store.Tx,
        ) -> tuple[records.Run, list[records.Step], dict[str, str]] | None:
            run = tx.get_run(run_id)
            if run is None:
                return None
            episode = tx.get_episode(run.episode_id) if run.episode_id else None
            return run, tx.steps_of_run(run_id), episode.labels if episode else {}

        found = await self.store.read("plan.load", load)
        if found is None:
            return None
        return await self.previewer().plan_run(*found)

    # -- guards and the fleet ----------------------------------------------------------------

    async def breaker_status(self) -> BreakerStatus:
        state = await self.store.read("breaker", guarding.breaker_status)

        def budget(tx: store.Tx) -> list[str]:
            snapshot = tx.guard_snapshot(
                node=None, since=tx.now, disruptive_playbooks=[], gpu_nodes=None
            )
            return sorted(snapshot.disrupted_nodes)

        disrupted = await self.store.read("budget", budget)
        return BreakerStatus(
            open=bool(state.get("open")),
            reason=_text(state.get("reason")),
            opened_at=_text(state.get("opened_at")),
            reset_at=_text(state.get("reset_at")),
            reset_by=_text(state.get("reset_by")),
            reset_comment=_text(state.get("reset_comment")),
            disrupted_nodes=tuple(disrupted),
        )

    async def reset_breaker(self, *, principal: str, comment: str) -> BreakerStatus:
        """Close the breaker; the answer is its status afterwards."""
        await self.store.run(
            "breaker.reset",
            lambda tx: guarding.reset_breaker(tx, principal=principal, comment=comment),
        )
        self.wake()
        return await self.breaker_status()

    async def fleet_status(self) -> fleet.FleetStatus:
        listed, failure = await self._nodes()
        found = await self.records.fleet_records()
        # Pure, immutable in, on a thread: 5,000 nodes are 30-40 ms of CPU, which the loop
        # then shares at the interpreter's switch interval instead of waiting them out.
        return await asyncio.to_thread(self._assemble, listed, found, failure)

    def _assemble(
        self, listed: list[NodeInfo] | None, found: fleet.Records, failure: str | None
    ) -> fleet.FleetStatus:
        nodes = (
            None
            if listed is None
            else [
                fleet.ClusterNode(
                    name=node.name,
                    labels=node.labels,  # read only: each change of a node is a new NodeInfo
                    taints=tuple(taint.key for taint in node.taints),
                    unschedulable=node.unschedulable,
                    ready=node.ready,
                )
                for node in listed
            ]
        )
        return fleet.assemble(nodes, found, config=self.guards, cluster_error=failure)

    async def _nodes(self) -> tuple[list[NodeInfo] | None, str | None]:
        found = self.cluster()
        if found is None:
            return None, None
        try:
            return await found.gpu_nodes(), None
        except errors.RemediatorError as e:
            return None, f"cannot list GPU nodes: {e}"


def check_node_name(node: object, *, field: str) -> None:
    """Refuse what is not a Kubernetes node name, naming the field it came in."""
    if isinstance(node, str) and re.fullmatch(NODE_NAME, node):
        return
    message = f"{str(node)[:80]!r} is not a Kubernetes node name (a DNS-1123 subdomain)"
    raise errors.ValidationFailed(message, fields=[{"field": field, "message": message}])


def _text(value: object) -> str | None:
    return None if value is None else str(value)
