"""``gpu.cuda_smoke_test``: run a CUDA program on the node in a short-lived pod; it must exit 0.

What nvidia-smi and DCGM cannot show: that a container gets a GPU through the device plugin and
the CUDA runtime can use it (the GPU Operator's own validator runs NVIDIA's vectorAdd sample the
same way). The pod requests ``nvidia.com/gpu: 1``, is pinned to the node (``spec.nodeName``:
the node under validation is cordoned), tolerates every taint, runs the configured ``image``
(its own entrypoint, or ``command`` as an argv, never a shell), is never restarted and has no
service account token. The step waits for the pod to end: ``Succeeded`` passes; ``Failed`` (a
non-zero exit, or the kubelet refusing it, e.g. no healthy GPU to allocate) or no end within
``timeout_seconds`` fails the step with the container's reason and message. The pod is deleted
afterwards in every case. Without an ``image`` the step does nothing (an optional check).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Annotated, Any, ClassVar

import pydantic

from remediator.actions import clusterops, validation
from remediator.domain import errors
from remediator.ports import actions
from remediator.ports import cluster as port

IMAGE = r"^([A-Za-z0-9][A-Za-z0-9._/:@-]{0,254})?$"
CONTAINER = "cuda"


class SmokeParams(validation.Model):
    node: validation.NodeName | None = None
    image: str = pydantic.Field("", pattern=IMAGE)
    """The CUDA program's image (e.g. nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0);
    empty: the check is skipped."""
    command: list[Annotated[str, pydantic.Field(min_length=1, max_length=256)]] | None = (
        pydantic.Field(None, min_length=1, max_length=32)
    )
    """Argv to run instead of the image's entrypoint (no shell)."""
    namespace: Annotated[validation.Namespace | None, validation.EXEC_TARGET] = None
    """Where the pod runs; default: the GPU driver namespace. A literal, never a template."""
    timeout_seconds: float = pydantic.Field(300.0, gt=0, le=3600)
    """How long the pod may take to start and end (image pull included)."""


def manifest(ctx: actions.ActionContext, params: SmokeParams, node: str) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": params.image,
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    if params.command:
        container["command"] = list(params.command)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"remediator-cuda-smoke-{ctx.run_id}-{ctx.step_id}-{ctx.attempt}",
            "labels": {
                "app.kubernetes.io/name": "remediator-cuda-smoke",
                "app.kubernetes.io/managed-by": "remediator",
            },
            "annotations": {"remediator.io/run": str(ctx.run_id), "remediator.io/node": node},
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "activeDeadlineSeconds": int(params.timeout_seconds),
            "tolerations": [{"operator": "Exists"}],
            "containers": [container],
        },
    }


async def _wait_end(
    cluster: port.Cluster, namespace: str, name: str, timeout: float
) -> port.PodInfo | None:
    """The pod once it has ended (Succeeded or Failed); None when it did not in time."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    last: port.PodInfo | None = None
    while time.monotonic() < deadline:
        with clusterops.cluster_errors(f"reading the CUDA smoke-test pod {namespace}/{name}"):
            last = await cluster.get_pod(namespace, name)
        if last.phase in ("Succeeded", "Failed"):
            return last
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
    return None


class CudaSmokeTestAction(actions.Action[SmokeParams]):
    name: ClassVar[str] = "gpu.cuda_smoke_test"
    description: ClassVar[str] = (
        "Run a CUDA program (image) in a pod on the node that requests one GPU; it must exit 0."
    )
    params_model = SmokeParams
    semantics: ClassVar[dict[str, str]] = {
        "check": "in place only without an `image` (the check is skipped); otherwise a test "
        "always runs again.",
        "apply": "creates a pod pinned to the node requesting nvidia.com/gpu: 1 that runs "
        "`image` (or `command`), waits until it ends within `timeout_seconds`, fails unless it "
        "Succeeded (exit 0), naming the container's reason and message; deletes the pod.",
        "undo": "none.",
    }

    async def check(self, ctx: actions.ActionContext, params: SmokeParams) -> actions.Check:
        if not params.image:
            return actions.Check(in_place=True, output={"skipped": "no image configured"})
        return actions.Check(in_place=False)

    async def apply(self, ctx: actions.ActionContext, params: SmokeParams) -> dict[str, Any]:
        cluster = ctx.require_cluster()
        node = await clusterops.gpu_node(cluster, clusterops.target_node(ctx, params.node))
        namespace = params.namespace or cluster.driver_namespace
        body = manifest(ctx, params, node.name)
        name = body["metadata"]["name"]
        output: dict[str, Any] = {
            "node": node.name,
            "pod": f"{namespace}/{name}",
            "image": params.image,
        }
        started = time.monotonic()
        try:
            with clusterops.cluster_errors(f"creating the CUDA smoke-test pod on {node.name}"):
                await cluster.create_pod(namespace, body)
            ended = await _wait_end(cluster, namespace, name, params.timeout_seconds)
            if ended is None:
                pod = await _current(cluster, namespace, name)
                state = "; ".join(pod.waiting) if pod and pod.waiting else "not started"
                raise errors.ActionFailed(
                    f"CUDA smoke test on {node.name} did not end within "
                    f"{params.timeout_seconds:g} s (phase {pod.phase if pod else 'gone'}: {state})",
                    output=output,
                )
        finally:
            await _delete(cluster, namespace, name)
        output |= {"phase": ended.phase, "containers": ended.terminated}
        output["seconds"] = round(time.monotonic() - started, 1)
        if ended.phase != "Succeeded":
            raise errors.ActionFailed(
                f"CUDA smoke test on {node.name} failed: {'; '.join(ended.terminated) or 'Failed'}",
                output=output,
            )
        return output

    def describe(self, params: SmokeParams) -> str:
        what = params.image or "(no image: skipped)"
        return f"run the CUDA smoke test {what} on {params.node or '(alert node)'}"


async def _current(cluster: port.Cluster, namespace: str, name: str) -> port.PodInfo | None:
    try:
        return await cluster.get_pod(namespace, name)
    except port.ClusterError:
        return None


async def _delete(cluster: port.Cluster, namespace: str, name: str) -> None:
    # A pod left behind ends by itself (activeDeadlineSeconds); it holds its GPU only then.
    with contextlib.suppress(port.ClusterError):
        await cluster.delete_pod(namespace, name)
