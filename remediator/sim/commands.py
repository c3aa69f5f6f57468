"""Commands that can be exec'd in simulated containers. Nothing ever runs on the host.

GPU driver containers (``nvidia-driver-ctr`` in pods labelled as the GPU Operator's driver
daemonset) have ``nvidia-smi``, ``dcgmi diag`` (see ``dcgm``), ``nvidia-bug-report.sh``,
``cat``, ``rm`` and ``ls`` over a per-pod in-memory filesystem; being hostPID, they also read
the node's kubelet device checkpoint under ``/proc/1/root`` (see ``kubelet``). Everything else
answers like a missing executable (exit 127).

A privileged container with the host's root filesystem mounted (``hostPath: /``) reaches the
host's own driver tools by ``chroot <mount> <argv>``: on a node whose driver is installed on
the host (labelled ``nvidia.com/gpu.deploy.driver=pre-installed``, as the GPU Operator labels
such nodes) they answer exactly as in a driver container; elsewhere chroot finds no
``nvidia-smi`` (exit 127).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import posixpath
from collections.abc import Awaitable, Callable
from typing import Any

from remediator.sim import dcgm, mutations, nvidia

STDOUT = 1
STDERR = 2
RC_NOT_FOUND = 127
DRIVER_CONTAINER = "nvidia-driver-ctr"
DRIVER_DEPLOY_LABEL = "nvidia.com/gpu.deploy.driver"
PRE_INSTALLED = "pre-installed"

Emit = Callable[[int, bytes], Awaitable[None]]


@dataclasses.dataclass
class Context:
    pod: dict[str, Any]
    container: str
    host: nvidia.Host | None
    files: dict[str, bytes]
    bug_report_seconds: float = 0.0  # real seconds, already scaled
    mutations: mutations.Log | None = None
    """Where effects (power limits) are logged."""
    host_files: Callable[[str], bytes | None] | None = None
    """The node's files a hostPID container reads under ``/proc/1/root`` (driver pods)."""
    host_root: str | None = None
    """Where a privileged container has the host's root mounted (``chroot`` target)."""


def status_for(argv: list[str], rc: int) -> dict[str, Any]:
    if rc == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": (
            f"command terminated with non-zero exit code: error executing command "
            f"[{' '.join(argv)}], exit code {rc}"
        ),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(rc)}]},
    }


def is_driver_pod(pod: dict[str, Any]) -> bool:
    meta = pod.get("metadata", {})
    labels = meta.get("labels") or {}
    return meta.get("namespace") == "gpu-operator" and (
        labels.get("app") == "nvidia-driver-daemonset"
        or labels.get("app.kubernetes.io/component") == "nvidia-driver"
    )


def host_root_mount(pod: dict[str, Any], container: str) -> str | None:
    """Where ``container`` (privileged) has the host's root filesystem mounted, if it does."""
    roots = {
        v["name"]
        for v in pod.get("spec", {}).get("volumes") or []
        if _path(str((v.get("hostPath") or {}).get("path", "-"))) == "/"
    }
    for c in pod.get("spec", {}).get("containers") or []:
        if c.get("name") != container or not (c.get("securityContext") or {}).get("privileged"):
            continue
        for mount in c.get("volumeMounts") or []:
            if mount.get("name") in roots:
                return _path(str(mount.get("mountPath", "/")))
    return None


def _path(raw: str) -> str:
    return posixpath.normpath(posixpath.join("/", raw))


async def run(ctx: Context, argv: list[str], emit: Emit) -> int:
    """Run ``argv`` in the container, streaming output through ``emit``; return the exit code."""
    chrooted = bool(ctx.host_root and argv[:1] == ["chroot"] and len(argv) > 2)
    if chrooted and _path(argv[1]) == ctx.host_root:
        if ctx.host is None:  # no driver on this host: it lives in the driver container
            await emit(
                STDERR,
                f"chroot: failed to run command '{argv[2]}': No such file or directory\n".encode(),
            )
            return RC_NOT_FOUND
        argv = argv[2:]
    else:
        chrooted = False
    program = posixpath.basename(argv[0]) if argv else ""
    has_driver = ctx.host is not None and (ctx.container == DRIVER_CONTAINER or chrooted)
    if has_driver and ctx.host is not None:
        if program == "nvidia-smi":
            before = {g.uuid: g.power_limit for g in ctx.host.gpus}
            out, err, rc = nvidia.run(ctx.host, argv[1:])
            if rc == nvidia.RC_OK:
                _log_power_limits(ctx, ctx.host, argv, before)
            await _emit_text(emit, out, err)
            return rc
        if program == "dcgmi":
            out, err, rc = dcgm.run(ctx.host, argv[1:])
            await _emit_text(emit, out, err)
            return rc
        if program == "nvidia-bug-report.sh":
            return await bug_report(ctx, ctx.host, argv[1:], emit)
        if program in BUILTINS:
            return await BUILTINS[program](ctx, argv[1:], emit)
    message = (
        "OCI runtime exec failed: exec failed: unable to start container process: exec: "
        f'"{argv[0] if argv else ""}": executable file not found in $PATH: unknown\n'
    )
    await emit(STDERR, message.encode())
    return RC_NOT_FOUND


def _log_power_limits(
    ctx: Context, host: nvidia.Host, argv: list[str], before: dict[str, float]
) -> None:
    args = nvidia.parse_args(argv[1:])
    if ctx.mutations is None or args.power_limit is None:
        return
    meta = ctx.pod.get("metadata", {})
    source = f"exec {' '.join(argv)} in {meta.get('namespace')}/{meta.get('name')}"
    for gpu in nvidia.select(host, args.ids) or []:
        ctx.mutations.record(
            mutations.POWER_LIMIT,
            ctx.pod.get("spec", {}).get("nodeName", ""),
            gpu.uuid,
            before=before.get(gpu.uuid),
            after=gpu.power_limit,
            source=source,
        )


