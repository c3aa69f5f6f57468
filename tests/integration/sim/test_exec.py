"""Exec into simulated GPU driver pods over the real websocket client (v4.channel.k8s.io)."""

from __future__ import annotations

import gzip
import pathlib
import re

import aiohttp
import pytest

from remediator.sim import testing
from tests.integration.sim.conftest import ExecFn

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi" / "h200"
FIXTURE_FIELDS = (
    "index,name,uuid,pci.bus_id,driver_version,persistence_mode,temperature.gpu,"
    "temperature.memory,power.draw,power.limit,power.default_limit,power.min_limit,"
    "power.max_limit,enforced.power.limit,utilization.gpu,utilization.memory,memory.used,"
    "memory.free,memory.total,ecc.mode.current,ecc.errors.corrected.volatile.total,"
    "ecc.errors.uncorrected.volatile.total,ecc.errors.corrected.aggregate.total,"
    "ecc.errors.uncorrected.aggregate.total,pcie.link.gen.current,pcie.link.gen.max,"
    "pcie.link.width.current,pcie.link.width.max,mig.mode.current,"
    "clocks_throttle_reasons.active,clocks.current.sm,clocks.current.memory,pstate"
)


def fixture_section(name: str) -> list[str]:
    text = (FIXTURES / "nvidia-smi-text.txt").read_text()
    section = text.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]
    return section.splitlines()


def shape(line: str) -> str:
    """A line with its digits and hex digits blurred, to compare formats not values."""
    return re.sub(r"[0-9A-Fa-f]", "0", line)


async def test_nvidia_smi_table_has_the_real_layout(driver_exec: ExecFn) -> None:
    result = await driver_exec("gpu-node-04", ["nvidia-smi"])
    assert result.exit_code == 0
    lines = result.text.splitlines()
    real = fixture_section("nvidia-smi")
    assert len(lines[0]) == len(real[0])
    assert lines[3:8] == real[3:8]  # column headings
    assert all(len(line) == 91 for line in lines[1:] if line)
    assert shape(lines[8]) == shape(real[8])  # "|   0  NVIDIA H200   On  |   00000000:..."
    assert shape(lines[9]) == shape(real[9])  # fan/temp/power/memory/util row
    assert shape(lines[2]) == shape(real[2])  # NVIDIA-SMI / Driver Version / CUDA Version
    assert lines[-7:] == real[-7:]  # processes section
    assert sum(1 for line in lines if "NVIDIA H200" in line) == 8


async def test_nvidia_smi_lists_gpus_with_fixture_uuids(driver_exec: ExecFn) -> None:
    result = await driver_exec("gpu-node-01", ["nvidia-smi", "-L"])
    assert result.exit_code == 0
    lines = result.text.splitlines()
    assert (
        lines[0] == "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-ff9ed5c2-6902-5875-b00a-6fbab9d5b881)"
    )
    assert (
        lines[1] == "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-659ac159-c80d-597b-9774-44ba7b02381d)"
    )
    assert len(lines) == 8


async def test_query_gpu_csv_matches_the_real_header_and_value_shapes(driver_exec: ExecFn) -> None:
    real = fixture_section("query csv")
    result = await driver_exec(
        "gpu-node-04", ["nvidia-smi", "-i", "0", f"--query-gpu={FIXTURE_FIELDS}", "--format=csv"]
    )
    assert result.exit_code == 0
    header, row = result.text.splitlines()
    assert header == real[0]
    ours, theirs = row.split(", "), real[1].split(", ")
    assert len(ours) == len(theirs)
    for mine, capture in zip(ours, theirs, strict=True):
        assert mine.split(" ")[1:] == capture.split(" ")[1:]  # same units after the value
    plain = await driver_exec(
        "gpu-node-04",
        ["nvidia-smi", "-i", "0", f"--query-gpu={FIXTURE_FIELDS}", "--format=csv,noheader,nounits"],
    )
    assert len(plain.text.splitlines()) == 1
    assert all(" " not in v or v.startswith("NVIDIA") for v in plain.text.strip().split(", "))


