"""Evaluate the scenario's expectations against the simulator's state (and, for bug reports,
the artifact the server stored): each answers (holds, what was found)."""

from __future__ import annotations

import hashlib
import pathlib
from typing import Any

from remediator.demo import acts
from remediator.sim import cluster as sim_cluster

Found = tuple[bool, str]


def _node(cluster: sim_cluster.Cluster, name: str) -> dict[str, Any]:
    node = cluster.store.get("nodes", "", name)
    if node is None:
        raise LookupError(f"node {name} does not exist in the simulator")
    return node


def power_limit(cluster: sim_cluster.Cluster, want: acts.PowerLimit) -> Found:
    gpu = cluster.gpu(want.node, want.gpu)
    if gpu is None:
        return False, f"{want.node} has no GPU {want.gpu}"
    target = gpu.default_limit * want.percent_of_default / 100
    ok = abs(gpu.power_limit - target) < 0.5
    return ok, f"limit {gpu.power_limit:g} W (default {gpu.default_limit:g} W, want {target:g} W)"


def cordoned(cluster: sim_cluster.Cluster, want: acts.Cordoned) -> Found:
    flag = bool(_node(cluster, want.node)["spec"].get("unschedulable"))
    return flag, f"spec.unschedulable={flag}"


def node_label(cluster: sim_cluster.Cluster, want: acts.NodeLabel) -> Found:
    value = (_node(cluster, want.node)["metadata"].get("labels") or {}).get(want.key)
    return value == want.value, f"{want.key}={value}"


def node_taint(cluster: sim_cluster.Cluster, want: acts.NodeTaint) -> Found:
    taints = _node(cluster, want.node)["spec"].get("taints") or []
    found = [f"{t.get('key')}:{t.get('effect')}" for t in taints]
    ok = any(t.get("key") == want.key and t.get("effect") == want.effect for t in taints)
    return ok, f"taints {found}"


def only_daemonset_pods(cluster: sim_cluster.Cluster, want: acts.OnlyDaemonSetPods) -> Found:
    others = []
    for pod in cluster.store.list("pods"):
        if pod["spec"].get("nodeName") != want.node:
            continue
        owners = pod["metadata"].get("ownerReferences") or []
        if not any(owner.get("kind") == "DaemonSet" for owner in owners):
            others.append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
    return not others, f"still there: {', '.join(others)}" if others else "only DaemonSet pods"


def pod_annotation(cluster: sim_cluster.Cluster, want: acts.PodAnnotation) -> Found:
    pod = cluster.store.get("pods", want.namespace, want.pod)
    if pod is None:
        return not want.present, "pod not found"
    annotations = pod["metadata"].get("annotations") or {}
    present = want.key in annotations
    return present == want.present, f"{want.key}: {annotations.get(want.key, '(absent)')}"


def bug_report(
    details: list[dict[str, Any]], artifacts: pathlib.Path, want: acts.BugReport
) -> Found:
    """The run's bug-report step succeeded and its stored file hashes to what it recorded."""
    for detail in details:
        if detail.get("playbook") != want.playbook or detail.get("node") != want.node:
            continue
        for step in detail.get("steps") or []:
            if step.get("key") != "bug-report":
                continue
            output = step.get("output") or {}
            if step.get("status") != "succeeded" or "path" not in output:
                return False, f"bug-report step {step.get('status')}: {step.get('error')}"
            path = artifacts / str(output["path"])
            if not path.is_file():
                return False, f"{output['path']} is not in the artifact directory"
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            if digest != output.get("sha256"):
                return (
                    False,
                    f"{output['path']} hashes to {digest[:12]}, recorded {output.get('sha256')}",
                )
            if bool(output.get("safe_mode")) != want.safe_mode:
                return False, f"safe_mode={output.get('safe_mode')}"
            return True, f"{output['path']} sha256 {digest[:12]}"
    return False, f"no {want.playbook} run on {want.node} with a bug-report step"


def evaluate(
    want: acts.Expectation,
    *,
    cluster: sim_cluster.Cluster,
    details: list[dict[str, Any]],
    artifacts: pathlib.Path,
) -> Found:
    try:
        if isinstance(want, acts.PowerLimit):
            return power_limit(cluster, want)
        if isinstance(want, acts.Cordoned):
            return cordoned(cluster, want)
        if isinstance(want, acts.NodeLabel):
            return node_label(cluster, want)
        if isinstance(want, acts.NodeTaint):
            return node_taint(cluster, want)
        if isinstance(want, acts.OnlyDaemonSetPods):
            return only_daemonset_pods(cluster, want)
        if isinstance(want, acts.PodAnnotation):
            return pod_annotation(cluster, want)
        return bug_report(details, artifacts, want)
    except LookupError as e:
        return False, str(e)
