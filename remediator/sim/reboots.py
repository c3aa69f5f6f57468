"""A host reboot: the node goes NotReady, its GPUs lose their volatile state, its pods restart.

Triggered by a privileged pod running the host's reboot command on the node (the way a
remediation tool reboots a host from inside the cluster) or by the admin API (standing in for
an out-of-band hook, a BMC say). While the host is down the node's ``Ready`` condition is
``Unknown`` (the node lifecycle controller's "Kubelet stopped posting node status") and its pods
are not ready; when it is back, ``Ready`` is ``True`` again with a new boot id and every pod that
was on the node starts again (phase ``Pending`` until the kubelet has started it), the driver
pod included. Durations are in simulated seconds (``reboot_seconds``), scaled like the rest.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from remediator.sim import cluster as cluster_mod
from remediator.sim import store

Obj = dict[str, Any]

#: What the reboot pod runs: enter the host's namespaces (hostPID) and ask systemd to reboot.
REBOOT_COMMAND = ["nsenter", "--target", "1", "--mount", "--uts", "--ipc", "--net", "--pid"]
REBOOT_ARGS = ["--", "systemctl", "reboot"]

_tasks: set[asyncio.Task[None]] = set()


def is_reboot_pod(pod: Obj) -> bool:
    """Privileged, host PID, and its container runs ``nsenter ... -- systemctl reboot``."""
    spec = pod.get("spec", {})
    if not spec.get("hostPID"):
        return False
    for container in spec.get("containers", []):
        privileged = (container.get("securityContext") or {}).get("privileged")
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        if privileged and argv[:1] == ["nsenter"] and argv[-2:] == ["systemctl", "reboot"]:
            return True
    return False


def _set_ready(node: Obj, status: str, reason: str, message: str) -> None:
    now = store.timestamp()
    for condition in node.setdefault("status", {}).setdefault("conditions", []):
        if condition.get("type") == "Ready":
            if condition.get("status") != status:
                condition["lastTransitionTime"] = now
            condition.update(status=status, reason=reason, message=message)
            condition["lastHeartbeatTime"] = now


def _pods_on(cluster: cluster_mod.Cluster, node: str) -> list[Obj]:
    return list(cluster.store.iter_pods_on_node(node))


def _not_ready(pod: Obj) -> None:
    for condition in pod.get("status", {}).get("conditions", []):
        if condition.get("type") in ("Ready", "ContainersReady"):
            condition["status"] = "False"


def _restart(pod: Obj) -> None:
    status = pod.setdefault("status", {})
    if status.get("phase") in ("Succeeded", "Failed"):
        return
    status["phase"] = "Pending"
    _not_ready(pod)


def _go_down(cluster: cluster_mod.Cluster, node: str) -> None:
    cluster.store.mutate(
        "nodes",
        "",
        node,
        lambda n: _set_ready(
            n, "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status."
        ),
    )
    for pod in _pods_on(cluster, node):
        meta = pod["metadata"]
        if is_reboot_pod(pod):  # done: the host it ran on went down under it
            cluster.store.mutate("pods", meta["namespace"], meta["name"], _succeed)
            continue
        cluster.store.mutate("pods", meta["namespace"], meta["name"], _not_ready)
        cluster.files.pop(meta.get("uid", ""), None)
    host = cluster.hosts.get(node)
    if host is not None:
        host.reboot()


def _succeed(pod: Obj) -> None:
    pod.setdefault("status", {})["phase"] = "Succeeded"
    _not_ready(pod)


def _come_up(cluster: cluster_mod.Cluster, node: str) -> None:
    def ready(obj: Obj) -> None:
        _set_ready(obj, "True", "KubeletReady", "kubelet is posting ready status")
        info = obj.setdefault("status", {}).setdefault("nodeInfo", {})
        info["bootID"] = hashlib.sha256((node + store.timestamp_precise()).encode()).hexdigest()

    cluster.store.mutate("nodes", "", node, ready)
    for pod in _pods_on(cluster, node):
        if not pod["metadata"].get("deletionTimestamp"):
            meta = pod["metadata"]
            cluster.store.mutate("pods", meta["namespace"], meta["name"], _restart)
    cluster.wake.set()


async def reboot(cluster: cluster_mod.Cluster, node: str) -> None:
    """Take ``node`` down now, bring it back after ``reboot_seconds``."""
    cluster.reboots.append(node)
    _go_down(cluster, node)
    await asyncio.sleep(cluster.scaled(cluster.settings.reboot_seconds))
    if cluster.store.get("nodes", "", node) is not None:
        _come_up(cluster, node)


def start(cluster: cluster_mod.Cluster, node: str) -> bool:
    """Begin a reboot of ``node`` in the background; False when there is no such node."""
    if cluster.store.get("nodes", "", node) is None:
        return False
    task = asyncio.get_running_loop().create_task(reboot(cluster, node))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return True
