"""``gpu.reset``: reset one GPU with ``nvidia-smi -r -i <gpu>`` in the node's driver pod.

A reset clears what the driver holds for the GPU (volatile ECC counters, a pending row remap,
a hung engine) without rebooting the node, and it is refused by the driver while any process
uses the GPU. So, before it:
- no pod that holds a GPU may still run on the node (the playbook drains it first; refused
  otherwise, naming the pods), and
- ``nvidia-smi --query-compute-apps`` must list no process on that GPU (refused otherwise,
  naming them: a process outside Kubernetes, or a pod that has not ended yet).
Refusals fail the step and change nothing. After it the GPU must answer ``nvidia-smi`` with no
uncorrectable volatile ECC errors and no pending or failed row remap, else the step fails.

On a ladder (``rung: reset``) a reset that ran and failed (the GPU is lost, the driver refused,
or it does not come back healthy) climbs this run to the reboot rung and the step succeeds
with the failure in its output: the next rung's step acts in the same run, as the field guide
says ("if the reset fails, reboot the node"). Without a rung such a failure fails the step.

Not undoable (there is nothing to put back). ``check`` finds a reset done when an earlier
attempt of this step may have reset the GPU and it now answers healthy, so a retry after a
lost stream does not reset it twice.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pydantic

from remediator.actions import clusterops, gpu, health, hostexec, ladder, remap, validation
from remediator.domain import errors, ladders
from remediator.ports import actions
from remediator.ports import cluster as port

APPS_QUERY = "gpu_uuid,pid,process_name,used_gpu_memory"
DONE_PHASES = ("Succeeded", "Failed")


class ResetParams(gpu.DriverParams):
    gpu: validation.GpuId | None = None
    """UUID, PCI bus id or index; default: the run's GPU (a reset always names one GPU)."""
    rung: ladders.Rung | None = None
    """Act only when this run is on this rung of the GPU's ladder (see gpu.ladder)."""
    require_no_gpu_pods: bool = True
    """Refuse while a pod holding a GPU still runs on the node (drain first)."""
    reset_timeout_seconds: float = pydantic.Field(120.0, gt=0, le=900)


def target(ctx: actions.ActionContext, params: ResetParams) -> str:
    ident = params.gpu or ladder.validated_gpu(ctx)
    if ident is None:
        raise errors.ActionFailed("refused: no GPU to reset (give params.gpu or alert on a GPU)")
    return ident


async def gpu_pods(ctx: actions.ActionContext, node: str, driver_ns: str) -> list[str]:
    cluster = ctx.require_cluster()
    with clusterops.cluster_errors(f"listing pods on {node}"):
        pods = await cluster.list_pods(field_selector=f"spec.nodeName={node}")
    return [
        p.key
        for p in pods
        if p.gpu_requests > 0 and p.phase not in DONE_PHASES and p.namespace != driver_ns
    ]


def parse_apps(text: str) -> list[dict[str, str]]:
    apps = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 4 and fields[1].isdigit():
            apps.append({"gpu_uuid": fields[0], "pid": fields[1], "process_name": fields[2]})
    return apps


async def compute_apps(
    ctx: actions.ActionContext, driver: gpu.Driver, ident: str, timeout: float
) -> tuple[list[dict[str, str]], port.ExecResult]:
    argv = ["nvidia-smi", "-i", ident, f"--query-compute-apps={APPS_QUERY}", "--format=csv"]
    result = await gpu.run(ctx, driver, argv, timeout=timeout, idempotent=True)
    return parse_apps(result.stdout.decode("utf-8", "replace")), result


async def healthy(
    ctx: actions.ActionContext, driver: gpu.Driver, ident: str, timeout: float
) -> tuple[dict[str, Any] | None, str | None]:
    """The GPU's state after a reset, and what is wrong with it (None: healthy)."""
    gpus, lost, _ = await health.query_health(ctx, driver, timeout)
    found = next((g for g in gpus if _is(g, ident)), None)
    if found is None:
        return None, "the GPU does not answer nvidia-smi" + (" (lost)" if lost else "")
    state: dict[str, Any] = {
        "uuid": found.uuid,
        "pci_bus_id": found.pci_bus_id,
        "ecc_uncorrected_volatile": found.ecc_uncorrected_volatile,
    }
    if found.ecc_uncorrected_volatile:
        return state, f"{found.ecc_uncorrected_volatile} uncorrectable volatile ECC errors"
    rows = await remap.query(ctx, driver, found.uuid, timeout)
    state["remapped_rows"] = [r.record() for r in rows]
    if any(r.failure for r in rows):
        return state, "row remapping failed"
    if any(r.pending for r in rows):
        return state, "a row remap is still pending"
    return state, None


