"""The mutation log: every effect write (cordon, label, taint, power limit, eviction) with the
value before and after it, and the effects applied twice."""

from __future__ import annotations

from typing import Any

import aiohttp
from kubernetes_asyncio import client

from remediator.sim import mutations, testing
from tests.integration.sim.conftest import ExecFn
from tests.integration.sim.test_admin_and_faults import admin

UUID0 = "GPU-ff9ed5c2-6902-5875-b00a-6fbab9d5b881"


async def _log(sim: testing.RunningSim, since: int = 0) -> dict[str, Any]:
    status, body = await admin(sim, "GET", f"/mutations?since={since}")
    assert status == 200
    return body


def _effects(body: dict[str, Any]) -> list[tuple[str, str, str, Any, Any]]:
    return [(e["kind"], e["target"], e["key"], e["before"], e["after"]) for e in body["entries"]]


async def test_node_writes_are_logged_with_the_value_before_and_after(
    sim_server: testing.RunningSim, core: client.CoreV1Api
) -> None:
    await core.patch_node("gpu-node-01", {"spec": {"unschedulable": True}})
    await core.patch_node("gpu-node-01", {"spec": {"unschedulable": True}})
    await core.patch_node(
        "gpu-node-01",
        {"metadata": {"labels": {"gpu-status": "faulty"}}},
        _content_type="application/merge-patch+json",
    )
    node = await core.read_node("gpu-node-01")
    node.spec.taints.append(client.V1Taint(key="nvidia.com/gpu-unhealthy", effect="NoSchedule"))
    await core.replace_node("gpu-node-01", node)
    await core.patch_node("gpu-node-01", {"spec": {"unschedulable": None}})
    body = await _log(sim_server)
    assert _effects(body) == [
        ("node.unschedulable", "gpu-node-01", "", False, True),
        ("node.unschedulable", "gpu-node-01", "", True, True),
        ("node.label", "gpu-node-01", "gpu-status", None, "faulty"),
        ("node.taint", "gpu-node-01", "nvidia.com/gpu-unhealthy:NoSchedule", None, ""),
        ("node.unschedulable", "gpu-node-01", "", True, False),
    ]
    assert body["entries"][0]["source"] == "PATCH /api/v1/nodes/gpu-node-01"
    assert body["repeated"] == [[1, 2]]
    later = await _log(sim_server, since=4)
    assert [e["seq"] for e in later["entries"]] == [5]


async def test_power_limits_set_by_nvidia_smi_are_logged_per_gpu(
    sim_server: testing.RunningSim, driver_exec: ExecFn
) -> None:
    result = await driver_exec("gpu-node-01", ["nvidia-smi", "-i", UUID0, "-pl", "490"])
    assert result.exit_code == 0
    result = await driver_exec("gpu-node-01", ["nvidia-smi", "-i", UUID0, "-pl", "9000"])
    assert result.exit_code == 2
    await admin(sim_server, "PATCH", "/nodes/gpu-node-01/gpus/0", {"power_limit": 700})
    body = await _log(sim_server)
    assert _effects(body) == [
        ("gpu.power_limit", "gpu-node-01", UUID0, 700.0, 490.0),
        ("gpu.power_limit", "gpu-node-01", UUID0, 490.0, 700.0),
    ]
    assert body["entries"][0]["source"].startswith(f"exec nvidia-smi -i {UUID0} -pl 490 in ")
    assert body["entries"][1]["source"] == "admin"


async def test_evicting_a_terminating_pod_is_logged_but_not_a_repeat(
    sim_server: testing.RunningSim, policy: client.PolicyV1Api
) -> None:
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="jupyter-alice"))
    for _ in range(2):
        await client.CoreV1Api(policy.api_client).create_namespaced_pod_eviction(
            "jupyter-alice", "research", eviction
        )
    body = await _log(sim_server)
    uid = sim_server.pod("research", "jupyter-alice")["metadata"]["uid"]
    assert _effects(body) == [
        ("pod.eviction", "research/jupyter-alice", uid, "present", "terminating"),
        ("pod.eviction", "research/jupyter-alice", uid, "terminating", "terminating"),
    ]
    assert body["repeated"] == []


def test_an_effect_reversed_and_applied_again_is_not_a_repeat() -> None:
    def entry(seq: int, before: Any, after: Any, epoch: str = "a") -> dict[str, Any]:
        return {
            "seq": seq,
            "epoch": epoch,
            "kind": mutations.POWER_LIMIT,
            "target": "n",
            "key": "g",
            "before": before,
            "after": after,
        }

    assert mutations.repeated([entry(1, 700, 490), entry(2, 490, 700), entry(3, 700, 490)]) == []
    assert mutations.repeated([entry(1, 700, 490), entry(1, 700, 490, epoch="b")]) == []
    first, second = entry(1, 700, 490), entry(2, 490, 490)
    assert mutations.repeated([second, first]) == [(first, second)]


async def test_an_exec_dropped_after_its_command_ran_has_its_effect_but_no_status(
    sim_server: testing.RunningSim, driver_exec: ExecFn
) -> None:
    await admin(sim_server, "PUT", "/faults", {"drop_websocket_after_rate": 1.0})
    result = await driver_exec("gpu-node-01", ["nvidia-smi", "-i", "0", "-pl", "500"])
    assert result.status == {}
    assert b"was set to 500.00 W" in result.stdout
    assert sim_server.gpu("gpu-node-01", 0).power_limit == 500.0
    assert sim_server.cluster.exec_log[-1].dropped == "after"
    await admin(sim_server, "PUT", "/faults", {"drop_websocket_rate": 1.0})
    result = await driver_exec("gpu-node-01", ["nvidia-smi", "-i", "0", "-pl", "600"])
    assert (result.stdout, result.status) == (b"", {})
    assert sim_server.gpu("gpu-node-01", 0).power_limit == 500.0
    assert sim_server.cluster.exec_log[-1].dropped == "before"
    status, sessions = await admin(sim_server, "GET", "/execs")
    assert status == 200
    assert [(e["argv"][-1], e["dropped"]) for e in sessions] == [
        ("500", "after"),
        ("600", "before"),
    ]


async def test_a_reset_starts_a_new_epoch_with_an_empty_log(
    sim_server: testing.RunningSim, core: client.CoreV1Api
) -> None:
    await core.patch_node("gpu-node-02", {"spec": {"unschedulable": True}})
    before = await _log(sim_server)
    async with aiohttp.ClientSession(headers=sim_server.headers) as http:
        await http.post(f"{sim_server.url}/sim/v1/reset")
    after = await _log(sim_server)
    assert after["epoch"] != before["epoch"]
    assert (after["entries"], after["boot"]) == ([], before["boot"])
