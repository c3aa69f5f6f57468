"""gpu.diagnose (dcgmi diag) and gpu.verify_pcie through websocket exec into the simulated
driver pods."""

from __future__ import annotations

import aiohttp
import pytest

from remediator.actions import diagnose
from remediator.domain import errors
from remediator.sim import testing
from tests.integration.kube.conftest import MakeContext, run_action


async def test_diagnose_passes_on_healthy_gpus_at_each_level(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    quick = await run_action(diagnose.DiagnoseAction(), make_ctx(), {})
    assert quick["level"] == 1
    assert quick["counts"]["Fail"] == 0
    assert quick["counts"]["Pass"] > 0
    medium = await run_action(diagnose.DiagnoseAction(), make_ctx(), {"level": 2})
    assert medium["tests"] > quick["tests"]  # PCIe and GPU memory join the deployment checks
    assert medium["failed"] == []


async def test_diagnose_fails_naming_the_failed_test_and_gpu(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    async with (
        aiohttp.ClientSession(headers=sim.headers) as http,
        http.patch(
            f"{sim.url}/sim/v1/nodes/gpu-node-01/gpus/3", json={"diag_failures": ["GPU Memory"]}
        ) as answer,
    ):
        assert answer.status == 200
    assert await run_action(diagnose.DiagnoseAction(), make_ctx(), {"level": 1})  # not run at 1
    with pytest.raises(errors.ActionFailed, match=r"GPU Memory \(Hardware\) Fail on GPU 3") as e:
        await run_action(diagnose.DiagnoseAction(), make_ctx(), {"level": 2})
    assert e.value.temporary is False
    [failed] = e.value.output["failed"]
    assert (failed["test"], failed["gpu"]) == ("GPU Memory", "3")
    assert e.value.output["exit_code"] == 226


async def test_diagnose_fails_a_pending_row_remap_at_level_one(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    sim.gpu("gpu-node-02", 5).remap_pending = True
    with pytest.raises(errors.ActionFailed, match="row remappings that are pending"):
        await run_action(diagnose.DiagnoseAction(), make_ctx(node="gpu-node-02"), {})


async def test_verify_pcie_passes_at_full_link_and_expected_driver(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    params = {"driver_version": "535.129.03"}
    output = await run_action(diagnose.VerifyPcieAction(), make_ctx(), params)
    assert output["problems"] == {}
    assert {(g["gen"], g["width"]) for g in output["gpus"]} == {(5, 16)}


async def test_verify_pcie_fails_a_degraded_link_or_another_driver(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    degraded = sim.gpu("gpu-node-01", 2)
    degraded.pcie_width_current = 8
    with pytest.raises(errors.ActionFailed, match=r"PCIe link width x8 of x16") as e:
        await run_action(diagnose.VerifyPcieAction(), make_ctx(), {})
    assert list(e.value.output["problems"]) == [degraded.uuid]
    degraded.pcie_width_current = 16
    with pytest.raises(
        errors.ActionFailed, match=r"\(node\): driver 535.129.03, expected 570.195.03$"
    ):
        await run_action(diagnose.VerifyPcieAction(), make_ctx(), {"driver_version": "570.195.03"})
    degraded.pcie_gen_current = 3
    with pytest.raises(errors.ActionFailed, match=r"PCIe link generation 3 of 5"):
        await run_action(diagnose.VerifyPcieAction(), make_ctx(), {})
    assert await run_action(diagnose.VerifyPcieAction(), make_ctx(), {"check_generation": False})
