"""``gpu.recovery_action``: put the run on the rung the driver recommends (Xid 154).

When the driver changes a GPU's recommended recovery action it logs Xid 154 with the new
action; ``nvidia-smi -q`` shows it as "GPU Recovery Action" (``--query-gpu=gpu_recovery_action``).
NVIDIA's Xid catalogue says to follow it:

================  ==========================================  ========================
recommendation    what it means                               rung
================  ==========================================  ========================
None              nothing to do                               none (the run declines)
GPU Reset         reset the GPU                               reset
Drain and Reset   drain the GPU's work, then reset it         reset
Drain P2P         stop peer-to-peer work on it, then reset    reset
Node Reboot       reboot the node                             reboot
================  ==========================================  ========================

The recommendation is taken from the alert when it carries one (``labels``, then the same
keys in its annotations: a log-based alert can), else read from the GPU with ``nvidia-smi``
(argv, through the same exec target as every GPU action). A GPU that no longer answers
(fallen off the bus) cannot be asked; what the driver says for such a GPU is to reboot, so the
run takes the reboot rung. Anything else that cannot be read or is not one of the values above
(``N/A`` on GPUs without the field) fails the step: remediator never guesses a recovery.

The decision goes on the GPU's ladder for this run (``ladder.escalate`` or ``decline``), where
the rung steps (``gpu.reset``, ``node.reboot``, drains with ``rungs``) read it; unlike
``gpu.ladder`` it does not climb from earlier episodes: the driver knows better.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pydantic

from remediator.actions import clusterops, gpu, hostexec, ladder, validation
from remediator.domain import errors, ladders
from remediator.ports import actions

RUNGS: dict[str, ladders.Rung | None] = {
    "none": None,
    "gpu reset": ladders.Rung.RESET,
    "drain and reset": ladders.Rung.RESET,
    "drain p2p": ladders.Rung.RESET,
    "node reboot": ladders.Rung.REBOOT,
}
LOST = "GPU is lost"
NVML_PREFIX = "nvml gpu recovery action "


def normalize(raw: str) -> str | None:
    """The recommendation's key in ``RUNGS`` ("Drain and Reset", "DRAIN_AND_RESET" and
    NVML's "NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET" alike), or None when unknown."""
    text = " ".join(raw.strip().lower().replace("_", " ").replace("-", " ").split())
    text = text.removeprefix(NVML_PREFIX)
    return text if text in RUNGS else None


def parse_query(text: str) -> dict[str, str]:
    """``--query-gpu=uuid,gpu_recovery_action --format=csv,noheader``: uuid → value."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        uuid, comma, value = line.partition(",")
        if comma and uuid.strip():
            found[uuid.strip()] = value.strip()
    return found


def worst(keys: list[str]) -> str:
    """The most disruptive of several recommendations (a node-wide decision)."""
    order = ["none", "drain p2p", "gpu reset", "drain and reset", "node reboot"]
    return max(keys, key=order.index)


class RecoveryParams(gpu.DriverParams):
    gpu: validation.GpuId | None = None
    """UUID, PCI bus id or index; default: the run's GPU, else every GPU of the node."""
    labels: list[validation.LabelKey] = pydantic.Field(
        default_factory=lambda: ["recovery_action", "gpu_recovery_action"], max_length=8
    )
    """Alert labels (then annotations) that may carry the recommendation."""


@hostexec.scoped_action
class RecoveryAction(actions.Action[RecoveryParams]):
    name: ClassVar[str] = "gpu.recovery_action"
    description: ClassVar[str] = (
        "Put the run on the rung the driver recommends for the GPU (Xid 154): reset for GPU "
        "Reset, Drain and Reset or Drain P2P; reboot for Node Reboot; none for None."
    )
    params_model = RecoveryParams
    semantics: ClassVar[dict[str, str]] = {
        "check": "in place when the run already has a decision on the GPU's ladder.",
        "apply": "reads the recommendation from the alert's `labels` (then annotations), else "
        "`nvidia-smi --query-gpu=uuid,gpu_recovery_action` (a GPU that fell off the bus: "
        "reboot); records the rung for the run on the GPU's ladder, or declines it for None "
        "(rung steps then stand aside); fails on N/A or an unknown value.",
        "undo": "none.",
    }

    async def check(self, ctx: actions.ActionContext, params: RecoveryParams) -> actions.Check:
        key = ladder.ladder_key(ctx, params.node)
        state = await ladder.service(ctx).state(key)
        rung = ladders.rung_of_run(state, ctx.run_id)
        if rung is None and ladders.declined(state, ctx.run_id) is None:
            return actions.Check(in_place=False)
        output = {"key": key, "rung": rung.value if rung else None}
        return actions.Check(in_place=True, output=output)

    async def apply(self, ctx: actions.ActionContext, params: RecoveryParams) -> dict[str, Any]:
        node = clusterops.target_node(ctx, params.node)
        ident = params.gpu or ladder.validated_gpu(ctx)
        found = self._from_alert(ctx, params)
        if found is None:
            found = await self._from_gpu(ctx, params, ident)
        source, raw = found
        normal = normalize(raw) if raw != LOST else "node reboot"
        if normal is None:
            raise errors.ActionFailed(
                f"the driver's recovery action for GPU {ident or '(all)'} on {node} is {raw!r} "
                f"({source}): not one remediator can follow",
                output={"node": node, "gpu": ident, "recommended": raw, "source": source},
            )
        rung = RUNGS[normal]
        reason = f"driver recommends {raw} ({source})"
        if rung is None:
            await ladder.service(ctx).decline(
                ladder.ladder_key(ctx, params.node), run_id=ctx.run_id, reason=reason
            )
            decided = None
        else:
            decided = await ladder.escalate(ctx, rung, reason, params.node)
        return {
            "node": node,
            "gpu": ident,
            "recommended": raw,
            "source": source,
            "rung": decided,
        }

    @staticmethod
    def _from_alert(ctx: actions.ActionContext, params: RecoveryParams) -> tuple[str, str] | None:
        for where, values in (("label", ctx.labels), ("annotation", ctx.annotations)):
            for key in params.labels:
                if values.get(key, "").strip():
                    return f"alert {where} {key}", values[key].strip()
        return None

    @staticmethod
    async def _from_gpu(
        ctx: actions.ActionContext, params: RecoveryParams, ident: str | None
    ) -> tuple[str, str]:
        _, driver = await gpu.find_driver(ctx, params)
        argv = ["nvidia-smi", "--query-gpu=uuid,gpu_recovery_action", "--format=csv,noheader"]
        if ident is not None:
            argv[1:1] = ["-i", ident]
        result = await gpu.run(
            ctx, driver, argv, timeout=params.exec_timeout_seconds, idempotent=True
        )
        source = "nvidia-smi gpu_recovery_action"
        if result.exit_code == gpu.RC_GPU_LOST:
            return f"{source}: the GPU does not answer", LOST
        values = parse_query(result.stdout.decode("utf-8", "replace"))
        if result.exit_code != 0 or not values:
            raise gpu.failure(driver, argv, result)
        keys = [normalize(v) for v in values.values()]
        known = [k for k in keys if k is not None]
        if len(known) != len(keys):
            unknown = sorted({v for v in values.values() if normalize(v) is None})
            return source, ", ".join(unknown)
        chosen = worst(known)
        return source, next(v for v in values.values() if normalize(v) == chosen)

    def describe(self, params: RecoveryParams) -> str:
        return f"follow the driver's recovery action on {params.node or '(alert node)'}"
