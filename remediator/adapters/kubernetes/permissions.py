"""The Kubernetes API calls this adapter makes, per method, as RBAC sees them.

``deploy/kustomize/base/rbac.yaml`` must grant exactly these: ``tests/deploy`` compares the two
and fails on anything granted but unused or used but not granted, and an integration test runs
every method against the simulator and checks its request log against this table, so the table
cannot drift from the code.

Scopes: ``cluster`` (cluster-scoped objects, or namespaced objects in any namespace: needs a
ClusterRole), ``driver`` (the GPU Operator namespace, ``driver_namespace``) and ``lease``
(remediator's own namespace, where the leader Lease lives).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Scope = Literal["cluster", "driver", "lease"]


@dataclasses.dataclass(frozen=True)
class Call:
    group: str  # "" is the core group
    resource: str  # with its subresource, e.g. "pods/eviction"
    verb: str
    scope: Scope
    request_shows_it: bool = True
    """False for verbs the API server authorizes although the request's method does not
    show them (websocket exec is a GET, authorized as ``get``; clusters with
    AuthorizePodWebsocketUpgradeCreatePermission also require ``create``)."""


def _c(resource: str, verb: str, scope: Scope = "cluster", group: str = "") -> Call:
    return Call(group, resource, verb, scope)


CLUSTER_CALLS: dict[str, tuple[Call, ...]] = {
    "get_node": (_c("nodes", "get"),),
    "list_nodes": (_c("nodes", "list"),),
    "gpu_fleet": (_c("nodes", "list"), _c("nodes", "watch")),
    "gpu_nodes": (_c("nodes", "list"),),  # the watch's copies, or a list while it fails
    "patch_node": (_c("nodes", "patch"),),
    "replace_node_taints": (_c("nodes", "patch"),),
    "list_pods": (_c("pods", "list"),),
    "get_pod": (_c("pods", "get"),),
    "get_namespace": (_c("namespaces", "get"),),
    "evict_pod": (_c("pods/eviction", "create"),),
    "annotate_pod": (_c("pods", "patch"),),
    "list_pdbs": (_c("poddisruptionbudgets", "list", group="policy"),),
    "find_driver_pod": (_c("pods", "list", "driver"),),
    # node.reboot's pod and the GPU exec pods of host_pod pools (actions.hostexec)
    "create_pod": (_c("pods", "create", "driver"),),
    "delete_pod": (_c("pods", "delete", "driver"),),
    "create_event": (_c("events", "create"),),
    "exec": (
        _c("pods/exec", "get", "driver"),
        Call("", "pods/exec", "create", "driver", request_shows_it=False),
    ),
}
"""``KubeCluster`` method → the calls it makes (``exec`` only ever targets driver pods and
remediator's own GPU exec pods, both in the driver namespace)."""

LEASE_CALLS: dict[str, tuple[Call, ...]] = {
    "acquire_or_renew": (
        _c("leases", "get", "lease", "coordination.k8s.io"),
        _c("leases", "create", "lease", "coordination.k8s.io"),
        _c("leases", "update", "lease", "coordination.k8s.io"),
    ),
    "release": (
        _c("leases", "get", "lease", "coordination.k8s.io"),
        _c("leases", "update", "lease", "coordination.k8s.io"),
    ),
}
"""``KubeLease`` method → the calls it makes."""


def all_calls(
    *, driver_namespace: str = "gpu-operator", lease_namespace: str = "remediator"
) -> set[tuple[str, str, str, str]]:
    """Every call as ``(apiGroup, resource, verb, scope)`` with ``cluster`` or
    ``namespace:<name>`` scopes (the shape ``tests/deploy/rbac.py`` reads manifests into)."""
    scopes = {
        "cluster": "cluster",
        "driver": f"namespace:{driver_namespace}",
        "lease": f"namespace:{lease_namespace}",
    }
    return {
        (call.group, call.resource, call.verb, scopes[call.scope])
        for table in (CLUSTER_CALLS, LEASE_CALLS)
        for calls in table.values()
        for call in calls
    }