async def test_query_by_uuid_and_pci_bus_id_selects_the_fixture_gpu(driver_exec: ExecFn) -> None:
    for ident in ("GPU-e0128808-1f24-5c4b-a5e0-5aec74e66175", "00000000:38:00.0", "2"):
        result = await driver_exec(
            "gpu-node-02",
            [
                "nvidia-smi",
                "-i",
                ident,
                "--query-gpu=index,uuid,pci.bus_id,utilization.gpu",
                "--format=csv,noheader",
            ],
        )
        assert result.text == (
            "2, GPU-e0128808-1f24-5c4b-a5e0-5aec74e66175, 00000000:38:00.0, 12 %\n"
        )


async def test_bad_index_and_bad_field_fail_like_the_real_tool(driver_exec: ExecFn) -> None:
    missing = await driver_exec("gpu-node-01", ["nvidia-smi", "-i", "9", "-L"])
    assert (missing.text, missing.exit_code) == ("No devices were found\n", 6)
    assert missing.status["message"] == (
        "command terminated with non-zero exit code: error executing command "
        "[nvidia-smi -i 9 -L], exit code 6"
    )
    assert missing.status["reason"] == "NonZeroExitCode"
    bad = await driver_exec(
        "gpu-node-01", ["nvidia-smi", "--query-gpu=not.a.field", "--format=csv"]
    )
    assert (bad.text, bad.exit_code) == (
        'Field "not.a.field" is not a valid field to query.\n\n',
        2,
    )


async def test_power_limit_is_validated_applied_and_read_back(
    driver_exec: ExecFn, sim_server: testing.RunningSim
) -> None:
    low = await driver_exec("gpu-node-01", ["nvidia-smi", "-i", "0", "-pl", "100"])
    assert low.exit_code == 2
    assert low.text.splitlines()[0] == (
        "Provided power limit 100.00 W is not a valid power limit which should be between "
        "200.00 W and 700.00 W for GPU 00000000:18:00.0"
    )
    ok = await driver_exec(
        "gpu-node-01",
        ["nvidia-smi", "-i", "GPU-ff9ed5c2-6902-5875-b00a-6fbab9d5b881", "-pl", "250"],
    )
    assert ok.exit_code == 0
    assert ok.text == (
        "Power limit for GPU 00000000:18:00.0 was set to 250.00 W from 700.00 W.\nAll done.\n"
    )
    back = await driver_exec(
        "gpu-node-01",
        [
            "nvidia-smi",
            "-i",
            "0",
            "--query-gpu=power.limit,enforced.power.limit,"
            "power.default_limit,power.min_limit,power.max_limit",
            "--format=csv,noheader,nounits",
        ],
    )
    assert back.text == "250.00, 250.00, 700.00, 200.00, 700.00\n"
    assert sim_server.gpu("gpu-node-01", 0).power_limit == 250.0
    everyone = await driver_exec("gpu-node-02", ["nvidia-smi", "-pl", "300"])
    assert everyone.exit_code == 0
    assert everyone.text.count("was set to 300.00 W") == 8


async def test_a_lost_gpu_answers_with_exit_code_15(
    driver_exec: ExecFn, sim_server: testing.RunningSim
) -> None:
    async with (
        aiohttp.ClientSession(headers=sim_server.headers) as http,
        http.patch(
            f"{sim_server.url}/sim/v1/nodes/gpu-node-03/gpus/3",
            json={"lost": True, "temperature": 0},
        ) as resp,
    ):
        assert resp.status == 200
        assert (await resp.json())["lost"] is True
    result = await driver_exec("gpu-node-03", ["nvidia-smi", "-i", "3", "-q"])
    assert result.exit_code == 15
    assert result.text == (
        "Unable to determine the device handle for GPU0000:48:00.0: GPU is lost.  "
        "Reboot the system to recover this GPU\n"
    )
    table = await driver_exec("gpu-node-03", ["nvidia-smi"])
    assert table.exit_code == 15
    healthy = await driver_exec("gpu-node-03", ["nvidia-smi", "-i", "0", "-L"])
    assert healthy.exit_code == 0


