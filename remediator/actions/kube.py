"""Node actions: cordon/uncordon, labels, taints. ``KUBE_ACTIONS`` lists every Kubernetes action.

Each action re-reads the node, refuses nodes outside the GPU selector, writes with a
resourceVersion precondition (retried on 409 with a fresh read), records what it changed (the
previous values) in its output, and emits an Event on the node. Undo restores only what is
still as this run left it: whatever someone else changed since is left alone and said so.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import pydantic

from remediator.actions import (
    bugreport,
    clusterops,
    drain,
    gpu,
    gpudrain,
    pods,
    taints,
    validation,
)
from remediator.domain import errors
from remediator.ports import actions
from remediator.ports import cluster as port

CORDONED_BY = clusterops.CORDONED_BY


class NodeParams(validation.Model):
    node: validation.NodeName | None = None
    """Default: the run's node."""


async def _node(ctx: actions.ActionContext, params: NodeParams) -> port.NodeInfo:
    cluster = ctx.require_cluster()
    return await clusterops.gpu_node(cluster, clusterops.target_node(ctx, params.node))


class CordonAction(actions.Action[NodeParams]):
    name: ClassVar[str] = "node.cordon"
    description: ClassVar[str] = "Mark the node unschedulable (annotated with the run)."
    params_model = NodeParams
    disruptive: ClassVar[bool] = True
    supports_undo: ClassVar[bool] = True
    undo_returns_to_service: ClassVar[bool] = True
    observable: ClassVar[bool] = True

    async def check(self, ctx: actions.ActionContext, params: NodeParams) -> actions.Check:
        node = await _node(ctx, params)
        holder = node.annotations.get(CORDONED_BY)
        output = {
            "node": node.name,
            "cordoned_by": holder,
            # Ours only if this run's earlier attempt did it (found again after a crash).
            "ours": holder if node.unschedulable and holder == clusterops.run_marker(ctx) else None,
        }
        return actions.Check(in_place=node.unschedulable, output=output)

    async def apply(self, ctx: actions.ActionContext, params: NodeParams) -> dict[str, Any]:
        node = await _node(ctx, params)
        marker = clusterops.run_marker(ctx)
        with clusterops.changing({"node": node.name, "cordoned_by": marker, "ours": marker}):
            done = await clusterops.cordon(ctx, ctx.require_cluster(), node)
        ours = done["cordoned_by"] if done["cordoned"] else None
        return {"node": node.name, **done, "ours": ours}

    @staticmethod
    def _ours(ctx: actions.ActionContext) -> str | None:
        """The marker the cordoning run left (the undo runs in a run of its own)."""
        ours = ctx.applied_output.get("ours")
        return str(ours) if ours else None

    @staticmethod
    def _left_alone(node: port.NodeInfo, ours: str | None) -> str | None:
        """Why the undo must not touch the node, or ``None`` if it is still ours to undo."""
        holder = node.annotations.get(CORDONED_BY)
        if ours is None:
            return "the node was not cordoned by the run being undone"
        if holder == ours:
            return None
        if not node.unschedulable:
            return "uncordoned by someone else"
        return f"cordoned by {holder}" if holder else "cordon state changed by someone else"

    async def check_undo(self, ctx: actions.ActionContext, params: NodeParams) -> actions.Check:
        node = await _node(ctx, params)
        reason = self._left_alone(node, self._ours(ctx))
        if reason is not None:
            return actions.Check(in_place=True, output={"node": node.name, "left_alone": reason})
        return actions.Check(in_place=False)

    async def undo(self, ctx: actions.ActionContext, params: NodeParams) -> dict[str, Any]:
        cluster = ctx.require_cluster()
        node = await _node(ctx, params)
        reason = self._left_alone(node, self._ours(ctx))
        if reason is not None:
            return {"node": node.name, "left_alone": reason}
        output: dict[str, Any] = {"node": node.name}
        if not node.unschedulable:  # uncordoned by hand; only our annotation is left to clear
            output["left_alone"] = "uncordoned by someone else"
        await _uncordon(ctx, cluster, node, output)
        return output

    async def observe(self, ctx: actions.ActionContext, params: NodeParams) -> actions.Observation:
        node = await _observed_node(ctx, params.node)
        if node is None or not node.unschedulable:
            return _gone(ctx, params.node, "is not cordoned any more")
        holder = node.annotations.get(CORDONED_BY)
        if holder == clusterops.run_marker(ctx):
            return actions.Observation(
                actions.Presence.PRESENT, f"node {node.name} is cordoned by {holder}"
            )
        return actions.Observation(
            actions.Presence.CHANGED,
            f"node {node.name} is cordoned, but by {holder or 'someone else'} now",
        )

    def describe(self, params: NodeParams) -> str:
        return f"cordon node {params.node or '(alert node)'}"


