"""The controller loop: graceful termination, workload controllers, scheduler, kubelet start.

Level-triggered, like the real controllers: a pass compares desired with observed state. A pass
runs whenever a pod, node or workload changes (``Cluster.wake``) or a deadline (end of a grace
period, end of a pod's start-up) comes due. Deadlines are in real seconds already multiplied by
``settings.time_scale``.

A pass visits what changed since the last one and what is due, as the real controllers work
from their informers' events, never the whole fleet: the store indexes the pods with work left
(terminating, unscheduled, starting) and pods by controller and by node; a store observer
records which workloads had an object or one of their pods change and which nodes changed (a
DaemonSet looks at those nodes only; the driver upgrade controller likewise). After the store's
objects were replaced silently (``Store.epoch``) the next pass looks at everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any

from remediator.sim import cluster as cluster_mod
from remediator.sim import cuda, objects, reboots, store, upgrades

Obj = dict[str, Any]
WorkloadKey = tuple[str, str, str]  # store key, namespace, name
log = logging.getLogger(__name__)
WORKLOADS = {
    "ReplicaSet": "replicasets.apps",
    "StatefulSet": "statefulsets.apps",
    "DaemonSet": "daemonsets.apps",
}


class Controllers:
    def __init__(self, cluster: cluster_mod.Cluster) -> None:
        self.cluster = cluster
        self.terminate_at: dict[str, float] = {}  # pod uid -> loop time
        self.ready_at: dict[str, float] = {}
        self._epoch: int | None = None  # the store's epoch at the last pass (None: no pass yet)
        self._workloads: set[WorkloadKey] = set()
        """Workloads changed, or one of their pods, since their controller last looked."""
        self._daemonset_nodes: set[str] = set()
        """Nodes changed, or a DaemonSet pod on them, since the DaemonSets last looked."""
        self._upgrade_nodes: set[str] = set()
        """Nodes changed since the driver upgrade controller last looked."""
        cluster.store.observers.append(self._observe)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                self.cluster.wake.clear()
                try:
                    self.reconcile(loop.time())
                except Exception:  # a bad object must not stop the simulated cluster
                    log.exception("controller pass failed")
                    self._epoch = None  # what the failed pass had taken is looked at again
                    await asyncio.sleep(0.1)
                deadlines = [*self.terminate_at.values(), *self.ready_at.values()]
                timeout = max(0.0, min(deadlines) - loop.time()) if deadlines else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.cluster.wake.wait(), timeout)
        finally:
            with contextlib.suppress(ValueError):
                self.cluster.store.observers.remove(self._observe)

    def _observe(self, change: store.Change) -> None:
        """Note what a change gives the controllers to look at (the informers' event handlers)."""
        if change.store_key == "nodes":
            name = change.obj["metadata"]["name"]
            self._daemonset_nodes.add(name)
            self._upgrade_nodes.add(name)
        elif change.store_key == "pods":
            for pod in (change.obj, change.old):  # the owner it had and the one it has
                if pod is not None:
                    self._observe_pod(pod)
            if change.type == "DELETED":  # a StatefulSet waits for its ordinal's name to be free
                meta = change.obj["metadata"]
                owner = meta["name"].rpartition("-")[0]
                self._workloads.add(("statefulsets.apps", meta.get("namespace", ""), owner))
        elif change.store_key in WORKLOADS.values():
            meta = change.obj["metadata"]
            self._workloads.add((change.store_key, meta.get("namespace", ""), meta["name"]))

    def _observe_pod(self, pod: Obj) -> None:
        ref = objects.controller_of(pod)
        store_key = WORKLOADS.get(ref.get("kind", "")) if ref is not None else None
        if ref is None or store_key is None:
            return
        node = (pod.get("spec") or {}).get("nodeName")
        if store_key == "daemonsets.apps" and node:
            self._daemonset_nodes.add(node)
            return
        self._workloads.add((store_key, pod["metadata"].get("namespace", ""), ref.get("name", "")))

    def reconcile(self, now: float) -> None:
        full = self._epoch != self.cluster.store.epoch
        self._epoch = self.cluster.store.epoch
        self.finish_terminations(now)
        self.reconcile_workloads(full=full)
        self.schedule()
        self.start_pods(now)
        nodes, self._upgrade_nodes = self._upgrade_nodes, set()
        waiting = upgrades.reconcile(self.cluster, None if full else sorted(nodes))
        self._upgrade_nodes.update(waiting)

    # ---- termination -------------------------------------------------------------------

    def finish_terminations(self, now: float) -> None:
        st = self.cluster.store
        live = set()
        for pod in list(st.iter_pod_set("terminating")):
            meta = pod["metadata"]
            uid = meta["uid"]
            live.add(uid)
            grace = float(meta.get("deletionGracePeriodSeconds") or 0)
            deadline = self.terminate_at.setdefault(uid, now + self.cluster.scaled(grace))
            if deadline <= now:
                st.delete("pods", meta["namespace"], meta["name"])
                self.terminate_at.pop(uid, None)
                live.discard(uid)
        for uid in set(self.terminate_at) - live:
            del self.terminate_at[uid]

    # ---- workload controllers ----------------------------------------------------------

    def reconcile_workloads(self, *, full: bool = True) -> None:
        """Replace missing pods: of every workload (``full``), else of the workloads that
        changed or had a pod change, and DaemonSet pods on the nodes that changed."""
        st = self.cluster.store
        changed, self._workloads = self._workloads, set()
        nodes, self._daemonset_nodes = self._daemonset_nodes, set()

        def workloads(store_key: str) -> list[Obj]:
            if full:
                return list(st.iter(store_key))
            found = (st.peek(*key) for key in sorted(changed) if key[0] == store_key)
            return [obj for obj in found if obj is not None]

        for rs in workloads("replicasets.apps"):
            owned = st.iter_pods_of_owner(rs["metadata"]["uid"])
            active = [p for p in owned if not p["metadata"].get("deletionTimestamp")]
            for _ in range(int(rs["spec"].get("replicas", 1)) - len(active)):
                name = f"{rs['metadata']['name']}-{objects.random_suffix()}"
                self._create_pod(rs, name)
        for ss in workloads("statefulsets.apps"):
            names = {p["metadata"]["name"] for p in st.iter_pods_of_owner(ss["metadata"]["uid"])}
            for ordinal in range(int(ss["spec"].get("replicas", 1))):
                name = f"{ss['metadata']['name']}-{ordinal}"
                if name not in names and st.get("pods", ss["metadata"]["namespace"], name) is None:
                    self._create_pod(ss, name)
        whole = workloads("daemonsets.apps")
        for ds in whole:  # a DaemonSet that changed (or had an unbound pod) looks at every node
            covered = {
                p["spec"].get("nodeName") for p in st.iter_pods_of_owner(ds["metadata"]["uid"])
            }
            for node in list(st.iter("nodes")):
                self._place_daemon(ds, node, covered=node["metadata"]["name"] in covered)
        if nodes:
            self._daemons_on(sorted(nodes), skip={ds["metadata"]["uid"] for ds in whole})

    def _daemons_on(self, nodes: list[str], skip: set[str]) -> None:
        """The DaemonSets (but those in ``skip``, already done) look at ``nodes`` only."""
        st = self.cluster.store
        daemonsets = [ds for ds in st.iter("daemonsets.apps") if ds["metadata"]["uid"] not in skip]
        if not daemonsets:
            return
        for name in nodes:
            node = st.peek("nodes", "", name)
            if node is None:
                continue
            owners = set()
            for pod in st.iter_pods_on_node(name):
                ref = objects.controller_of(pod)
                if ref is not None:
                    owners.add(ref.get("uid"))
            for ds in daemonsets:
                self._place_daemon(ds, node, covered=ds["metadata"]["uid"] in owners)

    def _place_daemon(self, ds: Obj, node: Obj, *, covered: bool) -> None:
        """Create ``ds``'s pod on ``node`` unless it has one there or does not select it."""
        selector = ds["spec"]["template"].get("spec", {}).get("nodeSelector") or {}
        labels = node["metadata"].get("labels") or {}
        name = node["metadata"]["name"]
        if covered or not cluster_mod._selects(selector, labels):
            return
        pod_name = f"{ds['metadata']['name']}-{objects.random_suffix()}"
        self._create_pod(ds, pod_name, node_name=name)

    def _create_pod(self, owner: Obj, name: str, node_name: str | None = None) -> None:
        pod = objects.pod_from_template(
            owner["spec"]["template"],
            name=name,
            namespace=owner["metadata"]["namespace"],
            owner=owner,
            node_name=node_name,
        )
        if owner["kind"] == "DaemonSet":
            pod["spec"]["tolerations"] = [
                *pod["spec"].get("tolerations", []),
                *cluster_mod.DAEMONSET_TOLERATIONS,
            ]
        if node_name:
            objects.mark_scheduled(pod, node_name)
        self.cluster.store.create("pods", pod)

    # ---- scheduler ---------------------------------------------------------------------

    def schedule(self) -> None:
        st = self.cluster.store
        for pod in list(st.iter_pod_set("unscheduled")):
            node_name, message = self.pick_node(pod)
            meta = pod["metadata"]
            if node_name is not None:
                st.mutate(
                    "pods",
                    meta["namespace"],
                    meta["name"],
                    functools.partial(objects.mark_scheduled, node_name=node_name),
                )
                continue
            conditions = pod.get("status", {}).get("conditions") or []
            if not any(c.get("message") == message for c in conditions):
                st.mutate(
                    "pods",
                    meta["namespace"],
                    meta["name"],
                    functools.partial(objects.pending_unschedulable, message=message),
                )

    def gpus_in_use(self, node_name: str) -> int:
        return sum(
            objects.gpu_request(p)
            for p in self.cluster.store.iter_pods_on_node(node_name)
            if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        )

    def pick_node(self, pod: Obj) -> tuple[str | None, str]:
        nodes = list(self.cluster.store.iter("nodes"))
        reasons: dict[str, int] = {}
        fits: list[tuple[int, str]] = []
        selector = pod["spec"].get("nodeSelector") or {}
        wanted = objects.gpu_request(pod)
        for node in nodes:
            name = node["metadata"]["name"]
            taints = node["spec"].get("taints") or []
            untolerated = [
                t
                for t in taints
                if t.get("effect") in ("NoSchedule", "NoExecute") and not objects.tolerates(pod, t)
            ]
            free = int(node["status"].get("allocatable", {}).get("nvidia.com/gpu", "0")) - (
                self.gpus_in_use(name)
            )
            if node["spec"].get("unschedulable"):
                reason = "node(s) were unschedulable"
            elif untolerated:
                t = untolerated[0]
                reason = (
                    f"node(s) had untolerated taint {{{t['key']}: {t.get('value', '')}}}"
                    if t.get("value")
                    else f"node(s) had untolerated taint {{{t['key']}: }}"
                )
            elif not cluster_mod._selects(selector, node["metadata"].get("labels") or {}):
                reason = "node(s) didn't match Pod's node affinity/selector"
            elif wanted > free:
                reason = "Insufficient nvidia.com/gpu"
            else:
                fits.append((-free, name))
                continue
            reasons[reason] = reasons.get(reason, 0) + 1
        if fits:
            return sorted(fits)[0][1], ""
        detail = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
        message = (
            f"0/{len(nodes)} nodes are available: {detail}. preemption: 0/{len(nodes)} "
            "nodes are available: "
            f"{len(nodes)} Preemption is not helpful for scheduling."
        )
        return None, message

    # ---- kubelet ----------------------------------------------------------------------

    def start_pods(self, now: float) -> None:
        st = self.cluster.store
        seen = set()
        for pod in list(st.iter_pod_set("starting")):
            meta = pod["metadata"]
            node_name = pod["spec"]["nodeName"]
            uid = meta["uid"]
            if self._pull_fails(pod):
                continue
            seen.add(uid)
            due = self.ready_at.setdefault(
                uid, now + self.cluster.scaled(self.cluster.settings.pod_startup_seconds)
            )
            if due <= now and cuda.is_sample(pod):
                outcome = cuda.run(self.cluster, pod)
                st.mutate(
                    "pods",
                    meta["namespace"],
                    meta["name"],
                    functools.partial(
                        cuda.finish,
                        phase=outcome[0],
                        exit_code=outcome[1],
                        reason=outcome[2],
                        message=outcome[3],
                    ),
                )
                self.ready_at.pop(uid, None)
                continue
            if due <= now:
                node = st.get("nodes", "", node_name)
                ip = objects.node_ip(node) if node else "10.0.0.1"
                st.mutate(
                    "pods",
                    meta["namespace"],
                    meta["name"],
                    functools.partial(objects.mark_running, host_ip=ip),
                )
                self.ready_at.pop(uid, None)
                if reboots.is_reboot_pod(pod):
                    reboots.start(self.cluster, node_name)
        for uid in set(self.ready_at) - seen:
            del self.ready_at[uid]

    def _pull_fails(self, pod: Obj) -> bool:
        """A container whose image cannot be pulled keeps the pod Pending, as the kubelet does
        (``ErrImagePull``, then ``ImagePullBackOff``)."""
        missing = [
            c
            for c in pod["spec"].get("containers", [])
            if c.get("image") in self.cluster.unpullable_images
        ]
        if not missing:
            return False
        statuses = pod.get("status", {}).get("containerStatuses") or []
        if not any((s.get("state") or {}).get("waiting") for s in statuses):
            meta = pod["metadata"]
            self.cluster.store.mutate(
                "pods",
                meta["namespace"],
                meta["name"],
                functools.partial(objects.image_pull_failed, images=[c["image"] for c in missing]),
            )
        return True
