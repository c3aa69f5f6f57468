"""``node.drain`` with ``kubectl drain`` semantics.

Cordon first; list the node's pods (paged); decide per pod exactly as kubectl's filters do, in
their order (terminating-for-long skipped, DaemonSet pods an error unless ignored and then never
evicted, mirror pods skipped, emptyDir an error unless allowed, unmanaged pods an error unless
forced; finished pods always fine). Any error: nothing is evicted and the node stays cordoned.
Then evict in parallel (bounded), retry pods a PodDisruptionBudget blocks (429) every interval,
and wait until each pod is gone (404 or a new uid), reporting progress; one global timeout.

Eviction failures the cluster may recover from (5xx once the adapter's retries are spent,
connection errors, even the 500 that says several budgets select a pod, which someone may fix)
make the drain fail temporarily, for the engine to run it again later; only refusals by the
filters are permanent. Every failure after the cordon carries ``maybe_applied``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from typing import Annotated, Any, ClassVar

import pydantic

from remediator.actions import clusterops, ladder, validation
from remediator.domain import errors, ladders
from remediator.ports import actions
from remediator.ports import cluster as port

MIRROR = "kubernetes.io/config.mirror"
FINISHED = ("Succeeded", "Failed")


class EvictionParams(validation.Model):
    """kubectl's filters and the eviction loop's knobs, shared by every draining action."""

    ignore_daemonsets: bool = True
    delete_emptydir_data: bool = False
    force: bool = False
    """Also evict pods that no controller manages (they will not come back)."""
    grace_period_seconds: int | None = pydantic.Field(None, ge=0, le=86400)
    """Default: each pod's own terminationGracePeriodSeconds."""
    timeout_seconds: float = pydantic.Field(300.0, gt=0, le=86400)
    eviction_retry_interval_seconds: float = pydantic.Field(5.0, gt=0, le=600)
    poll_interval_seconds: float = pydantic.Field(1.0, gt=0, le=60)
    max_concurrency: int = pydantic.Field(10, ge=1, le=100)
    skip_wait_for_delete_timeout_seconds: int = pydantic.Field(0, ge=0)


Rungs = Annotated[list[ladders.Rung] | None, pydantic.Field(min_length=1)]


class DrainParams(EvictionParams):
    node: validation.NodeName | None = None
    pod_selector: validation.LabelSelector | None = None
    rungs: Rungs = None
    """Act only when this run is on one of these rungs (decided by gpu.ladder or
    gpu.recovery_action); default: always."""


@dataclasses.dataclass(frozen=True)
class Decision:
    pod: port.PodInfo
    evict: bool
    why: str = ""
    error: bool = False


@dataclasses.dataclass
class Plan:
    evict: list[port.PodInfo]
    skipped: dict[str, str]
    errors: dict[str, str]
    warnings: dict[str, str]


def _pod_summary(pod: port.PodInfo) -> dict[str, Any]:
    """A pod a plan would evict: who owns it (what recreates it) and its GPUs."""
    owner = pod.controller or (pod.owners[0] if pod.owners else None)
    return {
        "key": pod.key,
        "namespace": pod.namespace,
        "name": pod.name,
        "owner": f"{owner.kind}/{owner.name}" if owner else None,
        "gpus": pod.gpu_requests,
    }


