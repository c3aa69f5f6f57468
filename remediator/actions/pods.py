"""``k8s.event``, ``pod.annotate`` and ``pod.evict`` (PDB-aware, one pod)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import pydantic

from remediator.actions import clusterops, validation
from remediator.domain import errors
from remediator.ports import actions
from remediator.ports import cluster as port


async def _pod_on_gpu_node(cluster: port.Cluster, namespace: str, name: str) -> port.PodInfo | None:
    """The pod (None if gone), refusing pods that are not on a GPU node."""
    with clusterops.cluster_errors(f"reading pod {namespace}/{name}"):
        try:
            pod = await cluster.get_pod(namespace, name)
        except port.NotFound:
            return None
    if not pod.node_name:
        raise errors.ActionFailed(f"refused: pod {namespace}/{name} is not scheduled on a node")
    await clusterops.gpu_node(cluster, pod.node_name)
    return pod


class EventParams(validation.Model):
    kind: Literal["Node", "Pod"] = "Node"
    name: validation.NodeName | None = None
    """Node or pod name; default: the run's node."""
    namespace: validation.Namespace | None = None
    reason: validation.EventReason
    message: str = pydantic.Field(min_length=1, max_length=1024)
    type: Literal["Normal", "Warning"] = "Normal"

    @pydantic.model_validator(mode="after")
    def _pod_needs_namespace(self) -> EventParams:
        if self.kind == "Pod" and (not self.namespace or not self.name):
            raise ValueError("an Event on a Pod needs name and namespace")
        return self


class EventAction(actions.Action[EventParams]):
    """Record a Kubernetes Event. Delivery is at least once (a crash may repeat it)."""

    name: ClassVar[str] = "k8s.event"
    description: ClassVar[str] = "Create a Kubernetes Event on the node or a pod."
    params_model = EventParams

    async def check(self, ctx: actions.ActionContext, params: EventParams) -> actions.Check:
        return actions.Check(in_place=False)

    async def apply(self, ctx: actions.ActionContext, params: EventParams) -> dict[str, Any]:
        cluster = ctx.require_cluster()
        if params.kind == "Node":
            node = await clusterops.gpu_node(cluster, clusterops.target_node(ctx, params.name))
            target = port.ObjectRef(kind="Node", name=node.name, uid=node.uid)
        else:
            namespace, name = params.namespace or "", params.name or ""
            pod = await _pod_on_gpu_node(cluster, namespace, name)
            if pod is None:
                raise errors.ActionFailed(f"pod {namespace}/{name} does not exist")
            target = port.ObjectRef(kind="Pod", name=name, namespace=namespace, uid=pod.uid)
        message = f"{params.message} (remediator run {ctx.run_id}, playbook {ctx.playbook})"
        with clusterops.cluster_errors("creating the event"):
            event = await cluster.create_event(
                target=target, reason=params.reason, message=message, type=params.type
            )
        return {
            "event": event,
            "kind": target.kind,
            "name": target.name,
            "namespace": target.namespace or None,
            "reason": params.reason,
            "type": params.type,
            "message": message,
        }

    def describe(self, params: EventParams) -> str:
        return f"event {params.type} {params.reason} on {params.kind} {params.name or '(node)'}"


class AnnotateParams(validation.Model):
    namespace: validation.Namespace
    pod: validation.PodName
    annotations: dict[validation.LabelKey, validation.AnnotationValue] = pydantic.Field(
        min_length=1
    )


