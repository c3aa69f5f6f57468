"""GPU actions on a node pool whose driver is installed on the host (no driver pod): every
command runs in a short-lived privileged host pod that is gone afterwards."""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from remediator.actions import bugreport, gpu, health, hostexec
from remediator.domain import errors
from remediator.ports import actions
from remediator.sim import fleet as fleet_mod
from remediator.sim import testing
from tests.integration.kube.conftest import MakeContext, run_action

NODE = "gpu-node-04"
POOL_SELECTOR = "nvidia.com/gpu.deploy.driver=pre-installed"
IMAGE = "registry.example.com/tools/ubuntu:24.04"


def host_driver_fleet() -> fleet_mod.Fleet:
    """The default fleet, with gpu-node-04's driver pre-installed on the host: the GPU
    Operator's driver daemonset runs only on the nodes labelled for it."""
    fleet = fleet_mod.Fleet.default()
    nodes = []
    for node in fleet.nodes:
        value = "pre-installed" if node.name == NODE else "true"
        labels = {**node.labels, "nvidia.com/gpu.deploy.driver": value}
        nodes.append(node.model_copy(update={"labels": labels}))
    workloads = []
    for w in fleet.workloads:
        if w.name == "nvidia-driver-daemonset":
            selector = {**w.node_selector, "nvidia.com/gpu.deploy.driver": "true"}
            w = w.model_copy(update={"node_selector": selector})
        workloads.append(w)
    return fleet.model_copy(update={"nodes": nodes, "workloads": workloads})


@pytest.fixture
async def sim() -> AsyncIterator[testing.RunningSim]:
    async with testing.running_sim(host_driver_fleet(), time_scale=0.01) as running:
        yield running


def in_pool(ctx: actions.ActionContext, **pool: Any) -> actions.ActionContext:
    cfg = hostexec.GpuExecConfig.model_validate(
        {"pools": [{"name": "host-driver", "node_selector": POOL_SELECTOR, "image": IMAGE} | pool]}
    )
    return dataclasses.replace(ctx, services={**ctx.services, hostexec.SERVICE: cfg})


def host_pods(sim: testing.RunningSim) -> list[dict[str, Any]]:
    return [
        p
        for p in sim.pods(namespace="gpu-operator")
        if p["metadata"].get("labels", {}).get(hostexec.APP_LABEL) == hostexec.APP_NAME
    ]


async def test_a_node_without_a_driver_pod_is_capped_through_a_host_pod_that_is_then_deleted(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    assert not [p for p in sim.pods(node=NODE) if "driver" in p["metadata"]["name"]]
    target = sim.gpu(NODE, 3)
    ctx = in_pool(make_ctx(node=NODE, gpu=target.uuid))
    output = await run_action(gpu.PowerCapAction(), ctx, {"watts": 400})
    assert target.power_limit == 400.0
    assert output["gpus"][0]["verified_limit"] == 400.0
    runs = [r for r in sim.cluster.exec_log if r.node == NODE]
    assert runs
    assert all(r.pod.startswith("remediator-gpu-exec-7-3-") for r in runs)
    assert all(r.argv[:3] == ["chroot", "/host", "nvidia-smi"] for r in runs)
    assert ["chroot", "/host", "nvidia-smi", "-i", target.uuid, "-pl", "400"] in [
        r.argv for r in runs
    ]
    assert host_pods(sim) == []  # check and apply each had their pod, both deleted


async def test_the_host_pod_is_pinned_privileged_and_runs_no_shell(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    ctx = in_pool(make_ctx(node=NODE))
    seen: list[dict[str, Any]] = []
    async with hostexec.scope():
        _, driver = await gpu.find_driver(ctx, gpu.DriverParams())
        pod = sim.pod(driver.namespace, driver.pod)
        assert pod is not None
        seen.append(pod)
        again = await gpu.find_driver(ctx, gpu.DriverParams())
        assert again[1] == driver  # one pod per node and scope
    [pod] = seen
    spec = pod["spec"]
    assert spec["nodeName"] == NODE
    assert spec["hostPID"] is True
    assert spec["restartPolicy"] == "Never"
    [container] = spec["containers"]
    assert container["command"] == ["sleep", "3600"]
    assert "args" not in container
    assert container["securityContext"] == {"privileged": True}
    assert container["image"] == IMAGE
    assert spec["volumes"][0]["hostPath"]["path"] == "/"
    assert spec["activeDeadlineSeconds"] == 3600
    assert sim.pod(driver.namespace, driver.pod) is None


async def test_verify_and_bug_report_run_through_the_host_pod(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    ctx = in_pool(make_ctx(node=NODE, run_id=12, step_id=5))
    verified = await run_action(health.VerifyHealthyAction(), ctx, {})
    assert not verified["problems"]
    assert len(verified["gpus"]) == 8
    report = await run_action(bugreport.BugReportAction(), ctx, {"safe_mode": True})
    data = (pathlib.Path(ctx.services["artifact_dir"]) / report["path"]).read_bytes()
    assert f"Hostname: {NODE}" in gzip.decompress(data).decode()
    assert report["removed_from_node"] is True
    assert host_pods(sim) == []


async def test_a_host_pod_that_cannot_start_is_a_clear_temporary_failure_and_is_removed(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    sim.cluster.unpullable_images.add(IMAGE)
    ctx = in_pool(make_ctx(node=NODE), start_timeout_seconds=0.5)
    with pytest.raises(errors.ActionFailed) as failed:
        await run_action(gpu.PowerCapAction(), ctx, {"watts": 400})
    message = str(failed.value)
    assert "was not Ready within 0.5 s" in message
    assert "ImagePullBackOff" in message
    assert IMAGE in message
    assert failed.value.temporary
    assert host_pods(sim) == []
    assert sim.gpu(NODE, 0).power_limit == 700.0


async def test_leftover_host_pods_that_expired_are_removed_on_next_use(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    ctx = in_pool(make_ctx(node=NODE))
    pool = hostexec.config(ctx).pools[0]
    past = dataclasses.replace(ctx, now=lambda: dt.datetime.now(dt.UTC) - dt.timedelta(hours=2))
    cluster = ctx.require_cluster()
    for name in ("remediator-gpu-exec-old", "remediator-gpu-exec-live"):
        made = past if name.endswith("old") else ctx
        await cluster.create_pod(
            "gpu-operator", hostexec.manifest(made, pool, NODE, "gpu-operator", name)
        )
    await run_action(health.VerifyHealthyAction(), ctx, {})
    assert [p["metadata"]["name"] for p in host_pods(sim)] == ["remediator-gpu-exec-live"]


async def test_nodes_outside_every_host_pool_keep_using_their_driver_pod(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    ctx = in_pool(make_ctx(node="gpu-node-02"))
    _, driver = await gpu.find_driver(ctx, gpu.DriverParams())
    assert driver.pod == sim.driver_pod("gpu-node-02")["metadata"]["name"]
    assert not driver.host_pod
    assert driver.command(["nvidia-smi"]) == ["nvidia-smi"]


async def test_a_host_pod_on_a_node_whose_driver_is_not_on_the_host_finds_no_nvidia_smi(
    sim: testing.RunningSim, make_ctx: MakeContext
) -> None:
    ctx = in_pool(make_ctx(node="gpu-node-02"), node_selector="nvidia.com/gpu.present=true")
    with pytest.raises(errors.ActionFailed, match=r"executable not found \(exit 127\)") as failed:
        await run_action(gpu.PowerCapAction(), ctx, {"watts": 400})
    assert "chroot: failed to run command 'nvidia-smi'" in str(failed.value)
    assert host_pods(sim) == []
