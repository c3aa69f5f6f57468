"""gpu-xid-error and gpu-ecc-uncorrectable: take the node out of service, drain after approval,
collect the bug report, never put the node back automatically; return-node-to-service does."""

from __future__ import annotations

import gzip
import hashlib
import pathlib
from typing import Any

import aiohttp
import pytest

from remediator.sim import testing
from tests.integration.playbooks.conftest import (
    FakeNotifier,
    MakeGpuHarness,
    approve,
    built,
    cordoned,
    fixture,
    labels,
    node_events,
    only_run,
    pod_uids,
    post,
    statuses,
    step,
    taint_keys,
    trigger,
)

pytestmark = pytest.mark.timeout(90)

UNHEALTHY = "nvidia.com/gpu-unhealthy"


async def set_faults(sim: testing.RunningSim, body: dict[str, object]) -> None:
    async with (
        aiohttp.ClientSession(headers=sim.headers) as http,
        http.put(f"{sim.url}/sim/v1/faults", json=body) as response,
    ):
        assert response.status == 200


def assert_out_of_service(sim: testing.RunningSim, node: str) -> None:
    assert cordoned(sim, node)
    assert labels(sim, node)["gpu-status"] == "faulty"
    assert UNHEALTHY in taint_keys(sim, node)


def assert_bug_report_stored(output: dict, artifacts: pathlib.Path) -> bytes:  # type: ignore[type-arg]
    data = (artifacts / output["path"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == output["sha256"]
    assert output["size"] == len(data)
    sidecar = (artifacts / (output["path"] + ".sha256")).read_text()
    assert sidecar.split()[0] == output["sha256"]
    return gzip.decompress(data)


async def test_xid79_takes_the_node_out_drains_after_approval_and_keeps_it_out(
    gpu_harness: MakeGpuHarness,
    sim: testing.RunningSim,
    notifier: FakeNotifier,
    tmp_path: pathlib.Path,
) -> None:
    node = "gpu-node-03"
    sim.gpu(node, 3).lost = True  # what Xid 79 means: nvidia-smi fails with exit 15
    h = await gpu_harness()
    await post(h, fixture("GPUXidError79-firing-1alerts"))
    detail = await only_run(h, playbook="gpu-xid-error")
    assert detail["status"] == "waiting_approval", statuses(detail)
    assert_out_of_service(sim, node)
    # Only the lost GPU's pod is gone already (gpu.drain_workloads); the rest waits.
    assert "research/jupyter-alice" not in pod_uids(sim, node)
    assert step(detail, "drain-gpu")["output"]["holders"] == ["research/jupyter-alice"]
    started, waiting, held = notifier.sent
    assert held["data"]["event"] == "approval"  # the engine's own notice, once
    assert "step drain (node.drain) needs approval" in held["message"]
    assert started["data"]["stage"] == "started"
    assert started["data"]["needs_approval"] == "drain"
    assert started["data"]["workload"] == "research/jupyter-alice"
    for words in (
        "GPU 3 on gpu-node-03 has fallen off the bus (Xid 79)",
        sim.gpu(node, 3).uuid,
        "cordon, label gpu-status=faulty, taint",
        "always needs your approval",
        "dmesg | grep -i xid",
    ):
        assert words in started["message"]
    assert "Approve the drain" in waiting["message"]

    assert await approve(h, detail, "drain", "GPU is gone; evacuate") == 200
    detail = await h.run_detail(detail["id"])
    assert detail["status"] == "succeeded", statuses(detail)
    assert "research/jupyter-alice" not in pod_uids(sim, node)  # bare pod: force
    report = step(detail, "bug-report")["output"]
    assert report["safe_mode"] is True
    text = assert_bug_report_stored(report, tmp_path / "artifacts")
    assert b"Safe mode: yes" in text
    assert b"79, GPU has fallen off the bus" in text
    # The first rung: the reset cannot reach a GPU off the bus, so this episode reboots.
    assert step(detail, "ladder")["output"]["rung"] == "reset"
    assert step(detail, "reset")["output"]["escalated_to"] == "reboot"
    assert "fallen off the bus" in step(detail, "reset")["output"]["error"]
    assert sim.cluster.reboots == [node]
    assert sim.gpu(node, 3).lost is False  # back after the reboot
    assert step(detail, "replace")["output"]["skipped"] is True
    assert "escalation ladder" in notifier.messages()[-1]
    reasons = node_events(sim, node)
    # The GPU's pod was the node's only one: the node drain found nothing left to evict.
    for reason in ("RemediatorCordon", "RemediatorLabel", "RemediatorTaint", "RemediatorGpuDrain"):
        assert reason in reasons
    assert "RemediatorBugReport" in reasons
    assert "RemediatorReboot" in reasons

    # The Xid gauge drops back and the alert resolves: the node stays out of service.
    await post(h, fixture("GPUXidError79-resolved-1alerts"))
    assert await h.runs(kind="undo") == []
    assert_out_of_service(sim, node)

    # After the repair an operator returns it with the runbook.
    sim.gpu(node, 3).lost = False
    run_id = await trigger(h, "return-node-to-service", {"node": node}, node)
    back = await h.run_detail(run_id)
    assert back["status"] == "succeeded", statuses(back)
    assert not cordoned(sim, node)
    assert labels(sim, node)["gpu-status"] == "healthy"
    assert UNHEALTHY not in taint_keys(sim, node)
    assert "nvidia.com/gpu" in taint_keys(sim, node)  # the cluster's own taint stays
    verify = step(back, "verify")["output"]
    assert len(verify["gpus"]) == 8
    assert verify["problems"] == {}
    pods = step(back, "operator-pods")["output"]["pods"]
    assert len(pods) == 2
    assert set(pods.values()) == {"Running"}
    assert back["events"][0]["actor"] == "alice"


async def test_a_bug_report_that_fails_does_not_stop_the_run(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier, clock: Any
) -> None:
    node = "gpu-node-03"
    h = await gpu_harness()
    await post(h, fixture("GPUXidError79-firing-1alerts"))
    detail = await only_run(h, playbook="gpu-xid-error")
    driver = sim.driver_pod(node)["metadata"]["name"]
    exec_path = f"/api/v1/namespaces/gpu-operator/pods/{driver}/exec"
    await set_faults(sim, {"rules": [{"path_prefix": exec_path, "drop_websocket_rate": 1.0}]})
    assert await approve(h, detail, "drain") == 200
    detail = await h.run_detail(detail["id"])
    # A dropped stream is temporary: retried with backoff until the step's retry budget
    # (5 minutes by default) is spent, then the step fails and the run goes on.
    assert statuses(detail)["bug-report"] == "pending", step(detail, "bug-report")
    for _ in range(12):
        clock.advance(30)
        await h.settle()
    detail = await h.run_detail(detail["id"])
    assert statuses(detail)["bug-report"] == "failed", step(detail, "bug-report")
    assert step(detail, "bug-report")["attempt"] > 3
    assert "nvidia-bug-report.sh" in step(detail, "bug-report")["error"]
    # The exec stream is back: the ladder's reset (the GPU still answers) goes ahead.
    await set_faults(sim, {"rules": []})
    for _ in range(12):
        if statuses(await h.run_detail(detail["id"]))["notify"] == "succeeded":
            break
        clock.advance(30)
        await h.settle()
    detail = await h.run_detail(detail["id"])
    assert statuses(detail)["reset"] == "succeeded", step(detail, "reset")
    assert statuses(detail)["notify"] == "succeeded"
    assert "escalation ladder" in notifier.messages()[-1]


async def test_uncorrectable_ecc_takes_the_node_out_and_collects_a_full_bug_report(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, tmp_path: pathlib.Path
) -> None:
    node = "gpu-node-02"
    sim.gpu(node, 5).ecc_uncorrected_volatile = 2
    h = await gpu_harness()
    before = pod_uids(sim, node)
    await post(h, fixture("GPUECCUncorrectableError-firing-1alerts"))
    detail = await only_run(h, playbook="gpu-ecc-uncorrectable")
    assert detail["status"] == "waiting_approval", statuses(detail)
    assert_out_of_service(sim, node)
    assert pod_uids(sim, node) == before

    assert await approve(h, detail, "drain") == 200
    detail = await h.run_detail(detail["id"])
    assert detail["status"] == "succeeded", statuses(detail)
    assert "inference/vllm-llama3-70b-7c9d5" in step(detail, "drain")["output"]["gone"]
    report = step(detail, "bug-report")["output"]
    assert report["safe_mode"] is False
    assert b"Safe mode: no" in assert_bug_report_stored(report, tmp_path / "artifacts")
    # The ladder's first rung: the GPU is reset and its volatile counters clear.
    assert step(detail, "ladder")["output"]["rung"] == "reset"
    assert step(detail, "row-remap")["output"]["verdict"] == "ok"
    assert step(detail, "reset")["output"]["reset"] is True
    assert sim.gpu(node, 5).ecc_uncorrected_volatile == 0
    assert step(detail, "reboot")["output"]["skipped"] is True

    await post(h, fixture("GPUECCUncorrectableError-resolved-1alerts"))
    assert await h.runs(kind="undo") == []
    assert_out_of_service(sim, node)

    # The errors come back before anyone returns the node: the runbook refuses, changes nothing.
    sim.gpu(node, 5).ecc_uncorrected_volatile = 2
    run_id = await trigger(h, "return-node-to-service", {"node": node}, node)
    refused = await h.run_detail(run_id)
    assert refused["status"] == "failed"
    error = step(refused, "verify")["error"]
    assert sim.gpu(node, 5).uuid in error
    assert "uncorrectable ECC errors (volatile 2)" in error
    assert statuses(refused)["uncordon"] == "skipped"
    assert_out_of_service(sim, node)


async def test_an_ecc_xid_is_answered_by_the_ecc_playbook(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    node = "gpu-node-02"
    h = await gpu_harness()
    data = built(
        "GPUECCUncorrectableError-firing-1alerts",
        alertname="GPUXidErrorECC",
        set_labels={"xid": "48"},
        summary="GPU 5 on gpu-node-02 reported an ECC Xid (48)",
        fingerprint="5b1e0c2a9d7f4e31",
    )
    await post(h, data)
    detail = await only_run(h)
    assert detail["playbook"] == "gpu-ecc-uncorrectable"
    assert step(detail, "drain")["status"] == "waiting_approval"
    assert_out_of_service(sim, node)
    assert notifier.sent[0]["data"]["xid"] == "48"
