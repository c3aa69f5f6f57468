"""gpu.cuda_smoke_test: a CUDA sample in a pod with one GPU on the node, which must exit 0."""

from __future__ import annotations

import pytest

from remediator.actions import health, smoke
from remediator.domain import errors
from remediator.sim import testing
from tests.integration.kube.conftest import MakeContext, run_action

NODE = "gpu-node-04"  # no workload holds its GPUs
SAMPLE = "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0"


def smoke_pods(sim: testing.RunningSim) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in sim.pods(namespace="gpu-operator")
        if p["metadata"]["name"].startswith("remediator-cuda-smoke-")
    ]


async def test_the_sample_passes_on_a_healthy_node_and_its_pod_is_deleted(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    output = await run_action(
        smoke.CudaSmokeTestAction(), make_ctx(node=NODE), {"image": SAMPLE, "timeout_seconds": 30}
    )
    assert output["phase"] == "Succeeded"
    assert output["containers"][0].startswith("cuda: Completed (exit 0)")
    assert "Test PASSED" in output["containers"][0]
    assert smoke_pods(sim) == []


async def test_a_node_without_a_healthy_gpu_fails_the_smoke_test(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    for index in range(8):
        sim.gpu(NODE, index).ecc_uncorrected_volatile = 2  # the device plugin hands none out
    with pytest.raises(errors.ActionFailed) as failed:
        await run_action(
            smoke.CudaSmokeTestAction(),
            make_ctx(node=NODE),
            {"image": SAMPLE, "timeout_seconds": 30},
        )
    assert "UnexpectedAdmissionError" in str(failed.value)
    assert "Requested: 1, Available: 0" in str(failed.value)
    assert failed.value.output["phase"] == "Failed"
    assert smoke_pods(sim) == []


async def test_a_pod_that_never_starts_times_out_with_its_waiting_reason(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    sim.cluster.unpullable_images.add(SAMPLE)
    with pytest.raises(errors.ActionFailed, match="ImagePullBackOff"):
        await run_action(
            smoke.CudaSmokeTestAction(),
            make_ctx(node=NODE),
            {"image": SAMPLE, "timeout_seconds": 0.5},
        )
    assert smoke_pods(sim) == []


async def test_without_an_image_the_optional_check_is_skipped(make_ctx: MakeContext) -> None:
    output = await run_action(smoke.CudaSmokeTestAction(), make_ctx(node=NODE), {})
    assert output == {"already_in_place": True, "skipped": "no image configured"}


async def test_a_smoke_pod_left_behind_is_not_taken_for_a_gpu_operator_pod(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    sim.cluster.unpullable_images.add(SAMPLE)  # it will wait in ImagePullBackOff for ever
    ctx = make_ctx(node=NODE)
    params = smoke.SmokeParams(image=SAMPLE)
    await ctx.require_cluster().create_pod("gpu-operator", smoke.manifest(ctx, params, NODE))
    await sim.wait_for(lambda: bool(smoke_pods(sim)))
    output = await run_action(health.OperatorPodsAction(), ctx, {"node": NODE})
    assert output["waiting"] == {}
    assert not any("cuda-smoke" in key for key in output["pods"])
