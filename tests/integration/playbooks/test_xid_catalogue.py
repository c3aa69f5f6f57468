"""The Xid catalogue end to end: an alert of each resolution class, in the shape of the captured
Alertmanager bodies with the labels dcgm-exporter puts on the Xid gauge (gpu, UUID, pci_bus_id,
Hostname, modelName, the workload's pod) plus the rule's xid and resolution labels, reaches its
playbook through the webhook and runs the catalogue's resolution on the simulator."""

from __future__ import annotations

from typing import Any

import pytest

from remediator.sim import kubelet, testing
from tests.integration.playbooks.conftest import (
    FakeNotifier,
    MakeGpuHarness,
    approve,
    built,
    cordoned,
    labels,
    only_run,
    pod_uids,
    post,
    statuses,
    step,
    taint_keys,
)

pytestmark = pytest.mark.timeout(90)

XID79_BODY = "GPUXidError79-firing-1alerts"  # gpu-node-03, GPU 3, research/jupyter-alice
UNHEALTHY = "nvidia.com/gpu-unhealthy"


def xid_alert(
    alertname: str,
    *,
    xid: str,
    resolution: str,
    severity: str,
    summary: str,
    extra: dict[str, str] | None = None,
) -> bytes:
    set_labels = {"xid": xid, "resolution": resolution, "severity": severity} | (extra or {})
    if not xid:
        del set_labels["xid"]
    return built(
        XID79_BODY,
        alertname=alertname,
        set_labels=set_labels,
        summary=summary,
        fingerprint=f"7a1c{int(xid or 0):04d}{len(alertname):02d}5e6f70",
    )


def on_gpu_2_of_node_02(sim: testing.RunningSim) -> dict[str, str]:
    gpu = sim.gpu("gpu-node-02", 2)
    return {
        "node": "gpu-node-02",
        "Hostname": "gpu-node-02",
        "instance": "gpu-node-02:9400",
        "gpu": "2",
        "device": "nvidia2",
        "UUID": gpu.uuid,
        "pci_bus_id": gpu.pci_bus_id,
        "namespace": "inference",
        "pod": "vllm-llama3-70b-7c9d5",
        "container": "vllm",
    }


