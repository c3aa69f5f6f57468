"""A simulator restarted with its state file carries on where it stopped; without one it starts
over from the fleet (cordons and power limits gone, a new mutation-log epoch)."""

from __future__ import annotations

import asyncio
import pathlib
import sys

import httpx
from kubernetes_asyncio import client

from remediator.demo.processes import free_port
from remediator.sim import testing
from tests.integration.sim.conftest import configuration
from tests.integration.sim.test_admin_and_faults import admin


async def _cordon_and_cap(sim: testing.RunningSim) -> None:
    async with client.ApiClient(configuration=configuration(sim)) as api:
        await client.CoreV1Api(api).patch_node("gpu-node-02", {"spec": {"unschedulable": True}})
    await admin(sim, "PATCH", "/nodes/gpu-node-02/gpus/3", {"power_limit": 490})


async def test_a_restart_with_the_state_file_keeps_objects_gpus_and_the_log(
    tmp_path: pathlib.Path,
) -> None:
    state = tmp_path / "sim-state.json"
    first = await testing.start_sim(state_file=state)
    try:
        await _cordon_and_cap(first)
        node = first.node("gpu-node-02")
        rv = int(first.store.resource_version)
        epoch = first.cluster.mutations.epoch
    finally:
        await first.stop()
    second = await testing.start_sim(state_file=state)
    try:
        restored = second.node("gpu-node-02")
        assert restored["spec"]["unschedulable"] is True
        assert restored["metadata"]["uid"] == node["metadata"]["uid"]
        assert int(second.store.resource_version) == rv
        assert second.gpu("gpu-node-02", 3).power_limit == 490.0
        log = second.cluster.mutations
        assert (log.epoch, log.boot, len(log.entries)) == (epoch, 2, 2)
        async with client.ApiClient(configuration=configuration(second)) as api:
            core = client.CoreV1Api(api)
            await core.patch_node("gpu-node-02", {"spec": {"unschedulable": None}})
            assert int((await core.read_node("gpu-node-02")).metadata.resource_version) > rv
        assert [e.boot for e in log.entries] == [1, 1, 2]
    finally:
        await second.stop()


async def test_without_the_state_file_a_restart_loses_the_cluster_state() -> None:
    first = await testing.start_sim()
    try:
        await _cordon_and_cap(first)
        epoch = first.cluster.mutations.epoch
    finally:
        await first.stop()
    second = await testing.start_sim()
    try:
        assert not second.node("gpu-node-02")["spec"].get("unschedulable")
        assert second.gpu("gpu-node-02", 3).power_limit == 700.0
        assert second.cluster.mutations.epoch != epoch
        assert second.cluster.mutations.entries == []
    finally:
        await second.stop()


async def test_restoring_only_the_gpus_loses_the_objects_but_keeps_power_limits(
    tmp_path: pathlib.Path,
) -> None:
    state = tmp_path / "sim-state.json"
    first = await testing.start_sim(state_file=state)
    try:
        await _cordon_and_cap(first)
        epoch = first.cluster.mutations.epoch
    finally:
        await first.stop()
    second = await testing.start_sim(state_file=state, restore="gpus")
    try:
        assert not second.node("gpu-node-02")["spec"].get("unschedulable")
        assert second.gpu("gpu-node-02", 3).power_limit == 490.0
        assert second.cluster.mutations.epoch != epoch
        assert second.cluster.mutations.entries == []
    finally:
        await second.stop()


async def test_the_cli_saves_its_state_on_sigterm_and_restores_it(tmp_path: pathlib.Path) -> None:
    state = tmp_path / "state.json"
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "remediator.sim",
        "--listen",
        f"127.0.0.1:{port}",
        "--token",
        "t0k",
        "--no-tls",
        "--kubeconfig",
        str(tmp_path / "kubeconfig"),
        "--state-file",
        str(state),
    ]
    headers = {"Authorization": "Bearer t0k"}
    url = f"http://127.0.0.1:{port}/sim/v1/nodes/gpu-node-01/gpus/0"
    for boot, limit in ((1, 700.0), (2, 450.0)):
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
        try:
            assert proc.stdout is not None
            banner = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
            assert "serving the Kubernetes API" in banner
            async with httpx.AsyncClient(headers=headers) as http:
                assert (await http.get(url)).json()["power_limit"] == limit
                await http.patch(url, json={"power_limit": 450})
                log = (await http.get(f"http://127.0.0.1:{port}/sim/v1/mutations")).json()
            assert log["boot"] == boot
        finally:
            proc.terminate()
            assert await asyncio.wait_for(proc.wait(), 30) == 0
    assert state.exists()
