"""The simulator's controller loop visits what changed, never the fleet: a node write costs a
pass O(1) objects, a pod write the pods of its node or owner, an event nothing (counted by the
store's ``scanned``, as a real controller's informer events, not a resync, drive its work)."""

from __future__ import annotations

import pytest

from remediator.sim import cluster as sim_cluster
from remediator.sim import controllers as sim_controllers
from remediator.sim import fleet as sim_fleet

NODES = 2000
REPLICAS = 40


Fleet = tuple[sim_cluster.Cluster, sim_controllers.Controllers]


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    cluster = sim_cluster.Cluster(sim_fleet.generate(NODES))  # 4,000 DaemonSet pods
    names = [f"gpu-node-{i:04d}" for i in range(1, REPLICAS + 1)]
    trainer = sim_fleet.Workload(
        kind="Deployment",
        name="trainer",
        replicas=REPLICAS,
        containers=[sim_fleet.Container(name="main", gpus=1)],
        nodes=names,
    )
    sim_cluster.seed_workload(cluster, trainer)
    loop = sim_controllers.Controllers(cluster)
    return cluster, loop


def _settled(fleet: Fleet) -> Fleet:
    """The fleet after passes until one has nothing left to do (the first looks at all)."""
    cluster, loop = fleet
    for _ in range(3):
        loop.reconcile(0.0)
    return cluster, loop


def _driver_pods(cluster: sim_cluster.Cluster, node: str) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in cluster.store.iter_pods_on_node(node, "gpu-operator")
        if p["metadata"]["name"].startswith("nvidia-driver")
    ]


def test_a_first_pass_looks_at_the_whole_fleet():
    cluster = sim_cluster.Cluster(sim_fleet.generate(50))
    loop = sim_controllers.Controllers(cluster)
    cluster.store.scanned = 0
    loop.reconcile(0.0)
    assert cluster.store.scanned >= 50 * 2  # every node, for each DaemonSet


def test_node_writes_and_events_cost_a_pass_a_few_visits_not_the_fleet(fleet: Fleet):
    cluster, loop = _settled(fleet)
    st = cluster.store
    node = "gpu-node-1234"
    on_node = len(list(st.iter_pods_on_node(node)))
    st.scanned = 0
    loop.reconcile(1.0)
    assert st.scanned == 0  # nothing changed: nothing to look at
    st.mutate("nodes", "", node, lambda n: n["spec"].update(unschedulable=True))
    st.mutate("nodes", "", node, lambda n: n["metadata"]["labels"].update(team="a"))
    st.mutate(
        "nodes", "", node, lambda n: n["spec"]["taints"].append({"key": "x", "effect": "NoExecute"})
    )
    st.create("events", {"metadata": {"name": "e.1", "namespace": "default"}, "reason": "Cordon"})
    st.scanned = 0
    loop.reconcile(2.0)
    # the node (DaemonSets, upgrades), the two DaemonSets, the node's pods
    assert st.scanned <= 4 + on_node


def test_pod_writes_cost_the_pods_of_their_node_or_owner(fleet: Fleet):
    cluster, loop = _settled(fleet)
    st = cluster.store
    driver = _driver_pods(cluster, "gpu-node-0777")[0]
    st.scanned = 0
    st.mutate("pods", "gpu-operator", driver, lambda p: p["metadata"].update(labels={"x": "y"}))
    loop.reconcile(3.0)
    assert st.scanned <= 4 + len(list(st.iter_pods_on_node("gpu-node-0777")))
    trainer = next(p for p in st.iter_pods_on_node("gpu-node-0007") if "trainer" in str(p))
    st.scanned = 0
    st.mutate("pods", "default", trainer["metadata"]["name"], lambda p: p["status"].update(x=1))
    loop.reconcile(4.0)
    assert st.scanned <= REPLICAS + 1


def test_deleted_pods_are_replaced_from_the_changes_alone(fleet: Fleet):
    cluster, loop = _settled(fleet)
    st = cluster.store
    driver = _driver_pods(cluster, "gpu-node-0042")[0]
    st.delete("pods", "gpu-operator", driver)
    loop.reconcile(5.0)
    replaced = _driver_pods(cluster, "gpu-node-0042")
    assert len(replaced) == 1
    assert replaced != [driver]
    trainers = [p["metadata"]["name"] for p in st.iter("pods", "default") if "trainer" in str(p)]
    st.delete("pods", "default", trainers[0])
    loop.reconcile(6.0)
    assert len([p for p in st.iter("pods", "default") if "trainer" in str(p)]) == REPLICAS


def test_a_node_labelled_for_a_daemonset_gets_its_pod_from_the_label_change(fleet: Fleet):
    cluster, loop = _settled(fleet)
    st = cluster.store
    st.create(
        "nodes",
        sim_cluster.objects.node(
            "cpu-node-1", labels={}, taints=[], allocatable={}, unschedulable=False
        ),
    )
    loop.reconcile(7.0)
    assert _driver_pods(cluster, "cpu-node-1") == []
    st.mutate(
        "nodes",
        "",
        "cpu-node-1",
        lambda n: n["metadata"]["labels"].update({"nvidia.com/gpu.present": "true"}),
    )
    st.scanned = 0
    loop.reconcile(8.0)
    visited = st.scanned  # the node, the DaemonSets, the pods still starting (new ones too)
    assert len(_driver_pods(cluster, "cpu-node-1")) == 1
    assert visited <= 16  # of 2,000 nodes and 4,000 pods


def test_a_stateful_set_takes_its_ordinal_back_when_a_pod_not_its_own_frees_the_name():
    cluster = sim_cluster.Cluster(sim_fleet.generate(3))
    db = sim_fleet.Workload(
        kind="StatefulSet", name="db", containers=[sim_fleet.Container(name="main")]
    )
    sim_cluster.seed_workload(cluster, db)
    loop = sim_controllers.Controllers(cluster)
    loop.reconcile(0.0)
    st = cluster.store
    st.mutate("pods", "default", "db-0", lambda p: p["metadata"].pop("ownerReferences"))
    loop.reconcile(1.0)
    assert sim_cluster.objects.controller_of(st.must_get("pods", "default", "db-0")) is None
    st.delete("pods", "default", "db-0")
    loop.reconcile(2.0)
    assert sim_cluster.objects.controller_of(st.must_get("pods", "default", "db-0")) is not None
