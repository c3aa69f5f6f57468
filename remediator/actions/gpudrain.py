"""``gpu.drain_workloads``: evict only the pods that hold one GPU, the way ``node.drain`` does.

Which pods hold the GPU, in this order of trust:

1. The kubelet's device allocation: its device-manager checkpoint
   (``/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint``, read with ``cat`` in the
   privileged, hostPID GPU driver container through ``/proc/1/root``; argv, never a shell). It
   lists, per pod UID and container, the device IDs the NVIDIA device plugin handed out (GPU
   UUIDs with the plugin's default ``deviceIDStrategy``, indexes with ``index``), the same data
   the kubelet's PodResources API serves. Pods that are not live on the node are ignored.
2. The alert's workload labels, when the allocation cannot be read: dcgm-exporter with pod
   attribution labels a GPU's series with the pod using it (from that same PodResources API);
   scraped with ``honorLabels: false`` they arrive as ``exported_namespace``/``exported_pod``
   and ``namespace``/``pod`` name the exporter, so the ``exported_`` pair wins. The named pod
   counts only if it runs on the node and requests ``nvidia.com/gpu`` (an exporter or driver
   pod never does). One pod per GPU: a GPU shared by time-slicing or MPS is out of scope.

When neither tells (no pod labels and no readable allocation, the GPU not among the devices
the kubelet registered — MIG, another ID strategy —, the named pod not on the node), the
action fails permanently saying why and evicts nothing: it never guesses. A playbook then
escalates to ``node.drain``.

The pods found go through ``node.drain``'s filters and eviction loop (PodDisruptionBudget
retries, progress, one global timeout; ``drain.evict``). The node is not cordoned: the playbook
cordons or taints it first. ``check`` finds the effect in place when no pod on the node holds
the GPU any more (a retry after a crash); a holder recorded by an earlier attempt that is gone,
or replaced under the same name by a pod with another UID, counts as evicted. No undo: an
eviction cannot be taken back (the pods' controllers recreate them elsewhere).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

import pydantic

from remediator.actions import clusterops, drain, gpu, hostexec, ladder, validation
from remediator.domain import errors
from remediator.ports import actions
from remediator.ports import cluster as port

CHECKPOINT = "/proc/1/root/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
GPU_RESOURCE_PREFIX = "nvidia.com/"
UUID = re.compile(r"^GPU-[0-9a-fA-F-]{36}$")
HOST_PATH = re.compile(r"^(/[A-Za-z0-9_][A-Za-z0-9._-]{0,254}){1,32}$")
WORKLOAD_LABELS = (("exported_namespace", "exported_pod"), ("namespace", "pod"))
"""Alert label pairs naming the pod that uses the GPU, most specific first."""


def host_path(value: str) -> str:
    if not HOST_PATH.fullmatch(value) or "/.." in value:
        raise ValueError(f"{value[:80]!r} is not an absolute path of plain names")
    return value


class GpuDrainParams(gpu.DriverParams, drain.EvictionParams):
    gpu: validation.GpuId | None = None
    """UUID, PCI bus id or index; default: the run's GPU."""
    rungs: drain.Rungs = None
    """Act only when this run is on one of these rungs (decided by gpu.ladder or
    gpu.recovery_action); default: always."""
    use_alert_workload: bool = True
    """Take the holder from the alert's pod labels when the allocation cannot be read."""
    allocation_checkpoint: Annotated[
        Annotated[str, pydantic.AfterValidator(host_path)], validation.EXEC_TARGET
    ] = CHECKPOINT
    """The kubelet's device checkpoint as the driver container sees it (change it for a
    kubelet with another ``--root-dir``). A literal, never a template."""


@dataclasses.dataclass
class Holders:
    """The pods holding the GPU, and how that was found out."""

    gpu: str
    source: str
    pods: list[port.PodInfo]
    notes: dict[str, str] = dataclasses.field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "source": self.source,
            "holders": [p.key for p in self.pods],
            "holder_uids": {p.key: p.uid for p in self.pods},
            **self.notes,
        }


class Unknown(Exception):
    """Which pods hold the GPU cannot be told; the message says why."""


def parse_checkpoint(text: str) -> tuple[set[str], dict[str, set[str]]]:
    """The devices the kubelet registered and, per pod UID, the devices it holds
    (``DeviceIDs`` keyed by NUMA node since Kubernetes 1.20, a plain list before)."""
    try:
        data = json.loads(text)["Data"]
        registered = {
            str(d)
            for name, ids in (data.get("RegisteredDevices") or {}).items()
            if str(name).startswith(GPU_RESOURCE_PREFIX)
            for d in ids or []
        }
        held: dict[str, set[str]] = {}
        for entry in data.get("PodDeviceEntries") or []:
            if not str(entry.get("ResourceName", "")).startswith(GPU_RESOURCE_PREFIX):
                continue
            ids = entry.get("DeviceIDs") or []
            flat = [d for group in ids.values() for d in group] if isinstance(ids, dict) else ids
            held.setdefault(str(entry["PodUID"]), set()).update(str(d) for d in flat)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise Unknown(f"the kubelet's device checkpoint cannot be parsed ({e!r})") from e
    return registered, held


