"""A test action that records each application in a file, for exactly-once checks.

``register(registry)`` makes it a remediator plugin (``REMEDIATOR_PLUGINS=tests.support.recording``)
so real ``remediator serve`` processes can run it. Each application appends one JSON line with
the step's idempotency key and the process id; ``check`` reports the effect in place when the
key is already recorded, which is how a real action inspects live state after a crash.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
from typing import Any, ClassVar

import pydantic

from remediator.domain import errors
from remediator.ports import actions

ENV = "REMEDIATOR_TEST_RECORD"


class RecordParams(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    label: str = "x"
    sleep_before: float = 0.0
    sleep_after: float = 0.0
    fail_attempts: int = 0
    fail_permanently: bool = False
    fail_after_apply: int = 0  # attempts that apply, then lose the answer (temporary failure)
    fail_undo: bool = False

    @pydantic.field_validator("label")
    @classmethod
    def _explode(cls, label: str) -> str:
        if label == "explode":  # a bug in an action's params model, as the engine meets it
            raise RuntimeError("params model bug")
        return label


def _path() -> pathlib.Path:
    return pathlib.Path(os.environ.get(ENV, "records.jsonl"))


def _append(entry: dict[str, Any]) -> None:
    with _path().open("a", encoding="utf-8") as stream:
        stream.write(json.dumps(entry) + "\n")
        stream.flush()
        os.fsync(stream.fileno())


def read_records(path: pathlib.Path) -> list[dict[str, Any]]:
    """The records whose lines are whole: another process (a replica) may be appending the last
    one as it is read, and a line is a record once its newline is written."""
    if not path.exists():
        return []
    *whole, _being_written = path.read_text().split("\n")
    return [json.loads(line) for line in whole if line.strip()]


class RecordAction(actions.Action[RecordParams]):
    name: ClassVar[str] = "test.record"
    description: ClassVar[str] = "Record an application (tests only)."
    params_model = RecordParams
    supports_undo: ClassVar[bool] = True

    async def check(self, ctx: actions.ActionContext, params: RecordParams) -> actions.Check:
        for record in read_records(_path()):
            if record["key"] == ctx.idempotency_key and record["kind"] == "apply":
                return actions.Check(in_place=True, output={"label": params.label})
        return actions.Check(in_place=False)

    async def apply(self, ctx: actions.ActionContext, params: RecordParams) -> dict[str, Any]:
        _append(
            {
                "kind": "start",
                "key": ctx.idempotency_key,
                "label": params.label,
                "attempt": ctx.attempt,
                "pid": os.getpid(),
            }
        )
        if params.fail_permanently:
            raise errors.ActionFailed(f"{params.label} fails for good")
        if ctx.attempt <= params.fail_attempts:
            raise errors.ActionFailed(f"{params.label} attempt {ctx.attempt} fails", temporary=True)
        await asyncio.sleep(params.sleep_before)
        _append(
            {
                "kind": "apply",
                "key": ctx.idempotency_key,
                "label": params.label,
                "node": ctx.node,
                "pid": os.getpid(),
            }
        )
        await asyncio.sleep(params.sleep_after)
        if ctx.attempt <= params.fail_after_apply:
            raise errors.ActionFailed(f"{params.label}: answer lost after apply", temporary=True)
        return {"label": params.label, "pid": os.getpid()}

    async def undo(self, ctx: actions.ActionContext, params: RecordParams) -> dict[str, Any]:
        if params.fail_undo:
            raise errors.ActionFailed(f"{params.label}: undo fails for good")
        _append(
            {
                "kind": "undo",
                "key": ctx.idempotency_key,
                "label": params.label,
                "applied": dict(ctx.applied_output),
                "pid": os.getpid(),
            }
        )
        return {"undone": params.label}


class DisruptAction(RecordAction):
    """Like ``test.record`` but counted as disruptive by the fleet guards."""

    name: ClassVar[str] = "test.disrupt"
    disruptive: ClassVar[bool] = True


def register(registry: actions.Registry) -> None:
    registry.register(RecordAction())
    registry.register(DisruptAction())
