"""RBAC grants remediator exactly the Kubernetes calls its actions make, nothing more."""

from __future__ import annotations

from . import rbac, tools

CLUSTER = "cluster"
EXPECTED = {
    ("", "nodes", "get", CLUSTER),
    ("", "nodes", "list", CLUSTER),
    # the GPU nodes the fleet guards count: listed once, then watched
    ("", "nodes", "watch", CLUSTER),
    ("", "nodes", "patch", CLUSTER),
    ("", "pods", "get", CLUSTER),
    ("", "pods", "list", CLUSTER),
    ("", "pods", "patch", CLUSTER),
    ("policy", "poddisruptionbudgets", "list", CLUSTER),
    ("", "pods/eviction", "create", CLUSTER),
    ("", "events", "create", CLUSTER),
    # notify's owner lookup: a workload's team/owner label or annotation on its namespace.
    ("", "namespaces", "get", CLUSTER),
    ("coordination.k8s.io", "leases", "get", "namespace:remediator"),
    ("coordination.k8s.io", "leases", "create", "namespace:remediator"),
    ("coordination.k8s.io", "leases", "update", "namespace:remediator"),
    ("", "pods/exec", "create", "namespace:gpu-operator"),
    ("", "pods/exec", "get", "namespace:gpu-operator"),
    # node.reboot's pod method: a short-lived privileged pod on the node, deleted once the node
    # is back. No more than exec into the (privileged) driver pods already allows.
    ("", "pods", "create", "namespace:gpu-operator"),
    ("", "pods", "delete", "namespace:gpu-operator"),
}
# The one delete granted: remediator's own reboot pods in the driver's namespace.
ALLOWED_DELETES = {("", "pods", "delete", "namespace:gpu-operator")}


def test_manifests_grant_exactly_the_expected_permissions() -> None:
    assert rbac.granted_permissions() == EXPECTED


def test_rendered_overlays_grant_the_same_as_the_base_file(overlay: tuple[str, list]) -> None:
    _, objects = overlay
    assert rbac.granted_permissions(objects) == EXPECTED


def test_no_wildcards_secrets_or_destructive_verbs_are_granted() -> None:
    for grant in rbac.granted_permissions():
        group, resource, verb, _ = grant
        assert "*" not in (group, resource, verb)
        assert resource not in {"secrets", "configmaps"}
        assert verb not in {"deletecollection", "escalate", "bind", "impersonate"}
        assert verb != "delete" or grant in ALLOWED_DELETES, grant


def test_roles_bound_to_someone_else_do_not_count() -> None:
    objects = rbac.load_objects()
    for obj in objects:
        if obj["kind"].endswith("Binding"):
            obj["subjects"] = [{"kind": "ServiceAccount", "name": "other", "namespace": "x"}]
    assert rbac.granted_permissions(objects) == set()


def test_rbac_objects_in_overlays_are_the_base_file_unchanged() -> None:
    base = {
        (o["kind"], o["metadata"]["name"]): o
        for o in rbac.load_objects()
        if o["kind"] in {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    }
    for name in tools.OVERLAYS:
        rendered = {
            (o["kind"], o["metadata"]["name"]): o
            for o in tools.render_overlay(name)
            if (o["kind"], o["metadata"]["name"]) in base
        }
        assert rendered == base