def alert_workload(labels: Mapping[str, str]) -> tuple[str | None, str]:
    """The ``namespace/pod`` the alert names, or None with why not."""
    for ns_label, pod_label in WORKLOAD_LABELS:
        namespace, name = labels.get(ns_label, ""), labels.get(pod_label, "")
        if not name:
            continue
        try:
            return f"{validation.dns_label(namespace)}/{validation.dns_subdomain(name)}", ""
        except ValueError as e:
            return None, f"the alert's {ns_label}/{pod_label} labels are not a pod name: {e}"
    return None, "the alert names no pod (pod/exported_pod labels)"


@hostexec.scoped_action
class GpuDrainAction(actions.Action[GpuDrainParams]):
    name: ClassVar[str] = "gpu.drain_workloads"
    description: ClassVar[str] = (
        "Evict only the pods holding the GPU (kubelet device allocation, else the alert's pod "
        "labels), with node.drain's filters and PDB handling; fails rather than guess."
    )
    params_model = GpuDrainParams
    disruptive: ClassVar[bool] = True
    semantics: ClassVar[dict[str, str]] = {
        "check": "in place when no live pod on the node holds the GPU (a holder an earlier "
        "attempt recorded that is gone or replaced counts as evicted); not in place when the "
        "holders cannot be told.",
        "apply": "finds the holders in the kubelet's device allocation (read through the GPU "
        "driver pod), else from the alert's pod labels (exported_namespace/exported_pod, then "
        "namespace/pod: a GPU pod on the node); evicts them with node.drain's filters, "
        "PodDisruptionBudget retries, progress and timeout; does not cordon. Fails, evicting "
        "nothing, when it cannot tell which pods hold the GPU.",
        "undo": "none (an eviction cannot be taken back).",
    }

    async def check(self, ctx: actions.ActionContext, params: GpuDrainParams) -> actions.Check:
        skip = await ladder.skipped(ctx, params.rungs, params.node)
        if skip is not None:
            return actions.Check(in_place=True, output=skip)
        node = await clusterops.gpu_node(
            ctx.require_cluster(), clusterops.target_node(ctx, params.node)
        )
        try:
            found = await self._holders(ctx, params, node.name)
        except Unknown as e:
            return actions.Check(in_place=False, output={"node": node.name, "unknown": str(e)})
        plan = drain.plan_drain(found.pods, params, now=ctx.now())
        done = not plan.evict and not plan.errors
        return actions.Check(
            in_place=done, output={"node": node.name, **found.record(), "skipped": plan.skipped}
        )

    async def apply(self, ctx: actions.ActionContext, params: GpuDrainParams) -> dict[str, Any]:
        node = await clusterops.gpu_node(
            ctx.require_cluster(), clusterops.target_node(ctx, params.node)
        )
        try:
            found = await self._holders(ctx, params, node.name)
        except Unknown as e:
            raise errors.ActionFailed(
                f"cannot tell which pods hold GPU {self._gpu(ctx, params)} on {node.name}, "
                f"nothing evicted: {e}",
                output={"node": node.name, "unknown": str(e)},
            ) from e
        plan = drain.plan_drain(found.pods, params, now=ctx.now())
        base = {"node": node.name, **found.record(), "skipped": plan.skipped}
        if plan.errors:
            listed = "; ".join(f"{k}: {why}" for k, why in sorted(plan.errors.items()))
            raise errors.ActionFailed(
                f"cannot drain GPU {found.gpu} on {node.name}, nothing evicted: {listed}",
                output={**base, "errors": plan.errors},
            )
        with clusterops.changing(base):
            report = await drain.evict(
                ctx,
                node=node.name,
                pods=plan.evict,
                params=params,
                base=base,
                what=f"drain of GPU {found.gpu} on {node.name}",
            )
        gone = ", ".join(report["gone"]) or "none"
        event = await clusterops.emit_node_event(
            ctx,
            ctx.require_cluster(),
            node,
            reason="RemediatorGpuDrain",
            what=f"evicted the pods holding GPU {found.gpu}: {gone}",
        )
        return {**base, **report, "warnings": plan.warnings, "event": event}

    def describe(self, params: GpuDrainParams) -> str:
        return (
            f"evict the pods holding GPU {params.gpu or '(alert GPU)'} on node "
            f"{params.node or '(alert node)'} (timeout {params.timeout_seconds:g}s)"
        )

    @staticmethod
    def _gpu(ctx: actions.ActionContext, params: GpuDrainParams) -> str:
        if params.gpu:
            return params.gpu
        if not ctx.gpu:
            raise errors.ActionFailed("refused: no GPU (give params.gpu or alert on a GPU)")
        try:
            return validation.gpu_id(ctx.gpu)
        except ValueError as e:
            raise errors.ActionFailed(f"refused: the run's GPU {e}") from e

    async def _holders(
        self, ctx: actions.ActionContext, params: GpuDrainParams, node: str
    ) -> Holders:
        ident = self._gpu(ctx, params)
        with clusterops.cluster_errors(f"listing pods on {node}"):
            pods = await ctx.require_cluster().list_pods(field_selector=f"spec.nodeName={node}")
        live = [p for p in pods if p.phase not in drain.FINISHED]
        try:
            uids = await self._allocated(ctx, params, ident)
        except Unknown as e:
            return self._from_labels(ctx, params, ident, live, allocation=str(e))
        holders = [p for p in live if p.uid in uids]
        found = Holders(gpu=ident, source="kubelet device allocation", pods=holders)
        named, _ = alert_workload(ctx.labels)
        if named and named not in {p.key for p in holders}:
            found.notes["alert_pod_not_holding"] = named
        return found

    async def _allocated(
        self, ctx: actions.ActionContext, params: GpuDrainParams, ident: str
    ) -> set[str]:
        """UIDs of the pods the kubelet gave the GPU; ``Unknown`` when it cannot be read."""
        try:
            _, driver = await gpu.find_driver(ctx, params)
        except errors.ActionFailed as e:
            raise Unknown(str(e)) from e
        argv = ["cat", params.allocation_checkpoint]
        timeout = params.exec_timeout_seconds
        try:
            result = await gpu.run(ctx, driver, argv, timeout=timeout, idempotent=True)
        except errors.ActionFailed as e:
            raise Unknown(f"reading the kubelet's device checkpoint: {e}") from e
        if result.exit_code != 0:
            text = (result.stderr or result.stdout).decode("utf-8", "replace").strip()[-300:]
            raise Unknown(f"the kubelet's device checkpoint cannot be read: {text}")
        registered, held = parse_checkpoint(result.stdout.decode("utf-8", "replace"))
        names = await self._names(ctx, driver, ident, registered, timeout)
        return {uid for uid, devices in held.items() if devices & names}

    @staticmethod
    async def _names(
        ctx: actions.ActionContext,
        driver: gpu.Driver,
        ident: str,
        registered: set[str],
        timeout: float,
    ) -> set[str]:
        """The GPU's device IDs as the kubelet registered them (UUID or index)."""
        names = {ident} if (UUID.fullmatch(ident) or ident.isdigit()) else set()
        if not names & registered:
            try:  # a PCI bus id, or the other ID strategy: ask nvidia-smi (a lost GPU is absent)
                listed = await gpu.query(ctx, driver, timeout)
            except errors.ActionFailed:
                listed = []
            for g in listed:
                if gpu.matches(g, ident):
                    names |= {g.uuid, str(g.index)}
        names &= registered
        if not names:
            raise Unknown(
                f"GPU {ident} is not among the devices the kubelet registered "
                f"({len(registered)} nvidia.com devices: MIG, or another device ID strategy)"
            )
        return names

    @staticmethod
    def _from_labels(
        ctx: actions.ActionContext,
        params: GpuDrainParams,
        ident: str,
        live: list[port.PodInfo],
        *,
        allocation: str,
    ) -> Holders:
        named, why = alert_workload(ctx.labels) if params.use_alert_workload else (None, "")
        if named is None:
            why = why or "the alert's pod labels are not used (use_alert_workload: false)"
            raise Unknown(f"{why}, and {allocation}")
        notes = {"allocation_unknown": allocation}
        pod = next((p for p in live if p.key == named), None)
        earlier = (ctx.applied_output.get("holder_uids") or {}).get(named)
        if pod is not None and earlier and pod.uid != earlier:
            pod = None  # replaced under the same name: the holder we saw is gone
        if pod is None:
            if earlier:  # an earlier attempt found it holding the GPU: evicted since
                return Holders(gpu=ident, source="earlier attempt", pods=[], notes=notes)
            raise Unknown(
                f"pod {named}, named by the alert, is not running on the node, and {allocation}"
            )
        if pod.gpu_requests < 1:
            raise Unknown(
                f"pod {named}, named by the alert, requests no nvidia.com/gpu (the exporter "
                f"itself?), and {allocation}"
            )
        return Holders(gpu=ident, source="alert labels", pods=[pod], notes=notes)
