"""Read-only GPU health actions: ``gpu.verify_healthy``, ``node.check_operator_pods`` and
``gpu.health_report``.

They change nothing, so ``check`` never claims an effect is in place: every attempt looks at
the live state again (a verification recorded before a crash says nothing about the node now).
``nvidia-smi`` runs by exec in the GPU Operator's driver pod, through the helpers of
``actions.gpu``; values are parsed by the position of the fields asked for, and "[N/A]" /
"[Not Supported]" become ``None`` rather than zero, so an unreadable ECC counter is never
mistaken for a clean one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import re
from typing import Annotated, Any, ClassVar, Literal

import pydantic

from remediator.actions import clusterops, gpu, hostexec, validation
from remediator.domain import errors
from remediator.ports import actions
from remediator.ports import cluster as port

HEALTH_QUERY = (
    "index,uuid,pci.bus_id,name,temperature.gpu,utilization.gpu,memory.used,memory.total,"
    "ecc.errors.uncorrected.volatile.total,ecc.errors.uncorrected.aggregate.total,"
    "ecc.errors.corrected.volatile.total,power.draw,power.limit,power.default_limit"
)
_FIELDS = len(HEALTH_QUERY.split(","))
_LOST = re.compile(r"GPU\s*(?P<bus>[0-9A-Fa-f:.]+):\s*GPU is lost", re.IGNORECASE)
RUNNING_PHASES = ("Running", "Succeeded")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GpuHealth:
    index: int
    uuid: str
    pci_bus_id: str
    name: str
    temperature: float | None
    utilization: float | None
    memory_used: float | None
    memory_total: float | None
    ecc_uncorrected_volatile: int | None
    ecc_uncorrected_aggregate: int | None
    ecc_corrected_volatile: int | None
    power_draw: float | None
    power_limit: float | None
    power_default_limit: float | None

    @property
    def memory_percent(self) -> float | None:
        if self.memory_used is None or not self.memory_total:
            return None
        return round(100.0 * self.memory_used / self.memory_total, 1)


def _number(raw: str) -> float | None:
    text = raw.strip()
    for unit in ("MiB", "W", "%", "C"):
        text = text.removesuffix(unit).strip()
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]", "N/A"


def _count(raw: str) -> int | None:
    value = _number(raw)
    return int(value) if value is not None else None


def parse_health(text: str) -> tuple[list[GpuHealth], list[str]]:
    """``HEALTH_QUERY`` rows (csv,noheader,nounits) by position, and the PCI bus ids of GPUs
    that nvidia-smi reports as lost (Xid 79: "Unable to determine the device handle ...")."""
    gpus: list[GpuHealth] = []
    lost: list[str] = []
    for line in text.splitlines():
        found = _LOST.search(line)
        if found:
            lost.append(found["bus"])
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != _FIELDS or not fields[0].isdigit():
            continue
        gpus.append(
            GpuHealth(
                index=int(fields[0]),
                uuid=fields[1],
                pci_bus_id=fields[2],
                name=fields[3],
                temperature=_number(fields[4]),
                utilization=_number(fields[5]),
                memory_used=_number(fields[6]),
                memory_total=_number(fields[7]),
                ecc_uncorrected_volatile=_count(fields[8]),
                ecc_uncorrected_aggregate=_count(fields[9]),
                ecc_corrected_volatile=_count(fields[10]),
                power_draw=_number(fields[11]),
                power_limit=_number(fields[12]),
                power_default_limit=_number(fields[13]),
            )
        )
    return gpus, lost


async def query_health(
    ctx: actions.ActionContext, driver: gpu.Driver, timeout: float
) -> tuple[list[GpuHealth], list[str], int | None]:
    """Query every GPU of the driver's node; a non-zero exit with no rows is a failure."""
    argv = ["nvidia-smi", f"--query-gpu={HEALTH_QUERY}", "--format=csv,noheader,nounits"]
    result = await gpu.run(ctx, driver, argv, timeout=timeout, idempotent=True)
    gpus, lost = parse_health(result.stdout.decode("utf-8", "replace"))
    if result.exit_code != 0 and not gpus and not lost:
        raise gpu.failure(driver, argv, result)
    return gpus, lost, result.exit_code


def _record(g: GpuHealth, **extra: Any) -> dict[str, Any]:
    return {
        "index": g.index,
        "uuid": g.uuid,
        "pci_bus_id": g.pci_bus_id,
        "ecc_uncorrected_volatile": g.ecc_uncorrected_volatile,
        "ecc_uncorrected_aggregate": g.ecc_uncorrected_aggregate,
        **extra,
    }


