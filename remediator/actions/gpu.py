"""``gpu.power_cap`` and the driver-pod plumbing the GPU actions share.

``nvidia-smi`` runs by exec (argv, never a shell) in the GPU Operator's driver pod on the node.
Targets are addressed by UUID (indexes can change across reboots). The cap is computed from the
GPU's *default* limit, so a re-fired alert does not stack caps, and must lie within the GPU's
own [min, max] range: out-of-range values are refused, or clamped when asked (by default for
``percent_of_default``: never below the minimum). Undo puts back each GPU's previous limit
unless someone has changed it since.

Once the first ``-pl`` is sent, the cap may be in place whatever happens next (a stream that
drops after ``nvidia-smi`` ran, a read-back that cannot be made, a second GPU that refuses):
such a failure never reads as "not applied". Its output carries ``maybe_applied: true`` and
the per-GPU records (``previous_limit``, ``set_limit``) that undo needs. A ``-pl`` whose stream
dropped is not sent again within the attempt: the next attempt's ``check`` reads the limits
and finds the cap in place if it was applied (a limit is never written twice).

A retry gets that earlier output as ``ctx.applied_output``. For a GPU still at the limit the
earlier attempt set, the limit read now may be our own cap, so the earlier ``previous_limit``
is kept, whether the retry finds the cap in place or writes the rest of it. When undo finds no
previous limit on record (the outcome was unknown and nothing was recorded, or a refire found
the cap in place), it restores the GPU's default limit, again only if the GPU is still at the
limit this cap sets, computed from the params and the GPU's own limits as ``apply`` does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

import pydantic

from remediator.actions import clusterops, hostexec, validation
from remediator.domain import errors
from remediator.ports import actions
from remediator.ports import cluster as port

QUERY = (
    "index,uuid,pci.bus_id,power.limit,power.default_limit,power.min_limit,"
    "power.max_limit,enforced.power.limit"
)
TOLERANCE_W = 0.5
RC_GPU_LOST = 15
EXIT_CODES = {
    2: "invalid argument",
    3: "not supported",
    4: "no permission",
    6: "GPU not found",
    9: "driver not loaded",
    15: "GPU has fallen off the bus",
    127: "executable not found",
    255: "unknown error",
}


class DriverParams(validation.Model):
    node: validation.NodeName | None = None
    driver_namespace: Annotated[validation.Namespace | None, validation.EXEC_TARGET] = None
    """Namespace of the GPU driver pod; default: the setting. A literal, never a template."""
    driver_selector: Annotated[validation.LabelSelector | None, validation.EXEC_TARGET] = None
    """Label selector of the GPU driver pod; default: the setting. A literal, never a template."""
    driver_container: Annotated[validation.ContainerName | None, validation.EXEC_TARGET] = None
    """Container to exec in; default: the setting. A literal, never a template."""
    exec_timeout_seconds: float = pydantic.Field(30.0, gt=0, le=600)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Driver:
    """Where a node's GPU commands run: its driver pod, or a host pod (see ``hostexec``)."""

    node: str
    namespace: str
    pod: str
    container: str
    prefix: tuple[str, ...] = ()
    """Put before each command's argv (``chroot /host`` in a host pod)."""
    host_pod: bool = False

    def command(self, argv: list[str]) -> list[str]:
        return [*self.prefix, *argv]


async def find_driver(
    ctx: actions.ActionContext, params: DriverParams
) -> tuple[port.NodeInfo, Driver]:
    """The node and where its GPU commands run. A node in a ``host_pod`` pool gets the exec
    scope's host pod (created and Ready on first use; callers run in ``hostexec.scoped``)."""
    cluster = ctx.require_cluster()
    node = await clusterops.gpu_node(cluster, clusterops.target_node(ctx, params.node))
    return node, await driver_on(ctx, node, params)


