"""The GPU nodes as the adapter keeps them: listed once, then watched (``informer``), through
the real client against the simulator's list and watch."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any

from remediator.actions import clusterops
from remediator.adapters import kubernetes
from remediator.sim import testing
from tests.integration.kube.conftest import MakeContext, start_listening, stop_listening

GPU = "gpu-node-02"
GPU_LABEL = "nvidia.com/gpu.present"


async def _until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


def _relabel(sim: testing.RunningSim, node: str, **labels: str | None) -> None:
    def change(obj: dict[str, Any]) -> None:
        for key, value in labels.items():
            if value is None:
                obj["metadata"]["labels"].pop(key, None)
            else:
                obj["metadata"]["labels"][key] = value

    sim.store.mutate("nodes", "", node, change)


async def test_gpu_nodes_are_listed_once_then_every_change_comes_from_the_watch(
    sim: testing.RunningSim, cluster: kubernetes.KubeCluster
) -> None:
    sim.cluster.requests.clear()
    fleet = await cluster.gpu_fleet()
    assert fleet is not None
    assert sorted(fleet.snapshot()) == ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
    await _until(lambda: sim.cluster.requests["watch nodes"] == 1, "the watch started")

    _relabel(sim, GPU, pool="b")
    await _until(lambda: fleet.snapshot()[GPU].get("pool") == "b", "the label change")
    assert fleet.snapshot().pool_sizes("pool") == {None: 3, "b": 1}

    spare = copy.deepcopy(sim.store.must_get("nodes", "", "gpu-node-04"))
    spare["metadata"] = {"name": "gpu-node-05", "labels": spare["metadata"]["labels"]}
    sim.store.create("nodes", spare)
    await _until(lambda: "gpu-node-05" in fleet.snapshot(), "the new node")
    sim.store.delete("nodes", "", "gpu-node-05")
    await _until(lambda: "gpu-node-05" not in fleet.snapshot(), "the deleted node gone")
    _relabel(sim, "gpu-node-04", **{GPU_LABEL: None})  # out of the GPU selector
    await _until(lambda: "gpu-node-04" not in fleet.snapshot(), "the node out of the selector")
    _relabel(sim, "cpu-node-01", **{GPU_LABEL: "true"})  # into it
    await _until(lambda: "cpu-node-01" in fleet.snapshot(), "the node into the selector")

    assert await cluster.gpu_fleet() is fleet
    assert sim.cluster.requests["list nodes"] == 1  # never listed again
    assert sim.cluster.requests["watch nodes"] == 1


async def test_a_gpu_node_is_read_from_the_watch_and_any_other_from_the_api_server(
    sim: testing.RunningSim, cluster: kubernetes.KubeCluster
) -> None:
    assert await cluster.gpu_fleet() is not None
    sim.cluster.requests.clear()
    node = await cluster.get_node(GPU)
    assert (node.name, node.unschedulable) == (GPU, False)
    assert sim.cluster.requests["get nodes"] == 0

    sim.store.mutate("nodes", "", GPU, lambda obj: obj["spec"].update(unschedulable=True))
    for _ in range(1000):
        if (await cluster.get_node(GPU)).unschedulable:
            break
        await asyncio.sleep(0.01)
    assert (await cluster.get_node(GPU)).unschedulable  # the watch brought the change
    assert sim.cluster.requests["get nodes"] == 0

    assert (await cluster.get_node("cpu-node-01")).name == "cpu-node-01"
    assert sim.cluster.requests["get nodes"] == 1  # not a GPU node: not watched


async def test_a_write_answered_with_a_conflict_reads_the_node_fresh(
    sim: testing.RunningSim, cluster: kubernetes.KubeCluster, make_ctx: MakeContext
) -> None:
    """The cache is only a first guess: every write carries its resourceVersion, so a stale
    copy costs a 409 and one read from the API server, never a wrong write."""
    assert await cluster.gpu_fleet() is not None
    stale = await cluster.get_node(GPU)
    # Someone cordons the node; this client still holds the copy from before (as if the
    # watch had not delivered the change yet).
    sim.store.mutate("nodes", "", GPU, lambda obj: obj["spec"].update(unschedulable=True))
    informer = cluster._informer
    assert informer is not None
    await _until(lambda: informer.get(GPU) != stale, "the watch delivered the cordon")
    informer._nodes[GPU] = stale
    sim.cluster.requests.clear()

    done = await clusterops.cordon(make_ctx(node=GPU), cluster, stale)
    assert done["cordoned"] is False  # cordoned by someone else, found by the fresh read
    assert sim.cluster.requests["patch nodes"] == 1  # refused: 409
    assert sim.cluster.requests["get nodes"] == 1  # then read fresh, and nothing written
    assert (await cluster.get_node(GPU)).unschedulable


async def test_our_own_writes_are_read_back_at_once(
    sim: testing.RunningSim, cluster: kubernetes.KubeCluster
) -> None:
    assert await cluster.gpu_fleet() is not None
    written = await cluster.patch_node(GPU, labels={"gpu-status": "suspect"})
    assert (await cluster.get_node(GPU)).resource_version == written.resource_version
    assert (await cluster.get_node(GPU)).labels["gpu-status"] == "suspect"


async def test_a_dropped_watch_resumes_and_lists_again_only_when_its_version_expired(
    sim: testing.RunningSim, cluster: kubernetes.KubeCluster
) -> None:
    fleet = await cluster.gpu_fleet()
    assert fleet is not None
    await _until(lambda: sim.cluster.requests["watch nodes"] >= 1, "the watch started")
    sim.cluster.requests.clear()

    await stop_listening(sim)  # the API server goes away; a change is made meanwhile
    _relabel(sim, GPU, pool="while-away")
    await start_listening(sim)
    await _until(lambda: fleet.snapshot()[GPU].get("pool") == "while-away", "the change")
    assert sim.cluster.requests["list nodes"] == 0  # resumed from its resourceVersion

    await stop_listening(sim)
    _relabel(sim, GPU, pool="expired")
    sim.store.history.clear()  # the change left the server's history: 410 Expired
    _relabel(sim, "gpu-node-01", other="x")
    sim.store.history.clear()
    await start_listening(sim)
    await _until(lambda: fleet.snapshot()[GPU].get("pool") == "expired", "the relisted change")
    assert sim.cluster.requests["list nodes"] >= 1


async def test_each_page_of_the_first_list_is_converted_as_it_arrives(
    sim: testing.RunningSim, cluster: kubernetes.KubeCluster, monkeypatch: Any
) -> None:
    """The first list holds one page of raw JSON at a time: every parsed node of a 5,800-node
    fleet held until the last page kept the server's memory 50 MB higher for good."""
    from remediator.adapters.kubernetes import convert

    pages_read: list[int] = []
    node = convert.node

    def converting(obj: dict[str, Any]) -> Any:
        pages_read.append(sim.cluster.requests["list nodes"])
        return node(obj)

    monkeypatch.setattr(convert, "node", converting)
    cluster.node_page_size = 1
    sim.cluster.requests.clear()
    fleet = await cluster.gpu_fleet()
    assert fleet is not None
    assert len(fleet.snapshot()) == 4
    assert pages_read[:4] == [1, 2, 3, 4]  # each node made a record before the next page


