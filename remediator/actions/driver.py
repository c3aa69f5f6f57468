"""``gpu.upgrade_driver`` and ``gpu.driver_rollout``: the field guide's driver rolling upgrade.

``gpu.upgrade_driver`` upgrades one cordoned, drained node's GPU driver and waits for it. How
the upgrade is started is a setting (``driver_upgrade.method``):
- ``label`` (default): set the node's ``nvidia.com/gpu-driver-upgrade-state`` to
  ``upgrade-required``; the GPU Operator's upgrade controller restarts the node's driver pod
  with the ClusterPolicy's ``driver.version`` (which must already be the target version) and
  moves the label through its states to ``upgrade-done`` (or ``upgrade-failed``).
- ``hook``: POST ``{"node", "target_version", "run_id", "idempotency_key"}`` to
  ``driver_upgrade.hook_url`` (a fleet-management service that upgrades the node's driver);
  any 2xx accepts it.
Then it waits (``timeout_seconds``) until the driver pod on the node is Ready and nvidia-smi
reports the target version on every GPU. ``upgrade-failed`` fails the step at once. While it
works the node carries ``remediator.io/driver-upgrade=in-progress`` (alert-driven disruptive
steps on the node wait: ``domain.guards``); success removes it, failure sets ``failed`` and
leaves the node cordoned for a person, as the field guide does on a version mismatch.

``gpu.driver_rollout`` is the runbook's one step: every GPU node the selector matches, in name
order, ``batch_size`` at a time: mark → cordon → drain → upgrade → verify the GPUs
(``gpu.verify_healthy``) → uncordon → unmark, then ``pause_seconds`` before the next batch. The
first failure stops the rollout (no further node is touched), leaves the failed node cordoned
and marked ``failed``, and notifies. A node already at the target version and not marked is
skipped, so a retried or restarted rollout resumes where it stopped; a node marked ``failed``
by an earlier attempt stops it until a person clears the mark. A node another run holds, or
that the GPU Operator is upgrading itself, stops it too (no two controllers on one node).

Each node it takes counts in the fleet's disruption budget like a node an alert-driven run
disrupts (``ports.budget``): taken before the node is marked, given back once it is in service
again; a failed node keeps counting until it is returned to service. When the budget has no
room, the rollout touches no further node and its step is retried later (a temporary failure,
no notification): the retry skips the nodes already upgraded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import time
from typing import Any, ClassVar, Literal, cast

import pydantic

from remediator.actions import clusterops, drain, gpu, health, hostexec, kube, validation
from remediator.domain import errors, guards
from remediator.ports import actions
from remediator.ports import budget as budget_port
from remediator.ports import cluster as port

SERVICE = "driver_upgrade"
VERSION = r"^[0-9][0-9A-Za-z.+-]{0,63}$"
FAILED_STATE = "upgrade-failed"
REQUIRED_STATE = "upgrade-required"


class DriverUpgradeConfig(pydantic.BaseModel):
    """How ``gpu.upgrade_driver`` starts a node's driver upgrade (the ``driver_upgrade``
    setting)."""

    model_config = pydantic.ConfigDict(extra="forbid")
    method: Literal["label", "hook"] = pydantic.Field(
        default="label",
        description="label (set the GPU Operator's nvidia.com/gpu-driver-upgrade-state to "
        "upgrade-required), or hook (POST to hook_url).",
    )
    hook_url: pydantic.AnyHttpUrl | None = pydantic.Field(
        default=None,
        description="Where the hook method POSTs {node, target_version, run_id, idempotency_key}.",
    )
    hook_token_file: pathlib.Path | None = pydantic.Field(
        default=None,
        description="File holding a bearer token for the hook (read at each call: rotatable).",
    )
    hook_timeout_seconds: float = pydantic.Field(default=30.0, gt=0, le=300)

    @pydantic.model_validator(mode="after")
    def _hook_has_url(self) -> DriverUpgradeConfig:
        if self.method == "hook" and self.hook_url is None:
            raise ValueError("driver_upgrade.method hook needs driver_upgrade.hook_url")
        return self


def config(ctx: actions.ActionContext) -> DriverUpgradeConfig:
    found = ctx.services.get(SERVICE)
    return found if isinstance(found, DriverUpgradeConfig) else DriverUpgradeConfig()


class UpgradeParams(gpu.DriverParams):
    target_version: str = pydantic.Field(pattern=VERSION)
    """The driver version nvidia-smi must report afterwards (e.g. 580.95.05)."""
    timeout_seconds: float = pydantic.Field(1800.0, gt=0, le=7200)
    """How long the driver pod may take to come back Ready with the target version."""
    poll_seconds: float = pydantic.Field(5.0, gt=0, le=60)
    require_cordoned: bool = True


async def _mark(ctx: actions.ActionContext, node: str, value: str | None) -> None:
    with clusterops.cluster_errors(f"marking node {node}"):
        await ctx.require_cluster().patch_node(node, labels={guards.UPGRADE_MARK: value})


async def driver_versions(ctx: actions.ActionContext, params: gpu.DriverParams) -> list[str]:
    """The driver version each GPU reports, read in a Ready driver pod; [] while none is."""
    async with hostexec.scope():
        return await _driver_versions(ctx, params)


async def _driver_versions(ctx: actions.ActionContext, params: gpu.DriverParams) -> list[str]:
    try:
        _, driver = await gpu.find_driver(ctx, params)
    except errors.ActionFailed as e:
        if e.temporary:
            return []
        raise
    with clusterops.cluster_errors(f"reading the driver pod on {driver.node}"):
        pod = await ctx.require_cluster().get_pod(driver.namespace, driver.pod)
    if not pod.ready:
        return []
    argv = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    try:
        result = await gpu.run(
            ctx, driver, argv, timeout=params.exec_timeout_seconds, idempotent=True
        )
    except errors.ActionFailed:  # the container stopped under the exec: a restart under way
        return []
    if result.exit_code != 0:
        return []
    return [line.strip() for line in result.stdout.decode().splitlines() if line.strip()]


async def request_upgrade(
    ctx: actions.ActionContext, cfg: DriverUpgradeConfig, node: str, version: str
) -> dict[str, Any]:
    cluster = ctx.require_cluster()
    if cfg.method == "label":
        with clusterops.cluster_errors(f"labelling node {node} for the driver upgrade"):
            await cluster.patch_node(node, labels={guards.DRIVER_UPGRADE_STATE: REQUIRED_STATE})
        return {"method": "label", "label": f"{guards.DRIVER_UPGRADE_STATE}={REQUIRED_STATE}"}
    if cfg.hook_url is None:
        raise errors.ActionFailed("driver_upgrade.method hook needs driver_upgrade.hook_url")
    body = {
        "node": node,
        "target_version": version,
        "run_id": ctx.run_id,
        "idempotency_key": ctx.idempotency_key,
    }
    headers = {"Idempotency-Key": ctx.idempotency_key}
    if cfg.hook_token_file is not None:
        try:
            token = await asyncio.to_thread(cfg.hook_token_file.read_text, encoding="utf-8")
        except OSError as e:
            raise errors.ActionFailed(f"reading the driver upgrade hook token: {e}") from e
        headers["Authorization"] = f"Bearer {token.strip()}"
    import httpx  # only here: a server that calls no hook never loads it

    try:
        async with httpx.AsyncClient(timeout=cfg.hook_timeout_seconds) as http:
            response = await http.post(str(cfg.hook_url), json=body, headers=headers)
    except httpx.HTTPError as e:
        raise errors.ActionFailed(f"driver upgrade hook for {node}: {e}", temporary=True) from e
    if not 200 <= response.status_code < 300:
        raise errors.ActionFailed(
            f"driver upgrade hook for {node} answered {response.status_code}: "
            f"{response.text[:300]}",
            temporary=response.status_code >= 500 or response.status_code == 429,
        )
    return {"method": "hook", "hook_status": response.status_code}


async def wait_upgraded(ctx: actions.ActionContext, params: UpgradeParams, node: str) -> list[str]:
    """Wait until the driver pod is Ready and every GPU reports the target version."""
    deadline = time.monotonic() + params.timeout_seconds
    delay = min(0.25, params.poll_seconds)
    versions: list[str] = []
    while True:
        with clusterops.cluster_errors(f"reading node {node}"):
            info = await ctx.require_cluster().get_node(node)
        if info.labels.get(guards.DRIVER_UPGRADE_STATE) == FAILED_STATE:
            raise errors.ActionFailed(
                f"the GPU Operator failed the driver upgrade of {node} "
                f"({guards.DRIVER_UPGRADE_STATE}={FAILED_STATE}); versions {versions or '?'}",
                output={"node": node, "versions": versions},
            )
        versions = await driver_versions(ctx, params)
        if versions and all(v == params.target_version for v in versions):
            return versions
        if time.monotonic() >= deadline:
            raise errors.ActionFailed(
                f"node {node}: the driver pod did not come back Ready with driver "
                f"{params.target_version} within {params.timeout_seconds:g} s "
                f"(reports {sorted(set(versions)) or 'nothing'})",
                output={"node": node, "versions": versions},
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, params.poll_seconds)


class UpgradeDriverAction(actions.Action[UpgradeParams]):
    name: ClassVar[str] = "gpu.upgrade_driver"
    description: ClassVar[str] = (
        "Upgrade a cordoned node's GPU driver (GPU Operator label or hook) and wait until the "
        "driver pod is Ready with the target version."
    )
    params_model = UpgradeParams
    semantics: ClassVar[dict[str, str]] = {
        "check": "in place when the node's driver pod is Ready and every GPU reports "
        "`target_version`.",
        "apply": "refuses an uncordoned node; marks it remediator.io/driver-upgrade="
        "in-progress, starts the upgrade with the `driver_upgrade` setting's method (label "
        "upgrade-required, or the hook), waits for the driver pod Ready with the target "
        "version within `timeout_seconds` (upgrade-failed fails at once), then removes the "
        "mark; on failure the mark says failed and the node stays cordoned.",
        "undo": "none (a driver is rolled back by upgrading to the old version).",
    }

    async def check(self, ctx: actions.ActionContext, params: UpgradeParams) -> actions.Check:
        node = clusterops.target_node(ctx, params.node)
        versions = await driver_versions(ctx, params)
        done = bool(versions) and all(v == params.target_version for v in versions)
        return actions.Check(in_place=done, output={"node": node, "versions": versions})

    async def apply(self, ctx: actions.ActionContext, params: UpgradeParams) -> dict[str, Any]:
        cluster = ctx.require_cluster()
        node = await clusterops.gpu_node(cluster, clusterops.target_node(ctx, params.node))
        if params.require_cordoned and not node.unschedulable:
            raise errors.ActionFailed(f"refused: node {node.name} is not cordoned")
        before = await driver_versions(ctx, params)
        output: dict[str, Any] = {"node": node.name, "versions_before": before}
        started = time.monotonic()
        await _mark(ctx, node.name, guards.UPGRADE_IN_PROGRESS)
        try:
            with clusterops.changing(output):
                output |= await request_upgrade(ctx, config(ctx), node.name, params.target_version)
                output["versions"] = await wait_upgraded(ctx, params, node.name)
        except errors.ActionFailed:
            await _mark(ctx, node.name, guards.UPGRADE_FAILED)
            raise
        await _mark(ctx, node.name, None)
        output["seconds"] = round(time.monotonic() - started, 1)
        output["event"] = await clusterops.emit_node_event(
            ctx,
            cluster,
            node,
            reason="RemediatorDriverUpgrade",
            what=f"upgraded the GPU driver to {params.target_version}",
        )
        return output

    def describe(self, params: UpgradeParams) -> str:
        return (
            f"upgrade the GPU driver of {params.node or '(alert node)'} to {params.target_version}"
        )


class RolloutDrain(drain.EvictionParams):
    """The field guide's drain for an upgrade: ignore DaemonSets, delete emptyDir data, force,
    600 s."""

    delete_emptydir_data: bool = True
    force: bool = True
    timeout_seconds: float = pydantic.Field(600.0, gt=0, le=86400)


class RolloutParams(validation.Model):
    selector: validation.LabelSelector
    """The GPU nodes to upgrade (label selector)."""
    target_version: str = pydantic.Field(pattern=VERSION)
    batch_size: int = pydantic.Field(1, ge=1, le=100)
    """Nodes upgraded at the same time."""
    pause_seconds: float = pydantic.Field(60.0, ge=0, le=3600)
    """Wait after each batch before the next (the guide's 60 s)."""
    upgrade_timeout_seconds: float = pydantic.Field(1800.0, gt=0, le=7200)
    drain: RolloutDrain = pydantic.Field(default_factory=RolloutDrain)
    notify_channel: str = pydantic.Field("default", pattern=r"^[A-Za-z0-9_.-]{1,64}$")


class RolloutStopped(errors.ActionFailed):
    pass


class BudgetHeld(errors.ActionFailed):
    """No room in the disruption budget for the next node: try the rollout again later."""


async def _take_budget(ctx: actions.ActionContext, node: str) -> None:
    budget = ctx.services.get(budget_port.SERVICE)
    if budget is None:
        return
    verdict = await cast(budget_port.Budget, budget).take(
        node, run_id=ctx.run_id, playbook=ctx.playbook
    )
    if not verdict.go:
        wait = (verdict.until - ctx.now()).total_seconds() if verdict.until else None
        raise BudgetHeld(f"node {node} waits: {verdict.reason}", temporary=True, retry_after=wait)


async def _release_budget(ctx: actions.ActionContext, node: str) -> None:
    budget = ctx.services.get(budget_port.SERVICE)
    if budget is not None:
        await cast(budget_port.Budget, budget).release(node, run_id=ctx.run_id)


async def _refuse_busy(ctx: actions.ActionContext, node: port.NodeInfo) -> None:
    if node.labels.get(guards.UPGRADE_MARK) == guards.UPGRADE_FAILED:
        raise RolloutStopped(
            f"node {node.name} failed an earlier driver upgrade (label "
            f"{guards.UPGRADE_MARK}={guards.UPGRADE_FAILED}); clear it to go on"
        )
    state = node.labels.get(guards.DRIVER_UPGRADE_STATE, "")
    ours = node.labels.get(guards.UPGRADE_MARK) == guards.UPGRADE_IN_PROGRESS  # resuming
    if state in guards.UPGRADING_STATES and state != REQUIRED_STATE and not ours:
        raise RolloutStopped(f"the GPU Operator is upgrading node {node.name} ({state})")
    holders = await clusterops.other_holders(ctx, node.name)
    if holders:
        raise RolloutStopped(f"node {node.name} is held by runs {holders}")


async def upgrade_node(
    ctx: actions.ActionContext, params: RolloutParams, node: port.NodeInfo
) -> dict[str, Any]:
    """One node: mark, cordon, drain, upgrade, verify, uncordon, unmark."""
    node = await clusterops.gpu_node(ctx.require_cluster(), node.name)  # as it is now
    await _refuse_busy(ctx, node)
    holder = node.annotations.get(clusterops.CORDONED_BY, "")
    resuming = node.labels.get(guards.UPGRADE_MARK) == guards.UPGRADE_IN_PROGRESS
    if node.unschedulable and holder != clusterops.run_marker(ctx) and not resuming:
        return {"node": node.name, "result": f"skipped: cordoned by {holder or 'someone else'}"}
    one = dataclasses.replace(ctx, node=node.name)
    versions = await driver_versions(one, gpu.DriverParams(node=node.name))
    at_target = bool(versions) and all(v == params.target_version for v in versions)
    if at_target and node.labels.get(guards.UPGRADE_MARK) != guards.UPGRADE_IN_PROGRESS:
        return {"node": node.name, "result": "already at the target version"}
    await _take_budget(one, node.name)
    await _mark(one, node.name, guards.UPGRADE_IN_PROGRESS)
    try:
        await kube.CordonAction().apply(one, kube.NodeParams(node=node.name))
        drain_params = drain.DrainParams(node=node.name, **params.drain.model_dump())
        await drain.DrainAction().apply(one, drain_params)
        upgrade = UpgradeParams(
            node=node.name,
            target_version=params.target_version,
            timeout_seconds=params.upgrade_timeout_seconds,
        )
        if not at_target:  # else an earlier attempt upgraded it and stopped before the end
            versions = (await UpgradeDriverAction().apply(one, upgrade))["versions"]
            await _mark(one, node.name, guards.UPGRADE_IN_PROGRESS)  # until back in service
        await health.VerifyHealthyAction().apply(one, health.VerifyParams(node=node.name))
        await kube.UncordonAction().apply(one, kube.UncordonParams(node=node.name))
    except errors.ActionFailed as e:
        await _mark(one, node.name, guards.UPGRADE_FAILED)
        raise RolloutStopped(f"node {node.name}: {e}", output=e.output) from e
    await _mark(one, node.name, None)
    await _release_budget(one, node.name)
    return {"node": node.name, "result": "upgraded", "versions": versions}


class DriverRolloutAction(actions.Action[RolloutParams]):
    name: ClassVar[str] = "gpu.driver_rollout"
    description: ClassVar[str] = (
        "Upgrade the GPU driver of every node a selector matches, batch_size nodes at a time "
        "(cordon, drain, upgrade, verify, uncordon); stop at the first failure."
    )
    params_model = RolloutParams
    disruptive: ClassVar[bool] = True
    semantics: ClassVar[dict[str, str]] = {
        "check": "never in place: each attempt looks at every node again (nodes already at "
        "the target version and not marked are skipped).",
        "apply": "per batch of `batch_size` nodes (name order): take the node from the "
        "fleet's disruption budget, mark remediator.io/driver-upgrade=in-progress, cordon, "
        "drain, gpu.upgrade_driver, gpu.verify_healthy, uncordon, unmark, give the budget "
        "back, then wait `pause_seconds`; a node the budget has no room for fails the step "
        "temporarily (retried; no node touched for it); the first other failure stops the "
        "rollout, leaves that node cordoned, marked failed and counted in the budget, and "
        "notifies `notify_channel`.",
        "undo": "none.",
    }

    async def check(self, ctx: actions.ActionContext, params: RolloutParams) -> actions.Check:
        return actions.Check(in_place=False)

    async def apply(self, ctx: actions.ActionContext, params: RolloutParams) -> dict[str, Any]:
        cluster = ctx.require_cluster()
        with clusterops.cluster_errors(f"listing nodes {params.selector!r}"):
            found = await cluster.list_nodes(params.selector)
        nodes = sorted((n for n in found if cluster.is_gpu_node(n)), key=lambda n: n.name)
        if not nodes:
            raise errors.ActionFailed(f"no GPU node matches {params.selector!r}")
        done: list[dict[str, Any]] = []
        for start in range(0, len(nodes), params.batch_size):
            batch = nodes[start : start + params.batch_size]
            results = await asyncio.gather(
                *(upgrade_node(ctx, params, node) for node in batch), return_exceptions=True
            )
            failed = [r for r in results if isinstance(r, BaseException)]
            done += [r for r in results if isinstance(r, dict)]
            await ctx.progress({"nodes": done, "remaining": len(nodes) - start - len(batch)})
            held = [r for r in failed if isinstance(r, BudgetHeld)]
            if held and len(held) == len(failed):
                raise held[0]
            if failed:
                await self._stop(ctx, params, failed, done, nodes[start + len(batch) :])
            if start + len(batch) < len(nodes) and any(r["result"] == "upgraded" for r in done):
                await asyncio.sleep(params.pause_seconds)
        return {"target_version": params.target_version, "nodes": done}

    @staticmethod
    async def _stop(
        ctx: actions.ActionContext,
        params: RolloutParams,
        failed: list[BaseException],
        done: list[dict[str, Any]],
        untouched: list[port.NodeInfo],
    ) -> None:
        reasons = "; ".join(str(e) for e in failed)
        left = [n.name for n in untouched]
        message = (
            f"Driver rollout to {params.target_version} stopped: {reasons}. "
            f"Upgraded: {', '.join(d['node'] for d in done) or 'none'}; not started: "
            f"{', '.join(left) or 'none'}."
        )
        output = {"nodes": done, "not_started": left, "failure": reasons}
        try:
            output["notification"] = await ctx.notifier.send(
                channel=params.notify_channel,
                message=message,
                data={"event": "driver_rollout_stopped", **output},
                idempotency_key=f"{ctx.idempotency_key}-stopped",
            )
        except errors.RemediatorError as e:
            output["notification_error"] = str(e)
        raise RolloutStopped(message, output=output) from failed[0]

    def describe(self, params: RolloutParams) -> str:
        return (
            f"upgrade the GPU driver to {params.target_version} on nodes {params.selector!r}, "
            f"{params.batch_size} at a time"
        )
