"""The node (and GPU) an alert is about, with each label set a GPU Operator cluster really sends.

dcgm-exporter behind a ServiceMonitor labels its series with the exporter *pod* in ``Hostname``
(without the node-name setting), ``namespace``/``pod`` of the exporter (or of the workload),
``instance`` = ``<pod IP>:9400`` and, with the GPU Operator's relabeling, ``kubernetes_node``.
The shipped rules copy ``Hostname`` into ``node`` when the scrape set none. Whatever the label
set, the thermal playbook must cap the hot GPU on the node it sits on — and when no label leads
to a Node, fail with a reason naming every candidate and tell on-call.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest

from remediator.sim import fleet as fleet_mod
from remediator.sim import testing
from tests.conftest import am_payload
from tests.integration.playbooks.conftest import (
    FakeNotifier,
    MakeGpuHarness,
    body,
    post,
    step,
)

pytestmark = pytest.mark.timeout(60)

NODE = "gpu-node-01"
CAPPED = 490.0  # 70 % of the H100's 700 W default
DEFAULT = 700.0
NODE_LABELS = ("node", "Hostname", "hostname", "kubernetes_node", "instance")


def exporter_pod(sim: testing.RunningSim, node: str = NODE) -> dict[str, Any]:
    for pod in sim.pods(node=node, namespace="gpu-operator"):
        if (pod["metadata"].get("labels") or {}).get("app") == "nvidia-dcgm-exporter":
            return pod
    raise KeyError(f"no dcgm-exporter pod on {node}")


def node_ip(sim: testing.RunningSim, node: str = NODE) -> str:
    addresses = sim.node(node)["status"]["addresses"]
    return str(next(a["address"] for a in addresses if a["type"] == "InternalIP"))


def hot_gpu(labels: dict[str, str], *, drop: tuple[str, ...] = ()) -> bytes:
    """The captured GPUTemperatureHigh alert of GPU 1 on gpu-node-01, with its node labels
    replaced by ``labels`` (and ``drop`` removed)."""
    payload = copy.deepcopy(am_payload("GPUTemperatureHigh-firing-2alerts"))
    alert = payload["alerts"][0]
    kept = {k: v for k, v in alert["labels"].items() if k not in NODE_LABELS + drop}
    alert["labels"] = kept | labels
    payload["alerts"] = [alert]
    payload["commonLabels"] = dict(alert["labels"])
    payload["groupLabels"] = {"alertname": "GPUTemperatureHigh"}
    payload["groupKey"] = '{}:{alertname="GPUTemperatureHigh"}'
    return body(payload)


async def capped_run(h: Any, sim: testing.RunningSim, data: bytes) -> dict[str, Any]:
    await post(h, data)
    [run] = await h.runs(playbook="gpu-temperature-high")
    detail: dict[str, Any] = await h.run_detail(run["id"])
    assert detail["status"] == "succeeded", detail
    assert detail["node"] == NODE
    assert sim.gpu(NODE, 1).power_limit == CAPPED
    assert sim.gpu(NODE, 0).power_limit == DEFAULT
    return detail


async def test_a_node_relabelled_by_the_scrape_is_taken_as_it_is(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    pod = exporter_pod(sim)
    h = await gpu_harness()
    labels = {
        "node": NODE,
        "Hostname": pod["metadata"]["name"],
        "instance": f"{pod['status']['podIP']}:9400",
    }
    await capped_run(h, sim, hot_gpu(labels))


async def test_hostname_is_the_exporter_pod_and_the_node_is_in_kubernetes_node(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    """The rule copied the exporter pod's Hostname into ``node``; ``namespace``/``pod`` name the
    workload (honorLabels), so the exporter pod is not found there: kubernetes_node wins."""
    name = exporter_pod(sim)["metadata"]["name"]
    h = await gpu_harness()
    labels = {"node": name, "Hostname": name, "kubernetes_node": NODE}
    await capped_run(h, sim, hot_gpu(labels))


async def test_hostname_is_the_exporter_pod_found_in_its_namespace(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    """Without kubernetes_node: the exporter pod (ServiceMonitor target labels namespace/pod,
    the workload in exported_*) leads to the node it runs on."""
    name = exporter_pod(sim)["metadata"]["name"]
    h = await gpu_harness()
    labels = {
        "node": name,
        "Hostname": name,
        "namespace": "gpu-operator",
        "pod": name,
        "exported_namespace": "ml-training",
        "exported_pod": "llama-finetune-0",
    }
    await capped_run(h, sim, hot_gpu(labels, drop=("namespace", "pod")))


@pytest.mark.parametrize("instance", [NODE, f"{NODE}:9400"])
async def test_instance_is_the_node_with_or_without_a_port(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, instance: str
) -> None:
    name = exporter_pod(sim)["metadata"]["name"]
    h = await gpu_harness()
    labels = {"node": name, "Hostname": name, "instance": instance}
    await capped_run(h, sim, hot_gpu(labels))


async def test_instance_is_the_exporter_pod_ip(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    pod = exporter_pod(sim)
    name = pod["metadata"]["name"]
    h = await gpu_harness()
    labels = {"node": name, "Hostname": name, "instance": f"{pod['status']['podIP']}:9400"}
    detail = await capped_run(h, sim, hot_gpu(labels))
    assert step(detail, "power-cap")["output"]["node"] == NODE


async def test_no_candidate_is_a_node_fails_the_run_with_every_reason_and_tells_on_call(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim, notifier: FakeNotifier
) -> None:
    h = await gpu_harness()
    labels = {
        "node": "nvidia-dcgm-exporter-gone",
        "Hostname": "nvidia-dcgm-exporter-gone",
        "instance": "10.9.9.9:9400",
    }
    await post(h, hot_gpu(labels))
    [run] = await h.runs(playbook="gpu-temperature-high")
    detail = await h.run_detail(run["id"])
    assert detail["status"] == "failed"
    assert detail["node"] is None
    assert detail["steps"] == []
    reason = detail["reason"]
    assert "no candidate is a Node" in reason
    assert "node=nvidia-dcgm-exporter-gone: is not a Node nor a pod in ml-training" in reason
    assert "instance=10.9.9.9:9400: no running pod has IP 10.9.9.9" in reason
    assert all(sim.gpu(NODE, i).power_limit == DEFAULT for i in range(8))
    [told] = [s for s in notifier.sent if s["data"]["event"] == "unplanned"]
    assert "GPUTemperatureHigh could not be acted on" in told["message"]
    assert "no candidate is a Node" in told["message"]


async def test_the_gpu_is_found_by_pci_bus_id_when_the_alert_has_no_uuid(
    gpu_harness: MakeGpuHarness, sim: testing.RunningSim
) -> None:
    """UUID first, then the PCI bus id, then the index: a series without UUID and index still
    caps only its own GPU, never every GPU of the node."""
    h = await gpu_harness()
    labels = {"node": NODE, "pci_bus_id": "00000000:28:00.0"}
    detail = await capped_run(h, sim, hot_gpu(labels, drop=("UUID", "gpu")))
    assert detail["gpu"] == "00000000:28:00.0"


class TestHostNetworkExporter:
    """dcgm-exporter with hostNetwork: ``Hostname`` is the node, ``instance`` the node's IP,
    which is also the podIP of every host-network pod on it."""

    @pytest.fixture
    async def sim(self) -> AsyncIterator[testing.RunningSim]:
        fleet = fleet_mod.Fleet.default()
        workloads = [
            w.model_copy(update={"host_network": True}) if w.name == "nvidia-dcgm-exporter" else w
            for w in fleet.workloads
        ]
        async with testing.running_sim(
            fleet.model_copy(update={"workloads": workloads}), time_scale=0.01
        ) as running:
            yield running

    async def test_the_exporter_pod_has_the_node_ip(self, sim: testing.RunningSim) -> None:
        pod = exporter_pod(sim)
        assert pod["spec"]["hostNetwork"] is True
        assert pod["status"]["podIP"] == node_ip(sim)

    async def test_hostname_is_the_node(
        self, gpu_harness: MakeGpuHarness, sim: testing.RunningSim
    ) -> None:
        h = await gpu_harness()
        labels = {"Hostname": NODE, "instance": f"{node_ip(sim)}:9400"}
        await capped_run(h, sim, hot_gpu(labels))

    async def test_instance_alone_is_the_node_ip(
        self, gpu_harness: MakeGpuHarness, sim: testing.RunningSim
    ) -> None:
        h = await gpu_harness()
        await capped_run(h, sim, hot_gpu({"instance": f"{node_ip(sim)}:9400"}))
