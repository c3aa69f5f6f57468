"""The simulator's state file: what a restarted simulator needs to carry on where it stopped.

Saved on a clean stop, restored at start-up: every object (with its uid and resource version;
the resource version counter carries on), the GPUs, the files in pods, the GPUs the kubelet
gave each pod, the settings and the mutation log (same epoch, next boot). Not kept: watch
history (a client resuming a watch from before the restart gets 410 Expired and lists again,
as after an API server restart), fault rules and exec sessions. Without a state file, a
restart starts over from the fleet: cordons, labels, taints and power limits are gone, and the
mutation log starts a new epoch.

In between, ``restore(..., what="gpus")`` puts back only the GPUs: the Kubernetes objects start
over from the fleet (an API server that lost its etcd) while the GPUs keep their power limits
(they live in the driver on the node, not in the API server). The mutation log starts a new
epoch then too.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import pathlib
from typing import Any, Literal

from remediator.sim import cluster as cluster_mod
from remediator.sim import fleet, mutations, nvidia

VERSION = 1
Restore = Literal["all", "gpus"]


def snapshot(cluster: cluster_mod.Cluster) -> dict[str, Any]:
    return {
        "version": VERSION,
        "resourceVersion": int(cluster.store.resource_version),
        "objects": cluster.store.dump(),
        "settings": cluster.settings.model_dump(),
        "hosts": {
            node: {
                "driver_version": host.driver_version,
                "cuda_version": host.cuda_version,
                "bug_report_hangs": host.bug_report_hangs,
                "gpus": [dataclasses.asdict(gpu) for gpu in host.gpus],
            }
            for node, host in cluster.hosts.items()
        },
        "files": {
            uid: {path: base64.b64encode(data).decode() for path, data in files.items()}
            for uid, files in cluster.files.items()
        },
        "mutations": cluster.mutations.dump(),
        "device_allocations": cluster.device_allocations,
    }


def restore(cluster: cluster_mod.Cluster, state: dict[str, Any], what: Restore = "all") -> None:
    """Put ``cluster`` back in the state ``snapshot`` described (``what="gpus"``: only its GPUs)."""
    if state.get("version") != VERSION:
        raise ValueError(f"unsupported state file version {state.get('version')!r}")
    if what == "gpus":
        _restore_gpus(cluster, state)
        return
    cluster.store.load(state["objects"], int(state["resourceVersion"]))
    cluster.settings = fleet.Settings.model_validate(state["settings"])
    cluster.hosts = {
        node: nvidia.Host(
            gpus=[nvidia.Gpu(**gpu) for gpu in host["gpus"]],
            driver_version=host["driver_version"],
            cuda_version=host["cuda_version"],
            bug_report_hangs=host["bug_report_hangs"],
        )
        for node, host in state["hosts"].items()
    }
    cluster.files = {
        uid: {path: base64.b64decode(data) for path, data in files.items()}
        for uid, files in state["files"].items()
    }
    cluster.mutations = mutations.Log.restored(state["mutations"])
    cluster.device_allocations = dict(state.get("device_allocations") or {})
    cluster.wake.set()


def _restore_gpus(cluster: cluster_mod.Cluster, state: dict[str, Any]) -> None:
    for node, host in state["hosts"].items():
        current = cluster.hosts.get(node)
        if current is not None:
            current.gpus = [nvidia.Gpu(**gpu) for gpu in host["gpus"]]


def load(path: str | pathlib.Path) -> dict[str, Any] | None:
    """The state saved at ``path``, or ``None`` when there is none yet."""
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    state: dict[str, Any] = json.loads(text)
    return state


def save(cluster: cluster_mod.Cluster, path: str | pathlib.Path) -> None:
    """Write the state atomically (a crash while saving leaves the previous file)."""
    target = pathlib.Path(path)
    temporary = target.with_name(target.name + ".tmp")
    temporary.write_text(json.dumps(snapshot(cluster)), encoding="utf-8")
    os.replace(temporary, target)