def decide(pod: port.PodInfo, params: EvictionParams, *, now: dt.datetime) -> Decision:
    """kubectl's filter chain for one pod (``pkg/drain/filters.go``)."""
    finished = pod.phase in FINISHED
    timeout = params.skip_wait_for_delete_timeout_seconds
    deleted = pod.deletion_timestamp
    if timeout > 0 and deleted is not None and (now - deleted).total_seconds() > timeout:
        return Decision(pod, False, f"terminating for more than {timeout}s")
    controller = pod.controller
    if controller is not None and controller.kind == "DaemonSet" and not finished:
        if not params.ignore_daemonsets:
            return Decision(pod, False, "DaemonSet-managed (set ignore_daemonsets)", error=True)
        return Decision(pod, False, "DaemonSet-managed: ignored")
    if MIRROR in pod.annotations:
        return Decision(pod, False, "mirror pod: ignored")
    warning = ""
    if "emptyDir" in pod.volume_kinds and not finished:
        if not params.delete_emptydir_data:
            return Decision(
                pod, False, "has local storage (emptyDir; set delete_emptydir_data)", error=True
            )
        warning = "deleting emptyDir data"
    if controller is None and not finished:
        if not params.force:
            return Decision(pod, False, "declares no controller (set force)", error=True)
        warning = "unmanaged pod: will not come back"
    return Decision(pod, True, warning)


def plan_drain(pods: list[port.PodInfo], params: EvictionParams, *, now: dt.datetime) -> Plan:
    plan = Plan(evict=[], skipped={}, errors={}, warnings={})
    for pod in pods:
        decision = decide(pod, params, now=now)
        if decision.error:
            plan.errors[pod.key] = decision.why
        elif not decision.evict:
            plan.skipped[pod.key] = decision.why
        else:
            plan.evict.append(pod)
            if decision.why:
                plan.warnings[pod.key] = decision.why
    return plan


def pdb_selects(pdb: port.PdbInfo, labels: dict[str, str]) -> bool:
    if not pdb.match_labels and not pdb.match_expressions:
        return False
    if any(labels.get(k) != v for k, v in pdb.match_labels.items()):
        return False
    for expr in pdb.match_expressions:
        key, op, values = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
        present = key in labels
        if (
            (op == "In" and labels.get(key) not in values)
            or (op == "NotIn" and present and labels.get(key) in values)
            or (op == "Exists" and not present)
            or (op == "DoesNotExist" and present)
        ):
            return False
    return True


class _Eviction:
    """The state of one drain while it runs; ``report()`` is both progress and output."""

    def __init__(self, ctx: actions.ActionContext, node: str, params: EvictionParams) -> None:
        self.ctx = ctx
        self.cluster = ctx.require_cluster()
        self.node = node
        self.params = params
        self.pods: dict[str, port.PodInfo] = {}
        self.evicted: set[str] = set()
        self.gone: set[str] = set()
        self.blocked: dict[str, dict[str, Any]] = {}
        self.errors: dict[str, str] = {}
        self.transient = True
        self._limit = asyncio.Semaphore(params.max_concurrency)

    def report(self) -> dict[str, Any]:
        remaining = sorted(k for k in self.pods if k not in self.gone and k not in self.errors)
        return {
            "node": self.node,
            "total": len(self.pods),
            "evicted": sorted(self.evicted),
            "gone": sorted(self.gone),
            "blocked": {k: self.blocked[k] for k in sorted(self.blocked) if k not in self.gone},
            "remaining": remaining,
            "errors": dict(sorted(self.errors.items())),
        }

    async def _progress(self) -> None:
        await self.ctx.progress({"phase": "evicting", **self.report()})

    async def run(self, pods: list[port.PodInfo]) -> None:
        self.pods = {p.key: p for p in pods}
        await self._progress()
        await asyncio.gather(*(self._one(p) for p in pods))

    async def _one(self, pod: port.PodInfo) -> None:
        try:
            if await self._evict(pod):
                await self._wait_gone(pod)
        except port.ClusterError as e:
            self.errors[pod.key] = str(e)
            self.transient = self.transient and e.temporary
        await self._progress()

    async def _evict(self, pod: port.PodInfo) -> bool:
        """True once the eviction is accepted; False when there is nothing left to wait for."""
        while True:
            async with self._limit:
                result = await self.cluster.evict_pod(
                    pod.namespace, pod.name, grace_period_seconds=self.params.grace_period_seconds
                )
            if result.outcome is port.EvictionOutcome.EVICTED:
                self.evicted.add(pod.key)
                self.blocked.pop(pod.key, None)
                await self._progress()
                return True
            if result.outcome is port.EvictionOutcome.GONE:
                self.gone.add(pod.key)
                return False
            if result.outcome is port.EvictionOutcome.ERROR:  # may be fixed: not permanent
                self.errors[pod.key] = result.message
                return False
            pdb = result.pdb or await self._pdb_for(pod)
            self.blocked[pod.key] = {"pdb": pdb, "message": result.message}
            await self._progress()
            await asyncio.sleep(self.params.eviction_retry_interval_seconds)

    async def _wait_gone(self, pod: port.PodInfo) -> None:
        while True:
            try:
                current = await self.cluster.get_pod(pod.namespace, pod.name)
            except port.NotFound:
                break
            if current.uid != pod.uid:
                break
            await asyncio.sleep(self.params.poll_interval_seconds)
        self.gone.add(pod.key)

    async def _pdb_for(self, pod: port.PodInfo) -> str | None:
        try:
            pdbs = await self.cluster.list_pdbs(pod.namespace)
        except port.ClusterError:
            return None
        names = [p.name for p in pdbs if pdb_selects(p, pod.labels)]
        return ", ".join(names) or None