async def _emit_text(emit: Emit, out: str, err: str) -> None:
    if out:
        await emit(STDOUT, out.encode())
    if err:
        await emit(STDERR, err.encode())


async def cat(ctx: Context, args: list[str], emit: Emit) -> int:
    rc = 0
    for raw in args:
        path = _path(raw)
        data = ctx.files.get(path)
        if data is None and ctx.host_files is not None:
            data = ctx.host_files(path)
        if data is None:
            await emit(STDERR, f"cat: {raw}: No such file or directory\n".encode())
            rc = 1
            continue
        for start in range(0, len(data), 32 * 1024):
            await emit(STDOUT, data[start : start + 32 * 1024])
    return rc


async def rm(ctx: Context, args: list[str], emit: Emit) -> int:
    force = any(a in ("-f", "-rf", "-fr") for a in args)
    rc = 0
    for raw in (a for a in args if not a.startswith("-")):
        if ctx.files.pop(_path(raw), None) is None and not force:
            await emit(STDERR, f"rm: cannot remove '{raw}': No such file or directory\n".encode())
            rc = 1
    return rc


async def ls(ctx: Context, args: list[str], emit: Emit) -> int:
    long = any(a.startswith("-") and "l" in a for a in args)
    targets = [a for a in args if not a.startswith("-")] or ["."]
    rc = 0
    for raw in targets:
        path = _path(raw)
        if path in ctx.files:
            names = {raw: len(ctx.files[path])}
        else:
            prefix = path.rstrip("/") + "/"
            names = {
                f[len(prefix) :].split("/")[0]: len(data)
                for f, data in ctx.files.items()
                if f.startswith(prefix)
            }
            if not names and path != "/":
                await emit(
                    STDERR, f"ls: cannot access '{raw}': No such file or directory\n".encode()
                )
                rc = 2
                continue
        for name in sorted(names):
            line = f"-rw-r--r-- 1 root root {names[name]} {name}" if long else name
            await emit(STDOUT, (line + "\n").encode())
    return rc


BUILTINS: dict[str, Callable[[Context, list[str], Emit], Awaitable[int]]] = {
    "cat": cat,
    "rm": rm,
    "ls": ls,
}

BUG_REPORT_INTRO = """
nvidia-bug-report.sh will now collect information about your
system and create the file '{name}' in the current
directory.  It may take several seconds to run.  In some
cases, it may hang trying to capture data generated dynamically
by the Linux kernel and/or the NVIDIA kernel module.  While
the bug report log file will be incomplete if this happens, it
may still contain enough data to diagnose your problem.

If nvidia-bug-report.sh hangs, consider running with the --safe-mode
and --extra-system-data command line arguments.

Please include the '{name}' log file when reporting
your bug via the NVIDIA Linux forum (see forums.developer.nvidia.com)
or by sending email to 'linux-bugs@nvidia.com'.

By delivering '{name}' to NVIDIA, you acknowledge
and agree that personal information may inadvertently be included in
the output.  Notwithstanding the foregoing, NVIDIA will use the
output only for the purpose of investigating your reported issue.

Running nvidia-bug-report.sh..."""


async def bug_report(ctx: Context, host: nvidia.Host, args: list[str], emit: Emit) -> int:
    base = "nvidia-bug-report.log"
    safe_mode = False
    items = list(args)
    while items:
        item = items.pop(0)
        if item in ("--output-file", "-o"):
            if not items or items[0].startswith("-"):
                await emit(STDERR, b"nvidia-bug-report.sh: --output-file requires a file name\n")
                return 1
            base = items.pop(0)
        elif item == "--safe-mode":
            safe_mode = True
    target = _path(base + ".gz")
    await emit(STDOUT, BUG_REPORT_INTRO.format(name=posixpath.basename(target)).encode())
    lost = any(g.lost for g in host.gpus)
    if host.bug_report_hangs or (lost and not safe_mode):
        await asyncio.Event().wait()  # hangs until the client gives up
    await asyncio.sleep(ctx.bug_report_seconds)
    if target in ctx.files:
        ctx.files[target[: -len(".gz")] + ".old.gz"] = ctx.files.pop(target)
    ctx.files[target] = gzip.compress(_bug_report_log(ctx, host, safe_mode).encode())
    await emit(STDOUT, b" complete.\n\n")
    return 0


def _bug_report_log(ctx: Context, host: nvidia.Host, safe_mode: bool) -> str:
    node = ctx.pod.get("spec", {}).get("nodeName", "")
    smi_out, _, _ = nvidia.run(host, ["-q"])
    lines = [
        "____________________________________________",
        "",
        "Start of NVIDIA bug report log file.  Please include this file, along",
        "with a detailed description of your problem, when reporting a graphics",
        "driver bug via the NVIDIA Linux forum (see forums.developer.nvidia.com)",
        "or by sending email to 'linux-bugs@nvidia.com'.",
        "",
        "nvidia-bug-report.sh Version: 35582371",
        f"Hostname: {node}",
        f"Safe mode: {'yes' if safe_mode else 'no'}",
        "",
        "____________________________________________",
        "",
        "/usr/bin/nvidia-smi --query",
        "",
        smi_out,
    ]
    for gpu in host.gpus:
        if gpu.lost:
            lines.append(f"NVRM: Xid (PCI:{gpu.pci_bus_id[4:]}): 79, GPU has fallen off the bus.")
    return "\n".join(lines) + "\n"
