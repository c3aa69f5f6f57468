"""The resources the simulator serves, and the discovery documents that describe them."""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any

VERBS_RW = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclasses.dataclass(frozen=True)
class Resource:
    """One REST resource. ``store_key`` names its bucket in the store (shared across versions)."""

    name: str
    singular: str
    kind: str
    group: str
    version: str
    namespaced: bool
    store_key: str
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = tuple(VERBS_RW)
    has_generation: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> tuple[str, str]:
        return (self.group, self.version)


def _r(
    name: str,
    kind: str,
    group: str,
    version: str,
    *,
    namespaced: bool = True,
    short: tuple[str, ...] = (),
    store_key: str | None = None,
    generation: bool = False,
) -> Resource:
    singular = kind.lower()
    return Resource(
        name=name,
        singular=singular,
        kind=kind,
        group=group,
        version=version,
        namespaced=namespaced,
        store_key=store_key or (f"{name}.{group}" if group else name),
        short_names=short,
        has_generation=generation,
    )


RESOURCES: list[Resource] = [
    _r("namespaces", "Namespace", "", "v1", namespaced=False, short=("ns",)),
    _r("nodes", "Node", "", "v1", namespaced=False, short=("no",)),
    _r("pods", "Pod", "", "v1", short=("po",)),
    _r("events", "Event", "", "v1", short=("ev",)),
    _r("replicasets", "ReplicaSet", "apps", "v1", short=("rs",), generation=True),
    _r("statefulsets", "StatefulSet", "apps", "v1", short=("sts",), generation=True),
    _r("daemonsets", "DaemonSet", "apps", "v1", short=("ds",), generation=True),
    _r("deployments", "Deployment", "apps", "v1", short=("deploy",), generation=True),
    _r(
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        "policy",
        "v1",
        short=("pdb",),
        generation=True,
    ),
    _r(
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        "policy",
        "v1beta1",
        short=("pdb",),
        store_key="poddisruptionbudgets.policy",
        generation=True,
    ),
    _r("leases", "Lease", "coordination.k8s.io", "v1"),
    _r("events", "Event", "events.k8s.io", "v1", short=("ev",)),
]

GROUP_VERSIONS: dict[str, list[str]] = {
    "apps": ["v1"],
    "events.k8s.io": ["v1"],
    "policy": ["v1", "v1beta1"],
    "coordination.k8s.io": ["v1"],
}


def find(group: str, version: str, name: str) -> Resource | None:
    for res in RESOURCES:
        if res.group == group and res.version == version and res.name == name:
            return res
    return None


def by_store_key(key: str) -> Resource:
    for res in RESOURCES:
        if res.store_key == key:
            return res
    raise KeyError(key)


def _resource_entry(res: Resource) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": res.name,
        "singularName": res.singular,
        "namespaced": res.namespaced,
        "kind": res.kind,
        "verbs": list(res.verbs),
    }
    if res.short_names:
        entry["shortNames"] = list(res.short_names)
    entry["storageVersionHash"] = f"sim{zlib.crc32(res.store_key.encode()):08x}"
    return entry


def resource_list(group: str, version: str) -> dict[str, Any] | None:
    entries = [_resource_entry(r) for r in RESOURCES if r.group_version == (group, version)]
    if not entries:
        return None
    if (group, version) == ("", "v1"):
        entries.extend(_pod_subresources())
        entries.append(
            {
                "name": "nodes/status",
                "singularName": "",
                "namespaced": False,
                "kind": "Node",
                "verbs": ["get", "patch", "update"],
            }
        )
    if (group, version) == ("policy", "v1"):
        entries.append(
            {
                "name": "poddisruptionbudgets/status",
                "singularName": "",
                "namespaced": True,
                "kind": "PodDisruptionBudget",
                "verbs": ["get", "patch", "update"],
            }
        )
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": entries}


def _pod_subresources() -> list[dict[str, Any]]:
    return [
        {
            "name": "pods/eviction",
            "singularName": "",
            "namespaced": True,
            "group": "policy",
            "version": "v1",
            "kind": "Eviction",
            "verbs": ["create"],
        },
        {
            "name": "pods/exec",
            "singularName": "",
            "namespaced": True,
            "kind": "PodExecOptions",
            "verbs": ["create", "get"],
        },
        {
            "name": "pods/log",
            "singularName": "",
            "namespaced": True,
            "kind": "Pod",
            "verbs": ["get"],
        },
        {
            "name": "pods/status",
            "singularName": "",
            "namespaced": True,
            "kind": "Pod",
            "verbs": ["get", "patch", "update"],
        },
    ]


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def api_group(name: str) -> dict[str, Any]:
    versions = [{"groupVersion": f"{name}/{v}", "version": v} for v in GROUP_VERSIONS[name]]
    return {"name": name, "versions": versions, "preferredVersion": versions[0]}


def api_group_list() -> dict[str, Any]:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [api_group(name) for name in GROUP_VERSIONS],
    }


VERSION_INFO = {
    "major": "1",
    "minor": "29",
    "gitVersion": "v1.29.0-remediator-sim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.21.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}
