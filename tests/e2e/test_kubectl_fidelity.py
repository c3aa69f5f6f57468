"""A real kubectl against the simulator: the fake must satisfy an independent client.

kubectl is found through ``REMEDIATOR_KUBECTL`` (one or more paths separated by ``os.pathsep``,
e.g. Debian's 1.20 and a current release) or on ``PATH``. kubectl older than 1.30 runs exec
over SPDY/3.1, newer ones over websockets (v5.channel.k8s.io); both are served.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import pathlib
import shutil
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from remediator.sim import testing

pytestmark = pytest.mark.e2e


def kubectl_binaries() -> list[str]:
    configured = os.environ.get("REMEDIATOR_KUBECTL")
    if configured:
        return [p for p in configured.split(os.pathsep) if p]
    found = shutil.which("kubectl")
    return [found] if found else []


# Without a kubectl the tests below fail on the missing binary, and this one says why.
BINARIES = kubectl_binaries() or ["kubectl"]


def test_kubectl_is_installed():
    assert kubectl_binaries(), (
        "no kubectl: install Debian's kubernetes-client (make system-deps)"
        " or set REMEDIATOR_KUBECTL"
    )


class Kubectl:
    def __init__(self, binary: str, sim: testing.RunningSim, home: pathlib.Path) -> None:
        self.binary = binary
        self.sim = sim
        self.env = {**os.environ, "HOME": str(home), "KUBECONFIG": str(sim.kubeconfig_path)}
        self.env.pop("KUBERNETES_SERVICE_HOST", None)

    async def run(self, *args: str, timeout: float = 60) -> tuple[int, bytes, str]:
        proc = await asyncio.create_subprocess_exec(
            self.binary,
            *args,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(timeout):
                out, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        assert proc.returncode is not None
        return proc.returncode, out, err.decode()

    async def ok(self, *args: str, timeout: float = 60) -> str:
        rc, out, err = await self.run(*args, timeout=timeout)
        assert rc == 0, f"kubectl {' '.join(args)} failed ({rc}): {err}"
        return out.decode()

    async def json(self, *args: str) -> Any:
        return json.loads(await self.ok(*args, "-o", "json"))


@pytest.fixture(params=BINARIES, ids=lambda p: pathlib.Path(p).name)
async def kubectl(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> AsyncIterator[Kubectl]:
    async with testing.running_sim(
        tls=True, time_scale=0.01, kubeconfig_path=tmp_path / "kubeconfig"
    ) as sim:
        home = tmp_path / "home"
        home.mkdir()
        yield Kubectl(request.param, sim, home)


async def test_get_nodes_and_pods_as_json(kubectl: Kubectl) -> None:
    nodes = await kubectl.json("get", "nodes")
    assert nodes["kind"] == "List"
    names = [n["metadata"]["name"] for n in nodes["items"]]
    assert names == ["cpu-node-01", "gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
    gpu = next(n for n in nodes["items"] if n["metadata"]["name"] == "gpu-node-01")
    assert gpu["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    pods = await kubectl.json("get", "pods", "-A")
    by_name = {p["metadata"]["name"]: p for p in pods["items"]}
    owner = by_name["llama-finetune-0"]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["controller"]) == ("StatefulSet", True)
    assert by_name["jupyter-alice"]["spec"]["nodeName"] == "gpu-node-03"
    selected = await kubectl.json(
        "get",
        "pods",
        "-A",
        "--field-selector",
        "spec.nodeName=gpu-node-02",
        "-l",
        "app=vllm-llama3-70b",
    )
    assert [p["metadata"]["name"] for p in selected["items"]] == ["vllm-llama3-70b-7c9d5"]


async def test_label_taint_cordon_and_uncordon(kubectl: Kubectl) -> None:
    sim = kubectl.sim
    await kubectl.ok("label", "node", "gpu-node-01", "gpu-status=faulty")
    assert sim.node("gpu-node-01")["metadata"]["labels"]["gpu-status"] == "faulty"
    await kubectl.ok("label", "node", "gpu-node-01", "gpu-status-")
    assert "gpu-status" not in sim.node("gpu-node-01")["metadata"]["labels"]
    await kubectl.ok("taint", "node", "gpu-node-02", "gpu-status=faulty:NoSchedule")
    taints = sim.node("gpu-node-02")["spec"]["taints"]
    assert {"key": "gpu-status", "value": "faulty", "effect": "NoSchedule"} in taints
    assert len(taints) == 2
    await kubectl.ok("taint", "node", "gpu-node-02", "gpu-status:NoSchedule-")
    assert [t["key"] for t in sim.node("gpu-node-02")["spec"]["taints"]] == ["nvidia.com/gpu"]
    assert "cordoned" in await kubectl.ok("cordon", "gpu-node-03")
    assert sim.node("gpu-node-03")["spec"]["unschedulable"] is True
    table = await kubectl.ok("get", "nodes")  # server-side printing (meta.k8s.io Table)
    assert table.splitlines()[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    row = next(line for line in table.splitlines() if line.startswith("gpu-node-03"))
    assert row.split()[1] == "Ready,SchedulingDisabled"
    assert "uncordoned" in await kubectl.ok("uncordon", "gpu-node-03")
    assert not sim.node("gpu-node-03")["spec"].get("unschedulable")


async def _set_min_available(sim: testing.RunningSim, value: int) -> None:
    async with aiohttp.ClientSession(
        headers={**sim.headers, "Content-Type": "application/merge-patch+json"}
    ) as http:
        url = f"{sim.url}/apis/policy/v1/namespaces/ml-training/poddisruptionbudgets/llama-finetune"
        async with http.patch(
            url, data=json.dumps({"spec": {"minAvailable": value}}), ssl=False
        ) as resp:
            assert resp.status == 200


async def test_drain_retries_on_a_blocking_budget_and_finishes_once_relaxed(
    kubectl: Kubectl,
) -> None:
    sim = kubectl.sim
    await _set_min_available(sim, 2)
    drain = asyncio.create_task(
        kubectl.run(
            "drain",
            "gpu-node-01",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=60s",
            timeout=90,
        )
    )
    await sim.wait_for(lambda: bool(sim.node("gpu-node-01")["spec"].get("unschedulable")))
    await asyncio.sleep(1.5)  # kubectl's first eviction attempt is refused; it retries in 5 s
    assert not drain.done()
    old_uid = sim.pod("ml-training", "llama-finetune-0")["metadata"]["uid"]  # type: ignore[index]
    await _set_min_available(sim, 1)
    rc, out, err = await drain
    assert rc == 0, err
    assert "Cannot evict pod as it would violate the pod's disruption budget." in err
    assert "pod/llama-finetune-0 evicted" in out.decode()
    replacement = sim.pod("ml-training", "llama-finetune-0")
    assert replacement is not None
    assert replacement["metadata"]["uid"] != old_uid
    assert replacement["spec"].get("nodeName") != "gpu-node-01"
    remaining = {p["metadata"]["name"] for p in sim.pods(node="gpu-node-01")}
    assert any(n.startswith("nvidia-driver-daemonset") for n in remaining)
    assert "nginx-proxy-gpu-node-01" in remaining  # mirror pods are left alone


async def test_drain_refuses_a_bare_pod_without_force_and_leaves_the_node_cordoned(
    kubectl: Kubectl,
) -> None:
    rc, _, err = await kubectl.run(
        "drain", "gpu-node-03", "--ignore-daemonsets", "--delete-emptydir-data"
    )
    assert rc != 0
    assert "research/jupyter-alice" in err
    assert kubectl.sim.node("gpu-node-03")["spec"]["unschedulable"] is True
    assert kubectl.sim.pod("research", "jupyter-alice") is not None


async def test_exec_runs_nvidia_smi_in_the_driver_pod_with_exit_codes(kubectl: Kubectl) -> None:
    pod = kubectl.sim.driver_pod("gpu-node-01")["metadata"]["name"]
    base = ("exec", "-n", "gpu-operator", pod, "-c", "nvidia-driver-ctr", "--")
    listing = await kubectl.ok(*base, "nvidia-smi", "-L")
    assert listing.splitlines()[0] == (
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-ff9ed5c2-6902-5875-b00a-6fbab9d5b881)"
    )
    rc, out, err = await kubectl.run(*base, "nvidia-smi", "-i", "9")
    assert (rc, out) == (6, b"No devices were found\n")
    assert "command terminated with exit code 6" in err
    rc, out, _ = await kubectl.run(*base, "nvidia-smi", "-i", "0", "-pl", "100")
    assert rc == 2
    assert out.startswith(b"Provided power limit 100.00 W is not a valid power limit")
    record = kubectl.sim.cluster.exec_log[-1]
    assert (record.argv, record.exit_code) == (["nvidia-smi", "-i", "0", "-pl", "100"], 2)
    assert record.transport in ("spdy:v4.channel.k8s.io", "websocket:v5.channel.k8s.io")


async def test_exec_streams_a_binary_bug_report(kubectl: Kubectl) -> None:
    pod = kubectl.sim.driver_pod("gpu-node-02")["metadata"]["name"]
    base = ("exec", "-n", "gpu-operator", pod, "--")
    await kubectl.ok(*base, "nvidia-bug-report.sh", "--output-file", "/tmp/report")
    rc, data, _ = await kubectl.run(*base, "cat", "/tmp/report.gz")
    assert rc == 0
    assert "nvidia-bug-report.sh" in gzip.decompress(data).decode()


async def test_apply_get_and_delete_a_disruption_budget(
    kubectl: Kubectl, tmp_path: pathlib.Path
) -> None:
    manifest = tmp_path / "pdb.yaml"
    manifest.write_text(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\n"
        "metadata: {name: dashboard, namespace: monitoring}\n"
        "spec: {minAvailable: 1, selector: {matchLabels: {app: dashboard}}}\n"
    )
    assert "created" in await kubectl.ok("apply", "-f", str(manifest))
    stored = kubectl.sim.store.must_get("poddisruptionbudgets.policy", "monitoring", "dashboard")
    assert stored["status"]["disruptionsAllowed"] == 1
    table = (await kubectl.ok("get", "pdb", "-n", "monitoring")).splitlines()
    assert table[0].split() == [
        "NAME",
        "MIN",
        "AVAILABLE",
        "MAX",
        "UNAVAILABLE",
        "ALLOWED",
        "DISRUPTIONS",
        "AGE",
    ]
    assert table[1].split()[:4] == ["dashboard", "1", "N/A", "1"]
    await kubectl.ok("delete", "pdb", "-n", "monitoring", "dashboard")
    assert kubectl.sim.store.get("poddisruptionbudgets.policy", "monitoring", "dashboard") is None
