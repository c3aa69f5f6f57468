"""Simulated ``dcgmi diag -r <level> [-i <ids>] [-j]`` over the node's GPUs.

The JSON is the shape ``dcgmi diag -j`` prints (DCGM 3.x): ``"DCGM GPU Diagnostic"`` →
``test_categories`` → each ``category`` with ``tests`` → each ``name`` with ``results``, one per
GPU (``gpu_id``, ``status`` Pass/Fail/Warn/Skip, and ``warnings`` on a failure). Level 1 runs the
deployment checks, level 2 adds the PCIe and GPU memory tests, level 3 the diagnostic and stress
tests. A failure exits 226 (DCGM's NVVS error status) with the JSON still on stdout.

What fails: the tests named in a GPU's ``diag_failures``; the row-remap check on a GPU with a
pending or failed row remap; the PCIe test (level ≥ 2) on a link below its maximum width or
generation; everything on a GPU that fell off the bus.
"""

from __future__ import annotations

import json
from typing import Any

from remediator.sim import nvidia

RC_TEST_FAILED = 226
RC_BAD_ARGS = 255
DCGM_VERSION = "3.3.9"
ROW_REMAP = "Page Retirement/Row Remap"

TESTS: list[tuple[int, str, str]] = [
    (1, "Deployment", "Denylist"),
    (1, "Deployment", "NVML Library"),
    (1, "Deployment", "CUDA Main Library"),
    (1, "Deployment", "Permissions and OS Blocks"),
    (1, "Deployment", "Persistence Mode"),
    (1, "Deployment", "Environment Variables"),
    (1, "Deployment", ROW_REMAP),
    (1, "Deployment", "Graphics Processes"),
    (1, "Deployment", "Inforom"),
    (2, "Integration", "PCIe"),
    (2, "Hardware", "GPU Memory"),
    (3, "Hardware", "Diagnostic"),
    (3, "Stress", "Targeted Stress"),
    (3, "Stress", "Targeted Power"),
    (3, "Stress", "Memory Bandwidth"),
]
USAGE = "Usage: dcgmi diag --run <1|2|3|4> [--gpuList <ids>] [--json]\n"


def _warning(gpu: nvidia.Gpu, test: str) -> str | None:
    """Why ``gpu`` fails ``test``, or ``None`` when it passes."""
    i = gpu.index
    if gpu.lost:
        return f"GPU {i} is lost: Unable to get the device handle (GPU is lost)."
    if test == ROW_REMAP and gpu.remap_failure:
        return f"GPU {i} had uncorrectable memory errors and row remapping failed."
    if test == ROW_REMAP and gpu.remap_pending:
        return (
            f"GPU {i} has uncorrectable memory errors in row remappings that are pending. "
            "Drain the GPU and reset it or reboot the node."
        )
    if test == "PCIe" and gpu.pcie_width_current < gpu.pcie_width_max:
        return (
            f"GPU {i} is running at PCI link width {gpu.pcie_width_current}X, which is below "
            f"the minimum allowed link width of {gpu.pcie_width_max}."
        )
    if test == "PCIe" and gpu.pcie_gen_current < gpu.pcie_gen_max:
        return (
            f"GPU {i} is running at PCI link generation {gpu.pcie_gen_current}, which is below "
            f"the minimum allowed link generation of {gpu.pcie_gen_max}."
        )
    if test in gpu.diag_failures:
        return f"Test {test} failed on GPU {i}: errors were detected (injected fault)."
    return None


def report(host: nvidia.Host, gpus: list[nvidia.Gpu], level: int) -> tuple[dict[str, Any], bool]:
    categories: dict[str, list[dict[str, Any]]] = {}
    failed = False
    for test_level, category, name in TESTS:
        if test_level > level:
            continue
        results = []
        for gpu in gpus:
            warning = _warning(gpu, name)
            result: dict[str, Any] = {"gpu_id": str(gpu.index), "status": "Pass"}
            if warning:
                failed = True
                result["status"] = "Fail"
                result["warnings"] = [{"error_id": 0, "warning": warning}]
            results.append(result)
        categories.setdefault(category, []).append({"name": name, "results": results})
    body = {
        "DCGM GPU Diagnostic": {
            "test_categories": [
                {"category": category, "tests": tests} for category, tests in categories.items()
            ]
        },
        "Driver Version Detected": host.driver_version,
        "GPU Device IDs": ["2335" for _ in gpus],
        "version": DCGM_VERSION,
    }
    return body, failed


def _text(body: dict[str, Any]) -> str:
    lines = ["Successfully ran diagnostic for group.", "+---------------------------+"]
    for category in body["DCGM GPU Diagnostic"]["test_categories"]:
        lines.append(f"+----- {category['category']} -----+")
        for test in category["tests"]:
            statuses = {r["status"] for r in test["results"]}
            lines.append(f"| {test['name']:<25} | {'Fail' if 'Fail' in statuses else 'Pass'}")
    return "\n".join(lines) + "\n"


def run(host: nvidia.Host, args: list[str]) -> nvidia.Result:
    if not args or args[0] != "diag":
        return "", USAGE, RC_BAD_ARGS
    level: int | None = None
    ids: str | None = None
    as_json = False
    items = list(args[1:])
    while items:
        item = items.pop(0)
        if item in ("-r", "--run") and items:
            raw = items.pop(0)
            level = int(raw) if raw in ("1", "2", "3", "4") else None
            if level is None:
                return "", f"Error: invalid value '{raw}' for --run\n{USAGE}", RC_BAD_ARGS
        elif item in ("-i", "--gpuList") and items:
            ids = items.pop(0)
        elif item in ("-j", "--json"):
            as_json = True
        else:
            return "", f"Error: unknown argument '{item}'\n{USAGE}", RC_BAD_ARGS
    if level is None:
        return "", f"Error: --run is required\n{USAGE}", RC_BAD_ARGS
    gpus = nvidia.select(host, ids)
    if not gpus:
        return "", "Error: no GPUs match the GPU list\n", RC_BAD_ARGS
    body, failed = report(host, gpus, level)
    out = json.dumps(body, indent=3) + "\n" if as_json else _text(body)
    return out, "", RC_TEST_FAILED if failed else nvidia.RC_OK
