"""``gpu.row_remap_status``: the GPU's row-remapping state, read with ``nvidia-smi``.

On A100/H100/H200 an uncorrectable memory error makes the GPU remap the row. Until the next GPU
reset the remap is *pending* (the row is still in use; the GPU needs a reset); when no spare
row is left the remap *fails* (the GPU needs replacing). Read with
``--query-remapped-rows=gpu_bus_id,gpu_uuid,remapped_rows.correctable,
remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure --format=csv``, by the
position of the fields asked for; "Yes"/"No" flags, "[N/A]" (no row remapper) becomes ``None``.

Read-only: ``check`` never claims an effect. With ``escalate: true`` it raises this run's
rung on the GPU's ladder: pending → at least reset, failure → replace (the steps after it
act on that rung, see ``actions.ladder``). ``fail_on`` makes the step fail instead, for
playbooks that stop there.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

from remediator.actions import gpu, hostexec, ladder, validation
from remediator.domain import errors, ladders
from remediator.ports import actions

FIELDS = (
    "gpu_bus_id,gpu_uuid,remapped_rows.correctable,remapped_rows.uncorrectable,"
    "remapped_rows.pending,remapped_rows.failure"
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RemapState:
    pci_bus_id: str
    uuid: str
    correctable: int | None
    uncorrectable: int | None
    pending: bool | None
    failure: bool | None

    @property
    def verdict(self) -> str:
        if self.failure:
            return "replace"
        if self.pending:
            return "reset"
        return "ok"

    def record(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "verdict": self.verdict}


def _flag(raw: str) -> bool | None:
    return {"yes": True, "no": False}.get(raw.strip().lower())


def _count(raw: str) -> int | None:
    return int(raw) if raw.strip().isdigit() else None


def parse(text: str) -> list[RemapState]:
    """``FIELDS`` rows, with or without the header line."""
    states = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 6 or not fields[1].upper().startswith("GPU-"):
            continue
        states.append(
            RemapState(
                pci_bus_id=fields[0],
                uuid=fields[1],
                correctable=_count(fields[2]),
                uncorrectable=_count(fields[3]),
                pending=_flag(fields[4]),
                failure=_flag(fields[5]),
            )
        )
    return states


async def query(
    ctx: actions.ActionContext, driver: gpu.Driver, ident: str | None, timeout: float
) -> list[RemapState]:
    argv = ["nvidia-smi", f"--query-remapped-rows={FIELDS}", "--format=csv"]
    if ident is not None:
        argv[1:1] = ["-i", ident]
    result = await gpu.run(ctx, driver, argv, timeout=timeout, idempotent=True)
    if result.exit_code != 0:
        raise gpu.failure(driver, argv, result)
    return parse(result.stdout.decode("utf-8", "replace"))


class RemapParams(gpu.DriverParams):
    gpu: validation.GpuId | None = None
    """UUID, PCI bus id or index; default: the run's GPU, else every GPU of the node."""
    fail_on: list[Literal["pending", "failure"]] = []
    """Fail the step when a GPU shows one of these (default: only report)."""
    escalate: bool = False
    """Raise this run's ladder rung: pending → reset, failure → replace."""


@hostexec.scoped_action
class RowRemapStatusAction(actions.Action[RemapParams]):
    name: ClassVar[str] = "gpu.row_remap_status"
    description: ClassVar[str] = (
        "Read row remapping (nvidia-smi --query-remapped-rows): pending needs a reset, "
        "failure a replacement."
    )
    params_model = RemapParams
    semantics: ClassVar[dict[str, str]] = {
        "check": "never in place (a read: every attempt reads the live state).",
        "apply": "reads `nvidia-smi --query-remapped-rows` (pending: needs a reset; failure: "
        "needs a replacement); with `escalate`, raises the run's ladder rung (pending → "
        "reset, failure → replace); fails on the flags in `fail_on`.",
        "undo": "none (changes nothing).",
    }

    async def check(self, ctx: actions.ActionContext, params: RemapParams) -> actions.Check:
        return actions.Check(in_place=False)

    async def apply(self, ctx: actions.ActionContext, params: RemapParams) -> dict[str, Any]:
        node, driver = await gpu.find_driver(ctx, params)
        ident = params.gpu or (ladder.validated_gpu(ctx) if ctx.gpu else None)
        states = await query(ctx, driver, ident, params.exec_timeout_seconds)
        if not states:
            raise errors.ActionFailed(f"nvidia-smi on {node.name} reports no remapped-rows state")
        output: dict[str, Any] = {"node": node.name, "gpus": [s.record() for s in states]}
        worst = max((s.verdict for s in states), key=["ok", "reset", "replace"].index)
        output["verdict"] = worst
        if params.escalate and worst != "ok":
            rung = ladders.Rung.REPLACE if worst == "replace" else ladders.Rung.RESET
            output["ladder_rung"] = await ladder.escalate(
                ctx, rung, f"row remapping {'failed' if worst == 'replace' else 'pending'}"
            )
        bad = [
            f"GPU {s.uuid}: row remap {kind}"
            for s in states
            for kind in params.fail_on
            if getattr(s, kind)
        ]
        if bad:
            raise errors.ActionFailed("; ".join(bad), output=output)
        return output

    def describe(self, params: RemapParams) -> str:
        return f"read row remapping of GPU {params.gpu or '(alert GPU)'}"
