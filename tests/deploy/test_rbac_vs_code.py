"""RBAC in deploy/ against the Kubernetes calls the code makes.

The calls are the table in ``remediator.adapters.kubernetes.permissions``. The table is checked
two ways so it cannot drift: every public method of ``KubeCluster`` and ``KubeLease`` has an
entry, and running every method against the simulator makes exactly the requests its entry
declares (read from the simulator's request log). The manifests must then grant exactly the
table: anything granted but unused, or used but not granted, fails.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from remediator.actions import gpu, hostexec
from remediator.adapters import kubernetes
from remediator.adapters.kubernetes import leases, permissions
from remediator.ports import actions
from remediator.ports import cluster as port
from remediator.sim import fleet as fleet_mod
from remediator.sim import server, testing
from tests.support.notify import FakeNotifier

from . import rbac

DRIVER_NAMESPACE = "gpu-operator"
LEASE_NAMESPACE = "remediator"  # where deploy/ runs remediator and grants leases


def _authorizes(grant: rbac.Permission, call: rbac.Permission) -> bool:
    return grant[:3] == call[:3] and grant[3] in ("cluster", call[3])


def test_the_manifests_grant_exactly_the_calls_the_code_makes() -> None:
    granted = rbac.granted_permissions()
    used = permissions.all_calls(driver_namespace=DRIVER_NAMESPACE, lease_namespace=LEASE_NAMESPACE)
    missing = {c for c in used if not any(_authorizes(g, c) for g in granted)}
    unused = {g for g in granted if not any(_authorizes(g, c) for c in used)}
    # a namespaced grant that a cluster-wide grant already covers is unused too
    redundant = {g for g in granted if g[3] != "cluster" and (*g[:3], "cluster") in granted}
    assert not missing, f"used but not granted: {sorted(missing)}"
    assert not unused, f"granted but unused: {sorted(unused)}"
    assert not redundant, f"granted twice (cluster-wide and per namespace): {sorted(redundant)}"


def _public_methods(cls: type) -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(cls, inspect.iscoroutinefunction)
        if not name.startswith("_") and name != "close"
    }


def test_every_adapter_method_declares_its_calls() -> None:
    assert _public_methods(kubernetes.KubeCluster) == set(permissions.CLUSTER_CALLS)
    assert _public_methods(leases.KubeLease) == set(permissions.LEASE_CALLS)


# ---- the request log -------------------------------------------------------------------

_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)"
    r"(?:/namespaces/(?P<namespace>[^/]+))?/(?P<resource>[^/]+)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}

Observed = tuple[str, str, str, str | None]  # group, resource, verb, namespace


def _attributes(method: str, path: str, query: Any) -> Observed:
    match = _PATH.match(path)
    assert match, f"unexpected request path {path}"
    resource = match["resource"] + (f"/{match['sub']}" if match["sub"] else "")
    if method == "GET":
        verb = "get" if match["name"] else ("watch" if query.get("watch") else "list")
    else:
        verb = _VERBS[method]
    return match["group"] or "", resource, verb, match["namespace"]


class Recorder:
    def __init__(self) -> None:
        self.requests: list[Observed] = []

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith(("/api/", "/apis/")):
            self.requests.append(_attributes(request.method, request.path, request.query))
        return await handler(request)

    def take(self) -> set[Observed]:
        taken, self.requests = set(self.requests), []
        return taken


@pytest.fixture
async def recorded() -> AsyncIterator[tuple[str, Recorder, dict[str, Any]]]:
    """The simulator with a request log: (kubeconfig path, recorder, cluster store)."""
    recorder = Recorder()
    fleet = fleet_mod.Fleet.default()
    fleet = fleet.model_copy(update={"namespaces": [*fleet.namespaces, LEASE_NAMESPACE]})
    app = server.create_app(fleet, token="t", time_scale=0.01)
    app.middlewares.append(recorder.middleware)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield url, recorder, {"app": app}
    finally:
        await runner.cleanup()


def _declared_match(call: permissions.Call, seen: Observed) -> bool:
    group, resource, verb, namespace = seen
    if (call.group, call.resource, call.verb) != (group, resource, verb):
        return False
    if call.scope == "driver":
        return namespace == DRIVER_NAMESPACE
    if call.scope == "lease":
        return namespace == LEASE_NAMESPACE
    return True


def _check(method: str, declared: tuple[permissions.Call, ...], seen: set[Observed]) -> None:
    assert seen, f"{method} made no request"
    stray = {s for s in seen if not any(_declared_match(c, s) for c in declared)}
    assert not stray, f"{method} made undeclared calls {stray}"
    shown = [c for c in declared if c.request_shows_it]
    never = [c for c in shown if not any(_declared_match(c, s) for s in seen)]
    assert not never, f"{method} declares calls it never made: {never}"


async def _exercise_cluster(cluster: kubernetes.KubeCluster, store: Any) -> dict[str, Any]:
    """Call every ``KubeCluster`` method once; returns method → coroutine factory."""
    node = "gpu-node-02"
    driver = next(
        p
        for p in store.list("pods", DRIVER_NAMESPACE)
        if p["spec"].get("nodeName") == node
        and p["metadata"].get("labels", {}).get("app") == "nvidia-driver-daemonset"
    )
    workload = next(
        p
        for p in store.list("pods", None)
        if p["spec"].get("nodeName") == node
        and p["metadata"]["namespace"] != DRIVER_NAMESPACE
        and not any(o.get("kind") == "DaemonSet" for o in p["metadata"].get("ownerReferences", []))
    )
    ns, pod = workload["metadata"]["namespace"], workload["metadata"]["name"]
    return {
        "get_node": lambda: cluster.get_node(node),
        "list_nodes": lambda: cluster.list_nodes(cluster.gpu_node_selector),
        "gpu_nodes": lambda: cluster.gpu_nodes(),  # before the watch: its list
        "gpu_fleet": lambda: _watch_fleet(cluster, store, node),
        "patch_node": lambda: cluster.patch_node(node, labels={"x": "y"}),
        "replace_node_taints": lambda: _replace_taints(cluster, node),
        "list_pods": lambda: _list_pods(cluster, ns, node),
        "get_pod": lambda: cluster.get_pod(ns, pod),
        "get_namespace": lambda: cluster.get_namespace(ns),
        "annotate_pod": lambda: cluster.annotate_pod(ns, pod, {"a": "b"}),
        "list_pdbs": lambda: _list_pdbs(cluster, ns),
        "find_driver_pod": lambda: cluster.find_driver_pod(node),
        "create_event": lambda: cluster.create_event(
            target=port.ObjectRef(kind="Node", name=node), reason="Test", message="m"
        ),
        "exec": lambda: cluster.exec(
            namespace=DRIVER_NAMESPACE,
            pod=driver["metadata"]["name"],
            container=cluster.driver_container,
            argv=["nvidia-smi", "-L"],
            timeout=10,
        ),
        "evict_pod": lambda: cluster.evict_pod(ns, pod),
        "create_pod": lambda: cluster.create_pod(DRIVER_NAMESPACE, PROBE_POD),
        "delete_pod": lambda: cluster.delete_pod(DRIVER_NAMESPACE, "rbac-probe"),
    }


PROBE_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "rbac-probe"},
    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
}


async def _watch_fleet(cluster: kubernetes.KubeCluster, store: Any, node: str) -> Any:
    """The GPU node list, then its watch: done once the watch has brought a label change."""
    fleet = await cluster.gpu_fleet()
    assert fleet is not None
    store.mutate("nodes", "", node, lambda obj: obj["metadata"]["labels"].update(rbac="watched"))
    for _ in range(500):
        if fleet.snapshot()[node].get("rbac") == "watched":
            return fleet
        await asyncio.sleep(0.01)
    raise AssertionError("the node watch never brought the label change")


async def _replace_taints(cluster: kubernetes.KubeCluster, node: str) -> Any:
    current = await cluster.get_node(node)
    return current, await cluster.replace_node_taints(
        node, current.taints, resource_version=current.resource_version
    )


async def _list_pods(cluster: kubernetes.KubeCluster, namespace: str, node: str) -> Any:
    return [
        await cluster.list_pods(field_selector=f"spec.nodeName={node}"),
        await cluster.list_pods(namespace=namespace),
    ]


async def _list_pdbs(cluster: kubernetes.KubeCluster, namespace: str) -> Any:
    return [await cluster.list_pdbs(), await cluster.list_pdbs(namespace)]


async def test_each_cluster_method_makes_exactly_the_calls_it_declares(recorded, tmp_path):
    url, recorder, holder = recorded
    store = holder["app"][server.api.CLUSTER].store
    config = kubernetes.KubernetesConfig(mode="url", url=url, token="t")
    cluster = await kubernetes.connect(config)
    try:
        calls = await _exercise_cluster(cluster, store)
        assert set(calls) == set(permissions.CLUSTER_CALLS)
        for method, call in calls.items():
            recorder.take()
            await call()
            seen = recorder.take()
            if method == "replace_node_taints":  # its helper reads the node first
                seen.discard(("", "nodes", "get", None))
            _check(method, permissions.CLUSTER_CALLS[method], seen)
    finally:
        await cluster.close()


async def test_each_lease_method_makes_exactly_the_calls_it_declares(recorded):
    url, recorder, _ = recorded
    config = kubernetes.KubernetesConfig(mode="url", url=url, token="t")
    lease = await leases.connect(config, name="remediator", namespace=LEASE_NAMESPACE)
    try:
        recorder.take()
        assert await lease.acquire_or_renew("a", duration=5)  # get (404), create
        assert await lease.acquire_or_renew("a", duration=5)  # get, update
        _check("acquire_or_renew", permissions.LEASE_CALLS["acquire_or_renew"], recorder.take())
        await lease.release("a")
        _check("release", permissions.LEASE_CALLS["release"], recorder.take())
    finally:
        await lease.close()


def test_request_attributes_are_read_like_the_api_server_does() -> None:
    assert _attributes("GET", "/api/v1/nodes", {}) == ("", "nodes", "list", None)
    assert _attributes("GET", "/api/v1/nodes", {"watch": "1"}) == ("", "nodes", "watch", None)
    assert _attributes("POST", "/api/v1/namespaces/a/pods/p/eviction", {}) == (
        "",
        "pods/eviction",
        "create",
        "a",
    )
    assert _attributes("PUT", "/apis/coordination.k8s.io/v1/namespaces/r/leases/l", {}) == (
        "coordination.k8s.io",
        "leases",
        "update",
        "r",
    )
    assert testing.CONTEXT  # the simulator helpers stay importable from here


async def test_gpu_commands_through_a_host_pod_make_only_granted_calls(recorded, tmp_path):
    """A node pool whose driver is on the host: the exec pod is listed (leftovers), created,
    read until Ready, exec'd into and deleted, all within what the manifests grant."""
    url, recorder, holder = recorded
    store = holder["app"][server.api.CLUSTER].store
    node = "gpu-node-04"
    store.mutate(
        "nodes",
        "",
        node,
        lambda n: n["metadata"]["labels"].update({"nvidia.com/gpu.deploy.driver": "pre-installed"}),
    )
    pools = {"pools": [{"name": "host", "node_selector": "nvidia.com/gpu.deploy.driver"}]}
    config = kubernetes.KubernetesConfig(mode="url", url=url, token="t")
    cluster = await kubernetes.connect(config)
    ctx = actions.ActionContext(
        run_id=1,
        step_id=1,
        step_key="s",
        attempt=1,
        playbook="p",
        node=node,
        gpu=None,
        labels={},
        annotations={},
        dry_run=False,
        now=lambda: dt.datetime.now(dt.UTC),
        notifier=FakeNotifier(),
        cluster=cluster,
        services={hostexec.SERVICE: hostexec.GpuExecConfig.model_validate(pools)},
    )
    try:
        recorder.take()
        action = gpu.PowerCapAction()
        check = await action.check(ctx, action.parse({"watts": 500}))
        seen = recorder.take()
    finally:
        await cluster.close()
    assert check.in_place is False
    assert ("", "pods", "create", DRIVER_NAMESPACE) in seen
    assert ("", "pods", "delete", DRIVER_NAMESPACE) in seen
    assert ("", "pods/exec", "get", DRIVER_NAMESPACE) in seen
    granted = rbac.granted_permissions()
    for group, resource, verb, namespace in seen:
        call = (group, resource, verb, f"namespace:{namespace}" if namespace else "cluster")
        assert any(_authorizes(g, call) for g in granted), f"not granted: {call}"