async def test_an_application_xid_tells_the_workload_owner_and_touches_no_node(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    node = "gpu-node-03"
    before = pod_uids(sim, node)
    h = await gpu_harness()
    summary = "GPU 3 on gpu-node-03 reported an application Xid (31)"
    await post(
        h,
        xid_alert(
            "GPUXidApplication",
            xid="31",
            resolution="application",
            severity="warning",
            summary=summary,
        ),
    )
    detail = await only_run(h, playbook="gpu-xid-application")

    assert detail["status"] == "succeeded", statuses(detail)
    assert statuses(detail) == {"notify-owner": "succeeded"}
    assert not cordoned(sim, node)
    assert UNHEALTHY not in taint_keys(sim, node)
    assert "gpu-status" not in labels(sim, node)
    assert pod_uids(sim, node) == before
    assert sim.cluster.reboots == []
    [sent] = notifier.sent
    assert {
        "audience": "workload-owner",
        "namespace": "research",
        "pod": "jupyter-alice",
        "xid": "31",
        "resolution": "application",
    }.items() <= sent["data"].items()
    assert "research/jupyter-alice" in sent["message"]
    assert "no action on the node" in sent["message"]


async def test_a_memory_xid_drains_the_gpu_checks_its_rows_and_resets_it_after_approval(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    node = "gpu-node-02"
    assert kubelet.holders(sim.cluster, node, 2) == ["inference/vllm-llama3-70b-7c9d5"]
    h = await gpu_harness()
    await post(
        h,
        xid_alert(
            "GPUXidMemory",
            xid="64",
            resolution="reset",
            severity="warning",
            summary="GPU 2 on gpu-node-02 reported a memory Xid (64)",
            extra=on_gpu_2_of_node_02(sim),
        ),
    )
    detail = await only_run(h, playbook="gpu-xid-memory")

    assert detail["status"] == "waiting_approval", statuses(detail)
    assert cordoned(sim, node)
    assert UNHEALTHY in taint_keys(sim, node)
    assert step(detail, "drain-gpu")["output"]["holders"] == ["inference/vllm-llama3-70b-7c9d5"]
    assert "inference/vllm-llama3-70b-7c9d5" not in pod_uids(sim, node)
    assert step(detail, "row-remap")["output"]["verdict"] == "ok"
    assert statuses(detail)["reset"] == "pending"

    assert await approve(h, detail, "drain", "reset the GPU") == 200
    detail = await h.run_detail(detail["id"])
    assert detail["status"] == "succeeded", statuses(detail)
    assert step(detail, "ladder")["output"]["rung"] == "reset"
    assert step(detail, "reset")["output"]["reset"] is True
    assert step(detail, "reboot")["output"]["skipped"] is True
    assert sim.cluster.reboots == []


async def test_a_gsp_hang_resets_the_gpu_after_the_approved_drain(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    node = "gpu-node-03"
    h = await gpu_harness()
    await post(
        h,
        xid_alert(
            "GPUXidHang",
            xid="119",
            resolution="reboot",
            severity="critical",
            summary="GPU 3 on gpu-node-03 is hung (Xid 119)",
        ),
    )
    detail = await only_run(h, playbook="gpu-xid-hang")

    assert detail["status"] == "waiting_approval", statuses(detail)
    assert statuses(detail)["drain"] == "waiting_approval"
    assert cordoned(sim, node)
    assert labels(sim, node)["gpu-status"] == "faulty"
    assert step(detail, "drain-gpu")["output"]["holders"] == ["research/jupyter-alice"]
    assert notifier.sent[0]["data"]["xid"] == "119"

    assert await approve(h, detail, "drain", "reset the hung GPU") == 200
    detail = await h.run_detail(detail["id"])
    assert detail["status"] == "succeeded", statuses(detail)
    assert step(detail, "bug-report")["output"]["safe_mode"] is True
    assert step(detail, "ladder")["output"]["rung"] == "reset"
    assert step(detail, "reset")["output"]["reset"] is True
    assert step(detail, "reboot")["output"]["skipped"] is True


async def test_a_hung_gpu_the_reset_cannot_reach_reboots_the_node_in_the_same_episode(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    node = "gpu-node-03"
    sim.gpu(node, 3).lost = True  # the hung GSP no longer answers: nvidia-smi -r fails
    h = await gpu_harness()
    await post(
        h,
        xid_alert(
            "GPUXidHang",
            xid="120",
            resolution="reboot",
            severity="critical",
            summary="GPU 3 on gpu-node-03 is hung (Xid 120)",
        ),
    )
    detail = await only_run(h, playbook="gpu-xid-hang")
    assert await approve(h, detail, "drain", "GSP hung") == 200
    detail = await h.run_detail(detail["id"])

    assert detail["status"] == "succeeded", statuses(detail)
    assert step(detail, "ladder")["output"]["rung"] == "reset"
    assert step(detail, "reset")["output"]["escalated_to"] == "reboot"
    assert sim.cluster.reboots == [node]
    assert sim.gpu(node, 3).lost is False  # back after the reboot
    assert step(detail, "replace")["output"]["skipped"] is True
    assert cordoned(sim, node)  # never returned to service automatically


async def test_an_nvlink_xid_marks_the_node_for_investigation_without_a_reset(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    node = "gpu-node-02"
    h = await gpu_harness()
    await post(
        h,
        xid_alert(
            "GPUXidNVLink",
            xid="74",
            resolution="nvlink",
            severity="critical",
            summary="GPU 2 on gpu-node-02 reported an NVLink error (Xid 74)",
            extra=on_gpu_2_of_node_02(sim),
        ),
    )
    detail = await only_run(h, playbook="gpu-xid-nvlink")

    assert detail["status"] == "succeeded", statuses(detail)
    assert set(statuses(detail)) == {
        "notify-start",
        "cordon",
        "label",
        "drain-gpu",
        "bug-report",
        "notify",
    }
    assert cordoned(sim, node)
    assert labels(sim, node)["gpu-status"] == "nvlink-investigation"
    assert "inference/vllm-llama3-70b-7c9d5" not in pod_uids(sim, node)
    assert step(detail, "bug-report")["output"]["path"].endswith("nvidia-bug-report.log.gz")
    assert sim.cluster.reboots == []
    assert notifier.sent[-1]["data"]["action_needed"] == "investigate-nvlink"


async def recovery_action_run(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, recommended: str
) -> dict[str, Any]:
    """An Xid 154 on GPU 2 of gpu-node-02, whose driver recommends ``recommended``."""
    sim.gpu("gpu-node-02", 2).recovery_action = recommended
    h = await gpu_harness()
    await post(
        h,
        xid_alert(
            "GPUXidRecoveryAction",
            xid="154",
            resolution="recovery-action",
            severity="critical",
            summary="GPU 2 on gpu-node-02 needs a recovery action (Xid 154)",
            extra=on_gpu_2_of_node_02(sim),
        ),
    )
    return await only_run(h, playbook="gpu-xid-recovery-action")


async def test_a_recovery_action_xid_resets_the_gpu_when_the_driver_says_drain_and_reset(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    node = "gpu-node-02"
    detail = await recovery_action_run(gpu_harness, sim, "Drain and Reset")

    assert detail["status"] == "succeeded", statuses(detail)
    assert step(detail, "recovery")["output"]["rung"] == "reset"
    assert step(detail, "recovery")["output"]["recommended"] == "Drain and Reset"
    assert "inference/vllm-llama3-70b-7c9d5" not in pod_uids(sim, node)  # the GPU's pod only
    assert step(detail, "reset")["output"]["reset"] is True
    assert sim.gpu(node, 2).recovery_action == "None"  # the reset cleared it
    assert step(detail, "drain")["output"]["skipped"] is True
    assert step(detail, "reboot")["output"]["skipped"] is True
    assert not cordoned(sim, node)
    assert sim.cluster.reboots == []
    assert notifier.sent[-1]["data"]["action_needed"] == "review-recovery"


async def test_a_recovery_action_xid_drains_and_reboots_when_the_driver_says_node_reboot(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    node = "gpu-node-02"
    detail = await recovery_action_run(gpu_harness, sim, "Node Reboot")

    assert detail["status"] == "succeeded", statuses(detail)
    assert step(detail, "recovery")["output"]["rung"] == "reboot"
    assert step(detail, "reset")["output"]["skipped"] is True
    assert statuses(detail)["drain"] == "succeeded"
    assert sim.cluster.reboots == [node]
    assert cordoned(sim, node)  # back to service through return-node-to-service


async def test_a_recovery_action_xid_does_nothing_disruptive_when_the_driver_says_none(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    node = "gpu-node-02"
    before = pod_uids(sim, node)
    detail = await recovery_action_run(gpu_harness, sim, "None")

    assert detail["status"] == "succeeded", statuses(detail)
    assert step(detail, "recovery")["output"]["rung"] is None
    for key in ("drain-gpu", "reset", "drain", "reboot"):
        assert step(detail, key)["output"]["skipped"] is True, key
    assert pod_uids(sim, node) == before
    assert not cordoned(sim, node)
    assert sim.cluster.reboots == []
    assert statuses(detail)["bug-report"] == "succeeded"  # evidence all the same


async def test_an_xid_burst_notifies_with_the_count_beside_the_latest_codes_run(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    node = "gpu-node-03"
    h = await gpu_harness()
    await post(
        h,
        xid_alert(
            "GPUXidHang",
            xid="119",
            resolution="reboot",
            severity="critical",
            summary="GPU 3 on gpu-node-03 is hung (Xid 119)",
        ),
    )
    await post(
        h,
        xid_alert(
            "GPUXidBurst",
            xid="",
            resolution="burst",
            severity="warning",
            summary="GPU 3 on gpu-node-03 reported several Xid errors in 10m (2 changes)",
        ),
    )
    burst = await only_run(h, playbook="gpu-xid-burst")
    assert burst["status"] == "succeeded", statuses(burst)
    hang = await only_run(h, playbook="gpu-xid-hang")
    assert hang["status"] == "waiting_approval", statuses(hang)  # not held up by the burst
    [sent] = [m for m in notifier.sent if m["data"].get("resolution") == "burst"]
    assert "(2 changes)" in sent["message"]
    assert sent["data"]["action_needed"] == "read-xid-codes"
    assert cordoned(sim, node)  # by the hang's run only