async def test_nvidia_smi_q_uses_the_real_key_layout(driver_exec: ExecFn) -> None:
    result = await driver_exec("gpu-node-02", ["nvidia-smi", "-q", "-i", "5"])
    lines = result.text.splitlines()
    real = (FIXTURES / "nvidia-smi-q.txt").read_text().splitlines()
    assert lines[1] == real[1] == "==============NVSMI LOG=============="
    assert "GPU 00000000:68:00.0" in lines
    uuid_line = next(line for line in lines if "GPU UUID" in line)
    real_uuid = next(line for line in real if "GPU UUID" in line)
    assert uuid_line.index(":") == real_uuid.index(":")
    assert uuid_line.endswith("GPU-449b779b-54a4-5f93-be55-3dc552bc7351")


async def test_bug_report_writes_a_gzip_that_cat_streams_and_rm_removes(
    driver_exec: ExecFn,
    sim_server: testing.RunningSim,
) -> None:
    report = await driver_exec(
        "gpu-node-01", ["nvidia-bug-report.sh", "--output-file", "/tmp/report-1"]
    )
    assert report.exit_code == 0
    assert "complete." in report.text
    listing = await driver_exec("gpu-node-01", ["ls", "/tmp"])
    assert listing.text == "report-1.gz\n"
    cat = await driver_exec("gpu-node-01", ["cat", "/tmp/report-1.gz"])
    assert cat.exit_code == 0
    log = gzip.decompress(cat.stdout).decode()
    assert "nvidia-bug-report.sh" in log
    assert "GPU-ff9ed5c2-6902-5875-b00a-6fbab9d5b881" in log
    assert await driver_exec("gpu-node-01", ["rm", "-f", "/tmp/report-1.gz"])
    again = await driver_exec("gpu-node-01", ["cat", "/tmp/report-1.gz"])
    assert again.exit_code == 1
    assert again.stderr == b"cat: /tmp/report-1.gz: No such file or directory\n"
    default = await driver_exec("gpu-node-01", ["nvidia-bug-report.sh", "--safe-mode"])
    assert default.exit_code == 0
    assert "/nvidia-bug-report.log.gz" in sim_server.files(
        "gpu-operator", sim_server.driver_pod("gpu-node-01")["metadata"]["name"]
    )


async def test_bug_report_hangs_when_told_to_and_on_a_lost_gpu_without_safe_mode(
    driver_exec: ExecFn,
    sim_server: testing.RunningSim,
) -> None:
    async with (
        aiohttp.ClientSession(headers=sim_server.headers) as http,
        http.patch(f"{sim_server.url}/sim/v1/nodes/gpu-node-02", json={"bug_report_hangs": True}),
    ):
        pass
    with pytest.raises(TimeoutError):
        await driver_exec("gpu-node-02", ["nvidia-bug-report.sh"], timeout=0.5)
    sim_server.gpu("gpu-node-03", 3).lost = True
    with pytest.raises(TimeoutError):
        await driver_exec("gpu-node-03", ["nvidia-bug-report.sh"], timeout=0.5)
    safe = await driver_exec("gpu-node-03", ["nvidia-bug-report.sh", "--safe-mode"])
    assert safe.exit_code == 0


async def test_other_commands_and_pods_have_no_shell(exec_pod: ExecFn, driver_exec: ExecFn) -> None:
    result = await exec_pod("ml-training", "llama-finetune-0", ["sh", "-c", "true"])
    assert result.exit_code == 127
    assert result.stderr == (
        b'OCI runtime exec failed: exec failed: unable to start container process: exec: "sh": '
        b"executable file not found in $PATH: unknown\n"
    )
    for argv in (["echo", "hi"], ["true"], ["sh", "-c", "nvidia-smi"]):
        assert (await driver_exec("gpu-node-01", argv)).exit_code == 127
    no_smi = await exec_pod("ml-training", "llama-finetune-0", ["nvidia-smi"])
    assert no_smi.exit_code == 127


async def test_an_unknown_container_is_rejected_before_the_upgrade(exec_pod: ExecFn) -> None:
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        await exec_pod("ml-training", "llama-finetune-0", ["nvidia-smi"], container="nope")
    assert info.value.status == 400
