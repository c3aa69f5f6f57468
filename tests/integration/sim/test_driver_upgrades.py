"""The simulated GPU Operator upgrades a node's driver: the driver pod restarts (not ready, then
Ready again) and nvidia-smi in it reports the new version; a failing node ends upgrade-failed."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from kubernetes_asyncio import client

from remediator.sim import testing
from tests.integration.sim.conftest import ExecFn

pytestmark = pytest.mark.timeout(60)

STATE = "nvidia.com/gpu-driver-upgrade-state"
QUERY = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]


def driver_pod(sim: testing.RunningSim, node: str) -> dict[str, object]:
    return next(
        p
        for p in sim.pods(node=node)
        if p["metadata"].get("labels", {}).get("app") == "nvidia-driver-daemonset"
    )


def ready(pod: dict[str, object]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])  # type: ignore[attr-defined]
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


async def wait_state(core: client.CoreV1Api, node: str, wanted: str) -> None:
    for _ in range(200):
        if (await core.read_node(node)).metadata.labels.get(STATE) == wanted:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{node} never reached {wanted}")


async def test_an_upgrade_restarts_the_driver_pod_with_the_new_version(
    sim_server: testing.RunningSim, core: client.CoreV1Api, exec_pod: ExecFn
) -> None:
    node = "gpu-node-01"
    async with aiohttp.ClientSession(headers=sim_server.headers) as http:
        async with http.put(
            f"{sim_server.url}/sim/v1/driver-policy", json={"version": "550.127.05"}
        ) as response:
            assert response.status == 200
        # The restarted pod stays not ready for 0.2 s (scaled): long enough to be seen.
        settings = {"pod_startup_seconds": 20}
        async with http.patch(f"{sim_server.url}/sim/v1/settings", json=settings) as response:
            assert response.status == 200
        await core.patch_node(node, {"metadata": {"labels": {STATE: "upgrade-required"}}})
        await wait_state(core, node, "pod-restart-required")
        saw_not_ready = False
        for _ in range(200):
            pod = driver_pod(sim_server, node)
            saw_not_ready = saw_not_ready or not ready(pod)
            if saw_not_ready and ready(pod):
                break
            await asyncio.sleep(0.005)
        assert saw_not_ready
        assert ready(pod)
        await wait_state(core, node, "upgrade-done")
        meta = pod["metadata"]
        result = await exec_pod(meta["namespace"], meta["name"], QUERY)  # type: ignore[index]
        assert result.exit_code == 0
        assert set(result.stdout.decode().split()) == {"550.127.05"}
        async with http.get(f"{sim_server.url}/sim/v1/driver-policy") as response:
            assert (await response.json())["upgraded"] == [node]


async def test_a_failing_upgrade_keeps_the_old_driver_and_ends_upgrade_failed(
    sim_server: testing.RunningSim, core: client.CoreV1Api
) -> None:
    node = "gpu-node-02"
    async with aiohttp.ClientSession(headers=sim_server.headers) as http:
        body = {"version": "550.127.05", "failing": [node]}
        async with http.put(f"{sim_server.url}/sim/v1/driver-policy", json=body) as response:
            assert response.status == 200
        async with http.post(
            f"{sim_server.url}/sim/v1/driver-upgrades", json={"node": node}
        ) as response:
            assert response.status == 202
    await wait_state(core, node, "upgrade-failed")
    assert sim_server.cluster.hosts[node].driver_version == "535.129.03"
