"""Actions that touch nothing in the cluster: ``log`` and ``notify``."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import pydantic

from remediator.ports import actions

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


class NotifyParams(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    channel: str = pydantic.Field(
        default="default", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Configured channel."
    )
    message: str = pydantic.Field(max_length=8192)
    data: dict[str, str] = pydantic.Field(default_factory=dict)


class NotifyAction(actions.Action[NotifyParams]):
    """Send a notification to a configured channel (a generic JSON webhook).

    Delivery is at least once: a crash between sending and recording may send it again, so the
    request carries an ``Idempotency-Key`` that stays the same across attempts of one step.
    """

    name: ClassVar[str] = "notify"
    description: ClassVar[str] = "Post a JSON notification to a configured webhook channel."
    params_model = NotifyParams

    async def check(self, ctx: actions.ActionContext, params: NotifyParams) -> actions.Check:
        return actions.Check(in_place=False)

    async def apply(self, ctx: actions.ActionContext, params: NotifyParams) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "run_id": ctx.run_id,
            "playbook": ctx.playbook,
            "node": ctx.node,
            "gpu": ctx.gpu,
            "alertname": ctx.labels.get("alertname"),
            "dry_run": ctx.dry_run,
            **params.data,
        }
        return await ctx.notifier.send(
            channel=params.channel,
            message=params.message,
            data=payload,
            idempotency_key=ctx.idempotency_key,
        )

    def describe(self, params: NotifyParams) -> str:
        return f"notify {params.channel}: {params.message}"


ACTIONS: list[actions.Action[Any]] = [LogAction(), NotifyAction()]
