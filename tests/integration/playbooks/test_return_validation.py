"""return-node-to-service refuses a node whose GPUs would not survive work: a PCIe link below
its maximum, another driver than the one asked for, a pending or failed row remap, a failed
DCGM diagnostic. Nothing is changed on the node: it stays cordoned and unlabelled."""

from __future__ import annotations

from typing import Any

import pytest

from remediator.sim import testing
from tests.integration.playbooks.conftest import (
    MakeGpuHarness,
    cordoned,
    labels,
    statuses,
    step,
    trigger,
)

pytestmark = pytest.mark.timeout(60)

NODE = "gpu-node-04"


def cordon(sim: testing.RunningSim) -> None:
    sim.store.mutate("nodes", "", NODE, lambda obj: obj["spec"].update(unschedulable=True))


async def refused(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, params: dict[str, Any], at: str
) -> dict[str, Any]:
    cordon(sim)
    h = await gpu_harness()
    run_id = await trigger(h, "return-node-to-service", {"node": NODE, **params}, NODE)
    detail = await h.run_detail(run_id)
    assert detail["status"] == "failed", statuses(detail)
    assert step(detail, at)["status"] == "failed", statuses(detail)
    assert step(detail, "label-healthy")["status"] != "succeeded"
    assert cordoned(sim, NODE)
    assert labels(sim, NODE).get("gpu-status") != "healthy"
    return step(detail, at)


async def test_return_to_service_validates_pcie_row_remap_and_dcgm_before_uncordoning(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    cordon(sim)
    h = await gpu_harness()
    params = {
        "node": NODE,
        "driver_version": "535.129.03",
        "diag_level": 2,
        "cuda_image": "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
    }
    run_id = await trigger(h, "return-node-to-service", params, NODE)
    detail = await h.run_detail(run_id)
    assert detail["status"] == "succeeded", statuses(detail)
    assert step(detail, "pcie-driver")["output"]["problems"] == {}
    assert step(detail, "row-remap")["output"]["verdict"] == "ok"
    assert step(detail, "diagnose")["output"]["level"] == 2
    assert step(detail, "cuda-smoke-test")["output"]["phase"] == "Succeeded"
    assert not cordoned(sim, NODE)


async def test_return_to_service_refuses_a_degraded_pcie_link(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    sim.gpu(NODE, 6).pcie_width_current = 8
    failed = await refused(gpu_harness, sim, {}, "pcie-driver")
    assert "PCIe link width x8 of x16" in failed["error"]


async def test_return_to_service_refuses_another_driver_version(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    failed = await refused(gpu_harness, sim, {"driver_version": "570.195.03"}, "pcie-driver")
    assert "expected 570.195.03" in failed["error"]


async def test_return_to_service_refuses_a_pending_row_remap(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    sim.gpu(NODE, 1).remap_pending = True
    failed = await refused(gpu_harness, sim, {}, "row-remap")
    assert "row remap pending" in failed["error"]


async def test_return_to_service_refuses_a_failed_dcgm_diagnostic(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    sim.gpu(NODE, 3).diag_failures = ["GPU Memory"]
    failed = await refused(gpu_harness, sim, {"diag_level": 2}, "diagnose")
    assert "GPU Memory (Hardware) Fail on GPU 3" in failed["error"]