class AnnotateAction(actions.Action[AnnotateParams]):
    name: ClassVar[str] = "pod.annotate"
    description: ClassVar[str] = "Set annotations on a pod; undo removes (or restores) them."
    params_model = AnnotateParams
    supports_undo: ClassVar[bool] = True

    async def _pod(self, ctx: actions.ActionContext, params: AnnotateParams) -> port.PodInfo:
        pod = await _pod_on_gpu_node(ctx.require_cluster(), params.namespace, params.pod)
        if pod is None:
            raise errors.ActionFailed(f"pod {params.namespace}/{params.pod} does not exist")
        return pod

    async def check(self, ctx: actions.ActionContext, params: AnnotateParams) -> actions.Check:
        pod = await self._pod(ctx, params)
        wanted = dict(params.annotations)
        done = all(pod.annotations.get(k) == v for k, v in wanted.items())
        return actions.Check(
            in_place=done, output={"pod": pod.key, "set": wanted, "previous": wanted}
        )

    async def apply(self, ctx: actions.ActionContext, params: AnnotateParams) -> dict[str, Any]:
        pod = await self._pod(ctx, params)
        previous = {k: pod.annotations.get(k) for k in params.annotations}
        output = {"pod": pod.key, "set": dict(params.annotations), "previous": previous}
        with (
            clusterops.changing(output),
            clusterops.cluster_errors(f"annotating pod {pod.key}"),
        ):
            await ctx.require_cluster().annotate_pod(
                params.namespace, params.pod, dict(params.annotations)
            )
        return output

    async def check_undo(self, ctx: actions.ActionContext, params: AnnotateParams) -> actions.Check:
        pod = await self._pod(ctx, params)
        previous = dict(ctx.applied_output.get("previous") or {})
        done = all(pod.annotations.get(k) == v for k, v in previous.items())
        return actions.Check(in_place=done, output={"pod": pod.key})

    async def undo(self, ctx: actions.ActionContext, params: AnnotateParams) -> dict[str, Any]:
        pod = await self._pod(ctx, params)
        previous = dict(ctx.applied_output.get("previous") or {})
        written = dict(ctx.applied_output.get("set") or {})
        restore = {k: v for k, v in previous.items() if pod.annotations.get(k) == written.get(k)}
        left_alone = sorted(k for k in previous if k not in restore)
        if restore:
            with clusterops.cluster_errors(f"restoring annotations of pod {pod.key}"):
                await ctx.require_cluster().annotate_pod(params.namespace, params.pod, restore)
        return {"pod": pod.key, "restored": restore, "left_alone": left_alone}


class EvictParams(validation.Model):
    namespace: validation.Namespace
    pod: validation.PodName
    grace_period_seconds: int | None = pydantic.Field(None, ge=0, le=86400)
    retry_after_seconds: float = pydantic.Field(5.0, gt=0, le=3600)
    """When a PodDisruptionBudget blocks the eviction, try again after this long."""


class EvictAction(actions.Action[EvictParams]):
    name: ClassVar[str] = "pod.evict"
    description: ClassVar[str] = "Evict one pod through the Eviction API (honours PDBs)."
    params_model = EvictParams
    disruptive: ClassVar[bool] = True

    async def check(self, ctx: actions.ActionContext, params: EvictParams) -> actions.Check:
        cluster = ctx.require_cluster()
        key = f"{params.namespace}/{params.pod}"
        with clusterops.cluster_errors(f"reading pod {key}"):
            try:
                pod = await cluster.get_pod(params.namespace, params.pod)
            except port.NotFound:
                return actions.Check(in_place=True, output={"pod": key, "gone": True})
        terminating = pod.deletion_timestamp is not None
        return actions.Check(in_place=terminating, output={"pod": key, "terminating": True})

    async def apply(self, ctx: actions.ActionContext, params: EvictParams) -> dict[str, Any]:
        cluster = ctx.require_cluster()
        key = f"{params.namespace}/{params.pod}"
        pod = await _pod_on_gpu_node(cluster, params.namespace, params.pod)
        if pod is None:
            return {"pod": key, "outcome": "gone"}
        with (
            clusterops.changing({"pod": key, "node": pod.node_name}),
            clusterops.cluster_errors(f"evicting pod {key}"),
        ):
            result = await cluster.evict_pod(
                params.namespace, params.pod, grace_period_seconds=params.grace_period_seconds
            )
        output: dict[str, object] = {
            "pod": key,
            "node": pod.node_name,
            "outcome": result.outcome.value,
        }
        if result.outcome is port.EvictionOutcome.BLOCKED:
            blocker = f"PodDisruptionBudget {result.pdb}" if result.pdb else "a disruption budget"
            raise errors.ActionFailed(
                f"eviction of {key} blocked by {blocker}: {result.message}",
                temporary=True,
                retry_after=result.retry_after or params.retry_after_seconds,
                output={**output, "pdb": result.pdb, "message": result.message},
            )
        if result.outcome is port.EvictionOutcome.ERROR:  # e.g. several budgets select it
            raise errors.ActionFailed(
                f"eviction of {key} failed: {result.message}",
                temporary=True,
                retry_after=params.retry_after_seconds,
                output={**output, "message": result.message},
            )
        return output

    def describe(self, params: EvictParams) -> str:
        return f"evict pod {params.namespace}/{params.pod}"
