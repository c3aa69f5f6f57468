"""``node.reboot``: reboot a node's host and wait until it and its GPU driver are back.

How the host is rebooted is a setting (``reboot.method``):
- ``hook``: POST ``{"node", "run_id", "idempotency_key"}`` to ``reboot.hook_url`` (a BMC or
  fleet-management service that power-cycles the machine out of band); any 2xx accepts it.
  The ``Idempotency-Key`` header stays the same across attempts of the step.
- ``pod``: create a short-lived privileged pod (host PID, ``reboot.pod_image``) on the node, in
  the GPU driver's namespace (it already admits privileged pods), that enters the host's
  namespaces and runs ``systemctl reboot``; it is deleted once the node is back.
- ``manual`` (the default): remediator never reboots by itself; the step notifies on-call
  that the node needs a reboot (the channel in ``reboot.manual_channel``) and succeeds with
  ``rebooted: false``, so the run ends with a person asked to do it.

Then it waits (``timeout_seconds``) for the reboot to be seen — the node's ``Ready`` condition
leaves True, or its boot id changes (a fast reboot may never be seen NotReady) — and for the
node to be Ready again with the GPU driver pod on it running. A node that never goes down, or
never comes back, fails the step.

Only nodes the run holds should be rebooted: playbooks cordon and drain first (the step itself
refuses a node that is not cordoned). Not undoable. ``check`` finds the reboot done when an
earlier attempt of this step recorded the boot id it saw before and the node has booted since
and is Ready: a retry never reboots twice.
"""

from __future__ import annotations

import asyncio
import pathlib
import time
from typing import Any, ClassVar, Literal

import pydantic

from remediator.actions import clusterops, gpu, hostexec, ladder
from remediator.domain import errors, ladders
from remediator.ports import actions
from remediator.ports import cluster as port

SERVICE = "reboot"


class RebootConfig(pydantic.BaseModel):
    """How ``node.reboot`` reboots a host (the ``reboot`` setting)."""

    model_config = pydantic.ConfigDict(extra="forbid")
    method: Literal["manual", "hook", "pod"] = pydantic.Field(
        default="manual",
        description="manual (notify on-call that the node needs a reboot; never reboots by "
        "itself), hook (POST to hook_url) or pod (a privileged pod on the node reboots it).",
    )
    pod_image: str = pydantic.Field(
        default="docker.io/library/ubuntu:24.04",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$",
        description="Image of the reboot pod (needs nsenter; runs in the GPU driver namespace).",
    )
    manual_channel: str = pydantic.Field(
        default="default",
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="Notification channel the manual method asks on.",
    )
    hook_url: pydantic.AnyHttpUrl | None = pydantic.Field(
        default=None, description="Where the hook method POSTs {node, run_id, idempotency_key}."
    )
    hook_token_file: pathlib.Path | None = pydantic.Field(
        default=None,
        description="File holding a bearer token for the hook (read at each call: rotatable).",
    )
    hook_timeout_seconds: float = pydantic.Field(default=30.0, gt=0, le=300)

    @pydantic.model_validator(mode="after")
    def _hook_has_url(self) -> RebootConfig:
        if self.method == "hook" and self.hook_url is None:
            raise ValueError("reboot.method hook needs reboot.hook_url")
        return self


class RebootParams(gpu.DriverParams):
    rung: ladders.Rung | None = None
    """Act only when this run is on this rung of the GPU's ladder (see gpu.ladder)."""
    timeout_seconds: float = pydantic.Field(900.0, gt=0, le=7200)
    """How long the node may take to go down and come back with its driver pod running."""
    poll_seconds: float = pydantic.Field(5.0, gt=0, le=60)
    require_cordoned: bool = True


def config(ctx: actions.ActionContext) -> RebootConfig:
    found = ctx.services.get(SERVICE)
    return found if isinstance(found, RebootConfig) else RebootConfig()


async def _node(ctx: actions.ActionContext, name: str) -> port.NodeInfo:
    return await clusterops.gpu_node(ctx.require_cluster(), name)