def _is(g: health.GpuHealth, ident: str) -> bool:
    bus = g.pci_bus_id.lower()
    return ident.lower() in (str(g.index), g.uuid.lower(), bus, bus[4:])


@hostexec.scoped_action
class ResetAction(actions.Action[ResetParams]):
    name: ClassVar[str] = "gpu.reset"
    description: ClassVar[str] = (
        "Reset one GPU (nvidia-smi -r) when no process uses it and its pods are drained; "
        "verifies it answers healthy."
    )
    params_model = ResetParams
    disruptive: ClassVar[bool] = True
    semantics: ClassVar[dict[str, str]] = {
        "check": "with `rung`, in place (nothing to do) when the run is on another rung; in "
        "place when an earlier attempt may have reset the GPU and it now answers healthy.",
        "apply": "refuses while GPU pods run on the node or nvidia-smi lists a compute process "
        "on the GPU; runs `nvidia-smi -r -i <gpu>`; verifies the GPU answers with no "
        "uncorrectable volatile ECC and no pending or failed row remap. With `rung`, a failed "
        "reset climbs the run to the reboot rung instead of failing the step.",
        "undo": "none.",
    }

    async def check(self, ctx: actions.ActionContext, params: ResetParams) -> actions.Check:
        skip = await ladder.skipped(ctx, params.rung, params.node)
        if skip is not None:
            return actions.Check(in_place=True, output=skip)
        if not ctx.applied_output.get(clusterops.MAYBE_APPLIED):
            return actions.Check(in_place=False)
        _, driver = await gpu.find_driver(ctx, params)
        state, problem = await healthy(
            ctx, driver, target(ctx, params), params.exec_timeout_seconds
        )
        return actions.Check(in_place=problem is None, output={"gpu": state, "reset": True})

    async def apply(self, ctx: actions.ActionContext, params: ResetParams) -> dict[str, Any]:
        node, driver = await gpu.find_driver(ctx, params)
        ident = target(ctx, params)
        timeout = params.exec_timeout_seconds
        if params.require_no_gpu_pods:
            pods = await gpu_pods(ctx, node.name, driver.namespace)
            if pods:
                raise errors.ActionFailed(
                    f"refused: pods holding GPUs still run on {node.name}: {', '.join(pods)} "
                    "(drain the node first)",
                    output={"node": node.name, "gpu_pods": pods},
                )
        apps, listed = await compute_apps(ctx, driver, ident, timeout)
        if listed.exit_code not in (0, gpu.RC_GPU_LOST):  # lost: the reset will say so
            raise gpu.failure(driver, ["nvidia-smi", "--query-compute-apps"], listed)
        if apps:
            raise errors.ActionFailed(
                f"refused: GPU {ident} on {node.name} is in use by "
                + ", ".join(f"{a['process_name']} (pid {a['pid']})" for a in apps),
                output={"node": node.name, "gpu": ident, "processes": apps},
            )
        output: dict[str, Any] = {"node": node.name, "gpu": ident, "driver_pod": driver.pod}
        argv = ["nvidia-smi", "-r", "-i", ident]
        with clusterops.changing(output):
            result = await gpu.run(ctx, driver, argv, timeout=params.reset_timeout_seconds)
        problem = None
        if result.exit_code != 0:
            problem = str(gpu.failure(driver, argv, result))
        else:
            output["reset"] = True
            output["verified"], problem = await healthy(ctx, driver, ident, timeout)
        return await self._outcome(ctx, params, node, output, problem)

    async def _outcome(
        self,
        ctx: actions.ActionContext,
        params: ResetParams,
        node: port.NodeInfo,
        output: dict[str, Any],
        problem: str | None,
    ) -> dict[str, Any]:
        cluster = ctx.require_cluster()
        if problem is None:
            output["event"] = await clusterops.emit_node_event(
                ctx, cluster, node, reason="RemediatorGpuReset", what=f"reset GPU {output['gpu']}"
            )
            return output
        output |= {"reset": False, "error": problem}
        if params.rung is None:
            raise errors.ActionFailed(f"GPU reset on {node.name}: {problem}", output=output)
        output["escalated_to"] = await ladder.escalate(
            ctx, ladders.Rung.REBOOT, f"GPU reset failed: {problem}"[:500], params.node
        )
        output["event"] = await clusterops.emit_node_event(
            ctx,
            cluster,
            node,
            reason="RemediatorGpuResetFailed",
            what=f"reset of GPU {output['gpu']} failed ({problem}); escalating to a reboot",
        )
        return output

    def describe(self, params: ResetParams) -> str:
        rung = f" (ladder rung {params.rung.value})" if params.rung else ""
        return f"reset GPU {params.gpu or '(alert GPU)'} on {params.node or '(alert node)'}{rung}"
