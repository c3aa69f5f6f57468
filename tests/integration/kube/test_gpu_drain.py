"""gpu.drain_workloads against the simulator through the real client: eight GPUs, eight
single-GPU pods on one node; only the pod holding the failed GPU is evicted, or nothing."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from remediator.actions import gpudrain
from remediator.domain import errors
from remediator.ports import actions
from remediator.sim import fleet as fleet_mod
from remediator.sim import kubelet, testing
from tests.integration.kube.conftest import MakeContext, Progress, node_events, run_action

pytestmark = pytest.mark.timeout(60)

NODE = "gpu-node-01"
FAST: dict[str, Any] = {"eviction_retry_interval_seconds": 0.1, "poll_interval_seconds": 0.05}
GPU_LABELS = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
OPERATOR = {"namespace": "gpu-operator", "tolerations": [{"operator": "Exists"}]}


def eight_by_eight() -> fleet_mod.Fleet:
    return fleet_mod.Fleet.model_validate(
        {
            "namespaces": ["ml-training", "gpu-operator"],
            "nodes": [{"name": NODE, "labels": GPU_LABELS, "gpus": {"model": "H100", "count": 8}}],
            "workloads": [
                {
                    **OPERATOR,
                    "kind": "DaemonSet",
                    "name": "nvidia-driver-daemonset",
                    "labels": {
                        "app": "nvidia-driver-daemonset",
                        "app.kubernetes.io/component": "nvidia-driver",
                    },
                    "containers": [{"name": "nvidia-driver-ctr"}],
                },
                {
                    **OPERATOR,
                    "kind": "DaemonSet",
                    "name": "nvidia-dcgm-exporter",
                    "labels": {"app": "nvidia-dcgm-exporter"},
                    "pod_names": ["nvidia-dcgm-exporter-7xk2p"],
                    "containers": [{"name": "nvidia-dcgm-exporter"}],
                },
                {
                    "kind": "StatefulSet",
                    "name": "shard",
                    "namespace": "ml-training",
                    "replicas": 8,
                    "labels": {"app": "shard"},
                    "nodes": [NODE] * 8,
                    "containers": [{"name": "trainer", "gpus": 1}],
                },
                {
                    "kind": "Deployment",
                    "name": "proxy",
                    "namespace": "ml-training",
                    "labels": {"app": "proxy"},
                    "nodes": [NODE],
                    "pod_names": ["proxy-5d9f8"],
                    "containers": [{"name": "nginx"}],
                },
            ],
            "pdbs": [
                {
                    "name": "shard",
                    "namespace": "ml-training",
                    "match_labels": {"app": "shard"},
                    "max_unavailable": 1,
                }
            ],
        }
    )


@pytest.fixture
async def sim() -> AsyncIterator[testing.RunningSim]:
    async with testing.running_sim(eight_by_eight(), time_scale=0.01) as running:
        yield running


def uids(sim: testing.RunningSim) -> dict[str, str]:
    return {
        f"{p['metadata']['namespace']}/{p['metadata']['name']}": p["metadata"]["uid"]
        for p in sim.pods(node=NODE)
    }


def context(
    make_ctx: MakeContext, *, gpu: str, labels: dict[str, str], progress: Progress | None = None
) -> actions.ActionContext:
    ctx = make_ctx(node=NODE, gpu=gpu, progress=progress)
    return dataclasses.replace(ctx, labels=labels)


def evicted(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {key for key, uid in before.items() if after.get(key) != uid}


async def test_an_xid_on_gpu_3_evicts_only_the_pod_holding_gpu_3(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    assert kubelet.holders(sim.cluster, NODE, 3) == ["ml-training/shard-3"]
    gpu3 = sim.gpu(NODE, 3)
    gpu3.lost = True  # Xid 79: the device plugin marks it unhealthy, the kubelet keeps it out
    before = uids(sim)
    labels = {  # dcgm-exporter's pod attribution, scraped with honorLabels: false
        "namespace": "gpu-operator",
        "pod": "nvidia-dcgm-exporter-7xk2p",
        "exported_namespace": "ml-training",
        "exported_pod": "shard-3",
        "UUID": gpu3.uuid,
    }
    progress = Progress()
    ctx = context(make_ctx, gpu=gpu3.uuid, labels=labels, progress=progress)
    output = await run_action(gpudrain.GpuDrainAction(), ctx, FAST)

    assert evicted(before, uids(sim)) == {"ml-training/shard-3"}
    assert output["source"] == "kubelet device allocation"
    assert output["holders"] == ["ml-training/shard-3"]
    assert output["gone"] == ["ml-training/shard-3"]
    assert "alert_pod_not_holding" not in output
    assert sim.node(NODE)["spec"].get("unschedulable") is not True  # the playbook cordons
    assert progress.updates[-1]["remaining"] == []
    assert "RemediatorGpuDrain" in {e["reason"] for e in node_events(sim, NODE)}
    assert kubelet.holders(sim.cluster, NODE, 3) == []  # its replacement got no lost GPU

    again = await run_action(gpudrain.GpuDrainAction(), ctx, FAST)
    assert again["already_in_place"] is True


async def test_an_alert_without_pod_labels_uses_the_kubelet_device_allocation(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    holder = kubelet.holders(sim.cluster, NODE, 5)
    before = uids(sim)
    bus_id = sim.gpu(NODE, 5).pci_bus_id  # resolved to the UUID through nvidia-smi
    ctx = context(make_ctx, gpu=bus_id, labels={"gpu": "5", "Hostname": NODE})
    output = await run_action(gpudrain.GpuDrainAction(), ctx, FAST)

    assert holder == ["ml-training/shard-5"]
    assert evicted(before, uids(sim)) == set(holder)
    assert output["holders"] == holder


async def test_a_blocking_pdb_holds_the_eviction_and_the_timeout_names_it(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    def strict(pdb: dict[str, Any]) -> None:
        pdb["spec"] = {"selector": pdb["spec"]["selector"], "minAvailable": 8}

    sim.store.mutate("poddisruptionbudgets.policy", "ml-training", "shard", strict)
    await sim.wait_for(
        lambda: (
            sim.store.must_get("poddisruptionbudgets.policy", "ml-training", "shard")
            .get("status", {})
            .get("disruptionsAllowed")
            == 0
        )
    )
    before = uids(sim)
    progress = Progress()
    ctx = context(make_ctx, gpu="2", labels={}, progress=progress)
    task = asyncio.create_task(
        run_action(gpudrain.GpuDrainAction(), ctx, {**FAST, "timeout_seconds": 1})
    )
    await sim.wait_for(lambda: any(u.get("blocked") for u in progress.updates))
    with pytest.raises(errors.ActionFailed) as info:
        await task

    assert "drain of GPU 2 on gpu-node-01 timed out" in str(info.value)
    assert "ml-training/shard-2 (blocked by PodDisruptionBudget shard)" in str(info.value)
    assert info.value.temporary is True
    assert uids(sim) == before  # nothing evicted, nothing else touched


async def test_when_no_one_can_tell_which_pods_hold_the_gpu_nothing_is_evicted(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    before = uids(sim)
    elsewhere = {"allocation_checkpoint": "/var/lib/k0s/kubelet/kubelet_internal_checkpoint"}
    exporter_only = {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-7xk2p"}
    for labels in ({}, exporter_only, {"exported_namespace": "ml-training", "exported_pod": "x"}):
        ctx = context(make_ctx, gpu="4", labels=labels)
        with pytest.raises(errors.ActionFailed, match="cannot tell which pods hold GPU 4") as info:
            await run_action(gpudrain.GpuDrainAction(), ctx, {**FAST, **elsewhere})
        assert info.value.temporary is False
        assert "No such file or directory" in str(info.value)
    assert uids(sim) == before

    # The alert's own attribution is enough when it names a GPU pod on the node.
    named = {"exported_namespace": "ml-training", "exported_pod": "shard-4"}
    output = await run_action(
        gpudrain.GpuDrainAction(), context(make_ctx, gpu="4", labels=named), {**FAST, **elsewhere}
    )
    assert output["source"] == "alert labels"
    assert evicted(before, uids(sim)) == {"ml-training/shard-4"}


async def test_hostile_pod_labels_are_refused_not_used(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    hostile = {"exported_namespace": "ml-training", "exported_pod": "shard-1; rm -rf /"}
    ctx = context(make_ctx, gpu="1", labels=hostile)
    params = {**FAST, "allocation_checkpoint": "/nowhere/checkpoint"}
    with pytest.raises(errors.ActionFailed, match="not a pod name"):
        await run_action(gpudrain.GpuDrainAction(), ctx, params)
    with pytest.raises(ValueError, match="absolute path"):
        gpudrain.GpuDrainAction().parse({"allocation_checkpoint": "/proc/1/root/../etc/shadow"})