async def _observed_node(ctx: actions.ActionContext, param: str | None) -> port.NodeInfo | None:
    """The node as it is now, or ``None`` when it no longer exists."""
    cluster = ctx.require_cluster()
    name = clusterops.target_node(ctx, param)
    with clusterops.cluster_errors(f"reading node {name}"):
        try:
            return await cluster.get_node(name)
        except port.NotFound:
            return None


def _gone(ctx: actions.ActionContext, param: str | None, what: str) -> actions.Observation:
    name = param or ctx.node
    return actions.Observation(actions.Presence.GONE, f"node {name} {what}")


async def _uncordon(
    ctx: actions.ActionContext, cluster: port.Cluster, node: port.NodeInfo, output: dict[str, Any]
) -> None:
    was_cordoned = node.unschedulable

    async def attempt() -> port.NodeInfo:
        fresh = await cluster.get_node(node.name)
        return await cluster.patch_node(
            node.name,
            unschedulable=False if fresh.unschedulable else None,
            annotations={CORDONED_BY: None},
            resource_version=fresh.resource_version,
        )

    await clusterops.with_conflict_retries(f"uncordoning node {node.name}", attempt)
    output["uncordoned"] = was_cordoned
    output["annotation_removed"] = CORDONED_BY in node.annotations
    if was_cordoned:
        output["event"] = await clusterops.emit_node_event(
            ctx, cluster, node, reason="RemediatorUncordon", what="uncordoned the node"
        )


class UncordonParams(NodeParams):
    only_if_cordoned_by_us: bool = True
    """Refuse when the node was cordoned by something other than remediator."""


class UncordonAction(actions.Action[UncordonParams]):
    name: ClassVar[str] = "node.uncordon"
    description: ClassVar[str] = "Mark the node schedulable again (if remediator cordoned it)."
    params_model = UncordonParams
    returns_to_service: ClassVar[bool] = True

    async def check(self, ctx: actions.ActionContext, params: UncordonParams) -> actions.Check:
        node = await _node(ctx, params)
        done = not node.unschedulable and CORDONED_BY not in node.annotations
        return actions.Check(in_place=done, output={"node": node.name})

    async def apply(self, ctx: actions.ActionContext, params: UncordonParams) -> dict[str, Any]:
        cluster = ctx.require_cluster()
        node = await _node(ctx, params)
        others = await clusterops.other_holders(ctx, node.name)
        if others:
            raise errors.ActionFailed(f"refused: node {node.name} is held by runs {others}")
        holder = node.annotations.get(CORDONED_BY, "")
        if node.unschedulable and params.only_if_cordoned_by_us and not holder.startswith("run-"):
            raise errors.ActionFailed(
                f"refused: node {node.name} was not cordoned by remediator (no {CORDONED_BY} "
                "annotation); set only_if_cordoned_by_us: false to uncordon it anyway",
                output={"node": node.name, "refused": "cordoned by someone else"},
            )
        output: dict[str, Any] = {"node": node.name, "cordoned_by": holder or None}
        await _uncordon(ctx, cluster, node, output)
        return output

    def describe(self, params: UncordonParams) -> str:
        return f"uncordon node {params.node or '(alert node)'}"


# ---- labels -----------------------------------------------------------------------------


def _restore_plan(
    current: dict[str, str], previous: dict[str, str | None], written: dict[str, str | None]
) -> tuple[dict[str, str | None], dict[str, str]]:
    """Which keys to put back, and which to leave alone because someone changed them since."""
    restore: dict[str, str | None] = {}
    left_alone: dict[str, str] = {}
    for key, before in previous.items():
        now = current.get(key)
        if now == before:
            continue
        if now != written.get(key):
            left_alone[key] = f"changed by someone else to {now!r}"
            continue
        restore[key] = before
    return restore, left_alone


class LabelParams(NodeParams):
    labels: dict[validation.LabelKey, validation.LabelValue] = pydantic.Field(min_length=1)


class UnlabelParams(NodeParams):
    keys: list[validation.LabelKey] = pydantic.Field(min_length=1)


