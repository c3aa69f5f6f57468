"""Choosing an alert's node among its labels (``domain.targeting``) with the cluster's answers
(``engine.targeting``), against a fake of the cluster port that counts what it was asked."""

from __future__ import annotations

from typing import Any

import pytest

from remediator.domain import targeting
from remediator.engine import targeting as resolving
from remediator.ports import cluster as port

pytestmark = pytest.mark.timeout(10)

NODE = "gpu-node-01"
EXPORTER = "nvidia-dcgm-exporter-7x2kq"
EXPORTER_IP = "10.244.17.3"
NODE_IP = "10.0.4.21"
ORDER = targeting.DEFAULT_ORDER


def pod(name: str, *, node: str, ip: str, namespace: str = "gpu-operator") -> port.PodInfo:
    return port.PodInfo(
        namespace=namespace,
        name=name,
        uid=f"uid-{name}",
        node_name=node,
        phase="Running",
        labels={},
        annotations={},
        owners=[],
        volume_kinds=[],
        containers=["c"],
        termination_grace_period_seconds=30,
    )


class FakeCluster:
    """Nodes by name, pods by (namespace, name) and by IP; every call is counted."""

    def __init__(self, *, fail: port.ClusterError | None = None) -> None:
        self.nodes = {NODE, "gpu-node-02"}
        exporter = pod(EXPORTER, node=NODE, ip=EXPORTER_IP)
        host_pods = [pod("node-exporter-a", node=NODE, ip=NODE_IP, namespace="monitoring")]
        self.pods = {(p.namespace, p.name): p for p in [exporter, *host_pods]}
        self.by_ip = {EXPORTER_IP: [exporter], NODE_IP: host_pods}
        self.calls: list[tuple[str, str]] = []
        self.fail = fail

    async def get_node(self, name: str) -> Any:
        self.calls.append(("get_node", name))
        if self.fail:
            raise self.fail
        if name not in self.nodes:
            raise port.NotFound(f"nodes {name!r} not found", status=404)
        return object()

    async def list_pods(self, *, field_selector: str = "", **_: Any) -> list[port.PodInfo]:
        self.calls.append(("list_pods", field_selector))
        key, _, ip = field_selector.partition("=")
        assert key == "status.podIP"
        return list(self.by_ip.get(ip, []))

    async def get_pod(self, namespace: str, name: str) -> port.PodInfo:
        self.calls.append(("get_pod", f"{namespace}/{name}"))
        try:
            return self.pods[(namespace, name)]
        except KeyError:
            raise port.NotFound(f"pods {name!r} not found", status=404) from None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def resolver(cluster: FakeCluster, clock: Clock | None = None) -> resolving.NodeResolver:
    return resolving.NodeResolver(cluster, ttl=30.0, monotonic=clock or Clock())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("labels", "why"),
    [
        ({"node": NODE, "Hostname": EXPORTER}, "node=gpu-node-01: is a Node"),
        (
            {"node": EXPORTER, "Hostname": EXPORTER, "kubernetes_node": NODE},
            "kubernetes_node=gpu-node-01: is a Node",
        ),
        ({"Hostname": EXPORTER, "instance": f"{NODE}:9400"}, "instance=gpu-node-01:9400"),
        ({"Hostname": EXPORTER, "instance": NODE}, "instance=gpu-node-01: is a Node"),
        (
            {"Hostname": EXPORTER, "instance": f"{EXPORTER_IP}:9400"},
            f"IP {EXPORTER_IP} is pod gpu-operator/{EXPORTER} on node {NODE}",
        ),
        (
            {"Hostname": EXPORTER, "namespace": "gpu-operator", "pod": EXPORTER},
            f"Hostname={EXPORTER}: is pod gpu-operator/{EXPORTER} on node {NODE}",
        ),
        ({"Hostname": NODE, "instance": f"{NODE_IP}:9400"}, "Hostname=gpu-node-01: is a Node"),
        ({"instance": f"{NODE_IP}:9400"}, f"IP {NODE_IP} is pod monitoring/node-exporter-a"),
    ],
)
async def test_every_realistic_label_set_leads_to_the_node_the_gpu_is_on(
    labels: dict[str, str], why: str
) -> None:
    choice = await resolver(FakeCluster()).choose(labels, ORDER)
    assert choice.node == NODE
    assert why in choice.reason


