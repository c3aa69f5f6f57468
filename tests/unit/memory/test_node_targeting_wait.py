"""The engine asks the cluster which node an alert is about before planning its runs; a cluster
that cannot answer delays the episode (no guess), and past the wait fails its runs with the
reason and a notice to on-call."""

from __future__ import annotations

from typing import Any

from remediator.domain import runs
from remediator.ports import cluster as port

PLAYBOOK = """
name: record
match: {alertname: GPUXidError79}
steps:
  - {id: first, action: test.record, params: {label: one}}
"""


class Cluster:
    """The cluster port as far as the engine asks it: nodes by name, or down."""

    def __init__(self, *nodes: str) -> None:
        self.nodes = set(nodes)
        self.down = False

    async def get_node(self, name: str) -> Any:
        if self.down:
            raise port.Unavailable("connection refused")
        if name not in self.nodes:
            raise port.NotFound(f"nodes {name!r} not found", status=404)
        return object()

    async def list_pods(self, **_: Any) -> list[port.PodInfo]:
        return []

    async def get_pod(self, namespace: str, name: str) -> port.PodInfo:
        raise port.NotFound("no such pod", status=404)

    async def list_nodes(self, label_selector: str = "") -> list[Any]:
        return []

    async def gpu_fleet(self) -> None:
        return None  # the fleet budget's count: none known


async def test_an_unanswering_cluster_delays_the_episode_then_fails_its_runs_with_a_notice(
    make_engine: Any,
) -> None:
    h = make_engine(PLAYBOOK)
    cluster = Cluster("gpu-node-03")
    cluster.down = True
    h.engine.services.cluster = cluster
    await h.fire()
    await h.settle()
    assert h.runs() == []
    assert (await h.store.probe()).episodes  # still waiting for its node

    h.clock.advance(3 * 60)  # past targeting_wait
    await h.settle()
    [run] = h.runs()
    assert run.status is runs.RunStatus.FAILED
    assert run.node is None
    assert run.reason.startswith("no node confirmed: cannot ask the cluster about gpu-node-03")
    assert h.applied() == []
    [notice] = h.notifier.sent
    assert notice["data"]["event"] == "unplanned"
    assert "GPUXidError79 could not be acted on: no node confirmed" in notice["message"]


async def test_a_cluster_that_answers_again_in_time_gets_the_run_on_its_node(
    make_engine: Any,
) -> None:
    h = make_engine(PLAYBOOK)
    cluster = Cluster("gpu-node-03")
    cluster.down = True
    h.engine.services.cluster = cluster
    await h.fire()
    await h.settle()
    assert h.runs() == []

    cluster.down = False
    h.clock.advance(30)
    await h.settle()
    [run] = h.runs()
    assert (run.status, run.node) == (runs.RunStatus.SUCCEEDED, "gpu-node-03")
    assert h.applied() == ["one"]


async def test_an_alert_naming_no_node_fails_at_once_naming_what_it_looked_at(
    make_engine: Any,
) -> None:
    h = make_engine(PLAYBOOK)
    h.engine.services.cluster = Cluster("gpu-node-01")
    await h.fire(node="gpu-node-03")
    await h.settle()
    [run] = h.runs()
    assert run.status is runs.RunStatus.FAILED
    assert run.reason.startswith("no candidate is a Node (looked at node, kubernetes_node,")
    assert "node=gpu-node-03: is not a Node" in run.reason
    assert [s["data"]["event"] for s in h.notifier.sent] == ["unplanned"]
