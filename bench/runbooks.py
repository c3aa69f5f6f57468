"""Runbooks timed end to end over the API: the 200-pod drain against ``kubectl drain`` on the
same simulator, and the fleet-health sweep of a large generated fleet."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import time
import urllib.request
from typing import Any

import yaml

from bench import world
from remediator.sim import fleet as sim_fleet

TERMINAL = {"succeeded", "failed", "cancelled", "rejected", "timed_out"}


def _call(method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def trigger(server: str, name: str, body: dict[str, Any]) -> int:
    """Start runbook ``name``; the run's id."""
    run_id: int = _call("POST", f"{server}/api/v1/runbooks/{name}/runs", body)["runId"]
    return run_id


def run_runbook(
    server: str, name: str, body: dict[str, Any], *, timeout: float
) -> tuple[float, dict[str, Any]]:
    """Seconds from the trigger to the run's end, and the run."""
    started = time.monotonic()
    run_id = trigger(server, name, body)
    deadline = started + timeout
    while time.monotonic() < deadline:
        run: dict[str, Any] = _call("GET", f"{server}/api/v1/runs/{run_id}")
        status = run.get("status") or run.get("run", {}).get("status")
        if status in TERMINAL:
            return time.monotonic() - started, run
        time.sleep(0.1)
    raise RuntimeError(f"runbook {name} did not finish within {timeout:.0f} s")


def drain_fleet(workdir: pathlib.Path, pods: int) -> pathlib.Path:
    """Three generated GPU nodes; the first two carry ``pods`` workload pods each (one
    ReplicaSet per node, scratch space, 30 s grace), the third stays empty."""
    fleet = sim_fleet.generate(3)
    nodes = [
        n.model_copy(update={"allocatable": {**n.allocatable, "pods": "500"}}) for n in fleet.nodes
    ]
    workloads = list(fleet.workloads)
    for node in nodes[:2]:
        workloads.append(
            sim_fleet.Workload(
                kind="ReplicaSet",
                name=f"batch-{node.name}",
                namespace="default",
                replicas=pods,
                labels={"app": f"batch-{node.name}"},
                nodes=[node.name] * pods,
                pod_names=[f"batch-{node.name}-{i:04d}" for i in range(pods)],
                empty_dir=True,
                containers=[sim_fleet.Container(name="worker")],
            )
        )
    fleet = fleet.model_copy(update={"nodes": nodes, "workloads": workloads})
    path = workdir / "drain-fleet.yaml"
    path.write_text(yaml.safe_dump(fleet.model_dump(mode="json")), encoding="utf-8")
    return path


def kubectl_drain(sim: world.Sim, node: str, *, timeout: float) -> float | None:
    """Seconds ``kubectl drain`` takes, or ``None`` without kubectl."""
    if shutil.which("kubectl") is None:
        return None
    argv = ["kubectl", "--kubeconfig", str(sim.kubeconfig), "drain", node, "--ignore-daemonsets"]
    argv += ["--delete-emptydir-data", "--force", f"--timeout={int(timeout)}s"]
    started = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True, timeout=timeout + 30)
    return time.monotonic() - started
