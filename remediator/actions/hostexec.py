"""Where GPU commands run on a node: the GPU Operator's driver pod, or a short-lived host pod.

Nodes whose driver is installed on the host (cloud images, no driver daemonset) have no driver
pod to exec into. For them the ``gpu_exec`` setting lists node pools (a label selector each,
first match wins) whose mode is ``host_pod``: every GPU action on such a node runs its commands
(``nvidia-smi``, ``dcgmi``, ``nvidia-bug-report.sh``, ``cat``/``rm`` of their files) in a
privileged pod that remediator creates for it:

- pinned to the node by ``spec.nodeName`` (no scheduler, so a cordoned node still gets it),
  tolerating the pool's taints, host PID, the host's root mounted at ``/host``, no service
  account token, never restarted;
- its only process is ``sleep <lifetime>`` (argv, never a shell) and ``activeDeadlineSeconds``
  ends it in any case, so a pod left behind by a crash does nothing and ends by itself;
- each command is exec'd as ``chroot /host <argv>`` (the pool's ``command_prefix``), so it is
  the host's own driver tools that run, with the same argv the driver pod would get.

A pod lives for one *exec scope*: GPU actions (``scoped_action``) run each ``check``,
``apply``, ``undo`` and ``observe`` in one. The first command on a node in the scope creates
the pod and waits until it is Running and Ready, later ones reuse it, and the pod is deleted
when the scope ends, whether the method succeeded or failed. Before creating one, pods of
earlier scopes on the node that have ended or outlived their deadline (annotation
``remediator.io/expires-at``) are deleted; pods of scopes still running elsewhere are left
alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import datetime as dt
import functools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, TypeVar

import pydantic

from remediator.actions import clusterops
from remediator.domain import errors
from remediator.ports import actions
from remediator.ports import cluster as port

logger = logging.getLogger("remediator.actions")

SERVICE = "gpu_exec"
APP_LABEL = "app.kubernetes.io/name"
APP_NAME = "remediator-gpu-exec"
EXPIRES = "remediator.io/expires-at"
CONTAINER = "exec"
HOST_MOUNT = "/host"
_IMAGE = r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$"


class Pool(pydantic.BaseModel):
    """One node pool and how GPU commands reach its nodes."""

    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    node_selector: str = pydantic.Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9_./=!, ()-]{1,1024}$",
        description="Label selector of the pool's nodes (e.g. "
        "nvidia.com/gpu.deploy.driver=pre-installed).",
    )
    mode: Literal["host_pod", "driver_pod"] = pydantic.Field(
        default="host_pod",
        description="host_pod: a short-lived privileged pod with the host's driver; "
        "driver_pod: the GPU Operator's driver pod (the default for nodes in no pool).",
    )
    image: str = pydantic.Field(
        default="docker.io/library/ubuntu:24.04",
        pattern=_IMAGE,
        description="Image of the host pod (needs sleep and chroot).",
    )
    namespace: str | None = pydantic.Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description="Namespace of the host pods; default: the GPU driver namespace (which "
        "admits privileged pods and where remediator may create, exec into and delete pods).",
    )
    tolerations: list[dict[str, Any]] = pydantic.Field(
        default_factory=lambda: [{"operator": "Exists"}],
        description="Tolerations of the host pod (default: every taint, as the node may be "
        "cordoned and tainted by the run).",
    )
    host_root: str = pydantic.Field(
        default="/",
        pattern=r"^/[A-Za-z0-9._/-]{0,255}$",
        description="Host directory mounted at /host: the root the driver is installed in.",
    )
    command_prefix: list[str] = pydantic.Field(
        default_factory=lambda: ["chroot", HOST_MOUNT],
        max_length=8,
        description="Put before every command's argv in the host pod.",
    )
    start_timeout_seconds: float = pydantic.Field(
        default=120.0, gt=0, le=1800, description="How long the pod may take to be Ready."
    )
    lifetime_seconds: int = pydantic.Field(
        default=3600,
        ge=60,
        le=86400,
        description="Upper bound of a host pod's life (sleep and activeDeadlineSeconds).",
    )


class GpuExecConfig(pydantic.BaseModel):
    """Where GPU commands run, per node pool (the ``gpu_exec`` setting)."""

    model_config = pydantic.ConfigDict(extra="forbid")
    pools: list[Pool] = pydantic.Field(
        default_factory=list,
        description="Node pools, first match wins; nodes in none use the GPU driver pod.",
    )


def config(ctx: actions.ActionContext) -> GpuExecConfig:
    found = ctx.services.get(SERVICE)
    return found if isinstance(found, GpuExecConfig) else GpuExecConfig()


def host_pool(cfg: GpuExecConfig, node: port.NodeInfo) -> Pool | None:
    """The pool ``node`` belongs to when its GPU commands run in a host pod, else None."""
    for pool in cfg.pools:
        if port.selector_matches(pool.node_selector, node.labels):
            return pool if pool.mode == "host_pod" else None
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostPod:
    namespace: str
    name: str
    prefix: tuple[str, ...]


@dataclasses.dataclass
class Scope:
    """The host pods created in one exec scope, by node."""

    ready: dict[str, HostPod] = dataclasses.field(default_factory=dict)
    created: list[HostPod] = dataclasses.field(default_factory=list)
    cluster: port.Cluster | None = None


_scope: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("exec_scope", default=None)


@contextlib.asynccontextmanager
async def scope() -> AsyncIterator[Scope]:
    """An exec scope; nested scopes share the outermost one."""
    outer = _scope.get()
    if outer is not None:
        yield outer
        return
    current = Scope()
    token = _scope.set(current)
    try:
        yield current
    finally:
        _scope.reset(token)
        await _close(current)


async def _close(current: Scope) -> None:
    for pod in current.created:
        if current.cluster is None:
            break
        try:
            await current.cluster.delete_pod(pod.namespace, pod.name)
        except port.ClusterError as e:  # it ends by itself; the next scope deletes it
            logger.warning("could not delete GPU exec pod %s/%s: %s", pod.namespace, pod.name, e)


M = TypeVar("M", bound=Callable[..., Awaitable[Any]])
A = TypeVar("A", bound=type)
SCOPED_METHODS = ("check", "apply", "check_undo", "undo", "observe")


def scoped(method: M) -> M:
    """Run an action method in an exec scope (host pods it creates are deleted at its end)."""

    @functools.wraps(method)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        async with scope():
            return await method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def scoped_action(cls: A) -> A:
    """Class decorator of a GPU action: each of its ``SCOPED_METHODS`` that the class defines
    runs in its own exec scope."""
    for name in SCOPED_METHODS:
        method = cls.__dict__.get(name)
        if method is not None:
            setattr(cls, name, scoped(method))
    return cls


def manifest(
    ctx: actions.ActionContext, pool: Pool, node: str, namespace: str, name: str
) -> dict[str, Any]:
    expires = ctx.now() + dt.timedelta(seconds=pool.lifetime_seconds)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {APP_LABEL: APP_NAME, "app.kubernetes.io/managed-by": "remediator"},
            "annotations": {
                "remediator.io/run": str(ctx.run_id),
                "remediator.io/node": node,
                "remediator.io/pool": pool.name,
                EXPIRES: expires.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        },
        "spec": {
            "nodeName": node,
            "hostPID": True,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "activeDeadlineSeconds": pool.lifetime_seconds,
            "tolerations": [dict(t) for t in pool.tolerations],
            "volumes": [
                {"name": "host", "hostPath": {"path": pool.host_root, "type": "Directory"}}
            ],
            "containers": [
                {
                    "name": CONTAINER,
                    "image": pool.image,
                    "command": ["sleep", str(pool.lifetime_seconds)],
                    "securityContext": {"privileged": True},
                    "volumeMounts": [{"name": "host", "mountPath": HOST_MOUNT}],
                }
            ],
        },
    }


def _expired(pod: port.PodInfo, now: dt.datetime) -> bool:
    raw = pod.annotations.get(EXPIRES, "")
    try:
        expires = dt.datetime.strptime(raw, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return True  # not one of ours as we write them: nothing to keep it for
    return expires <= now


async def remove_leftovers(
    ctx: actions.ActionContext, namespace: str, node: str, keep: set[str]
) -> list[str]:
    """Delete host pods on ``node`` that have ended or outlived their deadline."""
    cluster = ctx.require_cluster()
    with clusterops.cluster_errors(f"listing GPU exec pods on {node}"):
        pods = await cluster.list_pods(
            namespace=namespace,
            label_selector=f"{APP_LABEL}={APP_NAME}",
            field_selector=f"spec.nodeName={node}",
        )
    removed = []
    for pod in pods:
        if pod.name in keep or pod.deletion_timestamp is not None:
            continue
        if pod.phase in ("Succeeded", "Failed") or _expired(pod, ctx.now()):
            with clusterops.cluster_errors(f"deleting the GPU exec pod {pod.key}"):
                await cluster.delete_pod(pod.namespace, pod.name)
            removed.append(pod.key)
    return removed


async def _wait_ready(
    cluster: port.Cluster, pool: Pool, namespace: str, name: str, node: str
) -> None:
    deadline = time.monotonic() + pool.start_timeout_seconds
    delay = 0.05
    pod: port.PodInfo | None = None
    while True:
        with clusterops.cluster_errors(f"reading the GPU exec pod {namespace}/{name}"):
            try:
                pod = await cluster.get_pod(namespace, name)
            except port.NotFound:
                pod = None
        if pod is not None and pod.phase == "Running" and pod.ready:
            return
        state = "gone" if pod is None else f"phase {pod.phase}"
        if pod is not None and pod.waiting:
            state += f", {'; '.join(pod.waiting)}"
        if pod is None or pod.phase in ("Succeeded", "Failed"):
            raise errors.ActionFailed(
                f"the GPU exec pod {namespace}/{name} on {node} ended before it was Ready "
                f"({state})",
                temporary=True,
            )
        if time.monotonic() >= deadline:
            raise errors.ActionFailed(
                f"the GPU exec pod {namespace}/{name} on {node} was not Ready within "
                f"{pool.start_timeout_seconds:g} s ({state}; image {pool.image})",
                temporary=True,
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


async def acquire(
    ctx: actions.ActionContext, pool: Pool, node: str, *, default_namespace: str
) -> HostPod:
    """The scope's host pod on ``node``: created and Ready the first time it is asked for."""
    current = _scope.get()
    if current is None:
        raise RuntimeError("GPU commands on a host-pod node need an exec scope (hostexec.scoped)")
    found = current.ready.get(node)
    if found is not None:
        return found
    cluster = ctx.require_cluster()
    current.cluster = cluster
    namespace = pool.namespace or default_namespace
    await remove_leftovers(ctx, namespace, node, keep=set())
    name = f"remediator-gpu-exec-{ctx.run_id}-{ctx.step_id}-{secrets.token_hex(3)}"
    pod = HostPod(namespace=namespace, name=name, prefix=tuple(pool.command_prefix))
    body = manifest(ctx, pool, node, namespace, name)
    current.created.append(pod)  # deleted at the scope's end, even if the create seems lost
    with clusterops.cluster_errors(f"creating the GPU exec pod {namespace}/{name} on {node}"):
        await cluster.create_pod(namespace, body)
    await _wait_ready(cluster, pool, namespace, name, node)
    current.ready[node] = pod
    return pod