async def test_the_old_first_label_rule_picks_the_exporter_pod() -> None:
    """What the engine did before: the first non-empty label, never asked about."""
    labels = {"node": EXPORTER, "Hostname": EXPORTER, "kubernetes_node": NODE}
    assert targeting.unverified(labels, ORDER).node == EXPORTER
    assert (await resolver(FakeCluster()).choose(labels, ORDER)).node == NODE


async def test_no_candidate_is_a_node_names_every_candidate_and_why() -> None:
    labels = {"node": "ghost", "Hostname": "GHOST_HOST", "instance": "10.9.9.9:9400"}
    choice = await resolver(FakeCluster()).choose(labels, ORDER)
    assert choice.node is None
    assert choice.reason == (
        "no candidate is a Node (looked at node, kubernetes_node, Hostname, hostname, instance): "
        "node=ghost: is not a Node; Hostname=GHOST_HOST: is neither a Node name nor an IP; "
        "instance=10.9.9.9:9400: no running pod has IP 10.9.9.9"
    )


async def test_no_label_at_all_says_which_labels_were_looked_at() -> None:
    choice = await resolver(FakeCluster()).choose({"alertname": "X"}, ("node", "instance"))
    assert choice == targeting.Choice(
        node=None, reason="no node label found (looked at node, instance)"
    )


async def test_a_playbook_order_is_followed_and_stops_at_the_first_node() -> None:
    cluster = FakeCluster()
    labels = {"node": "gpu-node-02", "kubernetes_node": NODE}
    choice = await resolver(cluster).choose(labels, ("kubernetes_node", "node"))
    assert choice.node == NODE
    assert cluster.calls == [("get_node", NODE)]


async def test_answers_are_cached_briefly_so_a_burst_asks_once_per_candidate() -> None:
    cluster, clock = FakeCluster(), Clock()
    resolve = resolver(cluster, clock)
    labels = {"node": EXPORTER, "instance": f"{EXPORTER_IP}:9400"}
    for _ in range(8):  # eight GPUs of one node alert together
        assert (await resolve.choose(labels, ORDER)).node == NODE
    assert sorted(set(cluster.calls)) == sorted(cluster.calls)  # each question asked once
    # get_node of the exporter pod's name and of the IP (a Node may be named by its IP), the
    # pods with that IP, get_node of their node
    assert len(cluster.calls) == 4
    clock.now += 31
    await resolve.choose(labels, ORDER)
    assert len(cluster.calls) == 8


async def test_pods_on_several_nodes_with_one_ip_lead_nowhere() -> None:
    cluster = FakeCluster()
    cluster.by_ip["10.1.1.1"] = [
        pod("a", node=NODE, ip="10.1.1.1"),
        pod("b", node="gpu-node-02", ip="10.1.1.1"),
    ]
    choice = await resolver(cluster).choose({"instance": "10.1.1.1:9400"}, ORDER)
    assert choice.node is None
    assert "pods with IP 10.1.1.1 run on several nodes (gpu-node-01, gpu-node-02)" in choice.reason


async def test_a_cluster_that_cannot_answer_is_not_a_refusal() -> None:
    cluster = FakeCluster(fail=port.Unavailable("connection refused"))
    with pytest.raises(resolving.TargetUnavailable, match="connection refused"):
        await resolver(cluster).choose({"node": NODE}, ORDER)


def test_candidates_strip_ports_and_skip_repeats() -> None:
    labels = {"node": NODE, "Hostname": NODE, "instance": "[fe80::1]:9400", "hostname": ""}
    found = targeting.candidates(labels, ORDER)
    assert [(c.label, c.host) for c in found] == [("node", NODE), ("instance", "fe80::1")]
    assert found[1].ip == "fe80::1"