async def test_the_cached_fleet_is_listed_in_small_pages_and_shares_its_strings(
    sim: testing.RunningSim, cluster: kubernetes.KubeCluster
) -> None:
    """Every GPU node stays cached: a page parsed whole before its nodes become records, and a
    new string for each label value of each node, left a 5,000-node fleet's server 19 MB
    larger; 100-node pages and shared strings, 8 MB."""
    template = sim.store.must_get("nodes", "", "gpu-node-04")
    for n in range(246):
        spare = copy.deepcopy(template)
        labels = {**spare["metadata"]["labels"], "kubernetes.io/hostname": f"gpu-spare-{n:03}"}
        spare["metadata"] = {"name": f"gpu-spare-{n:03}", "labels": labels}
        sim.store.create("nodes", spare)
    sim.cluster.requests.clear()
    fleet = await cluster.gpu_fleet()
    assert fleet is not None
    assert len(fleet.snapshot()) == 250
    assert sim.cluster.requests["list nodes"] == 3  # pages of 100

    first, last = await cluster.get_node("gpu-node-01"), await cluster.get_node("gpu-spare-245")
    assert sim.cluster.requests["get nodes"] == 0  # both from the cache
    shared = [key for key, value in first.labels.items() if last.labels.get(key) == value]
    assert len(shared) >= 5
    for key in shared:
        assert first.labels[key] is last.labels[key]
        assert next(k for k in last.labels if k == key) is key
    assert [t.key for t in first.taints] == [t.key for t in last.taints]
    assert all(a is b for a, b in zip(first.taints, last.taints, strict=True))  # (frozen)


async def test_the_gpu_nodes_come_from_the_watch_and_are_listed_only_while_it_fails(
    sim: testing.RunningSim, cluster: kubernetes.KubeCluster
) -> None:
    """The fleet view's nodes: the watch's copies while it keeps them current (a view
    refreshed every 5 s listed 5,000 nodes each time), the API server's list while the
    watch is failing (its copies may be stale)."""
    assert await cluster.gpu_fleet() is not None
    await _until(lambda: sim.cluster.requests["watch nodes"] >= 1, "the watch started")
    sim.cluster.requests.clear()
    _relabel(sim, GPU, pool="watched")

    async def pool_of_gpu() -> str | None:
        return {node.name: node for node in await cluster.gpu_nodes()}[GPU].labels.get("pool")

    for _ in range(1000):
        if await pool_of_gpu() == "watched":
            break
        await asyncio.sleep(0.01)
    names = sorted(node.name for node in await cluster.gpu_nodes())
    assert names == ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
    assert await pool_of_gpu() == "watched"
    assert sim.cluster.requests["list nodes"] == 0

    informer = cluster._informer
    assert informer is not None
    await stop_listening(sim)
    await _until(lambda: informer.failing, "the watch failed")
    _relabel(sim, GPU, pool="while-failing")
    await start_listening(sim)
    assert await pool_of_gpu() == "while-failing"  # listed: the watch waits out its backoff
    assert sim.cluster.requests["list nodes"] == 1

    await _until(lambda: not informer.failing and sim.cluster.requests["watch nodes"] >= 1, "")
    sim.cluster.requests.clear()
    _relabel(sim, GPU, pool="watched-again")
    for _ in range(1000):
        if await pool_of_gpu() == "watched-again":
            break
        await asyncio.sleep(0.01)
    assert await pool_of_gpu() == "watched-again"
    assert sim.cluster.requests["list nodes"] == 0
