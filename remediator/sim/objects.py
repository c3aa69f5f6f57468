"""Builders for the JSON shapes of nodes and pods, as kubelets and controllers write them."""

from __future__ import annotations

import hashlib
import random
from typing import Any

from remediator.sim import store, values

Obj = dict[str, Any]
_ALNUM = "bcdfghjklmnpqrstvwxz2456789"  # what k8s.io/apimachinery/pkg/util/rand uses


def random_suffix(n: int = 5) -> str:
    return "".join(random.choice(_ALNUM) for _ in range(n))


def _digest(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:32]


def _ip(seed: str, prefix: str) -> str:
    digest = hashlib.sha256(seed.encode()).digest()
    return f"{prefix}.{digest[0] % 250 + 2}.{digest[1] % 250 + 2}"


def node(
    name: str,
    *,
    labels: dict[str, str],
    taints: list[Obj],
    allocatable: dict[str, str],
    unschedulable: bool,
) -> Obj:
    base_labels = {
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
    }
    now = store.timestamp()
    spec: Obj = {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]}
    if taints:
        spec["taints"] = values.clone(taints)
    if unschedulable:
        spec["unschedulable"] = True
    conditions = [
        (
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {**base_labels, **labels},
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": spec,
        "status": {
            "capacity": dict(allocatable),
            "allocatable": dict(allocatable),
            "conditions": [
                {
                    "type": t,
                    "status": s,
                    "reason": r,
                    "message": m,
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
                for t, s, r, m in conditions
            ],
            "addresses": [
                {"type": "InternalIP", "address": _ip(name, "10.0")},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": _digest(name),
                "containerRuntimeVersion": "containerd://1.7.13",
                "kernelVersion": "5.15.0-105-generic",
                "kubeProxyVersion": "v1.29.0",
                "kubeletVersion": "v1.29.0",
                "machineID": _digest(name),
                "operatingSystem": "linux",
                "osImage": "Ubuntu 22.04.4 LTS",
                "systemUUID": _digest("uuid/" + name),
            },
        },
    }


def owner_reference(owner: Obj) -> Obj:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pod_from_template(
    template: Obj,
    *,
    name: str,
    namespace: str,
    owner: Obj | None,
    node_name: str | None = None,
    annotations: dict[str, str] | None = None,
) -> Obj:
    meta = values.clone(template.get("metadata") or {})
    spec = values.clone(template.get("spec") or {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    for container in spec.get("containers", []):
        container.setdefault("imagePullPolicy", "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("resources", {})
    if node_name:
        spec["nodeName"] = node_name
    meta["name"] = name
    meta["namespace"] = namespace
    if annotations:
        meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
    if owner is not None:
        meta["ownerReferences"] = [owner_reference(owner)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": "Pending", "qosClass": "BestEffort", "conditions": []},
    }


def pending_unschedulable(pod: Obj, message: str) -> None:
    pod["status"] = {
        "phase": "Pending",
        "qosClass": pod.get("status", {}).get("qosClass", "BestEffort"),
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastProbeTime": None,
                "lastTransitionTime": store.timestamp(),
            }
        ],
    }


def mark_scheduled(pod: Obj, node_name: str) -> None:
    pod["spec"]["nodeName"] = node_name
    now = store.timestamp()
    pod["status"] = {
        "phase": "Pending",
        "qosClass": pod.get("status", {}).get("qosClass", "BestEffort"),
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": now,
            }
        ],
    }


def image_pull_failed(pod: Obj, images: list[str]) -> None:
    """The kubelet could not pull ``images``: their containers wait in ``ImagePullBackOff``."""
    statuses = []
    for c in pod["spec"].get("containers", []):
        state: Obj = {"waiting": {"reason": "ContainerCreating"}}
        if c.get("image") in images:
            message = (
                f'Back-off pulling image "{c["image"]}": ErrImagePull: failed to pull and '
                f'unpack image "{c["image"]}": not found'
            )
            state = {"waiting": {"reason": "ImagePullBackOff", "message": message}}
        statuses.append(
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": state,
            }
        )
    pod.setdefault("status", {})["containerStatuses"] = statuses


def mark_running(pod: Obj, host_ip: str) -> None:
    now = store.timestamp()
    conditions = [
        {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
        for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    name = pod["metadata"]["name"]
    # The kubelet gives a host-network pod the node's IP; others get one from the pod CIDR.
    pod_ip = (
        host_ip
        if pod["spec"].get("hostNetwork")
        else _ip(pod["metadata"].get("uid", name), "10.244")
    )
    statuses = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": c.get("image", "")
            + "@sha256:"
            + hashlib.sha256(c.get("image", "").encode()).hexdigest(),
            "containerID": "containerd://"
            + hashlib.sha256((name + c["name"] + now).encode()).hexdigest(),
            "ready": True,
            "restartCount": 0,
            "started": True,
            "state": {"running": {"startedAt": now}},
            "lastState": {},
        }
        for c in pod["spec"].get("containers", [])
    ]
    pod["status"] = {
        "phase": "Running",
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": now,
        "containerStatuses": statuses,
        "qosClass": pod.get("status", {}).get("qosClass", "BestEffort"),
    }


def node_ip(node_obj: Obj) -> str:
    for addr in node_obj.get("status", {}).get("addresses", []):
        if addr.get("type") == "InternalIP":
            return str(addr["address"])
    return "10.0.0.1"


def is_ready(pod: Obj) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    if pod.get("status", {}).get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


def controller_of(obj: Obj) -> Obj | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def gpu_request(pod: Obj) -> int:
    total = 0
    for container in pod.get("spec", {}).get("containers", []):
        resources = container.get("resources") or {}
        value = (resources.get("limits") or {}).get("nvidia.com/gpu") or (
            resources.get("requests") or {}
        ).get("nvidia.com/gpu")
        total += int(value or 0)
    return total


def tolerates(pod: Obj, taint: Obj) -> bool:
    for tol in pod.get("spec", {}).get("tolerations") or []:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists":
            if not tol.get("key") or tol["key"] == taint.get("key"):
                return True
        elif tol.get("key") == taint.get("key") and (tol.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False
