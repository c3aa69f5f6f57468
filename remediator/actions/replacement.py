"""``node.mark_for_replacement``: the top of the ladder: mark the node for a hardware swap.

Sets a label (``remediator.io/replace=gpu``, for selectors and dashboards) and an annotation
holding the evidence as JSON, and sends a notification with the same evidence:
- the GPU's ECC counters and row-remapping state, read through the driver pod when the GPU
  still answers (otherwise what went wrong reading them, which is evidence too);
- a link to the newest ``nvidia-bug-report`` stored for the node, if a step collected one;
- the GPU's ladder history (which episodes reset and rebooted it).

``check`` finds it done when the node carries the label and this run's annotation. Undo (an
operator's mistake, a false alarm) removes the label and the annotation if they are still the
ones this run set.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
from typing import Any, ClassVar

import pydantic

from remediator.actions import (
    bugreport,
    clusterops,
    gpu,
    health,
    hostexec,
    ladder,
    remap,
    validation,
)
from remediator.domain import errors, ladders
from remediator.ports import actions
from remediator.ports import cluster as port

LABEL = "remediator.io/replace"
ANNOTATION = "remediator.io/replace-evidence"


class ReplaceParams(gpu.DriverParams):
    rung: ladders.Rung | None = None
    """Act only when this run is on this rung of the GPU's ladder (see gpu.ladder)."""
    label_value: validation.LabelValue = "gpu"
    channel: str = pydantic.Field(default="default", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    reason: str = pydantic.Field(default="", max_length=1024)
    """Why, in words (e.g. the alert's summary)."""


def newest_bug_report(root: pathlib.Path, node: str) -> str | None:
    reports = sorted(
        (root / node).glob("*-nvidia-bug-report.log.gz"), key=lambda p: p.stat().st_mtime
    )
    return f"{node}/{reports[-1].name}" if reports else None


async def gpu_evidence(ctx: actions.ActionContext, params: ReplaceParams) -> dict[str, Any]:
    """ECC and row-remap state of the run's GPU (all GPUs without one), best effort: what
    cannot be read is recorded as such (a lost GPU answers nothing)."""
    ident = ladder.validated_gpu(ctx)
    timeout = params.exec_timeout_seconds
    try:
        _, driver = await gpu.find_driver(ctx, params)
        gpus, lost, _ = await health.query_health(ctx, driver, timeout)
    except errors.ActionFailed as e:
        return {"unreadable": str(e)[:500]}
    wanted = ident.lower() if ident else None
    chosen = [
        g
        for g in gpus
        if wanted is None or wanted in (str(g.index), g.uuid.lower(), g.pci_bus_id.lower())
    ]
    evidence: dict[str, Any] = {
        "lost_gpus": lost,
        "ecc": [
            {
                "uuid": g.uuid,
                "uncorrectable_volatile": g.ecc_uncorrected_volatile,
                "uncorrectable_aggregate": g.ecc_uncorrected_aggregate,
                "correctable_volatile": g.ecc_corrected_volatile,
            }
            for g in chosen
        ],
        "remapped_rows": [],
    }
    if wanted is not None and not chosen:
        evidence["unreadable"] = f"GPU {ident} does not answer nvidia-smi"
        return evidence
    try:
        rows = await remap.query(ctx, driver, ident, timeout)
    except errors.ActionFailed as e:
        evidence["unreadable"] = str(e)[:500]
    else:
        evidence["remapped_rows"] = [r.record() for r in rows]
    return evidence


@hostexec.scoped_action
class MarkForReplacementAction(actions.Action[ReplaceParams]):
    name: ClassVar[str] = "node.mark_for_replacement"
    description: ClassVar[str] = (
        "Label and annotate the node for a GPU replacement and notify with the evidence "
        "(ECC, row remapping, bug report, ladder history)."
    )
    params_model = ReplaceParams
    disruptive: ClassVar[bool] = True
    supports_undo: ClassVar[bool] = True
    semantics: ClassVar[dict[str, str]] = {
        "check": "with `rung`, in place when the run is on another rung; in place when the "
        "node carries the label and this run's evidence annotation.",
        "apply": "sets `remediator.io/replace` and the `remediator.io/replace-evidence` JSON "
        "annotation (ECC, remapped rows, newest bug report link, ladder history) and notifies "
        "the channel with the same evidence.",
        "undo": "removes the label and annotation if they are still this run's.",
    }

    async def check(self, ctx: actions.ActionContext, params: ReplaceParams) -> actions.Check:
        skip = await ladder.skipped(ctx, params.rung, params.node)
        if skip is not None:
            return actions.Check(in_place=True, output=skip)
        node = await clusterops.gpu_node(
            ctx.require_cluster(), clusterops.target_node(ctx, params.node)
        )
        ours = _run_of(node) == ctx.run_id and node.labels.get(LABEL) == params.label_value
        return actions.Check(in_place=ours, output={"node": node.name, "marked": ours})

    async def apply(self, ctx: actions.ActionContext, params: ReplaceParams) -> dict[str, Any]:
        cluster = ctx.require_cluster()
        node = await clusterops.gpu_node(cluster, clusterops.target_node(ctx, params.node))
        report = await asyncio.to_thread(newest_bug_report, bugreport.artifact_dir(ctx), node.name)
        key = ladder.ladder_key(ctx, params.node)
        history = (await ladder.service(ctx).state(key)).get("history", [])
        evidence = {
            "run_id": ctx.run_id,
            "gpu": ctx.gpu,
            "reason": params.reason,
            "bug_report": f"/api/v1/artifacts/{report}" if report else None,
            "ladder": [{k: e.get(k) for k in ("run_id", "rung", "at")} for e in history[-6:]],
            **await gpu_evidence(ctx, params),
        }
        text = json.dumps(evidence, separators=(",", ":"), sort_keys=True)
        with (
            clusterops.changing({"node": node.name, "run_id": ctx.run_id}),
            clusterops.cluster_errors(f"marking {node.name} for replacement"),
        ):
            await cluster.patch_node(
                node.name, labels={LABEL: params.label_value}, annotations={ANNOTATION: text}
            )
        sent = await ctx.notifier.send(
            channel=params.channel,
            message=(
                f"Node {node.name}: GPU {ctx.gpu or '(node)'} needs replacing (RMA). "
                f"{params.reason} Evidence: bug report {evidence['bug_report'] or 'none'}; "
                f"ECC {evidence.get('ecc')}; remapped rows {evidence.get('remapped_rows')}."
            ).strip(),
            data={
                "severity": "critical",
                "node": node.name,
                "gpu": ctx.gpu,
                "action_needed": "replace-gpu",
                "evidence": evidence,
            },
            idempotency_key=ctx.idempotency_key,
        )
        event = await clusterops.emit_node_event(
            ctx, cluster, node, reason="RemediatorMarkForReplacement", what=f"{LABEL} set"
        )
        return {
            "node": node.name,
            "run_id": ctx.run_id,
            "label": {LABEL: params.label_value},
            "evidence": evidence,
            "notification": sent,
            "event": event,
        }

    async def check_undo(self, ctx: actions.ActionContext, params: ReplaceParams) -> actions.Check:
        node = await clusterops.gpu_node(
            ctx.require_cluster(), clusterops.target_node(ctx, params.node)
        )
        ours = _run_of(node) == ctx.applied_output.get("run_id")
        return actions.Check(in_place=not ours, output={"node": node.name, "ours": ours})

    async def undo(self, ctx: actions.ActionContext, params: ReplaceParams) -> dict[str, Any]:
        cluster = ctx.require_cluster()
        name = clusterops.target_node(ctx, params.node)
        with clusterops.cluster_errors(f"unmarking {name}"):
            await cluster.patch_node(name, labels={LABEL: None}, annotations={ANNOTATION: None})
        return {"node": name, "removed": [LABEL, ANNOTATION]}

    def describe(self, params: ReplaceParams) -> str:
        rung = f" (ladder rung {params.rung.value})" if params.rung else ""
        return f"mark {params.node or '(alert node)'} for GPU replacement{rung}"


def _run_of(node: port.NodeInfo) -> int | None:
    try:
        return int(json.loads(node.annotations.get(ANNOTATION, "{}")).get("run_id"))
    except (ValueError, TypeError, AttributeError):
        return None
