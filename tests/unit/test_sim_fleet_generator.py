"""``remediator sim --nodes N``: a generated fleet has N GPU nodes, each with its own driver and
DCGM exporter pod, and names that cannot collide however large the fleet."""

from __future__ import annotations

import argparse

import pytest

from remediator.sim import cli as sim_cli
from remediator.sim import cluster as sim_cluster
from remediator.sim import fleet as sim_fleet
from remediator.sim import kubelet as sim_kubelet
from remediator.sim import reboots as sim_reboots


def test_generated_fleet_puts_a_driver_and_a_dcgm_pod_on_every_gpu_node():
    cluster = sim_cluster.Cluster(sim_fleet.generate(12))
    nodes = [n["metadata"]["name"] for n in cluster.store.iter("nodes")]
    assert nodes == [f"gpu-node-{i:04d}" for i in range(1, 13)]
    pods = list(cluster.store.iter("pods", "gpu-operator"))
    by_node: dict[str, list[str]] = {}
    for pod in pods:
        by_node.setdefault(pod["spec"]["nodeName"], []).append(pod["metadata"]["name"])
    assert sorted(by_node) == nodes
    assert all(len(names) == 2 for names in by_node.values())
    assert len({p["metadata"]["name"] for p in pods}) == len(pods) == 24
    assert all(len(cluster.hosts[name].gpus) == 8 for name in nodes)


def test_generated_node_names_widen_with_the_fleet():
    assert sim_fleet.generated_node_name(7, 5000) == "gpu-node-0007"
    assert sim_fleet.generated_node_name(7, 20000) == "gpu-node-00007"


def test_sim_refuses_a_fleet_file_and_a_node_count_together():
    parser = argparse.ArgumentParser()
    sim_cli.add_arguments(parser)
    with pytest.raises(ValueError, match="not both"):
        sim_cli._load_fleet(parser.parse_args(["--nodes", "3", "--fleet", "fleet.yaml"]))
    assert len(sim_cli._load_fleet(parser.parse_args(["--nodes", "3"])).nodes) == 3


def test_pods_by_node_follow_binding_and_deletion():
    cluster = sim_cluster.Cluster(sim_fleet.generate(3))
    store = cluster.store

    def on_node(node: str, namespace: str | None = None) -> list[str]:
        return [p["metadata"]["name"] for p in store.iter_pods_on_node(node, namespace)]

    def scanned(node: str, namespace: str | None = None) -> list[str]:
        return [
            p["metadata"]["name"]
            for p in store.iter("pods", namespace)
            if (p["spec"].get("nodeName") or "") == node
        ]

    assert on_node("gpu-node-0002") == scanned("gpu-node-0002") != []
    store.create("pods", {"metadata": {"name": "loose", "namespace": "default"}, "spec": {}})
    assert on_node("") == ["loose"]
    store.mutate("pods", "default", "loose", lambda p: p["spec"].update(nodeName="gpu-node-0002"))
    assert "loose" in on_node("gpu-node-0002", "default")
    assert on_node("") == []
    driver = on_node("gpu-node-0001", "gpu-operator")[0]
    store.delete("pods", "gpu-operator", driver)
    assert on_node("gpu-node-0001") == scanned("gpu-node-0001")
    assert driver not in on_node("gpu-node-0001")


def test_pod_writes_keep_the_node_index_and_node_lookups_never_scan_the_fleet():
    cluster = sim_cluster.Cluster(sim_fleet.generate(200))  # 400 pods
    store = cluster.store
    node = "gpu-node-0007"
    on_node = len(list(store.iter_pods_on_node(node)))
    store.scanned = 0
    for i in range(50):  # a pod created and deleted per step, as a host pod per node is
        pod = {"metadata": {"name": f"host-{i}", "namespace": "default"}, "spec": {}}
        pod["spec"]["nodeName"] = node
        store.create("pods", pod)
        assert f"host-{i}" in [p["metadata"]["name"] for p in store.iter_pods_on_node(node)]
        store.delete("pods", "default", f"host-{i}")
    assert store.scanned == 50 * (on_node + 1)  # never a pass over the fleet's pods
    # What the kubelet (exec, GPU holders), the scheduler and reboots ask about one node
    store.scanned = 0
    sim_kubelet.allocations(cluster, node)
    sim_reboots._pods_on(cluster, node)
    assert store.scanned == 2 * on_node
