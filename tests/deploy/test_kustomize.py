"""deploy/kustomize: both overlays render, validate offline and keep their promises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from . import rulefiles, tools

Objects = list[dict[str, Any]]
Overlay = tuple[str, Objects]

SCHEMA_VERSIONS = ("1.30", kubernetes_validate.latest_version())
CRD_GROUPS = ("monitoring.coreos.com/",)
NON_ROOT_UID = 10001
# what kubectl 1.20's built-in kustomize (v2.0.3) understands, and what we use of it
KUSTOMIZE_V2_FIELDS = {
    "apiVersion",
    "kind",
    "resources",
    "bases",
    "patchesStrategicMerge",
    "configMapGenerator",
    "namespace",
    "commonLabels",
    "images",
}
COMMON_OBJECTS = {
    ("Namespace", "remediator", None),
    ("ServiceAccount", "remediator", "remediator"),
    ("ClusterRole", "remediator", None),
    ("ClusterRoleBinding", "remediator", None),
    ("Role", "remediator-leases", "remediator"),
    ("RoleBinding", "remediator-leases", "remediator"),
    ("Role", "remediator-gpu-exec", "gpu-operator"),
    ("RoleBinding", "remediator-gpu-exec", "gpu-operator"),
    ("Deployment", "remediator", "remediator"),
    ("Service", "remediator", "remediator"),
    ("NetworkPolicy", "remediator", "remediator"),
    ("PodDisruptionBudget", "remediator", "remediator"),
    ("ServiceMonitor", "remediator", "remediator"),
    ("PrometheusRule", "remediator", "remediator"),
}
OVERLAY_OBJECTS = {
    "single": {
        ("PersistentVolumeClaim", "remediator-data", "remediator"),
        ("Secret", "remediator-database", "remediator"),
    },
    "ha": set(),
}


def pod_spec(objects: Objects) -> dict[str, Any]:
    return tools.find(objects, "Deployment", "remediator")["spec"]["template"]["spec"]


def pod_labels(objects: Objects) -> dict[str, str]:
    deployment = tools.find(objects, "Deployment", "remediator")
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def selects_pods(selector: dict[str, str], objects: Objects) -> bool:
    return bool(selector) and selector.items() <= pod_labels(objects).items()


def test_overlay_renders_exactly_the_expected_objects(overlay: Overlay) -> None:
    name, objects = overlay
    found = {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in objects}
    assert found == COMMON_OBJECTS | OVERLAY_OBJECTS[name]


@pytest.mark.usefixtures("no_network")
def test_every_builtin_object_validates_offline_against_kubernetes_schemas(
    overlay: Overlay,
) -> None:
    _, objects = overlay
    checked = 0
    for obj in objects:
        if obj["apiVersion"].startswith(CRD_GROUPS):
            continue
        for version in SCHEMA_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                summary = str(e).splitlines()[0]
                pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} on {version}: {summary}")
        checked += 1
    assert checked == len(objects) - 2


def test_prometheus_rule_holds_the_rule_files_and_passes_promtool(
    overlay: Overlay, tmp_path: Path
) -> None:
    _, objects = overlay
    rule = tools.find(objects, "PrometheusRule", "remediator")
    assert set(rule) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(rule["spec"]) == {"groups"}
    expected = [g for path in rulefiles.RULE_FILES for g in rulefiles.load_groups(path)]
    assert rule["spec"]["groups"] == expected
    path = tmp_path / "embedded.yaml"
    path.write_text(rulefiles.dump(rule["spec"]), encoding="utf-8")
    assert "24 rules found" in tools.run("promtool", ["check", "rules", path])


def test_service_monitor_scrapes_metrics_from_the_service(overlay: Overlay) -> None:
    _, objects = overlay
    monitor = tools.find(objects, "ServiceMonitor", "remediator")
    service = tools.find(objects, "Service", "remediator")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    port_names = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in port_names
        assert endpoint["path"] == "/metrics"


def test_every_container_runs_non_root_read_only_without_capabilities(overlay: Overlay) -> None:
    _, objects = overlay
    spec = pod_spec(objects)
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] == NON_ROOT_UID
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not spec.get("hostNetwork")
    assert not spec.get("hostPID")
    containers = spec["containers"] + spec.get("initContainers", [])
    for container in containers:
        context = container["securityContext"]
        assert context["runAsNonRoot"] is True, container["name"]
        assert context["runAsUser"] == NON_ROOT_UID, container["name"]
        assert context["readOnlyRootFilesystem"] is True, container["name"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["capabilities"] == {"drop": ["ALL"]}, container["name"]
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, container["name"]
        assert container["resources"]["requests"]
        assert container["resources"]["limits"]


def test_the_server_container_is_wired_as_documented(overlay: Overlay) -> None:
    _, objects = overlay
    spec = pod_spec(objects)
    (server,) = spec["containers"]
    assert server["args"] == ["serve", "--listen", "0.0.0.0:8080"]
    assert server["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert server["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert server["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {e["name"]: e for e in server["env"]}
    assert env["REMEDIATOR_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "remediator-database",
        "key": "url",
    }
    assert env["REMEDIATOR_TOKENS"]["value"] == "/etc/remediator/tokens.yaml"
    assert env["REMEDIATOR_RULES"]["value"] == "/etc/remediator/rules"
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
    tokens = mounts["/etc/remediator/tokens.yaml"]
    assert volumes[tokens["name"]]["secret"]["secretName"] == "remediator-tokens"
    assert tokens["readOnly"] is True
    rules = mounts["/etc/remediator/rules"]
    assert volumes[rules["name"]]["configMap"]["name"] == "remediator-rules"
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    assert "/var/lib/remediator" in mounts
    for container in spec["containers"] + spec.get("initContainers", []):
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes, f"{container['name']} mounts a missing volume"


def test_migrations_run_in_an_init_container_before_the_server(overlay: Overlay) -> None:
    _, objects = overlay
    (migrate,) = pod_spec(objects)["initContainers"]
    (server,) = pod_spec(objects)["containers"]
    assert migrate["args"] == ["migrate"]
    assert migrate["image"] == server["image"]
    env = {e["name"]: e for e in migrate["env"]}
    server_env = {e["name"]: e for e in server["env"]}
    assert env["REMEDIATOR_DATABASE_URL"] == server_env["REMEDIATOR_DATABASE_URL"]


def test_selectors_select_the_remediator_pods(overlay: Overlay) -> None:
    _, objects = overlay
    deployment = tools.find(objects, "Deployment", "remediator")
    assert selects_pods(deployment["spec"]["selector"]["matchLabels"], objects)
    service = tools.find(objects, "Service", "remediator")
    assert selects_pods(service["spec"]["selector"], objects)
    pdb = tools.find(objects, "PodDisruptionBudget", "remediator")
    assert selects_pods(pdb["spec"]["selector"]["matchLabels"], objects)
    policy = tools.find(objects, "NetworkPolicy", "remediator")
    assert selects_pods(policy["spec"]["podSelector"]["matchLabels"], objects)
    assert pod_spec(objects)["serviceAccountName"] == "remediator"


def test_network_policy_admits_only_port_8080_and_the_needed_egress(overlay: Overlay) -> None:
    _, objects = overlay
    spec = tools.find(objects, "NetworkPolicy", "remediator")["spec"]
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"}
    for rule in spec["ingress"]:
        assert rule["from"], "ingress must name its peers"
        assert [p["port"] for p in rule["ports"]] == [8080]
    egress_ports = {p["port"] for rule in spec["egress"] for p in rule["ports"]}
    assert egress_ports == {53, 443, 6443, 5432, 9093}


def test_single_overlay_keeps_sqlite_on_a_volume_with_one_replica() -> None:
    objects = list(tools.render_overlay("single"))
    deployment = tools.find(objects, "Deployment", "remediator")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    secret = tools.find(objects, "Secret", "remediator-database")
    assert secret["stringData"]["url"] == "sqlite+aiosqlite:////var/lib/remediator/remediator.db"
    volumes = {v["name"]: v for v in pod_spec(objects)["volumes"]}
    assert volumes["data"] == {
        "name": "data",
        "persistentVolumeClaim": {"claimName": "remediator-data"},
    }
    tools.find(objects, "PersistentVolumeClaim", "remediator-data")
    pdb = tools.find(objects, "PodDisruptionBudget", "remediator")
    assert pdb["spec"]["maxUnavailable"] == 1, "a single replica must stay drainable"


def test_ha_overlay_spreads_two_replicas_that_share_postgres() -> None:
    objects = list(tools.render_overlay("ha"))
    deployment = tools.find(objects, "Deployment", "remediator")
    assert deployment["spec"]["replicas"] >= 2
    anti = pod_spec(objects)["affinity"]["podAntiAffinity"]
    terms = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert all(
        selects_pods(t["podAffinityTerm"]["labelSelector"]["matchLabels"], objects) for t in terms
    )
    pdb = tools.find(objects, "PodDisruptionBudget", "remediator")["spec"]
    assert pdb["minAvailable"] == 1
    assert "maxUnavailable" not in pdb
    assert not [o for o in objects if o["kind"] == "Secret"], "the Postgres URL is not in git"
    example = tools.KUSTOMIZE / "overlays" / "ha" / "secret-database.example.yaml"
    url = yaml.safe_load(example.read_text(encoding="utf-8"))["stringData"]["url"]
    assert url.startswith("postgresql+asyncpg://")


def kustomizations() -> list[Path]:
    return sorted(tools.KUSTOMIZE.rglob("kustomization.yaml"))


@pytest.mark.parametrize(
    "path", kustomizations(), ids=lambda p: str(p.parent.relative_to(tools.KUSTOMIZE))
)
def test_kustomizations_use_only_what_kubectl_1_20_understands(path: Path) -> None:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert set(doc) <= KUSTOMIZE_V2_FIELDS
    for entry in doc.get("resources", []):
        assert (path.parent / entry).is_file(), (
            f"kustomize v2 lists directories under bases: {entry}"
        )
    for entry in doc.get("bases", []):
        assert (path.parent / entry / "kustomization.yaml").is_file()


def test_example_files_are_never_applied() -> None:
    listed = set()
    for path in kustomizations():
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for key in ("resources", "patchesStrategicMerge"):
            listed |= {(path.parent / e).resolve() for e in doc.get(key, [])}
    examples = set(tools.KUSTOMIZE.rglob("*.example.yaml"))
    assert examples
    assert not {e.resolve() for e in examples} & listed
