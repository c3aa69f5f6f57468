"""GPU actions through websocket exec into the simulated driver pods."""

from __future__ import annotations

import gzip
import hashlib
import pathlib

import pytest

from remediator.actions import bugreport, gpu
from remediator.domain import errors
from remediator.sim import testing
from tests.integration.kube.conftest import MakeContext, node_events, run_action, run_undo


async def test_power_cap_applies_verifies_and_undo_restores_the_previous_limit(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    action = gpu.PowerCapAction()
    target = sim.gpu("gpu-node-04", 2)  # H200: 200-700 W, default 700 W
    sim.gpu("gpu-node-04", 2).power_limit = 650.0
    params = {"percent_of_default": 50}
    ctx = make_ctx(node="gpu-node-04", gpu=target.uuid)
    output = await run_action(action, ctx, params)
    assert target.power_limit == 350.0
    assert sim.gpu("gpu-node-04", 1).power_limit == 700.0  # only the run's GPU
    [record] = output["gpus"]
    assert record["uuid"] == target.uuid
    assert record["previous_limit"] == 650.0
    assert record["verified_limit"] == 350.0
    assert "RemediatorPowerCap" in {e["reason"] for e in node_events(sim, "gpu-node-04")}

    again = await run_action(action, ctx, params)  # a re-fire does not stack caps
    assert again["already_in_place"] is True
    assert target.power_limit == 350.0

    undone = await run_undo(action, make_ctx(node="gpu-node-04", applied_output=output), params)
    assert target.power_limit == 650.0
    assert undone["restored"] == {target.uuid: 650.0}


async def test_power_cap_undo_leaves_a_limit_someone_else_changed(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    action = gpu.PowerCapAction()
    params = {"watts": 400, "gpus": ["0", "1"]}
    output = await run_action(action, make_ctx(), params)
    assert [sim.gpu("gpu-node-01", i).power_limit for i in (0, 1)] == [400.0, 400.0]
    sim.gpu("gpu-node-01", 1).power_limit = 500.0
    undone = await run_undo(action, make_ctx(applied_output=output), params)
    assert sim.gpu("gpu-node-01", 0).power_limit == 700.0
    assert sim.gpu("gpu-node-01", 1).power_limit == 500.0
    uuid1 = sim.gpu("gpu-node-01", 1).uuid
    assert undone["left_alone"] == {uuid1: "limit changed by someone else to 500 W"}


async def test_power_cap_refuses_watts_outside_the_gpu_range(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    with pytest.raises(errors.ActionFailed, match="outside the power limit range 200-700 W"):
        await run_action(gpu.PowerCapAction(), make_ctx(gpu="0"), {"watts": 150})
    assert sim.gpu("gpu-node-01", 0).power_limit == 700.0


async def test_power_cap_by_percent_never_goes_below_the_minimum(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    output = await run_action(gpu.PowerCapAction(), make_ctx(gpu="3"), {"percent_of_default": 10})
    assert sim.gpu("gpu-node-01", 3).power_limit == 200.0
    assert output["gpus"][0]["clamped"] is True


async def test_power_cap_on_a_gpu_that_fell_off_the_bus_fails(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    sim.gpu("gpu-node-02", 5).lost = True  # Xid 79
    with pytest.raises(errors.ActionFailed, match=r"fallen off the bus \(exit 15\)") as info:
        await run_action(gpu.PowerCapAction(), make_ctx(node="gpu-node-02"), {"watts": 300})
    assert info.value.temporary is False


async def test_bug_report_is_stored_with_its_sha256_and_removed_from_the_node(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    ctx = make_ctx(node="gpu-node-02", run_id=11, step_id=4)
    output = await run_action(bugreport.BugReportAction(), ctx, {"safe_mode": True})
    artifacts = pathlib.Path(ctx.services["artifact_dir"])
    stored = artifacts / output["path"]
    assert output["path"] == "gpu-node-02/11-4-nvidia-bug-report.log.gz"
    data = stored.read_bytes()
    assert hashlib.sha256(data).hexdigest() == output["sha256"]
    assert output["size"] == len(data)
    assert b"Safe mode: yes" in gzip.decompress(data)
    driver = sim.driver_pod("gpu-node-02")
    assert sim.files("gpu-operator", driver["metadata"]["name"]) == {}
    assert output["removed_from_node"] is True
    again = await run_action(bugreport.BugReportAction(), ctx, {"safe_mode": True})
    assert again["already_in_place"] is True
    assert again["sha256"] == output["sha256"]


async def test_a_hanging_bug_report_is_a_timeout_failure(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    sim.cluster.hosts["gpu-node-03"].bug_report_hangs = True
    with pytest.raises(errors.ActionFailed, match=r"did not finish within 0\.5s") as info:
        await run_action(
            bugreport.BugReportAction(), make_ctx(node="gpu-node-03"), {"timeout_seconds": 0.5}
        )
    assert info.value.output["timed_out"] is True
