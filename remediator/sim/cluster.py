"""The simulated cluster: the object store plus what lives outside it (GPUs, pod files)."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from typing import Any

from remediator.sim import fleet as fleet_mod
from remediator.sim import mutations, nvidia, objects, store, values

Obj = dict[str, Any]
GPU_TAINT_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@dataclasses.dataclass
class ExecRecord:
    """One exec session, for tests to inspect what clients ran where."""

    namespace: str
    pod: str
    node: str
    container: str
    argv: list[str]
    transport: str  # "websocket:<subprotocol>" or "spdy:<protocol>"
    exit_code: int | None = None  # None while running or when the client went away
    dropped: str | None = None
    """An injected fault closed the stream "before" the command ran or "after" it."""
    at: str = dataclasses.field(default_factory=store.timestamp_precise)


class Cluster:
    """Everything the API handlers and the controller loop share."""

    def __init__(self, fleet: fleet_mod.Fleet) -> None:
        self.fleet = fleet
        self.settings = fleet.settings.model_copy()
        self.store = store.Store()
        self.hosts: dict[str, nvidia.Host] = {}
        self.files: dict[str, dict[str, bytes]] = {}  # pod uid -> path -> bytes
        self.wake = asyncio.Event()
        self.exec_log: list[ExecRecord] = []
        self.requests: collections.Counter[str] = collections.Counter()
        """Kubernetes API requests served, by verb and resource as the apiserver's audit log
        names them (``list pods``, ``get nodes``, ``create pods/exec``)."""
        self.mutations = mutations.Log()
        self.reboots: list[str] = []  # nodes, in the order their reboots began
        self.device_allocations: dict[str, dict[str, dict[str, Any]]] = {}
        """Node → pod uid → the GPUs the kubelet gave the pod (see ``kubelet``)."""
        self.unpullable_images: set[str] = set()
        """Images no registry serves: pods using them wait in ``ErrImagePull`` for ever."""
        self.store.hooks.append(self._on_change)
        seed(self, fleet)

    def _on_change(self, store_key: str, kind: str, obj: Obj) -> None:
        if store_key in (
            "pods",
            "nodes",
            "replicasets.apps",
            "statefulsets.apps",
            "daemonsets.apps",
        ):
            self.wake.set()
        if store_key == "pods" and kind == "DELETED":
            self.files.pop(obj["metadata"].get("uid", ""), None)

    def scaled(self, seconds: float) -> float:
        return max(0.0, seconds * self.settings.time_scale)

    def reset(self) -> None:
        self.store.clear()
        self.hosts.clear()
        self.files.clear()
        self.exec_log.clear()
        self.requests.clear()
        self.reboots.clear()
        self.device_allocations.clear()
        self.unpullable_images.clear()
        self.mutations = mutations.Log(boot=self.mutations.boot)
        self.settings = self.fleet.settings.model_copy()
        seed(self, self.fleet)
        self.wake.set()

    def gpu(self, node: str, index: int) -> nvidia.Gpu | None:
        host = self.hosts.get(node)
        if host is None:
            return None
        return next((g for g in host.gpus if g.index == index), None)


# ---- seeding --------------------------------------------------------------------------


def seed(cluster: Cluster, fleet: fleet_mod.Fleet) -> None:
    st = cluster.store
    namespaces = ["default", "kube-system", "kube-public", "kube-node-lease", *fleet.namespaces]
    namespaces += [w.namespace for w in fleet.workloads] + [p.namespace for p in fleet.pdbs]
    for ns in dict.fromkeys(namespaces):
        st.create(
            "namespaces",
            {
                "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}},
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"},
            },
        )
    for node in fleet.nodes:
        allocatable = dict(node.allocatable)
        host = fleet_mod.build_host(node, cluster.settings)
        if host is not None:
            cluster.hosts[node.name] = host
            allocatable.setdefault("nvidia.com/gpu", str(len(host.gpus)))
        st.create(
            "nodes",
            objects.node(
                node.name,
                labels=node.labels,
                taints=[t.model_dump(exclude_none=True) for t in node.taints],
                allocatable=allocatable,
                unschedulable=node.unschedulable,
            ),
        )
    for workload in fleet.workloads:
        seed_workload(cluster, workload)
    for pdb in fleet.pdbs:
        spec: Obj = {"selector": {"matchLabels": dict(pdb.match_labels)}}
        if pdb.min_available is not None:
            spec["minAvailable"] = pdb.min_available
        if pdb.max_unavailable is not None:
            spec["maxUnavailable"] = pdb.max_unavailable
        st.create(
            "poddisruptionbudgets.policy",
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": pdb.name, "namespace": pdb.namespace},
                "spec": spec,
            },
        )


def pod_template(workload: fleet_mod.Workload) -> Obj:
    containers = []
    for c in workload.containers:
        container: Obj = {"name": c.name, "image": c.image}
        if c.gpus:
            container["resources"] = {
                "limits": {"nvidia.com/gpu": str(c.gpus)},
                "requests": {"nvidia.com/gpu": str(c.gpus)},
            }
        if workload.empty_dir:
            container["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
        containers.append(container)
    spec: Obj = {"containers": containers, "terminationGracePeriodSeconds": workload.grace_seconds}
    if workload.empty_dir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    if workload.host_network:
        spec["hostNetwork"] = True
    if workload.node_selector:
        spec["nodeSelector"] = dict(workload.node_selector)
    tolerations = [dict(t) for t in workload.tolerations]
    if any(c.gpus for c in workload.containers) and GPU_TAINT_TOLERATION not in tolerations:
        tolerations.append(dict(GPU_TAINT_TOLERATION))
    if tolerations:
        spec["tolerations"] = tolerations
    return {"metadata": {"labels": dict(workload.labels)}, "spec": spec}


def _controller(workload: fleet_mod.Workload, template: Obj) -> Obj:
    kind = "ReplicaSet" if workload.kind == "Deployment" else workload.kind
    spec: Obj = {"selector": {"matchLabels": dict(workload.labels)}, "template": template}
    status: Obj = {"observedGeneration": 1}
    if kind != "DaemonSet":
        spec["replicas"] = workload.replicas
        status.update(replicas=workload.replicas, readyReplicas=workload.replicas)
    else:
        spec["updateStrategy"] = {"type": "RollingUpdate"}
    if kind == "StatefulSet":
        spec["serviceName"] = workload.name
        spec["podManagementPolicy"] = "OrderedReady"
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {
            "name": workload.name,
            "namespace": workload.namespace,
            "labels": dict(workload.labels),
        },
        "spec": spec,
        "status": status,
    }


def seed_workload(cluster: Cluster, workload: fleet_mod.Workload) -> None:
    st = cluster.store
    template = pod_template(workload)
    if workload.kind in ("Pod", "MirrorPod"):
        annotations = None
        if workload.kind == "MirrorPod":
            annotations = {
                "kubernetes.io/config.mirror": "sim-" + workload.name,
                "kubernetes.io/config.source": "file",
            }
        pod = objects.pod_from_template(
            template,
            name=workload.name,
            namespace=workload.namespace,
            owner=None,
            node_name=workload.nodes[0] if workload.nodes else None,
            annotations=annotations,
        )
        if workload.kind == "MirrorPod":
            node = st.get("nodes", "", workload.nodes[0]) if workload.nodes else None
            if node is not None:
                pod["metadata"]["ownerReferences"] = [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": workload.nodes[0],
                        "uid": node["metadata"]["uid"],
                        "controller": True,
                    }
                ]
        _allocate(cluster, _create_running(cluster, pod), workload, 0)
        return
    controller = _controller(workload, template)
    store_key = controller["kind"].lower() + "s.apps"
    owner = st.create(store_key, controller)
    if controller["kind"] == "DaemonSet":
        placements = workload.nodes or [
            n["metadata"]["name"]
            for n in st.iter("nodes")
            if _selects(workload.node_selector, n["metadata"].get("labels") or {})
        ]
    else:
        placements = (workload.nodes + [""] * workload.replicas)[: workload.replicas]
    for i, node_name in enumerate(placements):
        if controller["kind"] == "StatefulSet":
            name = f"{workload.name}-{i}"
        elif i < len(workload.pod_names):
            name = workload.pod_names[i]
        else:
            name = f"{workload.name}-{objects.random_suffix()}"
        pod = objects.pod_from_template(
            template,
            name=name,
            namespace=workload.namespace,
            owner=owner,
            node_name=node_name or None,
        )
        if controller["kind"] == "DaemonSet":
            pod["spec"]["tolerations"] = [
                *pod["spec"].get("tolerations", []),
                *DAEMONSET_TOLERATIONS,
            ]
        if node_name:
            _allocate(cluster, _create_running(cluster, pod), workload, i)
        else:
            st.create("pods", pod)  # the scheduler places it


DAEMONSET_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _create_running(cluster: Cluster, pod: Obj) -> Obj:
    created = cluster.store.create("pods", pod)
    node = cluster.store.get("nodes", "", created["spec"].get("nodeName", ""))
    running = values.clone(created)
    objects.mark_running(running, objects.node_ip(node) if node else "10.0.0.1")
    cluster.store.update("pods", running, check_rv=False)
    return running


def _allocate(cluster: Cluster, pod: Obj, workload: fleet_mod.Workload, replica: int) -> None:
    """Pin the GPUs the fleet says this replica holds (the kubelet's allocation)."""
    if replica >= len(workload.gpu_indexes):
        return
    node = pod["spec"]["nodeName"]
    host = cluster.hosts.get(node)
    wanted = set(workload.gpu_indexes[replica])
    cluster.device_allocations.setdefault(node, {})[pod["metadata"]["uid"]] = {
        "namespace": pod["metadata"]["namespace"],
        "name": pod["metadata"]["name"],
        "container": next(c.name for c in workload.containers if c.gpus),
        "devices": [g.uuid for g in host.gpus if g.index in wanted] if host else [],
    }