async def driver_on(
    ctx: actions.ActionContext,
    node: port.NodeInfo,
    params: DriverParams,
    *,
    listed: port.PodInfo | None = None,
) -> Driver:
    """Where ``node``'s GPU commands run, the node already read (``find_driver``). ``listed``:
    its driver pod, found in a list taken beforehand (the fleet sweep lists every driver pod
    once instead of once per node); a host pod pool's node never uses it."""
    cluster = ctx.require_cluster()
    pool = hostexec.host_pool(hostexec.config(ctx), node)
    if pool is not None:
        host = await hostexec.acquire(
            ctx, pool, node.name, default_namespace=cluster.driver_namespace
        )
        return Driver(
            node=node.name,
            namespace=host.namespace,
            pod=host.name,
            container=hostexec.CONTAINER,
            prefix=host.prefix,
            host_pod=True,
        )
    namespace = params.driver_namespace or cluster.driver_namespace
    pod = listed
    if pod is None:
        with clusterops.cluster_errors(f"finding the GPU driver pod on {node.name}"):
            pod = await cluster.find_driver_pod(
                node.name, namespace=namespace, selector=params.driver_selector
            )
    if pod is None:
        raise errors.ActionFailed(
            f"no running GPU driver pod on {node.name} in namespace {namespace} "
            f"(selector {params.driver_selector or cluster.driver_selector!r})",
            temporary=True,
        )
    container = params.driver_container or cluster.driver_container
    return Driver(node=node.name, namespace=pod.namespace, pod=pod.name, container=container)


async def run(
    ctx: actions.ActionContext,
    driver: Driver,
    argv: list[str],
    *,
    timeout: float,
    idempotent: bool = False,
) -> port.ExecResult:
    """Exec ``argv`` in the driver container; exit codes are the caller's to judge.

    ``idempotent`` commands (reads) are run again if their stream drops; other failures to get
    a result are temporary ``ActionFailed``."""
    with clusterops.cluster_errors(f"running {argv[0]} on {driver.node}"):
        return await ctx.require_cluster().exec(
            namespace=driver.namespace,
            pod=driver.pod,
            container=driver.container,
            argv=driver.command(argv),
            timeout=timeout,
            idempotent=idempotent,
        )


