"""``node.taint`` / ``node.untaint``: ``spec.taints`` is atomic, so every write replaces the
whole list, guarded by the resourceVersion it was read at, and is retried on 409."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, ClassVar

import pydantic

from remediator.actions import clusterops, validation
from remediator.ports import actions
from remediator.ports import cluster as port


class TaintParams(validation.Model):
    node: validation.NodeName | None = None
    taints: list[validation.TaintSpec] = pydantic.Field(min_length=1)


class UntaintParams(validation.Model):
    node: validation.NodeName | None = None
    taints: list[validation.TaintRef] = pydantic.Field(min_length=1)


def _taint(spec: validation.TaintSpec | dict[str, Any]) -> port.Taint:
    if isinstance(spec, dict):
        return port.Taint(key=spec["key"], effect=spec["effect"], value=spec.get("value"))
    return port.Taint(key=spec.key, effect=spec.effect, value=spec.value)


def _slot(taint: port.Taint) -> tuple[str, str]:
    return taint.key, taint.effect


def with_taints(current: list[port.Taint], wanted: list[port.Taint]) -> list[port.Taint]:
    """``current`` with each wanted taint added, replacing one with the same key and effect."""
    slots = {_slot(t): t for t in wanted}
    result = [slots.pop(_slot(t)) if _slot(t) in slots else t for t in current]
    return result + [t for t in wanted if _slot(t) in slots]


def without_taints(
    current: list[port.Taint], refs: list[validation.TaintRef]
) -> tuple[list[port.Taint], list[port.Taint]]:
    def hit(t: port.Taint) -> bool:
        return any(t.key == r.key and (r.effect is None or r.effect == t.effect) for r in refs)

    return [t for t in current if not hit(t)], [t for t in current if hit(t)]


Changes = Callable[[list[port.Taint], list[port.Taint]], dict[str, Any]]


async def _replace(
    ctx: actions.ActionContext,
    node_param: str | None,
    edit: Any,
    *,
    changes: Changes | None = None,
) -> tuple[port.NodeInfo, list[port.Taint], list[port.Taint]]:
    """Read-modify-write of the taint list; returns the node and the list before and after.

    With ``changes`` (what apply reports from the lists before and after), a failure once the
    write may have landed says so (``clusterops.changing``)."""
    cluster = ctx.require_cluster()
    node = await clusterops.gpu_node(cluster, clusterops.target_node(ctx, node_param))
    seen: dict[str, list[port.Taint]] = {}

    def written() -> dict[str, Any]:
        before, after = seen.get("before", []), seen.get("after", [])
        return {"node": node.name, **(changes(before, after) if changes else {})}

    async def attempt() -> port.NodeInfo:
        fresh = await cluster.get_node(node.name)
        after = edit(list(fresh.taints))
        seen.update(before=list(fresh.taints), after=after)
        if after == fresh.taints:
            return fresh
        return await cluster.replace_node_taints(
            node.name, after, resource_version=fresh.resource_version
        )

    guard: contextlib.AbstractContextManager[None] = (
        clusterops.changing(written) if changes is not None else contextlib.nullcontext()
    )
    with guard:
        updated = await clusterops.with_conflict_retries(f"tainting node {node.name}", attempt)
    return updated, seen["before"], seen["after"]


def _dicts(taints: list[port.Taint]) -> list[dict[str, str]]:
    return [t.as_dict() for t in taints]


def _added_replaced(
    wanted: list[port.Taint], before: list[port.Taint]
) -> tuple[list[port.Taint], list[port.Taint]]:
    """The wanted taints that were not there, and the ones they replaced (same key, effect)."""
    slots = {_slot(t) for t in wanted}
    added = [t for t in wanted if t not in before]
    return added, [t for t in before if _slot(t) in slots and t not in wanted]


class TaintAction(actions.Action[TaintParams]):
    name: ClassVar[str] = "node.taint"
    description: ClassVar[str] = "Add or replace taints on the node; undo restores the old ones."
    params_model = TaintParams
    disruptive: ClassVar[bool] = True
    supports_undo: ClassVar[bool] = True
    observable: ClassVar[bool] = True

    async def observe(self, ctx: actions.ActionContext, params: TaintParams) -> actions.Observation:
        cluster = ctx.require_cluster()
        name = clusterops.target_node(ctx, params.node)
        with clusterops.cluster_errors(f"reading node {name}"):
            try:
                node = await cluster.get_node(name)
            except port.NotFound:
                return actions.Observation(
                    actions.Presence.GONE, f"node {name} does not exist any more"
                )
        wanted = [_taint(t) for t in params.taints]
        shown = ", ".join(f"{t.key}={t.value or ''}:{t.effect}" for t in wanted)
        if all(t in node.taints for t in wanted):
            return actions.Observation(actions.Presence.PRESENT, f"node {name} has taints {shown}")
        slots = {_slot(t) for t in node.taints}
        if not any(_slot(t) in slots for t in wanted):
            return actions.Observation(
                actions.Presence.GONE, f"node {name} no longer has taints {shown}"
            )
        return actions.Observation(
            actions.Presence.CHANGED, f"node {name} taints changed since; remediator set {shown}"
        )

    async def check(self, ctx: actions.ActionContext, params: TaintParams) -> actions.Check:
        cluster = ctx.require_cluster()
        node = await clusterops.gpu_node(cluster, clusterops.target_node(ctx, params.node))
        wanted = [_taint(t) for t in params.taints]
        done = all(t in node.taints for t in wanted)
        output = {"node": node.name, "added": [], "replaced": []}
        return actions.Check(in_place=done, output=output)

    async def apply(self, ctx: actions.ActionContext, params: TaintParams) -> dict[str, Any]:
        wanted = [_taint(t) for t in params.taints]

        def changes(before: list[port.Taint], _: list[port.Taint]) -> dict[str, Any]:
            added, replaced = _added_replaced(wanted, before)
            return {"added": _dicts(added), "replaced": _dicts(replaced)}

        node, before, _ = await _replace(
            ctx, params.node, lambda cur: with_taints(cur, wanted), changes=changes
        )
        added, replaced = _added_replaced(wanted, before)
        what = ", ".join(f"{t.key}={t.value or ''}:{t.effect}" for t in added) or "none"
        event = await clusterops.emit_node_event(
            ctx, ctx.require_cluster(), node, reason="RemediatorTaint", what=f"taints {what}"
        )
        return {
            "node": node.name,
            "added": _dicts(added),
            "replaced": _dicts(replaced),
            "event": event,
        }

    @staticmethod
    def _undo_edit(
        current: list[port.Taint], added: list[port.Taint], replaced: list[port.Taint]
    ) -> list[port.Taint]:
        result = [t for t in current if t not in added]
        free = {_slot(t) for t in result}
        return result + [t for t in replaced if _slot(t) not in free]

    async def check_undo(self, ctx: actions.ActionContext, params: TaintParams) -> actions.Check:
        cluster = ctx.require_cluster()
        node = await clusterops.gpu_node(cluster, clusterops.target_node(ctx, params.node))
        added = [_taint(t) for t in ctx.applied_output.get("added") or []]
        replaced = [_taint(t) for t in ctx.applied_output.get("replaced") or []]
        done = self._undo_edit(node.taints, added, replaced) == node.taints
        return actions.Check(in_place=done, output={"node": node.name})

    async def undo(self, ctx: actions.ActionContext, params: TaintParams) -> dict[str, Any]:
        added = [_taint(t) for t in ctx.applied_output.get("added") or []]
        replaced = [_taint(t) for t in ctx.applied_output.get("replaced") or []]
        node, before, after = await _replace(
            ctx, params.node, lambda cur: self._undo_edit(cur, added, replaced)
        )
        return {
            "node": node.name,
            "removed": _dicts([t for t in before if t not in after]),
            "restored": _dicts([t for t in after if t not in before]),
            "left_alone": _dicts([t for t in added if t not in before]),
        }


class UntaintAction(actions.Action[UntaintParams]):
    name: ClassVar[str] = "node.untaint"
    description: ClassVar[str] = "Remove taints (by key, optionally effect); undo re-adds them."
    params_model = UntaintParams
    supports_undo: ClassVar[bool] = True

    async def check(self, ctx: actions.ActionContext, params: UntaintParams) -> actions.Check:
        cluster = ctx.require_cluster()
        node = await clusterops.gpu_node(cluster, clusterops.target_node(ctx, params.node))
        _, hits = without_taints(node.taints, params.taints)
        return actions.Check(in_place=not hits, output={"node": node.name, "removed": []})

    async def apply(self, ctx: actions.ActionContext, params: UntaintParams) -> dict[str, Any]:
        def changes(before: list[port.Taint], after: list[port.Taint]) -> dict[str, Any]:
            return {"removed": _dicts([t for t in before if t not in after])}

        node, before, after = await _replace(
            ctx, params.node, lambda cur: without_taints(cur, params.taints)[0], changes=changes
        )
        removed = [t for t in before if t not in after]
        what = ", ".join(f"{t.key}:{t.effect}" for t in removed) or "none"
        event = await clusterops.emit_node_event(
            ctx, ctx.require_cluster(), node, reason="RemediatorUntaint", what=f"removed {what}"
        )
        return {"node": node.name, "removed": _dicts(removed), "event": event}

    async def check_undo(self, ctx: actions.ActionContext, params: UntaintParams) -> actions.Check:
        cluster = ctx.require_cluster()
        node = await clusterops.gpu_node(cluster, clusterops.target_node(ctx, params.node))
        removed = [_taint(t) for t in ctx.applied_output.get("removed") or []]
        slots = {_slot(t) for t in node.taints}
        return actions.Check(
            in_place=all(_slot(t) in slots for t in removed), output={"node": node.name}
        )

    async def undo(self, ctx: actions.ActionContext, params: UntaintParams) -> dict[str, Any]:
        removed = [_taint(t) for t in ctx.applied_output.get("removed") or []]

        def edit(current: list[port.Taint]) -> list[port.Taint]:
            slots = {_slot(t) for t in current}
            return current + [t for t in removed if _slot(t) not in slots]

        node, before, after = await _replace(ctx, params.node, edit)
        return {"node": node.name, "restored": _dicts([t for t in after if t not in before])}
