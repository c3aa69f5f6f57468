"""What the deploy/ manifests allow remediator's ServiceAccount to do.

`granted_permissions()` answers with a set of (apiGroup, resource, verb, scope) tuples, where
apiGroup is "" for the core group, resource may carry a subresource ("pods/eviction"), and scope
is "cluster" for a ClusterRole bound by a ClusterRoleBinding or "namespace:<name>" for a Role
bound in that namespace. Only roles bound to the ServiceAccount count. Compare it with the
Kubernetes calls the code makes, e.g.:

    from tests.deploy import rbac
    assert ("", "pods/eviction", "create", "cluster") in rbac.granted_permissions()

Standalone (PyYAML only, no kubectl): it reads deploy/kustomize/base/rbac.yaml unless it is
given already rendered objects.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

RBAC_FILE = Path(__file__).resolve().parents[2] / "deploy" / "kustomize" / "base" / "rbac.yaml"
SERVICE_ACCOUNT = ("remediator", "remediator")  # (namespace, name)

Permission = tuple[str, str, str, str]


def load_objects(path: Path = RBAC_FILE) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def _expand(rules: Iterable[dict[str, Any]], scope: str) -> set[Permission]:
    granted = set()
    for rule in rules:
        if rule.get("nonResourceURLs") or rule.get("resourceNames"):
            raise ValueError(f"unsupported rule shape (nonResourceURLs/resourceNames): {rule}")
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    granted.add((group, resource, verb, scope))
    return granted


def _binds_us(binding: dict[str, Any]) -> bool:
    namespace, name = SERVICE_ACCOUNT
    return any(
        s.get("kind") == "ServiceAccount"
        and s.get("name") == name
        and s.get("namespace", binding["metadata"].get("namespace")) == namespace
        for s in binding.get("subjects", [])
    )


def granted_permissions(objects: Iterable[dict[str, Any]] | None = None) -> set[Permission]:
    """Every (apiGroup, resource, verb, scope) the manifests grant remediator."""
    objects = list(load_objects() if objects is None else objects)
    cluster_roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRole"}
    roles = {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o
        for o in objects
        if o["kind"] == "Role"
    }
    granted: set[Permission] = set()
    for binding in objects:
        if binding["kind"] not in {"ClusterRoleBinding", "RoleBinding"} or not _binds_us(binding):
            continue
        ref = binding["roleRef"]
        if binding["kind"] == "ClusterRoleBinding":
            granted |= _expand(cluster_roles[ref["name"]].get("rules", []), "cluster")
            continue
        namespace = binding["metadata"]["namespace"]
        if ref["kind"] == "ClusterRole":
            role = cluster_roles[ref["name"]]
        else:
            role = roles[(namespace, ref["name"])]
        granted |= _expand(role.get("rules", []), f"namespace:{namespace}")
    return granted