# ---- gpu.verify_healthy ----------------------------------------------------------------


class VerifyParams(gpu.DriverParams):
    include_aggregate: bool = False
    """Also require the lifetime (aggregate) uncorrectable counter to be zero. Off by default:
    after a GPU reset with row remapping the aggregate stays non-zero for good."""
    require_ecc: bool = True
    """An ECC counter that cannot be read (ECC disabled, "[N/A]") counts as a failure."""
    gpu_count_label: validation.LabelKey | None = "nvidia.com/gpu.count"
    """Node label with the number of GPUs the node should have (GPU feature discovery);
    fewer GPUs answering means one is missing from the bus. None: do not compare."""


def verify_problems(
    gpus: list[GpuHealth], lost: list[str], params: VerifyParams, expected: int | None
) -> dict[str, str]:
    """What is wrong, by GPU (UUID, or PCI bus id for a lost GPU); empty when healthy."""
    problems: dict[str, str] = {bus: "GPU is lost (fallen off the bus)" for bus in lost}
    for g in gpus:
        counters = {"volatile": g.ecc_uncorrected_volatile}
        if params.include_aggregate:
            counters["aggregate"] = g.ecc_uncorrected_aggregate
        bad = [f"{kind} {value}" for kind, value in counters.items() if value]
        unreadable = [kind for kind, value in counters.items() if value is None]
        if bad:
            problems[g.uuid] = f"uncorrectable ECC errors ({', '.join(bad)})"
        elif unreadable and params.require_ecc:
            problems[g.uuid] = f"ECC counters not reported ({', '.join(unreadable)})"
    if expected is not None and len(gpus) < expected:
        problems["(node)"] = f"{len(gpus)} of {expected} GPUs answer nvidia-smi"
    return problems


def _expected_count(node: port.NodeInfo, label: str | None) -> int | None:
    raw = node.labels.get(label) if label else None
    return int(raw) if raw and raw.isdigit() else None


@hostexec.scoped_action
class VerifyHealthyAction(actions.Action[VerifyParams]):
    name: ClassVar[str] = "gpu.verify_healthy"
    description: ClassVar[str] = (
        "Check that nvidia-smi answers and uncorrectable ECC counters are zero on every GPU."
    )
    params_model = VerifyParams

    async def check(self, ctx: actions.ActionContext, params: VerifyParams) -> actions.Check:
        return actions.Check(in_place=False)  # a verification always looks again

    async def apply(self, ctx: actions.ActionContext, params: VerifyParams) -> dict[str, Any]:
        node, driver = await gpu.find_driver(ctx, params)
        gpus, lost, exit_code = await query_health(ctx, driver, params.exec_timeout_seconds)
        expected = _expected_count(node, params.gpu_count_label)
        problems = verify_problems(gpus, lost, params, expected)
        output: dict[str, Any] = {
            "node": node.name,
            "driver_pod": f"{driver.namespace}/{driver.pod}",
            "exit_code": exit_code,
            "expected_gpus": expected,
            "gpus": [_record(g) for g in gpus],
            "lost": lost,
            "problems": problems,
        }
        if problems:
            listed = "; ".join(f"{who}: {why}" for who, why in sorted(problems.items()))
            raise errors.ActionFailed(f"node {node.name} is not healthy: {listed}", output=output)
        if exit_code != 0:
            raise errors.ActionFailed(
                f"nvidia-smi on {node.name} exited {exit_code} although every GPU answered",
                output=output,
            )
        return output

    def describe(self, params: VerifyParams) -> str:
        return f"verify GPUs on {params.node or '(alert node)'} answer with zero uncorrectable ECC"


# ---- node.check_operator_pods ----------------------------------------------------------


class OperatorPodsParams(validation.Model):
    node: validation.NodeName | None = None
    namespace: validation.Namespace | None = None
    """Default: the cluster's GPU driver namespace (the GPU Operator's)."""
    selector: validation.LabelSelector | None = None
    """Only pods matching this label selector; default: every pod of the namespace."""
    min_pods: int = pydantic.Field(1, ge=0, le=100)
    retry_after_seconds: float = pydantic.Field(10.0, gt=0, le=3600)


MANAGED_BY = "app.kubernetes.io/managed-by"


