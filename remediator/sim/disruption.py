"""PodDisruptionBudget status and the eviction decision, after kube-apiserver.

Follows ``pkg/controller/disruption`` (status: expectedPods, desiredHealthy, currentHealthy,
disruptionsAllowed) and ``pkg/registry/core/pod/storage/eviction.go`` (PDB check skipped for
Pending/Succeeded/Failed or terminating pods; 429 when the budget has no disruption left; 500
when more than one budget selects the pod; unhealthy pods evictable while the budget is met).
"""

from __future__ import annotations

import math
from typing import Any

from remediator.sim import cluster as cluster_mod
from remediator.sim import errors, objects, selectors, store

Obj = dict[str, Any]
PDB = "poddisruptionbudgets.policy"
BLOCKED = "Cannot evict pod as it would violate the pod's disruption budget."
MULTIPLE = (
    "This pod has more than one PodDisruptionBudget, which the eviction subresource "
    "does not support."
)


def install(cluster: cluster_mod.Cluster) -> None:
    def hook(store_key: str, kind: str, obj: Obj) -> None:
        if (
            store_key == "pods"
            or (store_key == PDB and kind != "DELETED")
            or store_key in ("replicasets.apps", "statefulsets.apps")
        ):
            refresh(cluster, obj["metadata"].get("namespace"))

    cluster.store.hooks.append(hook)
    refresh(cluster, None)


def matching_pods(cluster: cluster_mod.Cluster, pdb: Obj) -> list[Obj]:
    reqs = selectors.selector_from_label_selector(pdb["spec"].get("selector"))
    if reqs is None:
        return []
    return [
        p
        for p in cluster.store.iter("pods", pdb["metadata"]["namespace"])
        if selectors.matches_labels(reqs, p["metadata"].get("labels"))
    ]


def _scaled(value: int | str, total: int, *, round_up: bool) -> int:
    if isinstance(value, int):
        return value
    percent = int(str(value).rstrip("%"))
    exact = percent * total / 100
    return math.ceil(exact) if round_up else math.floor(exact)


def _expected(cluster: cluster_mod.Cluster, pods: list[Obj]) -> int:
    seen: dict[str, int] = {}
    bare = 0
    for pod in pods:
        ref = objects.controller_of(pod)
        if ref is None or ref.get("kind") not in ("ReplicaSet", "StatefulSet"):
            bare += 1
            continue
        key = ref["kind"].lower() + "s.apps"
        owner = cluster.store.get(key, pod["metadata"]["namespace"], ref["name"])
        if owner is not None:
            seen[ref["uid"]] = int(owner["spec"].get("replicas", 1))
    return sum(seen.values()) + bare


def compute_status(cluster: cluster_mod.Cluster, pdb: Obj) -> Obj:
    pods = matching_pods(cluster, pdb)
    spec = pdb["spec"]
    healthy = sum(1 for p in pods if objects.is_ready(p))
    min_available = spec.get("minAvailable")
    max_unavailable = spec.get("maxUnavailable")
    if max_unavailable is None and isinstance(min_available, int):
        expected = len(pods)
        desired = min_available
    else:
        expected = _expected(cluster, pods)
        if max_unavailable is not None:
            desired = max(0, expected - _scaled(max_unavailable, expected, round_up=True))
        else:
            desired = _scaled(
                min_available if min_available is not None else 1, expected, round_up=True
            )
    allowed = max(0, healthy - desired)
    old = pdb.get("status") or {}
    reason = "SufficientPods" if allowed > 0 else "InsufficientPods"
    old_cond = next((c for c in old.get("conditions", []) if c.get("reason") == reason), None)
    condition = {
        "type": "DisruptionAllowed",
        "status": "True" if allowed > 0 else "False",
        "reason": reason,
        "message": "",
        "observedGeneration": pdb["metadata"].get("generation", 1),
        "lastTransitionTime": old_cond["lastTransitionTime"] if old_cond else store.timestamp(),
    }
    return {
        "observedGeneration": pdb["metadata"].get("generation", 1),
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [condition],
    }


def refresh(cluster: cluster_mod.Cluster, namespace: str | None) -> None:
    st = cluster.store
    for pdb in list(st.iter(PDB, namespace)):
        status = compute_status(cluster, pdb)
        if status != pdb.get("status"):
            meta = pdb["metadata"]

            def set_status(obj: Obj, status: Obj = status) -> None:
                obj["status"] = status

            st.mutate(PDB, meta["namespace"], meta["name"], set_status)


def check_eviction(cluster: cluster_mod.Cluster, pod: Obj) -> None:
    """Raise the API error that forbids evicting ``pod``, or return if it may go."""
    phase = pod.get("status", {}).get("phase")
    if phase in ("Pending", "Succeeded", "Failed") or pod["metadata"].get("deletionTimestamp"):
        return
    labels = pod["metadata"].get("labels") or {}
    pdbs = []
    for pdb in cluster.store.iter(PDB, pod["metadata"]["namespace"]):
        reqs = selectors.selector_from_label_selector(pdb["spec"].get("selector"))
        if reqs is not None and selectors.matches_labels(reqs, labels):
            pdbs.append(pdb)
    if not pdbs:
        return
    if len(pdbs) > 1:
        raise errors.ApiError(
            500, f"Internal error occurred: {MULTIPLE}", details={"causes": [{"message": MULTIPLE}]}
        )
    pdb = pdbs[0]
    status = compute_status(cluster, pdb)
    if not objects.is_ready(pod) and status["currentHealthy"] >= status["desiredHealthy"]:
        return  # IfHealthyBudget: an unhealthy pod may go while the budget is met
    if status["disruptionsAllowed"] <= 0:
        cause = (
            f"The disruption budget {pdb['metadata']['name']} needs "
            f"{status['desiredHealthy']} healthy pods and has "
            f"{status['currentHealthy']} currently"
        )
        raise errors.ApiError(
            429, BLOCKED, details={"causes": [{"reason": "DisruptionBudget", "message": cause}]}
        )