class _LabelsBase(abc.ABC):
    """Shared by node.label and node.unlabel: the wanted map, the write and its undo."""

    event_reason: ClassVar[str]

    @abc.abstractmethod
    def wanted(self, params: Any) -> dict[str, str | None]:
        """The labels to set (a value) or remove (``None``)."""

    async def _write(
        self, ctx: actions.ActionContext, params: NodeParams, wanted: dict[str, str | None]
    ) -> tuple[port.NodeInfo, dict[str, str | None]]:
        cluster = ctx.require_cluster()
        node = await _node(ctx, params)
        previous: dict[str, str | None] = {}

        def written() -> dict[str, Any]:
            return {"node": node.name, "set": wanted, "previous": dict(previous)}

        async def attempt() -> port.NodeInfo:
            fresh = await cluster.get_node(node.name)
            previous.clear()
            previous.update({k: fresh.labels.get(k) for k in wanted})
            changes = {k: v for k, v in wanted.items() if fresh.labels.get(k) != v}
            if not changes:
                return fresh
            return await cluster.patch_node(
                node.name, labels=changes, resource_version=fresh.resource_version
            )

        with clusterops.changing(written):
            updated = await clusterops.with_conflict_retries(f"labelling node {node.name}", attempt)
        return updated, previous

    async def check(self, ctx: actions.ActionContext, params: NodeParams) -> actions.Check:
        node = await _node(ctx, params)
        wanted = self.wanted(params)
        current = {k: node.labels.get(k) for k in wanted}
        # ``previous`` is what the node has now: once in place that is ``wanted`` (what undo
        # of a check that found the labels in place restores: nothing); before, what a plan
        # shows and what undo will put back.
        return actions.Check(
            in_place=current == wanted,
            output={"node": node.name, "set": wanted, "previous": current},
        )

    async def apply(self, ctx: actions.ActionContext, params: NodeParams) -> dict[str, Any]:
        wanted = self.wanted(params)
        node, previous = await self._write(ctx, params, wanted)
        what = ", ".join(f"{k}={v}" if v is not None else f"-{k}" for k, v in wanted.items())
        event = await clusterops.emit_node_event(
            ctx, ctx.require_cluster(), node, reason=self.event_reason, what=f"labels {what}"
        )
        return {"node": node.name, "set": wanted, "previous": previous, "event": event}

    async def check_undo(self, ctx: actions.ActionContext, params: NodeParams) -> actions.Check:
        node = await _node(ctx, params)
        previous = dict(ctx.applied_output.get("previous") or {})
        written = dict(ctx.applied_output.get("set") or {})
        restore, left_alone = _restore_plan(node.labels, previous, written)
        output = {"node": node.name, "left_alone": left_alone}
        return actions.Check(in_place=not restore, output=output)

    async def undo(self, ctx: actions.ActionContext, params: NodeParams) -> dict[str, Any]:
        cluster = ctx.require_cluster()
        node = await _node(ctx, params)
        previous = dict(ctx.applied_output.get("previous") or {})
        written = dict(ctx.applied_output.get("set") or {})
        plan: dict[str, Any] = {}

        async def attempt() -> port.NodeInfo:
            fresh = await cluster.get_node(node.name)
            restore, left_alone = _restore_plan(fresh.labels, previous, written)
            plan.update(restored=restore, left_alone=left_alone)
            if not restore:
                return fresh
            return await cluster.patch_node(
                node.name, labels=restore, resource_version=fresh.resource_version
            )

        await clusterops.with_conflict_retries(f"restoring labels of {node.name}", attempt)
        return {"node": node.name, **plan}


class LabelAction(_LabelsBase, actions.Action[LabelParams]):
    name: ClassVar[str] = "node.label"
    description: ClassVar[str] = "Set labels on the node; undo restores the previous values."
    params_model = LabelParams
    supports_undo: ClassVar[bool] = True
    observable: ClassVar[bool] = True
    event_reason: ClassVar[str] = "RemediatorLabel"

    def wanted(self, params: Any) -> dict[str, str | None]:
        return dict(params.labels)

    async def observe(self, ctx: actions.ActionContext, params: LabelParams) -> actions.Observation:
        node = await _observed_node(ctx, params.node)
        if node is None:
            return _gone(ctx, params.node, "does not exist any more")
        previous = dict(ctx.applied_output.get("previous") or {})
        found = {key: node.labels.get(key) for key in params.labels}
        differing = {k: v for k, v in found.items() if v != params.labels[k]}
        shown = ", ".join(f"{k}={v!r}" for k, v in differing.items())
        if not differing:
            what = ", ".join(f"{k}={v}" for k, v in params.labels.items())
            return actions.Observation(
                actions.Presence.PRESENT, f"node {node.name} has labels {what}"
            )
        if all(v is None or (k in previous and v == previous[k]) for k, v in differing.items()):
            return actions.Observation(
                actions.Presence.GONE, f"node {node.name} has labels {shown} again"
            )
        return actions.Observation(
            actions.Presence.CHANGED, f"node {node.name} labels changed since: {shown}"
        )


class UnlabelAction(_LabelsBase, actions.Action[UnlabelParams]):
    name: ClassVar[str] = "node.unlabel"
    description: ClassVar[str] = "Remove labels from the node; undo puts them back."
    params_model = UnlabelParams
    supports_undo: ClassVar[bool] = True
    event_reason: ClassVar[str] = "RemediatorUnlabel"

    def wanted(self, params: Any) -> dict[str, str | None]:
        return dict.fromkeys(params.keys)


KUBE_ACTIONS: list[actions.Action[Any]] = [
    CordonAction(),
    UncordonAction(),
    LabelAction(),
    UnlabelAction(),
    taints.TaintAction(),
    taints.UntaintAction(),
    drain.DrainAction(),
    gpudrain.GpuDrainAction(),
    pods.EventAction(),
    pods.AnnotateAction(),
    pods.EvictAction(),
    gpu.PowerCapAction(),
    bugreport.BugReportAction(),
]
"""Every Kubernetes action, for the composition root to register."""
