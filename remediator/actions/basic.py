"""Actions that touch nothing in the cluster: ``log`` and ``notify``."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, ClassVar

import pydantic

from remediator.actions import validation
from remediator.domain import errors, notices
from remediator.ports import actions
from remediator.ports import notify as notify_port

logger = logging.getLogger("remediator.actions")


class LogParams(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    message: str = pydantic.Field(max_length=4096)
    level: str = pydantic.Field(default="info", pattern=r"^(debug|info|warning|error)$")


class LogAction(actions.Action[LogParams]):
    """Write a line to remediator's own log and to the step output."""

    name: ClassVar[str] = "log"
    description: ClassVar[str] = "Write a message to remediator's log and the audit trail."
    params_model = LogParams

    async def check(self, ctx: actions.ActionContext, params: LogParams) -> actions.Check:
        return actions.Check(in_place=False)

    async def apply(self, ctx: actions.ActionContext, params: LogParams) -> dict[str, Any]:
        logger.log(
            logging.getLevelName(params.level.upper()),
            params.message,
            extra={"run_id": ctx.run_id, "step": ctx.step_key},
        )
        return {"logged": params.message, "level": params.level}

    def describe(self, params: LogParams) -> str:
        return f"log {params.level}: {params.message}"


class OwnerParams(validation.Model):
    namespace: validation.Namespace | None = None
    """Namespace of the workload (empty: the notice is about no workload)."""
    pod: validation.PodName | None = None
    """The pod, if the notice is about one (its labels and annotations are read first)."""

    @pydantic.field_validator("namespace", "pod", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value


class NotifyParams(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    channel: str | None = pydantic.Field(
        default=None,
        pattern=notices.CHANNEL_NAME,
        description="A configured channel; default: chosen by `notify_routing` (the owner of "
        "`owner`, then the routes, then the default channel).",
    )
    message: str = pydantic.Field(max_length=8192)
    data: dict[str, str] = pydantic.Field(default_factory=dict)
    owner: OwnerParams | None = pydantic.Field(
        default=None,
        description="The workload the notice is about: the owner key (`team`, `owner`, ...) "
        "on its pod, else its namespace, picks the channel (`notify_routing.owner`).",
    )
    severity: notices.Severity | None = pydantic.Field(
        default=None, description="Default: from the alert's `severity` label (else warning)."
    )
    resolve: bool = pydantic.Field(
        default=False,
        description="Close what an earlier notice with the same dedup_key opened (PagerDuty "
        "resolve, Alertmanager endsAt); chat channels get a 'Resolved:' message.",
    )
    dedup_key: str | None = pydantic.Field(
        default=None,
        min_length=1,
        max_length=255,
        description="Ties a resolve to the incident or alert it closes. Default: one per run "
        "(`remediator-run-<id>`); a template such as `{{ alert.fingerprint }}` makes it one "
        "per alert.",
    )


class NotifyAction(actions.Action[NotifyParams]):
    """Send a notification to a configured channel or to the one the routing chooses.

    Delivery is at least once: a crash between sending and recording may send it again, so the
    request carries an ``Idempotency-Key`` that stays the same across attempts of one step
    (PagerDuty and Alertmanager deduplicate by the dedup key themselves). Its undo (on
    resolution, with ``undo: true``) resolves what it opened, on the channel it went to.
    """

    name: ClassVar[str] = "notify"
    description: ClassVar[str] = (
        "Send a notification (webhook, Slack, Teams, PagerDuty or Alertmanager channel), "
        "routed by label or to the owner of a workload."
    )
    params_model = NotifyParams
    supports_undo: ClassVar[bool] = True
    semantics: ClassVar[dict[str, str]] = {
        "check": "never in place (each attempt sends; at least once).",
        "apply": "render the channel's template for the playbook, if any, and post the "
        "channel type's payload; a channel that refuses or cannot be reached fails the step "
        "(temporary after the adapter's retries for 5xx, 429 and connection errors). An "
        "unconfigured channel only logs the message.",
        "undo": "send the resolve of the same notice (same channel and dedup_key).",
    }

    async def check(self, ctx: actions.ActionContext, params: NotifyParams) -> actions.Check:
        return actions.Check(in_place=False)

    async def apply(self, ctx: actions.ActionContext, params: NotifyParams) -> dict[str, Any]:
        return await ctx.notifier.deliver(await _notice(ctx, params, resolve=params.resolve))

    async def preview(self, ctx: actions.ActionContext, params: NotifyParams) -> dict[str, Any]:
        """Where the notice would go (channel, type, why), read from live state."""
        notice = await _notice(ctx, params, resolve=params.resolve)
        return {"would": self.describe(params), "route": ctx.notifier.route(notice)}

    async def undo(self, ctx: actions.ActionContext, params: NotifyParams) -> dict[str, Any]:
        applied = ctx.applied_output
        channel = applied.get("channel") if applied.get("delivered") else None
        dedup_key = applied.get("dedup_key") or params.dedup_key
        params = params.model_copy(
            update={
                "channel": channel if isinstance(channel, str) else params.channel,
                "dedup_key": dedup_key if isinstance(dedup_key, str) else None,
            }
        )
        notice = await _notice(ctx, params, resolve=True)
        return await ctx.notifier.deliver(
            dataclasses.replace(notice, idempotency_key=f"{ctx.idempotency_key}-resolve")
        )

    def describe(self, params: NotifyParams) -> str:
        owner = params.owner
        where = params.channel or (
            f"the owner of {owner.namespace}/{owner.pod or ''}".rstrip("/")
            if owner and owner.namespace
            else "the routed channel"
        )
        verb = "resolve on" if params.resolve else "notify"
        return f"{verb} {where}: {params.message}"


async def _notice(
    ctx: actions.ActionContext, params: NotifyParams, *, resolve: bool
) -> notify_port.Notice:
    payload: dict[str, Any] = {
        "run_id": ctx.run_id,
        "playbook": ctx.playbook,
        "node": ctx.node,
        "gpu": ctx.gpu,
        "alertname": ctx.labels.get("alertname"),
        "dry_run": ctx.dry_run,
        **params.data,
    }
    return notify_port.Notice(
        channel=params.channel,
        message=params.message,
        data=payload,
        idempotency_key=ctx.idempotency_key,
        labels=ctx.labels,
        annotations=ctx.annotations,
        run_id=ctx.run_id,
        playbook=ctx.playbook,
        node=ctx.node,
        gpu=ctx.gpu,
        severity=params.severity,
        resolve=resolve,
        dedup_key=params.dedup_key,
        workload=await _workload(ctx, params.owner) if params.owner else None,
        at=ctx.now(),
    )


async def _workload(ctx: actions.ActionContext, owner: OwnerParams) -> notify_port.Workload | None:
    """The pod's and namespace's metadata; what cannot be read is said, and the notice goes
    where the routing sends notices without an owner."""
    if owner.namespace is None:
        return None
    if ctx.cluster is None:
        return notify_port.Workload(
            namespace=owner.namespace, pod=owner.pod, lookup_error="no cluster configured"
        )
    found: dict[str, Any] = {}
    problems: list[str] = []
    if owner.pod:
        try:
            pod = await ctx.cluster.get_pod(owner.namespace, owner.pod)
        except errors.RemediatorError as e:
            problems.append(f"pod {owner.namespace}/{owner.pod}: {e}")
        else:
            found |= {"pod_labels": pod.labels, "pod_annotations": pod.annotations}
    try:
        namespace = await ctx.cluster.get_namespace(owner.namespace)
    except errors.RemediatorError as e:
        problems.append(f"namespace {owner.namespace}: {e}")
    else:
        found |= {
            "namespace_labels": namespace.labels,
            "namespace_annotations": namespace.annotations,
        }
    return notify_port.Workload(
        namespace=owner.namespace,
        pod=owner.pod,
        lookup_error="; ".join(problems),
        **found,
    )


ACTIONS: list[actions.Action[Any]] = [LogAction(), NotifyAction()]