async def request_reboot(ctx: actions.ActionContext, cfg: RebootConfig, node: str) -> int:
    if cfg.hook_url is None:
        raise errors.ActionFailed("reboot.method hook needs reboot.hook_url")
    body = {"node": node, "run_id": ctx.run_id, "idempotency_key": ctx.idempotency_key}
    headers = {"Idempotency-Key": ctx.idempotency_key}
    if cfg.hook_token_file is not None:
        try:
            token = await asyncio.to_thread(cfg.hook_token_file.read_text, encoding="utf-8")
        except OSError as e:
            raise errors.ActionFailed(f"reading the reboot hook token: {e}") from e
        headers["Authorization"] = f"Bearer {token.strip()}"
    import httpx  # only here: a server that calls no hook never loads it

    try:
        async with httpx.AsyncClient(timeout=cfg.hook_timeout_seconds) as http:
            response = await http.post(str(cfg.hook_url), json=body, headers=headers)
    except httpx.HTTPError as e:
        raise errors.ActionFailed(f"reboot hook for {node}: {e}", temporary=True) from e
    if response.status_code >= 500 or response.status_code == 429:
        raise errors.ActionFailed(
            f"reboot hook for {node} answered {response.status_code}", temporary=True
        )
    if not 200 <= response.status_code < 300:
        raise errors.ActionFailed(
            f"reboot hook refused {node}: {response.status_code} {response.text[:300]}"
        )
    return response.status_code


#: Run in the reboot pod (host PID, privileged): enter the host's namespaces, ask systemd.
REBOOT_COMMAND = ["nsenter", "--target", "1", "--mount", "--uts", "--ipc", "--net", "--pid"]
REBOOT_ARGS = ["--", "systemctl", "reboot"]