def _describe_remaining(report: dict[str, Any]) -> str:
    parts = []
    for key in report["remaining"]:
        blocked = report["blocked"].get(key)
        if blocked:
            pdb = blocked.get("pdb") or "unknown budget"
            parts.append(f"{key} (blocked by PodDisruptionBudget {pdb})")
        elif key in report["evicted"]:
            parts.append(f"{key} (evicted, still terminating)")
        else:
            parts.append(f"{key} (not evicted yet)")
    return "; ".join(parts)


async def evict(
    ctx: actions.ActionContext,
    *,
    node: str,
    pods: list[port.PodInfo],
    params: EvictionParams,
    base: dict[str, Any],
    what: str,
    left: str = "",
) -> dict[str, Any]:
    """Evict ``pods`` in parallel, retrying those a budget blocks, and wait until they are
    gone, reporting progress; the final report, or ``ActionFailed`` on timeout or errors
    (``what`` names the drain in the message, ``left`` says what state it leaves)."""
    eviction = _Eviction(ctx, node, params)
    try:
        async with asyncio.timeout(params.timeout_seconds):
            await eviction.run(pods)
    except TimeoutError:
        report = eviction.report()
        raise errors.ActionFailed(
            f"{what} timed out after {params.timeout_seconds:g}s{left}; "
            f"{len(report['remaining'])} pods remain: {_describe_remaining(report)}",
            temporary=True,
            output={**base, **report, "timed_out": True},
        ) from None
    report = eviction.report()
    if report["errors"]:
        listed = "; ".join(f"{k}: {why}" for k, why in report["errors"].items())
        raise errors.ActionFailed(
            f"{what} failed{left}: {listed}",
            temporary=eviction.transient,
            output={**base, **report},
        )
    return report


