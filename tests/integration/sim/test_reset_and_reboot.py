"""GPU reset, row remapping and host reboots in the simulator, against the real H200 formats."""

from __future__ import annotations

import pathlib

import aiohttp

from remediator.sim import reboots, testing
from tests.integration.sim.conftest import ExecFn

FIXTURES_DIR = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi" / "h200"

REMAP_QUERY = (
    "--query-remapped-rows=gpu_bus_id,gpu_uuid,remapped_rows.correctable,"
    "remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure"
)
APPS_QUERY = "--query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory"


def extra_section(name: str) -> list[str]:
    text = (FIXTURES_DIR / "nvidia-smi-extra.txt").read_text()
    return text.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0].splitlines()


def node_ready(sim: testing.RunningSim, node: str) -> str:
    conditions = sim.node(node)["status"]["conditions"]
    return next(c["status"] for c in conditions if c["type"] == "Ready")


async def test_remapped_rows_csv_has_the_real_header_and_values(
    driver_exec: ExecFn, sim_server: testing.RunningSim
) -> None:
    real = extra_section("remapped rows csv")
    result = await driver_exec(
        "gpu-node-04", ["nvidia-smi", "-i", "0", REMAP_QUERY, "--format=csv"]
    )
    assert result.exit_code == 0
    header, row = result.text.splitlines()
    assert header == real[0]
    gpu = sim_server.gpu("gpu-node-04", 0)
    assert row == f"{gpu.pci_bus_id}, {gpu.uuid}, 0, 0, No, No"
    gpu.remap_pending, gpu.remapped_uncorrectable = True, 2
    again = await driver_exec(
        "gpu-node-04", ["nvidia-smi", "-i", "0", REMAP_QUERY, "--format=csv,noheader,nounits"]
    )
    assert again.text == f"{gpu.pci_bus_id}, {gpu.uuid}, 0, 2, Yes, No\n"


async def test_compute_apps_csv_has_the_real_header(
    driver_exec: ExecFn, sim_server: testing.RunningSim
) -> None:
    real = extra_section("compute apps (busy-GPU check for reset)")
    idle = await driver_exec("gpu-node-04", ["nvidia-smi", APPS_QUERY, "--format=csv"])
    assert idle.exit_code == 0
    assert idle.text.splitlines() == [real[0]]
    gpu = sim_server.gpu("gpu-node-04", 3)
    gpu.processes = [{"pid": 4242, "name": "python3", "used_mib": 1024}]
    busy = await driver_exec("gpu-node-04", ["nvidia-smi", APPS_QUERY, "--format=csv"])
    assert busy.text.splitlines()[1] == f"{gpu.uuid}, 4242, python3, 1024 MiB"


async def test_reset_is_refused_while_a_process_uses_the_gpu(
    driver_exec: ExecFn, sim_server: testing.RunningSim
) -> None:
    gpu = sim_server.gpu("gpu-node-01", 2)
    gpu.processes = [{"pid": 7, "name": "python3", "used_mib": 10}]
    gpu.ecc_uncorrected_volatile = 3
    result = await driver_exec("gpu-node-01", ["nvidia-smi", "-r", "-i", gpu.uuid])
    assert result.exit_code == 255
    assert result.text.startswith(f"GPU {gpu.pci_bus_id} is currently in use by another process.\n")
    assert gpu.ecc_uncorrected_volatile == 3


async def test_reset_clears_volatile_ecc_and_applies_a_pending_remap(
    driver_exec: ExecFn, sim_server: testing.RunningSim
) -> None:
    gpu = sim_server.gpu("gpu-node-01", 2)
    gpu.ecc_uncorrected_volatile, gpu.ecc_uncorrected_aggregate = 3, 3
    gpu.remap_pending, gpu.remapped_uncorrectable = True, 1
    result = await driver_exec("gpu-node-01", ["nvidia-smi", "-r", "-i", gpu.uuid])
    assert result.exit_code == 0
    assert result.text == f"GPU {gpu.pci_bus_id} was successfully reset.\nAll done.\n"
    assert (gpu.ecc_uncorrected_volatile, gpu.ecc_uncorrected_aggregate) == (0, 3)
    assert (gpu.remap_pending, gpu.remapped_uncorrectable) == (False, 1)


async def test_reset_of_a_gpu_that_fell_off_the_bus_fails_with_exit_15(
    driver_exec: ExecFn, sim_server: testing.RunningSim
) -> None:
    gpu = sim_server.gpu("gpu-node-02", 5)
    gpu.lost = True
    result = await driver_exec("gpu-node-02", ["nvidia-smi", "-r", "-i", gpu.uuid])
    assert result.exit_code == 15
    assert "GPU is lost" in result.text
    assert gpu.lost


async def test_reboot_makes_the_node_not_ready_then_ready_with_gpus_cleared_and_pods_restarted(
    sim_server: testing.RunningSim,
) -> None:
    sim_server.cluster.settings.reboot_seconds = 20  # 0.2 s at this time scale
    gpu = sim_server.gpu("gpu-node-03", 1)
    gpu.lost, gpu.ecc_uncorrected_volatile = True, 4
    driver = sim_server.driver_pod("gpu-node-03")["metadata"]["name"]
    async with (
        aiohttp.ClientSession(headers=sim_server.headers) as http,
        http.post(f"{sim_server.url}/sim/v1/nodes/gpu-node-03/reboot") as resp,
    ):
        assert resp.status == 202
    assert node_ready(sim_server, "gpu-node-03") == "Unknown"
    assert (gpu.lost, gpu.ecc_uncorrected_volatile) == (False, 0)
    await sim_server.wait_for(lambda: node_ready(sim_server, "gpu-node-03") == "True")
    pod = sim_server.pod("gpu-operator", driver)
    assert pod is not None
    assert pod["status"]["phase"] == "Pending"
    await sim_server.wait_for(
        lambda: (sim_server.pod("gpu-operator", driver) or {})["status"]["phase"] == "Running"
    )
    assert sim_server.cluster.reboots == ["gpu-node-03"]


async def test_a_privileged_pod_running_the_reboot_command_reboots_its_node(
    sim_server: testing.RunningSim,
) -> None:
    sim_server.cluster.settings.reboot_seconds = 20
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "reboot-gpu-node-02", "namespace": "default"},
        "spec": {
            "nodeName": "gpu-node-02",
            "hostPID": True,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "reboot",
                    "image": "busybox",
                    "command": reboots.REBOOT_COMMAND,
                    "args": reboots.REBOOT_ARGS,
                    "securityContext": {"privileged": True},
                }
            ],
        },
    }
    async with (
        aiohttp.ClientSession(headers=sim_server.headers) as http,
        http.post(f"{sim_server.url}/api/v1/namespaces/default/pods", json=pod) as resp,
    ):
        assert resp.status == 201
    await sim_server.wait_for(lambda: sim_server.cluster.reboots == ["gpu-node-02"])
    await sim_server.wait_for(lambda: node_ready(sim_server, "gpu-node-02") == "True")
    done = sim_server.pod("default", "reboot-gpu-node-02")
    assert done is not None
    assert done["status"]["phase"] == "Succeeded"
