"""`remediator demo`, the README's first command, as a user runs it: a subprocess with no
stdin, no colours; it must finish the scenario, tell the whole story and leave nothing behind."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.serial, pytest.mark.timeout(110)]


def _start_demo(argv: list[str]) -> subprocess.Popen[str]:
    """``remediator <argv>`` with its output in one text pipe and no standard input."""
    return subprocess.Popen(
        [sys.executable, "-m", "remediator", *argv],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _listening(url: str) -> bool:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, int(port))) == 0


@pytest.fixture(scope="module")
def demo() -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "remediator", "demo", "--color", "never"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=100,
    )
    return result, time.monotonic() - started


def test_demo_completes_the_scenario_quickly(
    demo: tuple[subprocess.CompletedProcess[str], float],
) -> None:
    result, elapsed = demo
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "Scenario complete" in result.stdout
    assert elapsed < 60, f"the demo took {elapsed:.1f} s"
    assert "\x1b[" not in result.stdout  # --color never


def test_demo_shows_each_alert_its_playbook_and_outcome(
    demo: tuple[subprocess.CompletedProcess[str], float],
) -> None:
    out = demo[0].stdout
    for alert, playbook in (
        (
            "GPUTemperatureHigh: firing gpu-node-01 GPU 1, firing gpu-node-01 GPU 0",
            "gpu-temperature-high",
        ),
        ("GPUUtilizationLow: firing gpu-node-02 GPU 2", "gpu-utilization-low"),
        ("GPUECCUncorrectableError: firing gpu-node-02 GPU 5", "gpu-ecc-uncorrectable"),
        ("GPUXidError79: firing gpu-node-03 GPU 3", "gpu-xid-error"),
    ):
        assert alert in out
        assert f"playbook {playbook} on" in out
        assert f"{playbook} succeeded" in out
    # power caps applied, then restored
    assert out.count("700 W → 490 W") == 2
    assert out.count("back to 700 W") == 2
    # on-call is told before the node is touched
    for node in ("gpu-node-02", "gpu-node-03"):
        told = re.search(rf"notify-start \[notify\] .*{node}", out)
        cordon = re.search(rf"cordon \[node\.cordon\] {node} unschedulable", out)
        assert told
        assert cordon
        assert told.start() < cordon.start()
    # the repeated Xid delivery is recognised as the same episode
    assert "0 changed, 1 deduplicated" in out
    # drains with progress, bug reports (safe mode for the lost GPU)
    assert "draining gpu-node-02" in out or "drain [node.drain] 1/1 pod(s) evicted" in out
    assert re.search(r"bug-report \[gpu.collect_bug_report\] gpu-node-03/\S+ \(safe mode\)", out)
    assert "annotation removed" in out


def test_demo_approves_through_the_api_and_checks_the_cluster(
    demo: tuple[subprocess.CompletedProcess[str], float],
) -> None:
    out = demo[0].stdout
    approvals = re.findall(
        r"approved by demo-operator: POST /api/v1/runs/\d+/steps/\d+/approve", out
    )
    assert len(approvals) == 2
    assert "✗" not in out
    for fact in (
        "gpu-node-01 GPU 0 power limit at 70% of default",
        "gpu-node-01 GPU 1 power limit at its default",
        "gpu-node-02 cordoned (unschedulable)",
        "gpu-node-03 runs only DaemonSet pods (workloads drained)",
        "nvidia-bug-report (--safe-mode) of gpu-node-03 stored, SHA-256 matches",
        "pod inference/vllm-llama3-70b-7c9d5 no longer carries annotation",
    ):
        assert f"✓ check: {fact}" in out


def test_demo_prints_the_audit_trail_and_its_verification(
    demo: tuple[subprocess.CompletedProcess[str], float],
) -> None:
    out = demo[0].stdout
    trail = out.split("Audit trail", 1)[1]
    assert "approval: approved by demo-operator" in trail
    assert re.search(r"demo-operator: step drain waiting_approval → pending", trail)
    assert re.search(r"engine: run running → succeeded", trail)
    assert re.search(r"check: GET /api/v1/audit/verify as demo-auditor: hash chain intact", trail)


def test_demo_leaves_nothing_behind(
    demo: tuple[subprocess.CompletedProcess[str], float],
) -> None:
    out = demo[0].stdout
    server = re.search(r"remediator serve at (http://127\.0\.0\.1:\d+)", out)
    sim = re.search(r"simulator: .* at (https://127\.0\.0\.1:\d+)", out)
    workdir = re.search(r"working directory (\S+) \(removed on exit\)", out)
    assert server
    assert sim
    assert workdir
    assert not _listening(server.group(1))
    assert not _listening(sim.group(1))
    assert not pathlib.Path(workdir.group(1)).exists()


def _children(pid: int) -> list[int]:
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_killed_demo_takes_its_server_with_it() -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "remediator", "demo", "--color", "never"],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    children: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while not children and time.monotonic() < deadline:
            children = _children(demo.pid)
            time.sleep(0.1)
        assert children, "the demo started no server"
        demo.kill()  # no finally, no atexit: only the kernel can tell the server
        demo.wait()
        deadline = time.monotonic() + 20
        while any(_alive(child) for child in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(child) for child in children)
    finally:
        if demo.poll() is None:
            demo.kill()
        for child in children:  # leave nothing behind, whatever the outcome
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


ACT_TIMEOUT = 10.0  # --act-timeout for the interactive run: what the old demo waited at most


@pytest.mark.timeout(150)
@pytest.mark.parametrize("approval_delay", [15.0])
def test_an_interactive_demo_waits_for_the_operator_as_long_as_they_like(
    approval_delay: float,
) -> None:
    """The operator approves the first drain with the printed CLI command only after the act
    timeout and the demo's wait for a run have both passed: waiting for a decision is no
    timeout. The second drain is approved at once."""
    assert approval_delay > ACT_TIMEOUT
    argv = ["demo", "--interactive", "--color", "never", "--act-timeout", str(ACT_TIMEOUT)]
    demo = _start_demo(argv)
    out: list[str] = []
    approvals: list[subprocess.CompletedProcess[str]] = []
    waited = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            out.append(line)
            if line.strip().startswith("console:"):
                assert re.search(r"console:  http://127\.0\.0\.1:\d+/runbooks/runs/\d+", line)
            if not line.strip().startswith("CLI:"):
                continue
            command = shlex.split(line.strip().removeprefix("CLI:"))
            assert command[command.index("runs") + 1] == "approve"
            if not approvals:
                started = time.monotonic()
                time.sleep(approval_delay)
                waited.append(time.monotonic() - started)
            approvals.append(
                subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
            )
        demo.wait(timeout=30)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    text = "".join(out)
    assert demo.returncode == 0, text[-4000:]
    assert "Scenario complete" in text
    assert len(approvals) == 2
    for approval in approvals:
        assert approval.returncode == 0, approval.stderr
    assert waited[0] >= approval_delay
    assert "waiting for your decision, as long as you like" in text
    assert text.count("approved by demo-operator: “looks right”") == 2
    assert "did not end as expected" not in text


@pytest.mark.timeout(60)
def test_keep_running_keeps_everything_up_after_a_failed_scenario_until_ctrl_c() -> None:
    argv = ["demo", "--keep-running", "--color", "never", "--act-timeout", "0.1"]
    demo = _start_demo(argv)
    out: list[str] = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            out.append(line)
            if "data " in line and "server log" in line:  # the last line of the list
                break
        text = "".join(out)
        # some act cannot end within 0.1 s (the first ones may: the engine reacts in less)
        assert re.search(r"demo failed: act \d+ \(.*\) did not end as expected within 0\.1 s", text)
        assert "Everything stays up until Ctrl-C" in text
        server = re.search(r"console\s+(http://127\.0\.0\.1:\d+)/", text)
        assert server
        assert _listening(server.group(1))
        demo.send_signal(signal.SIGINT)
        rest, _ = demo.communicate(timeout=30)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 1, rest
    assert not _listening(server.group(1))
