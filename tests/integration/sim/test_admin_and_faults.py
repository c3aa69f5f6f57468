"""Admin endpoints (GPU state, settings, state dump, reset) and runtime fault injection."""

from __future__ import annotations

import asyncio
import json
import pathlib
import sys
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from remediator.sim import fleet, testing
from tests.integration.sim.conftest import ExecFn


async def admin(
    sim: testing.RunningSim, method: str, path: str, body: dict[str, Any] | None = None
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(headers=sim.headers) as http,
        http.request(method, f"{sim.url}/sim/v1{path}", json=body) as resp,
    ):
        return resp.status, await resp.json()


async def test_gpu_state_can_be_read_and_changed_at_runtime(
    sim_server: testing.RunningSim,
    driver_exec: ExecFn,
) -> None:
    status, gpu = await admin(sim_server, "GET", "/nodes/gpu-node-01/gpus/0")
    assert status == 200
    assert gpu["uuid"] == "GPU-ff9ed5c2-6902-5875-b00a-6fbab9d5b881"
    assert gpu["pci_bus_id"] == "00000000:18:00.0"
    status, gpu = await admin(
        sim_server,
        "PATCH",
        "/nodes/gpu-node-01/gpus/0",
        {"temperature": 91, "ecc_uncorrected_volatile": 2},
    )
    assert (status, gpu["temperature"]) == (200, 91)
    result = await driver_exec(
        "gpu-node-01",
        [
            "nvidia-smi",
            "-i",
            "0",
            "--query-gpu=temperature.gpu,ecc.errors.uncorrected.volatile.total",
            "--format=csv,noheader",
        ],
    )
    assert result.text == "91, 2\n"
    status, _ = await admin(sim_server, "PATCH", "/nodes/gpu-node-01/gpus/0", {"nope": 1})
    assert status == 422
    status, _ = await admin(
        sim_server, "PATCH", "/nodes/gpu-node-01/gpus/0", {"temperature": "hot"}
    )
    assert status == 422
    status, _ = await admin(sim_server, "GET", "/nodes/cpu-node-01/gpus")
    assert status == 404
    status, listing = await admin(sim_server, "GET", "/nodes/gpu-node-02/gpus")
    assert [g["index"] for g in listing["gpus"]] == list(range(8))
    assert listing["gpus"][5]["uuid"] == "GPU-449b779b-54a4-5f93-be55-3dc552bc7351"


async def test_state_dump_and_reset_restore_the_seeded_fleet(
    sim_server: testing.RunningSim,
    core: client.CoreV1Api,
) -> None:
    await core.patch_node("gpu-node-01", {"spec": {"unschedulable": True}})
    sim_server.gpu("gpu-node-01", 0).lost = True
    status, state = await admin(sim_server, "GET", "/state")
    assert status == 200
    assert (
        next(n for n in state["nodes"] if n["metadata"]["name"] == "gpu-node-01")["spec"][
            "unschedulable"
        ]
        is True
    )
    assert state["gpus"]["gpu-node-01"][0]["lost"] is True
    rv = int(state["resourceVersion"])
    status, body = await admin(sim_server, "POST", "/reset")
    assert status == 200
    assert int(body["resourceVersion"]) > rv  # versions never go backwards
    assert not sim_server.node("gpu-node-01")["spec"].get("unschedulable")
    assert sim_server.gpu("gpu-node-01", 0).lost is False


async def test_settings_change_the_simulated_clock(sim_server: testing.RunningSim) -> None:
    status, settings = await admin(sim_server, "PATCH", "/settings", {"time_scale": 0.5})
    assert (status, settings["time_scale"]) == (200, 0.5)
    assert sim_server.cluster.scaled(30) == 15
    status, _ = await admin(sim_server, "PATCH", "/settings", {"time_scale": -1})
    assert status == 422


async def test_injected_429s_carry_retry_after(
    sim_server: testing.RunningSim, core: client.CoreV1Api
) -> None:
    status, _ = await admin(
        sim_server,
        "PUT",
        "/faults",
        {
            "path_prefix": "/api/v1/nodes",
            "methods": ["GET"],
            "rate_429": 1.0,
            "retry_after_seconds": 3,
        },
    )
    assert status == 200
    with pytest.raises(ApiException) as info:
        await core.list_node()
    assert info.value.status == 429
    assert info.value.headers["Retry-After"] == "3"
    assert json.loads(info.value.body)["details"] == {"retryAfterSeconds": 3}
    await core.patch_node("gpu-node-01", {"metadata": {"labels": {"a": "b"}}})  # PATCH unaffected
    await core.list_namespace()  # other paths unaffected
    _, faults = await admin(sim_server, "GET", "/faults")
    assert faults["rules"][0]["rate_429"] == 1.0
    await admin(sim_server, "PUT", "/faults", {"rules": []})
    await core.list_node()