class OperatorPodsAction(actions.Action[OperatorPodsParams]):
    """Pods of the GPU Operator on the node are Running and Ready (or Succeeded, for
    validators): a driver container that runs but has not passed its readiness probe has not
    loaded the driver yet.

    Not ready yet is a temporary failure, so the step's retries wait for them to start.
    """

    name: ClassVar[str] = "node.check_operator_pods"
    description: ClassVar[str] = "Confirm the GPU Operator's pods on the node run and are ready."
    params_model = OperatorPodsParams

    async def check(self, ctx: actions.ActionContext, params: OperatorPodsParams) -> actions.Check:
        return actions.Check(in_place=False)

    async def apply(self, ctx: actions.ActionContext, params: OperatorPodsParams) -> dict[str, Any]:
        cluster = ctx.require_cluster()
        node = await clusterops.gpu_node(cluster, clusterops.target_node(ctx, params.node))
        namespace = params.namespace or cluster.driver_namespace
        with clusterops.cluster_errors(f"listing pods of {namespace} on {node.name}"):
            pods = await cluster.list_pods(
                namespace=namespace,
                field_selector=f"spec.nodeName={node.name}",
                label_selector=params.selector or "",
            )
        # remediator's own short-lived pods there (reboot, GPU exec, CUDA smoke test) are not
        # the operator's
        pods = [p for p in pods if p.labels.get(MANAGED_BY) != "remediator"]
        phases = {p.key: p.phase for p in sorted(pods, key=lambda p: p.key)}
        waiting = {p.key: why for p in pods if (why := _not_running(p))}
        output: dict[str, Any] = {
            "node": node.name,
            "namespace": namespace,
            "pods": phases,
            "waiting": waiting,
        }
        if waiting or len(pods) < params.min_pods:
            what = ", ".join(f"{k} ({v})" for k, v in sorted(waiting.items()))
            if len(pods) < params.min_pods:
                what = f"{len(pods)} pods, expected at least {params.min_pods}" + (
                    f"; {what}" if what else ""
                )
            raise errors.ActionFailed(
                f"GPU Operator pods on {node.name} not running yet: {what}",
                temporary=True,
                retry_after=params.retry_after_seconds,
                output=output,
            )
        return output

    def describe(self, params: OperatorPodsParams) -> str:
        where = params.namespace or "the driver namespace"
        return f"check pods of {where} on {params.node or '(alert node)'} are running and ready"


def _not_running(pod: port.PodInfo) -> str | None:
    """Why ``pod`` does not count as up, or ``None`` if it does."""
    if pod.deletion_timestamp is not None:
        return "terminating"
    if pod.phase not in RUNNING_PHASES:
        return pod.phase
    if pod.phase == "Running" and not pod.ready:
        return "Running, not ready"
    return None


# ---- gpu.health_report -----------------------------------------------------------------


class Thresholds(validation.Model):
    """The field guide's health-check thresholds: its script flags a GPU at or above 80°C
    (``-ge``, its default threshold argument) and its temperature table alerts above 85°C."""

    temperature_warning: float = pydantic.Field(80.0, ge=0, le=150)
    """A GPU at or above this temperature (°C) is a warning."""
    temperature_critical: float = pydantic.Field(85.0, ge=0, le=150)
    """A GPU above this temperature (°C) is critical."""
    utilization_low: float = 30.0
    memory_high_percent: float = 95.0
    held_memory_mib: float = pydantic.Field(1024.0, ge=0)
    """A GPU with more framebuffer in use than this has a process on it. The API server tells
    how many GPUs a node's pods were allocated, not which ones: when pods hold some but not all
    of a node's GPUs, memory in use says which of them a pod holds."""


class HealthReportParams(validation.Model):
    node_selector: validation.LabelSelector | None = None
    """Default (or empty): the cluster's GPU node selector. Nodes outside it are never read."""
    max_concurrency: int = pydantic.Field(8, ge=1, le=64)
    thresholds: Thresholds = pydantic.Field(default_factory=Thresholds)
    driver_namespace: Annotated[validation.Namespace | None, validation.EXEC_TARGET] = None
    """Namespace of the GPU driver pods; default: the setting. A literal, never a template."""
    driver_selector: Annotated[validation.LabelSelector | None, validation.EXEC_TARGET] = None
    """Label selector of the GPU driver pods; default: the setting. A literal, never a template."""
    driver_container: Annotated[validation.ContainerName | None, validation.EXEC_TARGET] = None
    """Container to exec in; default: the setting. A literal, never a template."""
    exec_timeout_seconds: float = pydantic.Field(30.0, gt=0, le=600)
    fail_on: Literal["never", "warning", "critical"] = "never"
    """Fail the step when some finding is at least this severe (the report is kept)."""
    notify_channel: str | None = pydantic.Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    """Send the findings to this notification channel (before ``fail_on`` fails the step)."""