class DrainAction(actions.Action[DrainParams]):
    name: ClassVar[str] = "node.drain"
    description: ClassVar[str] = "Cordon the node and evict its pods like kubectl drain."
    params_model = DrainParams
    disruptive: ClassVar[bool] = True

    async def _plan(self, ctx: actions.ActionContext, node: str, params: DrainParams) -> Plan:
        with clusterops.cluster_errors(f"listing pods on {node}"):
            pods = await ctx.require_cluster().list_pods(
                field_selector=f"spec.nodeName={node}", label_selector=params.pod_selector or ""
            )
        return plan_drain(pods, params, now=ctx.now())

    async def check(self, ctx: actions.ActionContext, params: DrainParams) -> actions.Check:
        skip = await ladder.skipped(ctx, params.rungs, params.node)
        if skip is not None:
            return actions.Check(in_place=True, output=skip)
        cluster = ctx.require_cluster()
        node = await clusterops.gpu_node(cluster, clusterops.target_node(ctx, params.node))
        if not node.unschedulable:
            return actions.Check(in_place=False)
        plan = await self._plan(ctx, node.name, params)
        done = not plan.evict and not plan.errors
        return actions.Check(in_place=done, output={"node": node.name, "skipped": plan.skipped})

    async def preview(self, ctx: actions.ActionContext, params: DrainParams) -> dict[str, Any]:
        """The pods a drain would evict now, what it would skip or refuse, and the budgets
        (PodDisruptionBudgets) that would block evictions at this moment."""
        out: dict[str, Any] = {"would": self.describe(params)}
        try:
            cluster = ctx.require_cluster()
            node = await clusterops.gpu_node(cluster, clusterops.target_node(ctx, params.node))
            plan = await self._plan(ctx, node.name, params)
            with clusterops.cluster_errors("listing PodDisruptionBudgets"):
                pdbs = await cluster.list_pdbs()
        except errors.RemediatorError as e:
            return out | {"state_error": str(e)}
        blocking: dict[str, list[str]] = {}
        covering: dict[str, dict[str, Any]] = {}
        for pod in plan.evict:
            for pdb in pdbs:
                if pdb.namespace != pod.namespace or not pdb_selects(pdb, pod.labels):
                    continue
                key = f"{pdb.namespace}/{pdb.name}"
                allowed = pdb.disruptions_allowed or 0
                covering.setdefault(key, {"key": key, "allowed": allowed, "pods": []})
                covering[key]["pods"].append(pod.key)
                if allowed < 1:
                    blocking.setdefault(key, []).append(pod.key)
        return out | {
            "node": node.name,
            "cordoned": node.unschedulable,
            "evict": [pod.key for pod in plan.evict],
            "pods": [_pod_summary(pod) for pod in plan.evict],
            "pdbs": list(covering.values()),
            "skipped": plan.skipped,
            "refused": plan.errors,
            "warnings": plan.warnings,
            "blocking_pdbs": blocking,
        }

    async def apply(self, ctx: actions.ActionContext, params: DrainParams) -> dict[str, Any]:
        cluster = ctx.require_cluster()
        node = await clusterops.gpu_node(cluster, clusterops.target_node(ctx, params.node))
        with clusterops.changing({"node": node.name}):  # cordoned, pods perhaps evicted
            return await self._drain(ctx, cluster, node, params)

    async def _drain(
        self,
        ctx: actions.ActionContext,
        cluster: port.Cluster,
        node: port.NodeInfo,
        params: DrainParams,
    ) -> dict[str, Any]:
        cordon = await clusterops.cordon(ctx, cluster, node)
        plan = await self._plan(ctx, node.name, params)
        base = {"node": node.name, "cordon": cordon, "skipped": plan.skipped}
        if plan.errors:
            listed = "; ".join(f"{k}: {why}" for k, why in sorted(plan.errors.items()))
            raise errors.ActionFailed(
                f"cannot drain {node.name}, nothing evicted, node left cordoned: {listed}",
                output={
                    **base,
                    "errors": plan.errors,
                    clusterops.MAYBE_APPLIED: bool(cordon["cordoned"]),
                },
            )
        report = await evict(
            ctx,
            node=node.name,
            pods=plan.evict,
            params=params,
            base=base,
            what=f"drain of {node.name}",
            left=", node left cordoned",
        )
        event = await clusterops.emit_node_event(
            ctx,
            cluster,
            node,
            reason="RemediatorDrain",
            what=f"drained the node ({len(report['gone'])} pods evicted)",
        )
        return {**base, **report, "warnings": plan.warnings, "event": event}

    def describe(self, params: DrainParams) -> str:
        return f"drain node {params.node or '(alert node)'} (timeout {params.timeout_seconds:g}s)"
