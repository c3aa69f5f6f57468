"""``gpu.ladder``: decide the run's rung on the GPU's escalation ladder, and the rung gate.

The ladder (``domain.ladders``) is climbed once per run by a ``gpu.ladder`` step placed before
the rung steps. Each rung step (``gpu.reset``, ``node.reboot``, ``node.mark_for_replacement``)
names its rung in ``params.rung``; when the run is on another rung the step changes nothing
and says so in its output (``check`` finds it "in place": there is nothing for it to do), so
one playbook holds the whole ladder and every episode runs the same steps under the same
guards and approvals, acting on one rung only. A step without ``rung`` always acts.

Instead of ``gpu.ladder``, ``gpu.recovery_action`` may decide the rung: the one the driver
recommends, or none at all (the run is *declined*: every rung step stands aside).

The ladder is kept per GPU: the run's GPU as the alert names it (UUID, PCI bus id or index,
validated), or node-wide when the alert names none.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, ClassVar, cast

import pydantic

from remediator.actions import clusterops, validation
from remediator.domain import errors, ladders
from remediator.ports import actions
from remediator.ports import ladder as port


def service(ctx: actions.ActionContext) -> port.Ladder:
    found = ctx.services.get(port.SERVICE)
    if found is None:
        raise errors.ActionFailed("no escalation ladder store is configured")
    return cast(port.Ladder, found)


def validated_gpu(ctx: actions.ActionContext) -> str | None:
    """The run's GPU id, checked by the shared validator (alert data never reaches argv raw)."""
    if not ctx.gpu:
        return None
    try:
        return validation.gpu_id(ctx.gpu)
    except ValueError as e:
        raise errors.ActionFailed(f"refused: the run's GPU {e}") from e


def ladder_key(ctx: actions.ActionContext, node: str | None = None) -> str:
    return ladders.key(clusterops.target_node(ctx, node), validated_gpu(ctx))


async def run_rung(ctx: actions.ActionContext, node: str | None = None) -> ladders.Rung:
    """The rung this run is on; a failure when no ``gpu.ladder`` step decided one."""
    key = ladder_key(ctx, node)
    rung = ladders.rung_of_run(await service(ctx).state(key), ctx.run_id)
    if rung is None:
        raise errors.ActionFailed(
            f"no rung decided for run {ctx.run_id} on {key}: put a gpu.ladder step before "
            "the steps that name a rung"
        )
    return rung


async def skipped(
    ctx: actions.ActionContext,
    wanted: ladders.Rung | Sequence[ladders.Rung] | None,
    node: str | None = None,
) -> dict[str, Any] | None:
    """Output of a rung step that has nothing to do on this run's rung (one of ``wanted``);
    None when it acts."""
    if wanted is None:
        return None
    rungs = [wanted] if isinstance(wanted, ladders.Rung) else list(wanted)
    shown = " or ".join(r.value for r in rungs)
    no_rung = ladders.declined(await service(ctx).state(ladder_key(ctx, node)), ctx.run_id)
    if no_rung is not None:
        return {
            "skipped": True,
            "ladder_rung": None,
            "step_rung": shown,
            "reason": f"this episode is on no rung: {no_rung.get('reason', 'declined')}",
        }
    rung = await run_rung(ctx, node)
    if rung in rungs:
        return None
    return {
        "skipped": True,
        "ladder_rung": rung.value,
        "step_rung": shown,
        "reason": f"this episode is on the {rung.value} rung of the ladder, not {shown}",
    }


async def escalate(
    ctx: actions.ActionContext, to: ladders.Rung, reason: str, node: str | None = None
) -> str:
    rung, _ = await service(ctx).escalate(
        ladder_key(ctx, node), run_id=ctx.run_id, to=to, reason=reason
    )
    return rung.value


class LadderParams(validation.Model):
    node: validation.NodeName | None = None
    forget_after_days: float = pydantic.Field(30.0, gt=0, le=3650)
    """A GPU quiet for this long starts again at the first rung."""
    start: ladders.Rung = ladders.Rung.RESET
    """The lowest rung this playbook starts on (e.g. reboot for a fault a reset cannot fix)."""


class LadderAction(actions.Action[LadderParams]):
    name: ClassVar[str] = "gpu.ladder"
    description: ClassVar[str] = (
        "Decide this episode's rung (reset, reboot, replace) on the GPU's escalation ladder."
    )
    params_model = LadderParams
    semantics: ClassVar[dict[str, str]] = {
        "check": "in place when this run already has a rung (a retry never climbs twice).",
        "apply": "one rung above the GPU's last episode (reset, then reboot, then replace), "
        "or `start` when it has none or has been quiet for `forget_after_days`; kept per GPU "
        "in durable state, with an audit event.",
        "undo": "none (the ladder records history; an operator clears it).",
    }

    async def check(self, ctx: actions.ActionContext, params: LadderParams) -> actions.Check:
        key = ladder_key(ctx, params.node)
        state = await service(ctx).state(key)
        rung = ladders.rung_of_run(state, ctx.run_id)
        output = {"key": key, "rung": rung.value if rung else None}
        return actions.Check(in_place=rung is not None, output=output)

    async def apply(self, ctx: actions.ActionContext, params: LadderParams) -> dict[str, Any]:
        key = ladder_key(ctx, params.node)
        rung, state = await service(ctx).climb(
            key,
            run_id=ctx.run_id,
            forget_after=dt.timedelta(days=params.forget_after_days),
            start=params.start,
        )
        return {"key": key, "rung": rung.value, "history": state.get("history", [])[-5:]}

    def describe(self, params: LadderParams) -> str:
        return f"decide the ladder rung for {params.node or '(alert node)'}'s GPU"