SEVERITY = {"ok": 0, "warning": 1, "critical": 2}


def gpu_flags(g: GpuHealth, t: Thresholds, *, held: bool) -> list[tuple[str, str]]:
    """(severity, finding) for one GPU; ``held``: a pod holds it (see ``is_held``)."""
    flags: list[tuple[str, str]] = []
    if g.temperature is not None and g.temperature > t.temperature_critical:
        flags.append(("critical", f"temperature {g.temperature:g}C > {t.temperature_critical:g}C"))
    elif g.temperature is not None and g.temperature >= t.temperature_warning:
        flags.append(("warning", f"temperature {g.temperature:g}C >= {t.temperature_warning:g}C"))
    if g.ecc_uncorrected_volatile:
        flags.append(("critical", f"{g.ecc_uncorrected_volatile} uncorrectable ECC errors"))
    if held and g.utilization is not None and g.utilization < t.utilization_low:
        flags.append(("warning", f"utilization {g.utilization:g}% < {t.utilization_low:g}% (held)"))
    percent = g.memory_percent
    if percent is not None and percent > t.memory_high_percent:
        flags.append(("warning", f"memory {percent:g}% > {t.memory_high_percent:g}%"))
    return flags


def _has_process(g: GpuHealth, t: Thresholds) -> bool:
    return g.memory_used is not None and g.memory_used > t.held_memory_mib


def in_use(g: GpuHealth, t: Thresholds) -> bool:
    """Something runs on it: busy above the low-utilization mark, or memory in use."""
    busy = g.utilization is not None and g.utilization >= t.utilization_low
    return busy or _has_process(g, t)


def is_held(g: GpuHealth, t: Thresholds, *, allocated: int | None, gpus: int) -> bool:
    """Whether a pod holds this GPU, given ``allocated`` of the node's ``gpus`` GPUs are
    allocated to pods (``None``: unknown, and memory in use is the only sign)."""
    if allocated is None:
        return _has_process(g, t)
    return allocated > 0 and (allocated >= gpus or _has_process(g, t))


def node_flags(
    gpus: list[GpuHealth], t: Thresholds, *, allocated: int | None
) -> list[tuple[str, str]]:
    """Node findings: pods hold more GPUs than show any use (held and idle, no process)."""
    if allocated is None:
        return []
    used = sum(in_use(g, t) for g in gpus)
    if allocated > used:
        return [
            (
                "warning",
                f"{allocated} GPUs allocated to pods, {used} in use "
                f"(utilization >= {t.utilization_low:g}% or memory in use)",
            )
        ]
    return []


def gpu_report(g: GpuHealth, t: Thresholds, *, held: bool) -> dict[str, Any]:
    flags = gpu_flags(g, t, held=held)
    worst = max((SEVERITY[s] for s, _ in flags), default=0)
    return {
        "index": g.index,
        "uuid": g.uuid,
        "pci_bus_id": g.pci_bus_id,
        "name": g.name,
        "temperature_c": g.temperature,
        "utilization_percent": g.utilization,
        "memory_used_mib": g.memory_used,
        "memory_total_mib": g.memory_total,
        "memory_percent": g.memory_percent,
        "ecc_uncorrected_volatile": g.ecc_uncorrected_volatile,
        "ecc_uncorrected_aggregate": g.ecc_uncorrected_aggregate,
        "ecc_corrected_volatile": g.ecc_corrected_volatile,
        "power_draw_w": g.power_draw,
        "power_limit_w": g.power_limit,
        "power_default_limit_w": g.power_default_limit,
        "severity": next(k for k, v in SEVERITY.items() if v == worst),
        "flags": [f"{s}: {text}" for s, text in flags],
    }


