"""Validation before a GPU node goes back to work: ``gpu.diagnose`` and ``gpu.verify_pcie``.

``gpu.diagnose`` runs DCGM's diagnostic, ``dcgmi diag -r <level> -j`` (argv, never a shell), in
the driver pod by default, or in the DCGM pod when the exec target names it (``dcgmi`` must be
in that container and reach a host engine). Level 1 is the quick deployment check (seconds),
2 adds the PCIe and GPU memory tests (about two minutes), 3 the stress tests (about half an
hour). The JSON has ``test_categories`` → ``category`` / ``tests`` → ``name`` / ``results``
with a ``status`` per GPU (Pass, Fail, Warn, Skip); a failure exits non-zero with the JSON
still on stdout, so the JSON decides and the exit code only matters when there is none.

``gpu.verify_pcie`` compares every GPU's PCIe link width and generation with the maximum the
GPU and slot support (a riser or slot that trained down shows here first), and the driver
version with the expected one. An idle GPU may lower its link generation to save power; an
H200 stays at its maximum (see the captured ``nvidia-smi`` output), and on GPUs that do not,
``check_generation: false`` keeps only the width.

Both are reads: ``check`` never claims an effect, every attempt looks at the live state.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar

import pydantic

from remediator.actions import gpu, hostexec
from remediator.domain import errors
from remediator.ports import actions

STATUSES = ("Pass", "Fail", "Warn", "Skip")
PCIE_QUERY = (
    "index,uuid,pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,"
    "pcie.link.width.current,pcie.link.width.max,driver_version"
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DiagResult:
    category: str
    test: str
    gpu: str | None
    status: str
    warnings: tuple[str, ...]

    def describe(self) -> str:
        where = f"GPU {self.gpu}" if self.gpu is not None else "all GPUs"
        why = f": {'; '.join(self.warnings)}" if self.warnings else ""
        return f"{self.test} ({self.category}) {self.status} on {where}{why}"


def _warnings(raw: Any) -> tuple[str, ...]:
    """``warnings`` is a string in DCGM 2.x, a list of ``{"warning"|"message": ...}`` after."""
    if isinstance(raw, str):
        return (raw,) if raw else ()
    if isinstance(raw, list):
        found = []
        for item in raw:
            text = item.get("warning") or item.get("message") if isinstance(item, dict) else item
            if text:
                found.append(str(text))
        return tuple(found)
    return ()


def parse_diag(text: str) -> list[DiagResult]:
    """The results of ``dcgmi diag -j``; ``ValueError`` when it is not that JSON."""
    body = json.loads(text)
    if not isinstance(body, dict):
        raise ValueError("no DCGM diagnostic test_categories in the output")
    diag = body.get("DCGM GPU Diagnostic") or body.get("DCGM Diagnostic")
    if not isinstance(diag, dict) or not isinstance(diag.get("test_categories"), list):
        raise ValueError("no DCGM diagnostic test_categories in the output")
    results = []
    for category in diag["test_categories"]:
        for test in category.get("tests") or []:
            for result in test.get("results") or []:
                gpu_id = result.get("gpu_id", result.get("gpu_ids"))
                results.append(
                    DiagResult(
                        category=str(category.get("category", "")),
                        test=str(test.get("name", "")),
                        gpu=str(gpu_id) if gpu_id is not None else None,
                        status=str(result.get("status", "")),
                        warnings=_warnings(result.get("warnings")),
                    )
                )
    return results


class DiagnoseParams(gpu.DriverParams):
    level: int = pydantic.Field(1, ge=1, le=3)
    """1: deployment checks (seconds); 2: adds PCIe and memory (minutes); 3: stress (~30 min)."""
    exec_timeout_seconds: float = pydantic.Field(600.0, gt=0, le=7200)
    """How long the diagnostic may run before the step fails (level 3 needs about 2400)."""
    fail_on_warn: bool = False
    """A test that ends in Warn fails the step too."""


@hostexec.scoped_action
class DiagnoseAction(actions.Action[DiagnoseParams]):
    name: ClassVar[str] = "gpu.diagnose"
    description: ClassVar[str] = (
        "Run DCGM's diagnostic (dcgmi diag -r 1|2|3) on the node's GPUs and fail naming the "
        "tests that failed."
    )
    params_model = DiagnoseParams
    semantics: ClassVar[dict[str, str]] = {
        "check": "never in place (a read: every attempt runs the diagnostic again).",
        "apply": "runs `dcgmi diag -r <level> -j` in the driver pod (or the DCGM pod the exec "
        "target names) and fails when a test fails (or warns, with `fail_on_warn`), naming the "
        "test, the GPU and DCGM's message.",
        "undo": "none (changes nothing).",
    }

    async def check(self, ctx: actions.ActionContext, params: DiagnoseParams) -> actions.Check:
        return actions.Check(in_place=False)

    async def apply(self, ctx: actions.ActionContext, params: DiagnoseParams) -> dict[str, Any]:
        node, driver = await gpu.find_driver(ctx, params)
        argv = ["dcgmi", "diag", "-r", str(params.level), "-j"]
        result = await gpu.run(ctx, driver, argv, timeout=params.exec_timeout_seconds)
        try:
            results = parse_diag(result.stdout.decode("utf-8", "replace"))
        except ValueError:
            raise gpu.failure(driver, argv, result) from None
        bad = {"Fail", "Warn"} if params.fail_on_warn else {"Fail"}
        failed = [r for r in results if r.status in bad]
        output: dict[str, Any] = {
            "node": node.name,
            "level": params.level,
            "exit_code": result.exit_code,
            "tests": len({(r.category, r.test) for r in results}),
            "counts": {s: sum(r.status == s for r in results) for s in STATUSES},
            "failed": [dataclasses.asdict(r) for r in failed],
        }
        if failed:
            raise errors.ActionFailed(
                f"DCGM diagnostic level {params.level} on {node.name} failed: "
                + "; ".join(r.describe() for r in failed[:10]),
                output=output,
            )
        return output

    def describe(self, params: DiagnoseParams) -> str:
        return f"run dcgmi diag -r {params.level} on {params.node or '(alert node)'}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PcieLink:
    index: int
    uuid: str
    pci_bus_id: str
    gen: int | None
    gen_max: int | None
    width: int | None
    width_max: int | None
    driver_version: str


def _int(raw: str) -> int | None:
    text = raw.strip().removesuffix("x")
    return int(text) if text.isdigit() else None


def parse_pcie(text: str) -> list[PcieLink]:
    links = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 8 or not fields[0].isdigit():
            continue
        links.append(
            PcieLink(
                index=int(fields[0]),
                uuid=fields[1],
                pci_bus_id=fields[2],
                gen=_int(fields[3]),
                gen_max=_int(fields[4]),
                width=_int(fields[5]),
                width_max=_int(fields[6]),
                driver_version=fields[7],
            )
        )
    return links


class PcieParams(gpu.DriverParams):
    check_generation: bool = True
    """Also require the link generation at its maximum (see the module docstring)."""
    driver_version: str | None = pydantic.Field(None, pattern=r"^([0-9]+(\.[0-9]+){1,3})?$")
    """The driver version every GPU must report, e.g. ``580.159.04``; empty: not compared."""


def pcie_problems(links: list[PcieLink], params: PcieParams) -> dict[str, str]:
    problems: dict[str, str] = {}
    for link in links:
        found = []
        if link.width is None or link.width_max is None or link.width < link.width_max:
            found.append(f"PCIe link width x{link.width} of x{link.width_max}")
        if params.check_generation and (
            link.gen is None or link.gen_max is None or link.gen < link.gen_max
        ):
            found.append(f"PCIe link generation {link.gen} of {link.gen_max}")
        if found:
            problems[link.uuid] = ", ".join(found)
    versions = sorted({link.driver_version for link in links})
    if params.driver_version and versions != [params.driver_version]:
        problems["(node)"] = f"driver {', '.join(versions)}, expected {params.driver_version}"
    return problems


@hostexec.scoped_action
class VerifyPcieAction(actions.Action[PcieParams]):
    name: ClassVar[str] = "gpu.verify_pcie"
    description: ClassVar[str] = (
        "Check every GPU's PCIe link runs at its maximum width and generation, and the driver "
        "version is the expected one."
    )
    params_model = PcieParams
    semantics: ClassVar[dict[str, str]] = {
        "check": "never in place (a read: every attempt reads the live state).",
        "apply": "reads `nvidia-smi --query-gpu=pcie.link.*,driver_version` and fails naming "
        "each GPU whose link is below its maximum width (or generation, with "
        "`check_generation`) or whose driver is not `driver_version`.",
        "undo": "none (changes nothing).",
    }

    async def check(self, ctx: actions.ActionContext, params: PcieParams) -> actions.Check:
        return actions.Check(in_place=False)

    async def apply(self, ctx: actions.ActionContext, params: PcieParams) -> dict[str, Any]:
        node, driver = await gpu.find_driver(ctx, params)
        argv = ["nvidia-smi", f"--query-gpu={PCIE_QUERY}", "--format=csv,noheader,nounits"]
        result = await gpu.run(
            ctx, driver, argv, timeout=params.exec_timeout_seconds, idempotent=True
        )
        links = parse_pcie(result.stdout.decode("utf-8", "replace"))
        if result.exit_code != 0 or not links:
            raise gpu.failure(driver, argv, result)
        problems = pcie_problems(links, params)
        output: dict[str, Any] = {
            "node": node.name,
            "gpus": [dataclasses.asdict(link) for link in links],
            "problems": problems,
        }
        if problems:
            listed = "; ".join(f"{who}: {why}" for who, why in sorted(problems.items()))
            raise errors.ActionFailed(f"node {node.name}: {listed}", output=output)
        return output

    def describe(self, params: PcieParams) -> str:
        return f"verify PCIe links and driver on {params.node or '(alert node)'}"


ACTIONS: list[actions.Action[Any]] = [DiagnoseAction(), VerifyPcieAction()]
