"""``gpu.collect_bug_report``: run nvidia-bug-report.sh in the driver pod and keep the result.

The script can hang (a GPU that fell off the bus, a wedged kernel module), so it always runs
under a timeout: a hang becomes a recorded failure, never a stuck step. The report is streamed
back as gzip bytes with ``cat``, stored under the artifact directory as
``<node>/<run>-<step>-nvidia-bug-report.log.gz`` with a ``.sha256`` beside it (which is how
``check`` recognises a report an earlier attempt already stored), then removed from the node.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import pathlib
from typing import Any, ClassVar

import pydantic

from remediator.actions import clusterops, gpu, hostexec
from remediator.domain import errors
from remediator.ports import actions
from remediator.ports import cluster as port

GZIP_MAGIC = b"\x1f\x8b"


class BugReportParams(gpu.DriverParams):
    safe_mode: bool = False
    """Skip the parts that may hang (use it on a sick GPU, e.g. after Xid 79)."""
    timeout_seconds: float = pydantic.Field(300.0, gt=0, le=3600)
    copy_timeout_seconds: float = pydantic.Field(120.0, gt=0, le=3600)


def artifact_dir(ctx: actions.ActionContext) -> pathlib.Path:
    return pathlib.Path(ctx.services.get("artifact_dir") or "artifacts")


def relative_path(ctx: actions.ActionContext, node: str) -> str:
    return f"{node}/{ctx.run_id}-{ctx.step_id}-nvidia-bug-report.log.gz"


def remote_base(ctx: actions.ActionContext) -> str:
    return f"/tmp/remediator-{ctx.run_id}-{ctx.step_id}"  # noqa: S108 - a path in the pod


def _stored(path: pathlib.Path) -> dict[str, Any] | None:
    sidecar = path.with_name(path.name + ".sha256")
    if not path.is_file() or not sidecar.is_file():
        return None
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if sidecar.read_text(encoding="utf-8").split()[0:1] != [digest]:
        return None
    return {"size": len(data), "sha256": digest}


def _store(path: pathlib.Path, data: bytes, digest: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    path.with_name(path.name + ".sha256").write_text(f"{digest}  {path.name}\n", encoding="utf-8")


@hostexec.scoped_action
class BugReportAction(actions.Action[BugReportParams]):
    name: ClassVar[str] = "gpu.collect_bug_report"
    description: ClassVar[str] = "Run nvidia-bug-report.sh on the node and store the report."
    params_model = BugReportParams

    async def check(self, ctx: actions.ActionContext, params: BugReportParams) -> actions.Check:
        node = clusterops.target_node(ctx, params.node)
        relative = relative_path(ctx, node)
        stored = await asyncio.to_thread(_stored, artifact_dir(ctx) / relative)
        if stored is None:
            return actions.Check(in_place=False)
        return actions.Check(in_place=True, output={"node": node, "path": relative, **stored})

    async def apply(self, ctx: actions.ActionContext, params: BugReportParams) -> dict[str, Any]:
        node, driver = await gpu.find_driver(ctx, params)
        base = remote_base(ctx)
        remote = base + ".gz"
        argv = ["nvidia-bug-report.sh", "--output-file", base]
        if params.safe_mode:
            argv.append("--safe-mode")
        try:
            result = await ctx.require_cluster().exec(
                namespace=driver.namespace,
                pod=driver.pod,
                container=driver.container,
                argv=driver.command(argv),
                timeout=params.timeout_seconds,
            )
        except port.ExecTimedOut as e:
            await self._remove(ctx, driver, remote, params)
            hint = "" if params.safe_mode else "; a sick GPU may need safe_mode: true"
            raise errors.ActionFailed(
                f"nvidia-bug-report.sh on {node.name} did not finish within "
                f"{params.timeout_seconds:g}s (hung){hint}",
                output={"node": node.name, "timed_out": True, "safe_mode": params.safe_mode},
            ) from e
        except port.ClusterError as e:
            raise errors.ActionFailed(
                f"running nvidia-bug-report.sh on {node.name}: {e}",
                temporary=e.temporary,
                retry_after=e.retry_after,
            ) from e
        if result.exit_code != 0:
            raise gpu.failure(driver, argv, result)
        data = await self._fetch(ctx, driver, remote, params)
        digest = hashlib.sha256(data).hexdigest()
        relative = relative_path(ctx, node.name)
        await asyncio.to_thread(_store, artifact_dir(ctx) / relative, data, digest)
        removed = await self._remove(ctx, driver, remote, params)
        event = await clusterops.emit_node_event(
            ctx,
            ctx.require_cluster(),
            node,
            reason="RemediatorBugReport",
            what=f"collected nvidia-bug-report ({len(data)} bytes, sha256 {digest[:12]})",
        )
        return {
            "node": node.name,
            "driver_pod": f"{driver.namespace}/{driver.pod}",
            "path": relative,
            "size": len(data),
            "sha256": digest,
            "safe_mode": params.safe_mode,
            "removed_from_node": removed,
            "event": event,
        }

    async def _fetch(
        self,
        ctx: actions.ActionContext,
        driver: gpu.Driver,
        remote: str,
        params: BugReportParams,
    ) -> bytes:
        argv = ["cat", remote]
        result = await gpu.run(
            ctx, driver, argv, timeout=params.copy_timeout_seconds, idempotent=True
        )
        if result.exit_code != 0:
            raise gpu.failure(driver, argv, result)
        if not result.stdout.startswith(GZIP_MAGIC):
            raise errors.ActionFailed(f"{remote} on {driver.node} is not a gzip file")
        return result.stdout

    async def _remove(
        self,
        ctx: actions.ActionContext,
        driver: gpu.Driver,
        remote: str,
        params: BugReportParams,
    ) -> bool:
        try:
            result = await ctx.require_cluster().exec(
                namespace=driver.namespace,
                pod=driver.pod,
                container=driver.container,
                argv=driver.command(["rm", "-f", remote]),
                timeout=params.exec_timeout_seconds,
                idempotent=True,
            )
        except port.ClusterError:
            return False
        return result.exit_code == 0

    def describe(self, params: BugReportParams) -> str:
        mode = " (safe mode)" if params.safe_mode else ""
        return f"collect nvidia-bug-report on {params.node or '(alert node)'}{mode}"
