"""The non-disruptive playbooks: correctable-ECC watch, idle GPU, memory and power draw; and a
global dry run that records the whole plan while the cluster stays untouched."""

from __future__ import annotations

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
)

pytestmark = pytest.mark.timeout(60)

VLLM = ("inference", "vllm-llama3-70b-7c9d5")
UNDERUSED = "remediator.io/gpu-underutilized"


def pod_annotations(sim: testing.RunningSim, namespace: str, name: str) -> dict[str, str]:
    pod = sim.pod(namespace, name)
    assert pod is not None
    return dict(pod["metadata"].get("annotations") or {})


async def test_fast_correctable_ecc_marks_the_node_for_watch_and_changes_nothing_else(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    node = "gpu-node-02"
    h = await gpu_harness()
    firing = dict(
        alertname="GPUECCCorrectableRateHigh",
        set_labels={"severity": "warning"},
        summary="Correctable ECC errors are growing fast on GPU 5 of gpu-node-02",
        fingerprint="7c0ffee5badc0de1",
    )
    await post(h, built("GPUECCUncorrectableError-firing-1alerts", **firing))  # type: ignore[arg-type]
    detail = await only_run(h, playbook="gpu-ecc-correctable-rate")
    assert detail["status"] == "succeeded", statuses(detail)
    assert labels(sim, node)["gpu-watch"] == "ecc-correctable"
    assert "gpu-status" not in labels(sim, node)
    assert not cordoned(sim, node)
    assert taint_keys(sim, node) == {"nvidia.com/gpu"}
    assert "plan a replacement" in notifier.messages()[0]

    resolved = built("GPUECCUncorrectableError-firing-1alerts", status="resolved", **firing)  # type: ignore[arg-type]
    await post(h, resolved)
    assert await h.runs(kind="undo") == []
    assert labels(sim, node)["gpu-watch"] == "ecc-correctable"


async def test_low_utilization_annotates_the_pod_notifies_its_owner_and_never_evicts(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    h = await gpu_harness()
    uid = sim.pod(*VLLM)["metadata"]["uid"]  # type: ignore[index]
    await post(h, fixture("GPUUtilizationLow-firing-1alerts"))
    detail = await only_run(h, playbook="gpu-utilization-low")
    assert detail["status"] == "succeeded", statuses(detail)
    assert statuses(detail)["evict"] == "skipped"
    assert "below 30% utilization" in pod_annotations(sim, *VLLM)[UNDERUSED]
    assert sim.pod(*VLLM)["metadata"]["uid"] == uid  # type: ignore[index]
    [sent] = notifier.sent
    assert sent["data"]["namespace"] == "inference"
    assert sent["data"]["pod"] == "vllm-llama3-70b-7c9d5"
    assert "inference/vllm-llama3-70b-7c9d5" in sent["message"]
    workload = sent["notice"].workload  # the owner lookup read the live pod and namespace
    assert (workload.namespace, workload.pod) == ("inference", "vllm-llama3-70b-7c9d5")
    assert workload.lookup_error == ""
    assert sent["notice"].channel is None  # the routing chooses
    pod_events = [
        e["reason"]
        for e in sim.store.list("events", None)
        if e["involvedObject"].get("kind") == "Pod"
    ]
    assert pod_events == ["GPUUnderutilized"]

    await post(h, fixture("GPUUtilizationLow-resolved-1alerts"))
    undo = await only_run(h, kind="undo")
    assert undo["status"] == "succeeded"
    assert UNDERUSED not in pod_annotations(sim, *VLLM)


async def test_low_utilization_finds_the_workload_in_exported_labels(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    """When the scrape does not honour labels, `pod` is dcgm-exporter's own pod."""
    h = await gpu_harness()
    data = built(
        "GPUUtilizationLow-firing-1alerts",
        alertname="GPUUtilizationLow",
        set_labels={
            "pod": "nvidia-dcgm-exporter-x1",
            "namespace": "gpu-operator",
            "container": "nvidia-dcgm-exporter",
            "exported_pod": VLLM[1],
            "exported_namespace": VLLM[0],
            "exported_container": "vllm",
        },
        summary="GPU 2 on gpu-node-02 is underutilized (5%)",
        fingerprint="0e0e0e0e0e0e0e01",
    )
    await post(h, data)
    detail = await only_run(h, playbook="gpu-utilization-low")
    assert detail["status"] == "succeeded", statuses(detail)
    assert step(detail, "annotate-pod")["params"]["pod"] == VLLM[1]
    assert UNDERUSED in pod_annotations(sim, *VLLM)


@pytest.mark.parametrize(
    ("alertname", "playbook"),
    [("GPUMemoryUsageHigh", "gpu-memory-usage-high"), ("GPUPowerDrawHigh", "gpu-power-draw-high")],
)
async def test_memory_and_power_alerts_only_notify(
    gpu_harness: MakeGpuHarness,
    sim: testing.RunningSim,
    notifier: FakeNotifier,
    alertname: str,
    playbook: str,
) -> None:
    node = "gpu-node-01"
    h = await gpu_harness()
    data = built(
        "GPUTemperatureHigh-resolved-1alerts",
        alertname=alertname,
        status="firing",
        set_labels={"severity": "warning"},
        summary=f"{alertname} on GPU 0 of {node}",
        fingerprint="1234abcd5678ef90",
    )
    await post(h, data)
    detail = await only_run(h, playbook=playbook)
    assert detail["status"] == "succeeded", statuses(detail)
    assert [s["status"] for s in detail["steps"] if s["action"] != "notify"] in ([], ["skipped"])
    assert notifier.messages()[0].startswith(f"{alertname} on GPU 0 of {node}.")
    assert sim.gpu(node, 0).power_limit == 700.0
    assert not cordoned(sim, node)
    assert node_events(sim, node) == []


async def test_a_dry_run_records_the_whole_plan_and_leaves_the_cluster_untouched(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    node = "gpu-node-01"
    h = await gpu_harness(dry_run=True)
    before = pod_uids(sim, node)
    await post(h, fixture("GPUTemperatureCritical-firing-1alerts"))
    detail = await only_run(h, playbook="gpu-temperature-critical")
    assert detail["dryRun"] is True
    assert step(detail, "drain")["status"] == "waiting_approval"  # the gate is rehearsed too
    assert await approve(h, detail, "drain") == 200
    detail = await h.run_detail(detail["id"])
    assert detail["status"] == "succeeded", statuses(detail)
    would = {s["key"]: s["output"]["would"] for s in detail["steps"]}
    assert all(s["output"]["dry_run"] is True for s in detail["steps"])
    assert would["power-cap"] == "apply cap GPU power on (alert node) to 70% of default"
    assert would["cordon"] == "apply cordon node (alert node)"
    assert would["drain"] == "apply drain node (alert node) (timeout 300s)"
    await post(h, fixture("GPUTemperatureCritical-resolved-1alerts"))
    assert await h.runs(kind="undo") == []  # nothing was done, so nothing to undo

    assert sim.gpu(node, 0).power_limit == 700.0
    assert not cordoned(sim, node)
    assert pod_uids(sim, node) == before
    assert node_events(sim, node) == []