def reboot_pod(
    ctx: actions.ActionContext, cfg: RebootConfig, node: str, namespace: str
) -> dict[str, Any]:
    """The reboot pod: pinned to the node (no scheduler), tolerating every taint (the node is
    cordoned and tainted), no service account token, never restarted."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"remediator-reboot-{ctx.run_id}-{ctx.step_id}",
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "remediator-reboot",
                "app.kubernetes.io/managed-by": "remediator",
            },
            "annotations": {"remediator.io/run": str(ctx.run_id), "remediator.io/node": node},
        },
        "spec": {
            "nodeName": node,
            "hostPID": True,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "reboot",
                    "image": cfg.pod_image,
                    "command": REBOOT_COMMAND,
                    "args": REBOOT_ARGS,
                    "securityContext": {"privileged": True},
                }
            ],
        },
    }


async def _ready_driver(
    ctx: actions.ActionContext, params: RebootParams, node: port.NodeInfo
) -> str | None:
    """The node's GPU driver pod once it is Ready again (its containers pass readiness); on a
    node whose driver is on the host (a ``host_pod`` pool) there is none to wait for."""
    if hostexec.host_pool(hostexec.config(ctx), node) is not None:
        return "host driver"
    cluster = ctx.require_cluster()
    node_name = node.name
    with clusterops.cluster_errors(f"finding the GPU driver pod on {node_name}"):
        pod = await cluster.find_driver_pod(
            node_name,
            namespace=params.driver_namespace or cluster.driver_namespace,
            selector=params.driver_selector,
        )
    return pod.key if pod is not None and pod.ready else None


async def wait_back(
    ctx: actions.ActionContext, params: RebootParams, name: str, boot_id: str
) -> dict[str, Any]:
    """Wait for the node to go down (or boot anew) and come back Ready with its driver pod."""
    deadline = time.monotonic() + params.timeout_seconds
    went_down = False
    delay = min(0.25, params.poll_seconds)  # doubles up to poll_seconds
    while True:
        node = await _node(ctx, name)
        went_down = went_down or node.ready is not True or node.boot_id != boot_id
        if went_down and node.ready is True:
            driver = await _ready_driver(ctx, params, node)
            if driver is not None:
                return {"boot_id": node.boot_id, "driver_pod": driver}
        if time.monotonic() >= deadline:
            stage = "come back Ready with its GPU driver pod" if went_down else "go down"
            raise errors.ActionFailed(
                f"node {name} did not {stage} within {params.timeout_seconds:g} s",
                output={"node": name, "went_down": went_down, clusterops.MAYBE_APPLIED: True},
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, params.poll_seconds)


class RebootAction(actions.Action[RebootParams]):
    name: ClassVar[str] = "node.reboot"
    description: ClassVar[str] = (
        "Reboot the node's host (configured method) and wait until it is Ready with its GPU "
        "driver pod."
    )
    params_model = RebootParams
    disruptive: ClassVar[bool] = True
    semantics: ClassVar[dict[str, str]] = {
        "check": "with `rung`, in place when the run is on another rung; in place when an "
        "earlier attempt recorded the boot id before and the node has booted since and is "
        "Ready (never reboots twice).",
        "apply": "refuses an uncordoned node; with the `reboot` setting's hook method POSTs to "
        "the hook, with the pod method creates a privileged pod on the node that runs "
        "`systemctl reboot` on the host (deleted afterwards); then waits for NotReady or a new "
        "boot id, then Ready with the GPU driver pod running, within `timeout_seconds`. With "
        "the manual method (default) it notifies on-call that the node needs a reboot.",
        "undo": "none.",
    }

    async def check(self, ctx: actions.ActionContext, params: RebootParams) -> actions.Check:
        skip = await ladder.skipped(ctx, params.rung, params.node)
        if skip is not None:
            return actions.Check(in_place=True, output=skip)
        before = ctx.applied_output.get("boot_id_before")
        if not before:
            return actions.Check(in_place=False)
        node = await _node(ctx, clusterops.target_node(ctx, params.node))
        done = node.boot_id != before and node.ready is True
        return actions.Check(in_place=done, output={"node": node.name, "boot_id": node.boot_id})

    async def apply(self, ctx: actions.ActionContext, params: RebootParams) -> dict[str, Any]:
        cfg = config(ctx)
        node = await _node(ctx, clusterops.target_node(ctx, params.node))
        if params.require_cordoned and not node.unschedulable:
            raise errors.ActionFailed(f"refused: node {node.name} is not cordoned")
        if cfg.method == "manual":
            return await self._ask(ctx, cfg, node)
        if cfg.method == "pod":
            return await self._by_pod(ctx, cfg, params, node)
        started = time.monotonic()
        output: dict[str, Any] = {
            "node": node.name,
            "method": cfg.method,
            "boot_id_before": node.boot_id,
        }
        with clusterops.changing(output):
            output["hook_status"] = await request_reboot(ctx, cfg, node.name)
            output |= await wait_back(ctx, params, node.name, node.boot_id)
        output["seconds"] = round(time.monotonic() - started, 1)
        output["event"] = await clusterops.emit_node_event(
            ctx,
            ctx.require_cluster(),
            node,
            reason="RemediatorReboot",
            what=f"rebooted ({cfg.method}); back Ready after {output['seconds']} s",
        )
        return output

    async def _by_pod(
        self,
        ctx: actions.ActionContext,
        cfg: RebootConfig,
        params: RebootParams,
        node: port.NodeInfo,
    ) -> dict[str, Any]:
        cluster = ctx.require_cluster()
        manifest = reboot_pod(ctx, cfg, node.name, cluster.driver_namespace)
        name = manifest["metadata"]["name"]
        started = time.monotonic()
        output: dict[str, Any] = {
            "node": node.name,
            "method": "pod",
            "pod": f"{cluster.driver_namespace}/{name}",
            "boot_id_before": node.boot_id,
        }
        with clusterops.changing(output):
            with clusterops.cluster_errors(f"creating the reboot pod for {node.name}"):
                await cluster.create_pod(cluster.driver_namespace, manifest)
            output |= await wait_back(ctx, params, node.name, node.boot_id)
        with clusterops.cluster_errors(f"deleting the reboot pod {name}"):
            await cluster.delete_pod(cluster.driver_namespace, name)
        output["seconds"] = round(time.monotonic() - started, 1)
        output["event"] = await clusterops.emit_node_event(
            ctx,
            cluster,
            node,
            reason="RemediatorReboot",
            what=f"rebooted (pod); back Ready after {output['seconds']} s",
        )
        return output

    @staticmethod
    async def _ask(
        ctx: actions.ActionContext, cfg: RebootConfig, node: port.NodeInfo
    ) -> dict[str, Any]:
        sent = await ctx.notifier.send(
            channel=cfg.manual_channel,
            message=f"Node {node.name} needs a reboot (GPU {ctx.gpu or '(node)'}): remediator "
            "reboots hosts itself only with reboot.method hook. It stays cordoned; after the "
            "reboot run the return-node-to-service runbook.",
            data={"node": node.name, "gpu": ctx.gpu, "action_needed": "reboot-node"},
            idempotency_key=ctx.idempotency_key,
        )
        return {"node": node.name, "method": "manual", "rebooted": False, "notification": sent}

    def describe(self, params: RebootParams) -> str:
        rung = f" (ladder rung {params.rung.value})" if params.rung else ""
        return f"reboot {params.node or '(alert node)'} and wait for it{rung}"
