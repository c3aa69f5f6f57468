"""The manual runbooks: fleet-health-sweep, and return-node-to-service waiting for the GPU
Operator's pods; plus the report's parsing and flagging rules."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from remediator.actions import health
from remediator.sim import testing
from tests.integration.playbooks.conftest import (
    FakeNotifier,
    MakeGpuHarness,
    cordoned,
    statuses,
    step,
    trigger,
)

pytestmark = pytest.mark.timeout(60)


async def test_fleet_health_sweep_reports_every_gpu_and_flags_the_guide_thresholds(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    sim.gpu("gpu-node-01", 0).temperature = 92
    sim.gpu("gpu-node-01", 1).temperature = 87
    sim.gpu("gpu-node-01", 2).temperature = 80  # the guide's health check flags >= 80°C
    sim.gpu("gpu-node-01", 3).temperature = 79
    sim.gpu("gpu-node-04", 6).ecc_uncorrected_volatile = 1
    full = sim.gpu("gpu-node-04", 7)
    full.memory_used = int(full.memory_total * 0.98)
    sim.gpu("gpu-node-03", 3).lost = True
    h = await gpu_harness()
    run_id = await trigger(h, "fleet-health-sweep", {}, None)
    detail = await h.run_detail(run_id)
    # Like the guide's script (non-zero exit when anything is wrong): critical findings fail
    # the run (fail_on: critical by default); the report is kept.
    assert detail["status"] == "failed", statuses(detail)
    assert statuses(detail) == {"report": "failed"}
    assert "GPU health sweep found critical problems" in step(detail, "report")["error"]
    report = step(detail, "report")["output"]
    assert report["node_selector"] == "nvidia.com/gpu.present=true"
    nodes = {n["node"]: n for n in report["nodes"]}
    assert sorted(nodes) == ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
    summary = report["summary"]
    assert summary["gpus"] == 31  # 32 GPUs, one lost
    assert summary["lost_gpus"] == 1
    assert summary["worst"] == "critical"

    def gpu(node: str, index: int) -> dict[str, Any]:
        return next(g for g in nodes[node]["gpus"] if g["index"] == index)

    assert gpu("gpu-node-01", 0)["severity"] == "critical"
    assert gpu("gpu-node-01", 1)["flags"] == ["critical: temperature 87C > 85C"]
    assert gpu("gpu-node-01", 2)["flags"] == ["warning: temperature 80C >= 80C"]
    assert gpu("gpu-node-01", 3)["flags"] == []
    assert gpu("gpu-node-04", 6)["flags"] == ["critical: 1 uncorrectable ECC errors"]
    assert "warning: memory 98% > 95%" in gpu("gpu-node-04", 7)["flags"]
    assert gpu("gpu-node-02", 2)["flags"] == ["warning: utilization 12% < 30% (held)"]
    assert nodes["gpu-node-02"]["gpus_allocated"] == 1  # vLLM's one GPU: the busy one
    assert nodes["gpu-node-02"]["flags"] == []
    # Fine-tuning (2) and vLLM (1) hold three of gpu-node-04's GPUs; only GPU 7 shows any use.
    assert nodes["gpu-node-04"]["gpus_allocated"] == 3
    assert nodes["gpu-node-04"]["flags"] == [
        "warning: 3 GPUs allocated to pods, 1 in use (utilization >= 30% or memory in use)"
    ]
    assert any("gpu-node-04: 3 GPUs allocated to pods" in f for f in summary["findings"])
    assert gpu("gpu-node-03", 0)["severity"] == "ok"
    assert gpu("gpu-node-01", 0)["temperature_c"] == 92
    assert gpu("gpu-node-01", 0)["power_limit_w"] == 700
    assert nodes["gpu-node-03"]["severity"] == "critical"
    assert nodes["gpu-node-03"]["lost"] == ["0000:48:00.0"]
    assert any("gpu-node-03: GPU 0000:48:00.0 is lost" in f for f in summary["findings"])
    # The findings reach on-call, worst first, with the counts.
    [sent] = notifier.sent
    assert report["notified"]["delivered"] is True
    assert sent["data"]["event"] == "gpu_health_sweep"
    assert sent["data"]["worst"] == "critical"
    assert sent["data"]["findings"] == sorted(
        summary["findings"], key=lambda f: not f.startswith("critical")
    )
    message = sent["message"]
    assert message.startswith(
        "GPU health sweep of 4 node(s) matching 'nvidia.com/gpu.present=true'"
    )
    assert "critical: gpu-node-01 GPU 1 (" in message
    assert "temperature 87C > 85C" in message
    assert "warning: gpu-node-01 GPU 2 (" in message
    assert message.index("critical:") < message.index("warning:")


async def test_fleet_health_sweep_thresholds_and_fail_on_are_parameters(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    sim.gpu("gpu-node-01", 0).temperature = 87
    sim.gpu("gpu-node-01", 1).temperature = 82
    h = await gpu_harness()
    params = {"temperature_warning": 85, "temperature_critical": 90, "fail_on": "never"}
    run_id = await trigger(h, "fleet-health-sweep", params, None)
    detail = await h.run_detail(run_id)
    assert detail["status"] == "succeeded", statuses(detail)
    report = step(detail, "report")["output"]
    rows = {(n["node"], g["index"]): g for n in report["nodes"] for g in n["gpus"]}
    assert rows[("gpu-node-01", 0)]["flags"] == ["warning: temperature 87C >= 85C"]
    assert rows[("gpu-node-01", 1)]["flags"] == []
    assert "temperature 87C >= 85C" in notifier.sent[0]["message"]

    sim.gpu("gpu-node-01", 0).temperature = 82  # a warning with the default 80°C
    run_id = await trigger(h, "fleet-health-sweep", {"fail_on": "warning"}, None)
    detail = await h.run_detail(run_id)
    assert detail["status"] == "failed", statuses(detail)
    assert "found warning problems" in step(detail, "report")["error"]


async def test_fleet_health_sweep_reads_as_many_nodes_at_once_as_asked_up_to_64(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    h = await gpu_harness()
    run_id = await trigger(
        h, "fleet-health-sweep", {"max_concurrency": 2, "fail_on": "never"}, None
    )
    detail = await h.run_detail(run_id)
    assert detail["status"] == "succeeded", statuses(detail)
    assert len(step(detail, "report")["output"]["nodes"]) == 4

    run_id = await trigger(h, "fleet-health-sweep", {"max_concurrency": 65}, None)
    detail = await h.run_detail(run_id)
    assert detail["status"] == "failed", statuses(detail)
    assert "max_concurrency" in detail["reason"], detail["reason"]


async def test_fleet_health_sweep_reports_a_node_it_cannot_read(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    def not_running(pod: dict[str, Any]) -> None:
        pod["status"]["phase"] = "Pending"

    sim.cluster.settings.pod_startup_seconds = 10**6  # the kubelet does not start it meanwhile
    driver = sim.driver_pod("gpu-node-04")["metadata"]["name"]
    sim.store.mutate("pods", "gpu-operator", driver, not_running)
    h = await gpu_harness()
    run_id = await trigger(
        h, "fleet-health-sweep", {"node_selector": "kubernetes.io/hostname"}, None
    )
    detail = await h.run_detail(run_id)
    report = step(detail, "report")["output"]
    assert report["node_selector"] == "kubernetes.io/hostname"
    nodes = {n["node"]: n for n in report["nodes"]}
    assert "cpu-node-01" not in nodes  # never outside the GPU node selector
    assert "no running GPU driver pod" in nodes["gpu-node-04"]["error"]
    assert report["summary"]["unreachable_nodes"] == ["gpu-node-04"]


async def test_return_to_service_waits_for_the_gpu_operator_pods_to_run(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, clock: Any
) -> None:
    node = "gpu-node-04"

    def cordon(obj: dict[str, Any]) -> None:
        obj["spec"]["unschedulable"] = True

    def phase(value: str) -> Any:
        def set_phase(pod: dict[str, Any]) -> None:
            pod["status"]["phase"] = value

        return set_phase

    sim.store.mutate("nodes", "", node, cordon)  # cordoned by a human, not by remediator
    sim.cluster.settings.pod_startup_seconds = 10**6  # the kubelet does not start it meanwhile
    exporter = next(
        p["metadata"]["name"]
        for p in sim.pods(node=node, namespace="gpu-operator")
        if p["metadata"]["labels"].get("app") == "nvidia-dcgm-exporter"
    )
    sim.store.mutate("pods", "gpu-operator", exporter, phase("Pending"))
    h = await gpu_harness()
    run_id = await trigger(h, "return-node-to-service", {"node": node}, node)
    detail = await h.run_detail(run_id)
    waiting = step(detail, "operator-pods")
    assert waiting["status"] == "pending", statuses(detail)
    assert f"gpu-operator/{exporter} (Pending)" in waiting["error"]
    assert not cordoned(sim, node)  # a human's cordon: only_if_cordoned_by_us is false

    sim.store.mutate("pods", "gpu-operator", exporter, phase("Running"))  # it started
    clock.advance(60)
    await h.settle()
    detail = await h.run_detail(run_id)
    assert detail["status"] == "succeeded", statuses(detail)
    assert step(detail, "operator-pods")["attempt"] == 2


async def test_return_to_service_waits_for_a_running_driver_pod_to_become_ready(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, clock: Any
) -> None:
    node = "gpu-node-04"

    def ready(value: bool) -> Any:
        def set_ready(pod: dict[str, Any]) -> None:
            for condition in pod["status"]["conditions"]:
                if condition["type"] in ("Ready", "ContainersReady"):
                    condition["status"] = "True" if value else "False"

        return set_ready

    sim.store.mutate("nodes", "", node, lambda obj: obj["spec"].update(unschedulable=True))
    driver = next(
        p["metadata"]["name"]
        for p in sim.pods(node=node, namespace="gpu-operator")
        if p["metadata"]["labels"].get("app") == "nvidia-driver-daemonset"
    )
    sim.store.mutate("pods", "gpu-operator", driver, ready(False))  # running, probe failing
    h = await gpu_harness()
    run_id = await trigger(h, "return-node-to-service", {"node": node}, node)
    detail = await h.run_detail(run_id)
    waiting = step(detail, "operator-pods")
    assert waiting["status"] == "pending", statuses(detail)
    assert f"gpu-operator/{driver} (Running, not ready)" in waiting["error"]

    sim.store.mutate("pods", "gpu-operator", driver, ready(True))
    clock.advance(60)
    await h.settle()
    detail = await h.run_detail(run_id)
    assert detail["status"] == "succeeded", statuses(detail)


def test_health_rows_are_parsed_by_position_and_unreadable_counters_are_not_zero() -> None:
    text = (
        "0, GPU-a, 00000000:18:00.0, NVIDIA H100 80GB HBM3, 41, 97, 71230, 81559, 0, 0, 3, "
        "612.40, 700.00, 700.00\n"
        "1, GPU-b, 00000000:28:00.0, NVIDIA H100 80GB HBM3, 40, 5, 10, 81559, [N/A], [N/A], "
        "[N/A], 98.00, 700.00, 700.00\n"
        "Unable to determine the device handle for GPU0000:48:00.0: GPU is lost.  Reboot the "
        "system to recover this GPU\n"
    )
    gpus, lost = health.parse_health(text)
    assert [g.uuid for g in gpus] == ["GPU-a", "GPU-b"]
    assert gpus[0].ecc_uncorrected_volatile == 0
    assert gpus[1].ecc_uncorrected_volatile is None
    assert lost == ["0000:48:00.0"]
    problems = health.verify_problems(gpus, lost, health.VerifyParams(), expected=8)
    assert problems == {
        "0000:48:00.0": "GPU is lost (fallen off the bus)",
        "GPU-b": "ECC counters not reported (volatile)",
        "(node)": "2 of 8 GPUs answer nvidia-smi",
    }
    relaxed = health.VerifyParams(require_ecc=False)
    assert health.verify_problems(gpus, [], relaxed, expected=None) == {}


IDLE_GPU = health.GpuHealth(
    index=0,
    uuid="GPU-a",
    pci_bus_id="00000000:18:00.0",
    name="H100",
    temperature=35,
    utilization=0,
    memory_used=0,
    memory_total=81559,
    ecc_uncorrected_volatile=0,
    ecc_uncorrected_aggregate=0,
    ecc_corrected_volatile=0,
    power_draw=70,
    power_limit=700,
    power_default_limit=700,
)


def test_an_idle_gpu_nobody_holds_is_not_flagged_as_waste() -> None:
    idle = IDLE_GPU
    t = health.Thresholds()
    # No pod on the node asks for a GPU: idle is not waste, whatever its memory says.
    assert not health.is_held(idle, t, allocated=0, gpus=8)
    assert health.gpu_flags(idle, t, held=False) == []
    assert health.node_flags([idle], t, allocated=0) == []


def test_which_gpus_count_as_held_and_idle() -> None:
    idle = dataclasses.replace(IDLE_GPU, utilization=3)
    loaded = dataclasses.replace(idle, index=1, uuid="GPU-b", memory_used=40000)
    busy = dataclasses.replace(idle, index=2, uuid="GPU-c", utilization=90, memory_used=70000)
    t = health.Thresholds()
    # Pods hold every GPU of the node: an idle one is held even with no process on it.
    assert health.is_held(idle, t, allocated=8, gpus=8)
    assert health.gpu_flags(idle, t, held=True) == [("warning", "utilization 3% < 30% (held)")]
    # Pods hold some: memory in use says which; pods hold none: nothing is held.
    assert health.is_held(loaded, t, allocated=2, gpus=8)
    assert not health.is_held(idle, t, allocated=2, gpus=8)
    assert not health.is_held(loaded, t, allocated=0, gpus=8)
    # Pods could not be listed: memory in use is the only sign left.
    assert health.is_held(loaded, t, allocated=None, gpus=8)
    assert not health.is_held(idle, t, allocated=None, gpus=8)
    # More GPUs allocated than show any use: held with nothing running.
    assert health.node_flags([idle, loaded, busy], t, allocated=3) == [
        ("warning", "3 GPUs allocated to pods, 2 in use (utilization >= 30% or memory in use)")
    ]
    assert health.node_flags([idle, loaded, busy], t, allocated=2) == []
    assert health.node_flags([idle], t, allocated=None) == []


def test_new_action_params_forbid_unknown_fields() -> None:
    for action in health.ACTIONS:
        assert action.params_model.model_config.get("extra") == "forbid", action.name
        assert action.description


async def test_fleet_health_sweep_costs_one_exec_per_node_and_a_fixed_number_of_lists(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    # Each node is one exec: its driver pod and its pods' GPU allocations come from lists
    # of the whole fleet taken once, never from reads per node (O(fleet) requests, not more).
    h = await gpu_harness()
    sim.cluster.requests.clear()
    sim.store.scanned = 0
    run_id = await trigger(h, "fleet-health-sweep", {"fail_on": "never"}, None)
    detail = await h.run_detail(run_id)
    assert detail["status"] == "succeeded", statuses(detail)
    report = step(detail, "report")["output"]
    nodes = [n["node"] for n in report["nodes"]]
    assert len(nodes) == 4
    assert all(not n.get("error") for n in report["nodes"])
    requests = dict(sim.cluster.requests)
    assert requests.pop("create pods/exec") == len(nodes)
    assert requests.pop("list nodes") <= 2  # the sweep's, and the engine's first fleet list
    assert requests.pop("watch nodes", 0) <= 1  # the engine's fleet view, kept by a watch
    assert requests.pop("list pods") == 2  # the driver pods, and every pod for allocations
    assert requests == {}  # no reads per node (get nodes, list pods on a node)
    # The simulator looks at each object a bounded number of times for the whole sweep.
    objects = sum(1 for _ in sim.store.iter("pods")) + sum(1 for _ in sim.store.iter("nodes"))
    assert sim.store.scanned <= 4 * objects


async def test_fleet_health_sweep_looks_again_when_the_listed_driver_pod_is_gone(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A driver pod listed at the start of the sweep may be replaced before its node's turn:
    # the exec into it fails, and that node (only) looks its driver pod up again.
    read = health.FleetPods.read

    async def stale(ctx: Any, params: Any) -> health.FleetPods:
        listed = await read(ctx, params)
        assert listed.drivers is not None
        gone = dataclasses.replace(listed.drivers["gpu-node-02"], name="nvidia-driver-gone")
        return dataclasses.replace(listed, drivers={**listed.drivers, "gpu-node-02": gone})

    monkeypatch.setattr(health.FleetPods, "read", stale)
    h = await gpu_harness()
    sim.cluster.requests.clear()
    run_id = await trigger(h, "fleet-health-sweep", {"fail_on": "never"}, None)
    detail = await h.run_detail(run_id)
    report = step(detail, "report")["output"]
    nodes = {n["node"]: n for n in report["nodes"]}
    assert not nodes["gpu-node-02"].get("error"), nodes["gpu-node-02"]
    assert len(nodes["gpu-node-02"]["gpus"]) == 8
    assert sim.cluster.requests["create pods/exec"] == 5  # four nodes, one of them twice
    # the look-up of that one node reads it from the GPU node watch, not the API server
    assert sim.cluster.requests["get nodes"] == 0