async def test_injected_server_errors_and_latency(
    sim_server: testing.RunningSim, core: client.CoreV1Api
) -> None:
    await admin(sim_server, "PUT", "/faults", {"rules": [{"rate_503": 1.0}], "seed": 1})
    with pytest.raises(ApiException) as info:
        await core.read_node("gpu-node-01")
    assert info.value.status == 503
    await admin(sim_server, "PUT", "/faults", {"rules": [{"rate_500": 1.0}]})
    with pytest.raises(ApiException) as info:
        await core.read_node("gpu-node-01")
    assert info.value.status == 500
    await admin(sim_server, "PUT", "/faults", {"rules": [{"latency_ms": 200}]})
    loop = asyncio.get_running_loop()
    start = loop.time()
    await core.read_node("gpu-node-01")
    assert loop.time() - start >= 0.2


async def test_dropped_websockets_end_exec_without_a_status(
    sim_server: testing.RunningSim,
    driver_exec: ExecFn,
) -> None:
    await admin(sim_server, "PUT", "/faults", {"drop_websocket_rate": 1.0})
    result = await driver_exec("gpu-node-01", ["nvidia-smi", "-L"])
    assert (result.stdout, result.status) == (b"", {})


async def test_requests_are_counted_by_verb_and_resource_and_reset(
    sim_server: testing.RunningSim, core: client.CoreV1Api, driver_exec: ExecFn
) -> None:
    await core.list_node()
    await core.read_node("gpu-node-01")
    await core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-node-01")
    await core.patch_node("gpu-node-01", {"metadata": {"labels": {"counted": "yes"}}})
    await driver_exec("gpu-node-01", ["nvidia-smi", "-L"])
    status, counted = await admin(sim_server, "GET", "/requests")
    assert status == 200
    assert counted["list nodes"] == 1
    assert counted["get nodes"] == 1
    assert counted["patch nodes"] == 1
    assert counted["create pods/exec"] == 1
    assert counted["list pods"] == 1
    await admin(sim_server, "POST", "/reset")
    assert (await admin(sim_server, "GET", "/requests"))[1] == {}


async def test_a_custom_fleet_yaml_is_validated_and_seeded(tmp_path: pathlib.Path) -> None:
    description = {
        "settings": {"pod_startup_seconds": 0},
        "nodes": [
            {"name": "n1", "gpus": {"model": "A100", "count": 2}},
            {"name": "n2", "unschedulable": True},
        ],
        "workloads": [
            {
                "kind": "ReplicaSet",
                "name": "web",
                "replicas": 3,
                "labels": {"app": "web"},
                "containers": [{"name": "c"}],
            }
        ],
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(description))
    async with testing.running_sim(fleet.Fleet.from_file(path)) as sim:
        await sim.wait_for(
            lambda: len([p for p in sim.pods() if p["status"].get("phase") == "Running"]) == 3
        )
        assert {p["spec"]["nodeName"] for p in sim.pods()} == {"n1"}
        assert sim.gpu("n1", 1).max_limit == 400.0
    with pytest.raises(ValueError, match="extra"):
        fleet.Fleet.from_yaml("nodes: []\nbogus: 1\n")


async def test_the_cli_serves_and_writes_a_kubeconfig(tmp_path: pathlib.Path) -> None:
    kubeconfig = tmp_path / "sim.kubeconfig"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "remediator.sim",
        "--listen",
        "127.0.0.1:0",
        "--token",
        "t0k",
        "--kubeconfig",
        str(kubeconfig),
        "--no-tls",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(20):
            line = (await proc.stdout.readline()).decode()
        url = line.rsplit(" ", 1)[1].strip()
        config = yaml.safe_load(kubeconfig.read_text())
        assert config["current-context"] == "remediator-sim"
        assert config["clusters"][0]["cluster"]["server"] == url
        assert config["users"][0]["user"]["token"] == "t0k"
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{url}/api/v1/nodes", headers={"Authorization": "Bearer t0k"}) as resp,
        ):
            assert resp.status == 200
    finally:
        proc.terminate()
        async with asyncio.timeout(10):
            assert await proc.wait() == 0
