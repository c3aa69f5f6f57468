"""The GPU Operator's driver upgrade controller, as far as remediator sees it.

A node whose ``nvidia.com/gpu-driver-upgrade-state`` label is set to ``upgrade-required`` is
upgraded to the cluster policy's driver version (``DriverPolicy.version``; ``None`` keeps the
version the node has): the state moves to ``pod-restart-required``, the driver pod on the node
restarts (phase ``Pending``, not ready, until the kubelet has started it again: the driver's
kernel modules are unloaded and the new ones loaded), nvidia-smi reports the new version, and
the state ends at ``upgrade-done``. A node in ``DriverPolicy.failing`` fails: the new driver
does not load, the pod restarts with the old version and the state ends at
``upgrade-failed``, as the operator's ``podRestartTimeoutSeconds`` would leave it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import weakref
from collections.abc import Iterable
from typing import Any

from remediator.sim import cluster as cluster_mod

Obj = dict[str, Any]

STATE = "nvidia.com/gpu-driver-upgrade-state"
DRIVER_LABELS = {"app": "nvidia-driver-daemonset", "app.kubernetes.io/component": "nvidia-driver"}


@dataclasses.dataclass
class DriverPolicy:
    """The ClusterPolicy's ``spec.driver`` as far as upgrades go."""

    version: str | None = None
    failing: set[str] = dataclasses.field(default_factory=set)
    upgraded: list[str] = dataclasses.field(default_factory=list)  # nodes, in order begun
    peak: int = 0  # the most nodes upgrading at the same time


_policies: weakref.WeakKeyDictionary[cluster_mod.Cluster, DriverPolicy] = (
    weakref.WeakKeyDictionary()
)
_active: weakref.WeakKeyDictionary[cluster_mod.Cluster, set[str]] = weakref.WeakKeyDictionary()
_tasks: set[asyncio.Task[None]] = set()


def policy(cluster: cluster_mod.Cluster) -> DriverPolicy:
    return _policies.setdefault(cluster, DriverPolicy())


def _set_state(cluster: cluster_mod.Cluster, node: str, state: str) -> None:
    cluster.store.mutate(
        "nodes",
        "",
        node,
        lambda obj: obj["metadata"].setdefault("labels", {}).update({STATE: state}),
    )


def _driver_pods(cluster: cluster_mod.Cluster, node: str) -> list[Obj]:
    return [
        pod
        for pod in cluster.store.iter_pods_on_node(node)
        if not pod["metadata"].get("deletionTimestamp")
        and any(pod["metadata"].get("labels", {}).get(k) == v for k, v in DRIVER_LABELS.items())
    ]


def _restart(pod: Obj) -> None:
    status = pod.setdefault("status", {})
    status["phase"] = "Pending"
    for condition in status.get("conditions", []):
        if condition.get("type") in ("Ready", "ContainersReady"):
            condition["status"] = "False"


async def upgrade(cluster: cluster_mod.Cluster, node: str) -> None:
    wanted = policy(cluster)
    wanted.upgraded.append(node)
    wanted.peak = max(wanted.peak, len(_active.setdefault(cluster, set())))
    try:
        _set_state(cluster, node, "pod-restart-required")
        await asyncio.sleep(cluster.scaled(cluster.settings.pod_startup_seconds))
        for pod in _driver_pods(cluster, node):
            meta = pod["metadata"]
            cluster.store.mutate("pods", meta["namespace"], meta["name"], _restart)
            cluster.files.pop(meta.get("uid", ""), None)
        host = cluster.hosts.get(node)
        failed = node in wanted.failing
        if host is not None and wanted.version and not failed:
            host.driver_version = wanted.version
        _set_state(cluster, node, "upgrade-failed" if failed else "upgrade-done")
        cluster.wake.set()
    finally:
        _active.setdefault(cluster, set()).discard(node)


def reconcile(cluster: cluster_mod.Cluster, nodes: Iterable[str] | None = None) -> list[str]:
    """Start an upgrade of every node newly labelled ``upgrade-required`` (a controller pass):
    of ``nodes`` (those that changed since the last pass), or of every node. Returns the nodes
    labelled while their last upgrade is still going, to be looked at again next pass."""
    active = _active.setdefault(cluster, set())
    st = cluster.store
    found = st.iter("nodes") if nodes is None else (st.peek("nodes", "", n) for n in nodes)
    waiting = []
    for node in found:
        if node is None or node["metadata"].get("labels", {}).get(STATE) != "upgrade-required":
            continue
        name = node["metadata"]["name"]
        if name in active:
            waiting.append(name)
            continue
        active.add(name)
        task = asyncio.get_running_loop().create_task(upgrade(cluster, name))
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)
    return waiting


def request(cluster: cluster_mod.Cluster, node: str, version: str | None) -> bool:
    """What an upgrade hook does: pin ``version`` (if given) and ask for the node's upgrade;
    False when there is no such node."""
    if cluster.store.get("nodes", "", node) is None:
        return False
    if version:
        policy(cluster).version = version
    _set_state(cluster, node, "upgrade-required")
    cluster.wake.set()
    return True


def describe(cluster: cluster_mod.Cluster) -> dict[str, Any]:
    wanted = policy(cluster)
    return {
        "version": wanted.version,
        "failing": sorted(wanted.failing),
        "upgraded": list(wanted.upgraded),
    }