class HealthReportAction(actions.Action[HealthReportParams]):
    name: ClassVar[str] = "gpu.health_report"
    description: ClassVar[str] = (
        "Query every GPU node's GPUs (nvidia-smi) and report temperature, utilization, "
        "memory and ECC, flagging the health-check thresholds."
    )
    params_model = HealthReportParams

    async def check(self, ctx: actions.ActionContext, params: HealthReportParams) -> actions.Check:
        return actions.Check(in_place=False)

    async def apply(self, ctx: actions.ActionContext, params: HealthReportParams) -> dict[str, Any]:
        cluster = ctx.require_cluster()
        selector = params.node_selector or cluster.gpu_node_selector
        with clusterops.cluster_errors(f"listing nodes matching {selector!r}"):
            nodes = await cluster.list_nodes(label_selector=selector)
        gpu_nodes = sorted((n for n in nodes if cluster.is_gpu_node(n)), key=lambda n: n.name)
        listed = await FleetPods.read(ctx, params)
        limit = asyncio.Semaphore(params.max_concurrency)

        async def one(node: port.NodeInfo) -> dict[str, Any]:
            async with limit:
                return await self._node(ctx, params, node, listed)

        reports = await asyncio.gather(*(one(node) for node in gpu_nodes))
        summary = _summary(reports)
        output: dict[str, Any] = {"node_selector": selector, "nodes": reports, "summary": summary}
        worst = summary["worst"]
        if params.notify_channel:
            output["notified"] = await _notify(ctx, params.notify_channel, selector, summary)
        if params.fail_on != "never" and SEVERITY[worst] >= SEVERITY[params.fail_on]:
            findings = summary["findings"]
            raise errors.ActionFailed(
                f"GPU health sweep found {worst} problems: {'; '.join(findings[:20])}",
                output=output,
            )
        return output

    async def _node(
        self,
        ctx: actions.ActionContext,
        params: HealthReportParams,
        node: port.NodeInfo,
        listed: FleetPods,
    ) -> dict[str, Any]:
        name = node.name
        driver_params = gpu.DriverParams(
            node=name,
            driver_namespace=params.driver_namespace,
            driver_selector=params.driver_selector,
            driver_container=params.driver_container,
            exec_timeout_seconds=params.exec_timeout_seconds,
        )
        timeout = params.exec_timeout_seconds
        try:
            async with hostexec.scope():  # one host pod per node, deleted before the next
                known = listed.drivers.get(name) if listed.drivers is not None else None
                driver = await gpu.driver_on(ctx, node, driver_params, listed=known)
                try:
                    gpus, lost, exit_code = await query_health(ctx, driver, timeout)
                except errors.ActionFailed:
                    if known is None or driver.host_pod:
                        raise
                    # The pod listed at the start may have been replaced since: look again
                    # (reads for the nodes that fail only, never for the whole fleet).
                    _, fresh = await gpu.find_driver(ctx, driver_params)
                    if fresh == driver:
                        raise
                    gpus, lost, exit_code = await query_health(ctx, fresh, timeout)
        except errors.ActionFailed as e:
            return {
                "node": name,
                "severity": "critical",
                "error": str(e),
                "gpus": [],
                "lost": [],
                "flags": [],
            }
        if listed.allocated is not None:
            allocated: int | None = listed.allocated.get(name, 0)
            pods_error = ""
        else:
            allocated, pods_error = await _allocated_gpus(ctx, name)
        t = params.thresholds
        count = len(gpus) + len(lost)
        rows = [gpu_report(g, t, held=is_held(g, t, allocated=allocated, gpus=count)) for g in gpus]
        flags = node_flags(gpus, t, allocated=allocated)
        worst = max(
            [SEVERITY[r["severity"]] for r in rows]
            + [SEVERITY[s] for s, _ in flags]
            + [2 if lost else 0]
        )
        return {
            "node": name,
            "severity": next(k for k, v in SEVERITY.items() if v == worst),
            "exit_code": exit_code,
            "gpus_allocated": allocated,
            **({"pods_error": pods_error} if pods_error else {}),
            "gpus": rows,
            "lost": lost,
            "flags": [f"{s}: {text}" for s, text in flags],
        }

    def describe(self, params: HealthReportParams) -> str:
        return f"GPU health report of nodes matching {params.node_selector or '(GPU nodes)'}"


def _live(pod: port.PodInfo) -> bool:
    return pod.phase not in ("Succeeded", "Failed") and not pod.deletion_timestamp


