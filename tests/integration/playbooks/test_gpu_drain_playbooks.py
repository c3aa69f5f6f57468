"""gpu-xid-error and gpu-ecc-uncorrectable evict the failed GPU's pods first, without waiting
for the approval the node drain needs; when the holders cannot be told they evict nothing and
leave it to the node drain."""

from __future__ import annotations

import pytest

from remediator.sim import kubelet, testing
from tests.integration.playbooks.conftest import (
    MakeGpuHarness,
    approve,
    built,
    fixture,
    only_run,
    pod_uids,
    post,
    statuses,
    step,
)
from tests.integration.playbooks.test_hardware_faults import set_faults

pytestmark = pytest.mark.timeout(90)

NODE = "gpu-node-04"  # vllm-llama3-70b-x8k2p on GPU 0, llama-finetune-1 on GPUs 1 and 2


def xid79_on_gpu_1(sim: testing.RunningSim) -> bytes:
    gpu = sim.gpu(NODE, 1)
    return built(
        "GPUXidError79-firing-1alerts",
        alertname="GPUXidError79",
        set_labels={
            "node": NODE,
            "Hostname": NODE,
            "instance": f"{NODE}:9400",
            "gpu": "1",
            "device": "nvidia1",
            "UUID": gpu.uuid,
            "pci_bus_id": gpu.pci_bus_id,
            "modelName": "NVIDIA H200",
            "namespace": "ml-training",
            "pod": "llama-finetune-1",
            "container": "trainer",
        },
        summary=f"GPU 1 on {NODE} has fallen off the bus (Xid 79)",
        fingerprint="5d0c1e2f3a4b5c6d",
    )


async def test_xid79_evicts_the_lost_gpus_pod_at_once_and_the_rest_after_approval(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    assert kubelet.holders(sim.cluster, NODE, 1) == ["ml-training/llama-finetune-1"]
    sim.gpu(NODE, 1).lost = True
    before = pod_uids(sim, NODE)
    h = await gpu_harness()
    await post(h, xid79_on_gpu_1(sim))
    detail = await only_run(h, playbook="gpu-xid-error")

    assert detail["status"] == "waiting_approval", statuses(detail)
    assert statuses(detail)["drain-gpu"] == "succeeded", step(detail, "drain-gpu")
    assert statuses(detail)["drain"] == "waiting_approval"
    output = step(detail, "drain-gpu")["output"]
    assert output["holders"] == ["ml-training/llama-finetune-1"]
    assert output["source"] == "kubelet device allocation"
    after = pod_uids(sim, NODE)
    assert "ml-training/llama-finetune-1" not in after  # the node is tainted: not back here
    assert {k: v for k, v in before.items() if k != "ml-training/llama-finetune-1"} == after

    assert await approve(h, detail, "drain", "reset needs the node empty") == 200
    detail = await h.run_detail(detail["id"])
    assert statuses(detail)["drain"] == "succeeded", step(detail, "drain")
    assert "inference/vllm-llama3-70b-x8k2p" in step(detail, "drain")["output"]["gone"]


async def test_ecc_without_a_readable_allocation_evicts_nothing_and_leaves_it_to_the_drain(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    node = "gpu-node-02"  # the fixture names GPU 5 and no pod
    sim.gpu(node, 5).ecc_uncorrected_volatile = 2
    driver = sim.driver_pod(node)["metadata"]["name"]
    exec_path = f"/api/v1/namespaces/gpu-operator/pods/{driver}/exec"
    await set_faults(sim, {"rules": [{"path_prefix": exec_path, "drop_websocket_rate": 1.0}]})
    before = pod_uids(sim, node)
    h = await gpu_harness()
    await post(h, fixture("GPUECCUncorrectableError-firing-1alerts"))
    detail = await only_run(h, playbook="gpu-ecc-uncorrectable")

    assert statuses(detail)["drain-gpu"] == "failed", step(detail, "drain-gpu")
    error = step(detail, "drain-gpu")["error"]
    assert "cannot tell which pods hold GPU" in error
    assert "the alert names no pod" in error
    assert statuses(detail)["drain"] == "waiting_approval"  # escalated to the node drain
    assert pod_uids(sim, node) == before