def failure(driver: Driver, argv: list[str], result: port.ExecResult) -> errors.ActionFailed:
    code = result.exit_code
    meaning = EXIT_CODES.get(code, "failed") if code is not None else "did not run"
    text = (result.stderr or result.stdout).decode("utf-8", "replace").strip()[-500:]
    if code is None:
        text = str(result.status.get("message") or text)
    return errors.ActionFailed(
        f"{argv[0]} on {driver.node}: {meaning} (exit {code}): {text}",
        output={"node": driver.node, "exit_code": code, "argv": argv},
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class GpuLimits:
    index: int
    uuid: str
    pci_bus_id: str
    limit: float
    default: float
    min: float
    max: float
    enforced: float | None


def _watts(raw: str) -> float | None:
    raw = raw.strip().removesuffix("W").strip()
    try:
        return float(raw)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def parse_query(text: str) -> list[GpuLimits]:
    """``QUERY`` output (csv,noheader,nounits), by position."""
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 8 or not fields[0].isdigit():
            continue
        limit, default, low, high = (_watts(f) for f in fields[3:7])
        if limit is None or default is None or low is None or high is None:
            raise ValueError(f"GPU {fields[1]} does not report power limits: {line!r}")
        gpus.append(
            GpuLimits(
                index=int(fields[0]),
                uuid=fields[1],
                pci_bus_id=fields[2],
                limit=limit,
                default=default,
                min=low,
                max=high,
                enforced=_watts(fields[7]),
            )
        )
    return gpus


def matches(gpu: GpuLimits, ident: str) -> bool:
    ident = ident.lower()
    bus = gpu.pci_bus_id.lower()
    return ident in (str(gpu.index), gpu.uuid.lower(), bus, bus[4:])


def select(gpus: list[GpuLimits], idents: list[str] | None) -> list[GpuLimits]:
    if idents is None:
        return list(gpus)
    chosen = []
    for ident in idents:
        found = next((g for g in gpus if matches(g, ident)), None)
        if found is None:
            raise errors.ActionFailed(f"GPU {ident} not found on the node")
        if found not in chosen:
            chosen.append(found)
    return chosen


def compute_target(
    gpu: GpuLimits, *, watts: float | None, percent: float | None, clamp: bool
) -> tuple[float, bool]:
    """The limit to set on ``gpu`` and whether it was clamped; ValueError when out of range."""
    if watts is not None:
        target = float(watts)
    elif percent is not None:
        target = round(gpu.default * percent / 100.0, 2)
    else:
        raise ValueError("give watts or percent_of_default")
    if gpu.min - TOLERANCE_W <= target <= gpu.max + TOLERANCE_W:
        return min(max(target, gpu.min), gpu.max), False
    if clamp:
        return min(max(target, gpu.min), gpu.max), True
    raise ValueError(
        f"{target:g} W is outside the power limit range {gpu.min:g}-{gpu.max:g} W of GPU "
        f"{gpu.uuid} ({gpu.pci_bus_id})"
    )


def watts_arg(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


async def query(ctx: actions.ActionContext, driver: Driver, timeout: float) -> list[GpuLimits]:
    argv = ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"]
    result = await run(ctx, driver, argv, timeout=timeout, idempotent=True)
    if result.exit_code != 0:
        raise failure(driver, argv, result)
    try:
        return parse_query(result.stdout.decode("utf-8", "replace"))
    except ValueError as e:
        raise errors.ActionFailed(f"nvidia-smi on {driver.node}: {e}") from e


async def set_limit(
    ctx: actions.ActionContext, driver: Driver, uuid: str, watts: float, timeout: float
) -> None:
    argv = ["nvidia-smi", "-i", uuid, "-pl", watts_arg(watts)]
    # Not run again when its stream drops: it may have run, and check() will find out.
    result = await run(ctx, driver, argv, timeout=timeout)
    if result.exit_code != 0:
        raise failure(driver, argv, result)


GpuSelection = list[validation.GpuId] | Literal["all"] | None


class PowerCapParams(DriverParams):
    gpus: GpuSelection = None
    """UUIDs, PCI bus ids or indexes; "all"; default: the run's GPU, else all of the node."""
    watts: float | None = pydantic.Field(None, gt=0, le=5000)
    percent_of_default: float | None = pydantic.Field(None, gt=0, le=100)
    clamp: bool | None = None
    """Clamp into [min, max] instead of refusing; default: yes for percent_of_default."""

    @pydantic.model_validator(mode="after")
    def _one_target(self) -> PowerCapParams:
        if (self.watts is None) == (self.percent_of_default is None):
            raise ValueError("give exactly one of watts and percent_of_default")
        return self

    @property
    def clamping(self) -> bool:
        return self.clamp if self.clamp is not None else self.percent_of_default is not None


def wanted_gpus(ctx: actions.ActionContext, params: PowerCapParams) -> list[str] | None:
    if params.gpus == "all":
        return None
    if params.gpus:
        return list(params.gpus)
    if ctx.gpu:
        try:
            return [validation.gpu_id(ctx.gpu)]
        except ValueError as e:
            raise errors.ActionFailed(f"refused: the run's GPU {e}") from e
    return None


def plan_caps(gpus: list[GpuLimits], params: PowerCapParams) -> list[tuple[GpuLimits, float, bool]]:
    plan = []
    for gpu in gpus:
        try:
            target, clamped = compute_target(
                gpu, watts=params.watts, percent=params.percent_of_default, clamp=params.clamping
            )
        except ValueError as e:
            raise errors.ActionFailed(f"refused: {e}") from e
        plan.append((gpu, target, clamped))
    return plan


def _gpu_record(gpu: GpuLimits, **extra: Any) -> dict[str, Any]:
    return {
        "uuid": gpu.uuid,
        "index": gpu.index,
        "pci_bus_id": gpu.pci_bus_id,
        "default_limit": gpu.default,
        "min_limit": gpu.min,
        "max_limit": gpu.max,
        **extra,
    }


def kept_previous(applied: Mapping[str, Any], gpus: list[GpuLimits]) -> dict[str, float]:
    """uuid → the limit an earlier attempt of this step read before writing its cap, for each
    GPU still at the limit that attempt set (``applied``: that attempt's maybe-applied output;
    the limit read now is then likely our own cap, not the one to restore)."""
    if not applied.get(clusterops.MAYBE_APPLIED):
        return {}
    now = {g.uuid: g.limit for g in gpus}
    kept: dict[str, float] = {}
    for record in applied.get("gpus") or []:
        uuid = str(record.get("uuid"))
        previous, written = record.get("previous_limit"), record.get("set_limit")
        if uuid not in now or previous is None or written is None:
            continue
        if abs(now[uuid] - float(written)) <= TOLERANCE_W:
            kept[uuid] = float(previous)
    return kept


def cap_targets(
    ctx: actions.ActionContext, params: PowerCapParams, gpus: list[GpuLimits]
) -> dict[str, float]:
    """uuid → the limit this cap sets on each GPU it targets, computed as ``apply`` does;
    empty when ``apply`` would refuse (it then never wrote a limit)."""
    try:
        idents = wanted_gpus(ctx, params)
        chosen = [g for g in gpus if idents is None or any(matches(g, i) for i in idents)]
        return {gpu.uuid: target for gpu, target, _ in plan_caps(chosen, params)}
    except errors.ActionFailed:
        return {}


def undo_plan(
    current: list[GpuLimits],
    applied: list[Mapping[str, Any]],
    targets: Mapping[str, float] | None = None,
) -> tuple[list[tuple[str, float]], dict[str, str]]:
    """(uuid, watts) to restore, and GPUs left alone because someone changed them since.

    ``targets`` (from ``cap_targets``) stand in for what the output does not record: with no
    records at all, every GPU the cap targets is undone; without ``set_limit``, ours is the
    target. Without ``previous_limit``, the GPU goes back to its default limit."""
    targets = targets or {}
    by_uuid = {g.uuid: g for g in current}
    restore: list[tuple[str, float]] = []
    left_alone: dict[str, str] = {}
    for record in applied or [{"uuid": uuid} for uuid in targets]:
        gpu = by_uuid.get(str(record.get("uuid")))
        if gpu is None:
            left_alone[str(record.get("uuid"))] = "GPU no longer reported by nvidia-smi"
            continue
        previous = record.get("previous_limit")
        target = float(previous if previous is not None else gpu.default)
        ours = record.get("set_limit", targets.get(gpu.uuid))
        if abs(gpu.limit - target) <= TOLERANCE_W:
            continue
        if ours is None:
            left_alone[gpu.uuid] = f"limit {gpu.limit:g} W was not set by this cap"
            continue
        if abs(gpu.limit - float(ours)) > TOLERANCE_W:
            left_alone[gpu.uuid] = f"limit changed by someone else to {gpu.limit:g} W"
            continue
        restore.append((gpu.uuid, target))
    return restore, left_alone


@hostexec.scoped_action
class PowerCapAction(actions.Action[PowerCapParams]):
    name: ClassVar[str] = "gpu.power_cap"
    description: ClassVar[str] = "Cap GPU power limits with nvidia-smi -pl; undo restores them."
    params_model = PowerCapParams
    supports_undo: ClassVar[bool] = True
    observable: ClassVar[bool] = True

    async def _plan(
        self, ctx: actions.ActionContext, params: PowerCapParams
    ) -> tuple[port.NodeInfo, Driver, list[tuple[GpuLimits, float, bool]]]:
        node, driver = await find_driver(ctx, params)
        gpus = await query(ctx, driver, params.exec_timeout_seconds)
        return node, driver, plan_caps(select(gpus, wanted_gpus(ctx, params)), params)

    async def check(self, ctx: actions.ActionContext, params: PowerCapParams) -> actions.Check:
        node, _, plan = await self._plan(ctx, params)
        done = all(abs(g.limit - target) <= TOLERANCE_W for g, target, _ in plan)
        kept = kept_previous(ctx.applied_output, [g for g, _, _ in plan])
        gpus = [
            _gpu_record(
                g,
                current_limit=g.limit,
                set_limit=target,
                clamped=clamped,
                **({"previous_limit": kept[g.uuid]} if g.uuid in kept else {}),
            )
            for g, target, clamped in plan
        ]
        return actions.Check(in_place=done, output={"node": node.name, "gpus": gpus})

    async def apply(self, ctx: actions.ActionContext, params: PowerCapParams) -> dict[str, Any]:
        node, driver, plan = await self._plan(ctx, params)
        timeout = params.exec_timeout_seconds
        kept = kept_previous(ctx.applied_output, [g for g, _, _ in plan])
        records = [
            _gpu_record(
                gpu,
                previous_limit=kept.get(gpu.uuid, gpu.limit),
                set_limit=target,
                clamped=clamped,
                changed=abs(gpu.limit - target) > TOLERANCE_W,
            )
            for gpu, target, clamped in plan
        ]
        written = {
            "node": node.name,
            "driver_pod": f"{driver.namespace}/{driver.pod}",
            "gpus": records,
        }
        with clusterops.changing(written):
            for record in records:
                if record["changed"]:
                    await set_limit(ctx, driver, record["uuid"], record["set_limit"], timeout)
            self._verify(node, records, await query(ctx, driver, timeout))
        summary = ", ".join(f"{r['uuid']} {r['set_limit']:g} W" for r in records)
        event = await clusterops.emit_node_event(
            ctx, ctx.require_cluster(), node, reason="RemediatorPowerCap", what=f"capped {summary}"
        )
        return {
            "node": node.name,
            "driver_pod": f"{driver.namespace}/{driver.pod}",
            "watts": params.watts,
            "percent_of_default": params.percent_of_default,
            "gpus": records,
            "event": event,
        }

    @staticmethod
    def _verify(node: port.NodeInfo, records: list[dict[str, Any]], now: list[GpuLimits]) -> None:
        """Record what each GPU reads back as; fail if one is not at the limit set."""
        after = {g.uuid: g for g in now}
        for record in records:
            gpu = after.get(record["uuid"])
            record["verified_limit"] = gpu.limit if gpu else None
            record["enforced_limit"] = gpu.enforced if gpu else None
        for record in records:
            if record["verified_limit"] is None or (
                abs(record["verified_limit"] - record["set_limit"]) > TOLERANCE_W
            ):
                raise errors.ActionFailed(
                    f"power limit of GPU {record['uuid']} on {node.name} reads back as "
                    f"{record['verified_limit']} W, not {record['set_limit']:g} W",
                    output={"node": node.name, "gpus": records},
                )

    async def _undo_plan(
        self, ctx: actions.ActionContext, params: PowerCapParams
    ) -> tuple[port.NodeInfo, Driver, list[tuple[str, float]], dict[str, str]]:
        node, driver = await find_driver(ctx, params)
        current = await query(ctx, driver, params.exec_timeout_seconds)
        applied = list(ctx.applied_output.get("gpus") or [])
        restore, left_alone = undo_plan(current, applied, cap_targets(ctx, params, current))
        return node, driver, restore, left_alone

    async def check_undo(self, ctx: actions.ActionContext, params: PowerCapParams) -> actions.Check:
        node, _, restore, left_alone = await self._undo_plan(ctx, params)
        output = {"node": node.name, "left_alone": left_alone}
        return actions.Check(in_place=not restore, output=output)

    async def undo(self, ctx: actions.ActionContext, params: PowerCapParams) -> dict[str, Any]:
        node, driver, restore, left_alone = await self._undo_plan(ctx, params)
        for uuid, watts in restore:
            await set_limit(ctx, driver, uuid, watts, params.exec_timeout_seconds)
        after = {g.uuid: g.limit for g in await query(ctx, driver, params.exec_timeout_seconds)}
        restored = {uuid: after.get(uuid) for uuid, _ in restore}
        recorded = {
            str(r.get("uuid"))
            for r in ctx.applied_output.get("gpus") or []
            if r.get("previous_limit") is not None
        }
        to_default = sorted(uuid for uuid in restored if uuid not in recorded)
        event = await clusterops.emit_node_event(
            ctx,
            ctx.require_cluster(),
            node,
            reason="RemediatorPowerRestore",
            what=f"restored power limits {restored}; left alone {left_alone}",
        )
        return {
            "node": node.name,
            "restored": restored,
            "restored_to_default": to_default,  # no previous limit on record
            "left_alone": left_alone,
            "event": event,
        }

    async def observe(
        self, ctx: actions.ActionContext, params: PowerCapParams
    ) -> actions.Observation:
        """Present while any GPU the cap targeted is still at the limit it set (the undo can
        restore it); gone when every one is back at its previous (or default) limit."""
        node, driver = await find_driver(ctx, params)
        current = await query(ctx, driver, params.exec_timeout_seconds)
        targets = cap_targets(ctx, params, current)
        applied = list(ctx.applied_output.get("gpus") or []) or [{"uuid": u} for u in targets]
        by_uuid = {g.uuid: g for g in current}
        ours, back, other = [], [], []
        for record in applied:
            gpu = by_uuid.get(str(record.get("uuid")))
            if gpu is None:
                continue
            written = record.get("set_limit", targets.get(gpu.uuid))
            previous = record.get("previous_limit")
            before = float(previous if previous is not None else gpu.default)
            shown = f"GPU {gpu.uuid} at {gpu.limit:g} W"
            if written is not None and abs(gpu.limit - float(written)) <= TOLERANCE_W:
                ours.append(f"{shown} (capped from {before:g} W)")
            elif abs(gpu.limit - before) <= TOLERANCE_W:
                back.append(shown)
            else:
                other.append(f"{shown} (the cap set {written} W)")
        if ours:
            presence, found = actions.Presence.PRESENT, ours
        elif other:
            presence, found = actions.Presence.CHANGED, other
        else:
            presence, found = actions.Presence.GONE, back or ["no capped GPU reported"]
        return actions.Observation(presence, f"node {node.name}: {'; '.join(found)}")

    def describe(self, params: PowerCapParams) -> str:
        target = (
            f"{params.watts:g} W"
            if params.watts is not None
            else f"{params.percent_of_default:g}% of default"
        )
        return f"cap GPU power on {params.node or '(alert node)'} to {target}"