@dataclasses.dataclass(frozen=True)
class FleetPods:
    """What the sweep needs to know about pods, read once for the whole fleet and indexed by
    node, so that each node costs one exec and no reads: the running driver pod of each node
    (one list of the driver namespace by the driver selector) and the GPUs allocated to each
    node's live pods (one list of every pod). Either is ``None`` when its list failed; the
    sweep then reads that node by node, as a node outside these lists would."""

    drivers: dict[str, port.PodInfo] | None
    allocated: dict[str, int] | None

    @classmethod
    async def read(cls, ctx: actions.ActionContext, params: HealthReportParams) -> FleetPods:
        cluster = ctx.require_cluster()
        drivers: dict[str, port.PodInfo] | None = None
        allocated: dict[str, int] | None = None
        with contextlib.suppress(port.ClusterError):
            listed = await cluster.list_pods(
                namespace=params.driver_namespace or cluster.driver_namespace,
                label_selector=params.driver_selector or cluster.driver_selector,
            )
            drivers = {}
            for pod in listed:  # the first running one per node, as find_driver_pod picks
                if pod.node_name and pod.phase == "Running" and pod.deletion_timestamp is None:
                    drivers.setdefault(pod.node_name, pod)
        with contextlib.suppress(port.ClusterError):
            pods = await cluster.list_pods()
            allocated = collections.Counter()
            for pod in pods:
                if pod.node_name and _live(pod):
                    allocated[pod.node_name] += pod.gpu_requests
        return cls(drivers=drivers, allocated=allocated)


async def _allocated_gpus(ctx: actions.ActionContext, node: str) -> tuple[int | None, str]:
    """GPUs allocated to the node's live pods, or ``None`` and why they cannot be listed (a
    report with one unknown beats no report)."""
    cluster = ctx.require_cluster()
    try:
        pods = await cluster.list_pods(field_selector=f"spec.nodeName={node}")
    except port.ClusterError as e:
        return None, f"cannot list pods on {node}: {e}"
    return sum(p.gpu_requests for p in pods if _live(p)), ""


MAX_NOTIFIED_FINDINGS = 20


async def _notify(
    ctx: actions.ActionContext, channel: str, selector: str, summary: dict[str, Any]
) -> dict[str, Any]:
    """The findings, worst first, to on-call; a channel that fails does not lose the report."""
    findings = sorted(summary["findings"], key=lambda f: -SEVERITY.get(f.split(":", 1)[0], 0))
    counts = summary["gpus_by_severity"]
    lines = [
        f"GPU health sweep of {summary['nodes']} node(s) matching {selector!r}: "
        f"{summary['gpus']} GPU(s), {counts['critical']} critical, {counts['warning']} warning, "
        f"{summary['lost_gpus']} lost, {len(summary['unreachable_nodes'])} node(s) unreadable; "
        f"worst: {summary['worst']}.",
        *findings[:MAX_NOTIFIED_FINDINGS],
    ]
    if len(findings) > MAX_NOTIFIED_FINDINGS:
        lines.append(f"... and {len(findings) - MAX_NOTIFIED_FINDINGS} more in the run's report.")
    try:
        sent: dict[str, Any] = await ctx.notifier.send(
            channel=channel,
            message="\n".join(lines),
            data={
                "event": "gpu_health_sweep",
                "run_id": ctx.run_id,
                "worst": summary["worst"],
                "findings": findings,
                "unreachable_nodes": summary["unreachable_nodes"],
            },
            idempotency_key=ctx.idempotency_key,
        )
    except errors.RemediatorError as e:
        return {"delivered": False, "error": str(e)}
    return sent


def _summary(reports: list[dict[str, Any]]) -> dict[str, Any]:
    findings: list[str] = []
    counts = {"ok": 0, "warning": 0, "critical": 0}
    for report in reports:
        if report.get("error"):
            findings.append(f"critical: {report['node']}: {report['error']}")
        findings += [f"critical: {report['node']}: GPU {bus} is lost" for bus in report["lost"]]
        findings += [
            f"{flag.split(': ', 1)[0]}: {report['node']}: {flag.split(': ', 1)[1]}"
            for flag in report["flags"]
        ]
        for row in report["gpus"]:
            counts[row["severity"]] += 1
            findings += [
                f"{flag.split(': ', 1)[0]}: {report['node']} GPU {row['index']} ({row['uuid']}): "
                f"{flag.split(': ', 1)[1]}"
                for flag in row["flags"]
            ]
    worst = max((SEVERITY[r["severity"]] for r in reports), default=0)
    return {
        "nodes": len(reports),
        "gpus": sum(len(r["gpus"]) for r in reports),
        "gpus_by_severity": counts,
        "unreachable_nodes": sorted(r["node"] for r in reports if r.get("error")),
        "lost_gpus": sum(len(r["lost"]) for r in reports),
        "worst": next(k for k, v in SEVERITY.items() if v == worst),
        "findings": findings,
    }


ACTIONS: list[actions.Action[Any]] = [
    VerifyHealthyAction(),
    OperatorPodsAction(),
    HealthReportAction(),
]
