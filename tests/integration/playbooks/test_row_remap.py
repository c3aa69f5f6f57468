"""gpu-row-remap: a pending row remap is reset away; a failed one marks the node for
replacement, both through the webhook with the real Alertmanager payload shape."""

from __future__ import annotations

import pytest

from remediator.sim import testing
from tests.integration.playbooks.conftest import (
    FakeNotifier,
    MakeGpuHarness,
    approve,
    built,
    cordoned,
    labels,
    only_run,
    post,
    statuses,
    step,
)

pytestmark = pytest.mark.timeout(90)

NODE = "gpu-node-02"


def alert(name: str, severity: str, summary: str) -> bytes:
    return built(
        "GPUECCUncorrectableError-firing-1alerts",
        alertname=name,
        set_labels={"severity": severity},
        summary=summary,
        fingerprint="5f0c1d2e3a4b5c6d",
    )


async def test_a_pending_row_remap_is_applied_by_a_gpu_reset_after_the_drain(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    gpu = sim.gpu(NODE, 5)
    gpu.remap_pending, gpu.remapped_uncorrectable = True, 1
    h = await gpu_harness()
    await post(
        h, alert("GPURowRemapPending", "warning", "GPU 5 on gpu-node-02 has a row remap pending")
    )
    detail = await only_run(h, playbook="gpu-row-remap")
    assert detail["status"] == "waiting_approval", statuses(detail)
    assert cordoned(sim, NODE)
    assert await approve(h, detail, "drain") == 200
    detail = await h.run_detail(detail["id"])
    assert detail["status"] == "succeeded", statuses(detail)
    assert step(detail, "row-remap")["output"]["verdict"] == "reset"
    assert step(detail, "reset")["output"]["reset"] is True
    assert (gpu.remap_pending, gpu.remapped_uncorrectable) == (False, 1)
    assert step(detail, "reboot")["output"]["skipped"] is True
    assert step(detail, "replace")["output"]["skipped"] is True
    assert "remediator.io/replace" not in labels(sim, NODE)


async def test_a_failed_row_remap_marks_the_node_for_replacement_without_a_reset(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    gpu = sim.gpu(NODE, 5)
    gpu.remap_failure, gpu.remapped_uncorrectable = True, 8
    h = await gpu_harness()
    await post(
        h,
        alert(
            "GPURowRemapFailure", "critical", "GPU 5 on gpu-node-02 failed to remap a memory row"
        ),
    )
    detail = await only_run(h, playbook="gpu-row-remap")
    assert await approve(h, detail, "drain") == 200
    detail = await h.run_detail(detail["id"])
    assert detail["status"] == "succeeded", statuses(detail)
    assert step(detail, "ladder")["output"]["rung"] == "reset"
    assert step(detail, "row-remap")["output"]["ladder_rung"] == "replace"
    assert step(detail, "reset")["output"]["skipped"] is True
    assert step(detail, "reboot")["output"]["skipped"] is True
    evidence = step(detail, "replace")["output"]["evidence"]
    assert evidence["remapped_rows"][0]["failure"] is True
    assert (
        evidence["bug_report"]
        == f"/api/v1/artifacts/{step(detail, 'bug-report')['output']['path']}"
    )
    assert labels(sim, NODE)["remediator.io/replace"] == "gpu"
    assert any(m["data"].get("action_needed") == "replace-gpu" for m in notifier.sent)
    assert not any("-r" in e.argv for e in sim.cluster.exec_log)
