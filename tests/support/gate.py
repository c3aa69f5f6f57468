"""A test action that stays inside ``apply`` until the test opens its gate.

Lets a test act while a step is running (resolve its alert, lose its lease) without sleeping.
Register a fresh instance per test: it keeps its events and what it applied and undid.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pydantic

from remediator.ports import actions


class GateParams(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    label: str = "gate"


class GateAction(actions.Action[GateParams]):
    name: ClassVar[str] = "test.gate"
    description: ClassVar[str] = "Wait inside apply until the test opens the gate (tests only)."
    params_model = GateParams
    supports_undo: ClassVar[bool] = True

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.applied: list[str] = []
        self.undone: list[str] = []

    async def check(self, ctx: actions.ActionContext, params: GateParams) -> actions.Check:
        return actions.Check(in_place=False)

    async def apply(self, ctx: actions.ActionContext, params: GateParams) -> dict[str, Any]:
        self.entered.set()
        await self.gate.wait()
        self.applied.append(params.label)
        return {"label": params.label}

    async def undo(self, ctx: actions.ActionContext, params: GateParams) -> dict[str, Any]:
        self.undone.append(params.label)
        return {"undone": params.label}
