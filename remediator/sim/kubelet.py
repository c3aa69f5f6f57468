"""The kubelet's device manager: which GPUs each pod was given, and its checkpoint file.

A real kubelet asks the NVIDIA device plugin to allocate ``nvidia.com/gpu`` devices to a
container when it starts, and records the assignment in
``/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint`` (the same data its
PodResources API serves, which dcgm-exporter reads to attribute GPUs to pods). Device IDs are
GPU UUIDs (the plugin's default ``deviceIDStrategy``). Unhealthy GPUs (fallen off the bus,
uncorrectable ECC errors) are not handed out.

Here assignments are made the first time anyone looks (an exec reading the file, or a test),
lowest free GPU index first, pods in creation order, and kept until the pod is deleted: a pod
keeps its GPUs for its whole life, as on a real node.
"""

from __future__ import annotations

import json
import zlib
from typing import TYPE_CHECKING, Any

from remediator.sim import objects

if TYPE_CHECKING:
    from remediator.sim import cluster as cluster_mod

CHECKPOINT = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
RESOURCE = "nvidia.com/gpu"
HOST_ROOT = "/proc/1/root"
"""A hostPID container sees the host's root filesystem through init's root."""
FINISHED = ("Succeeded", "Failed")


def allocations(cluster: cluster_mod.Cluster, node: str) -> dict[str, dict[str, Any]]:
    """Pod uid → ``{"namespace", "name", "container", "devices"}`` for GPU pods on ``node``."""
    assigned = cluster.device_allocations.setdefault(node, {})
    pods = [
        p
        for p in cluster.store.iter_pods_on_node(node)
        if p.get("status", {}).get("phase") not in FINISHED
    ]
    live = {p["metadata"]["uid"] for p in pods}
    for uid in [u for u in assigned if u not in live]:
        del assigned[uid]
    host = cluster.hosts.get(node)
    if host is None:
        return assigned
    taken = {d for entry in assigned.values() for d in entry["devices"]}
    free = [
        g.uuid
        for g in host.gpus
        if g.uuid not in taken and not g.lost and not g.ecc_uncorrected_volatile
    ]
    ordered = sorted(
        pods,
        key=lambda p: (
            p["metadata"].get("creationTimestamp", ""),
            p["metadata"]["namespace"],
            p["metadata"]["name"],
        ),
    )
    for pod in ordered:
        uid = pod["metadata"]["uid"]
        if uid in assigned or not objects.gpu_request(pod):
            continue
        for container in pod["spec"].get("containers", []):
            wanted = int(((container.get("resources") or {}).get("limits") or {}).get(RESOURCE, 0))
            if wanted and len(free) >= wanted:
                assigned[uid] = {
                    "namespace": pod["metadata"]["namespace"],
                    "name": pod["metadata"]["name"],
                    "container": container["name"],
                    "devices": free[:wanted],
                }
                free = free[wanted:]
                break
    return assigned


def holders(cluster: cluster_mod.Cluster, node: str, index: int) -> list[str]:
    """``namespace/name`` of the pods holding GPU ``index`` on ``node``."""
    gpu = cluster.gpu(node, index)
    return [
        f"{e['namespace']}/{e['name']}"
        for e in allocations(cluster, node).values()
        if gpu is not None and gpu.uuid in e["devices"]
    ]


def checkpoint(cluster: cluster_mod.Cluster, node: str) -> bytes:
    """The checkpoint as kubelet 1.20+ writes it (DeviceIDs keyed by NUMA node)."""
    entries = [
        {
            "PodUID": uid,
            "ContainerName": entry["container"],
            "ResourceName": RESOURCE,
            "DeviceIDs": {"0": list(entry["devices"])},
            "AllocResp": "",
        }
        for uid, entry in allocations(cluster, node).items()
    ]
    host = cluster.hosts.get(node)
    registered = {RESOURCE: [g.uuid for g in host.gpus]} if host is not None else {}
    data = {"PodDeviceEntries": entries, "RegisteredDevices": registered}
    checksum = zlib.crc32(json.dumps(data, sort_keys=True).encode())
    return json.dumps({"Data": data, "Checksum": checksum}).encode()


def host_file(cluster: cluster_mod.Cluster, node: str, path: str) -> bytes | None:
    """A file of the node's root filesystem, as a hostPID driver container reads it."""
    if path == HOST_ROOT + CHECKPOINT and node in cluster.hosts:
        return checkpoint(cluster, node)
    return None
