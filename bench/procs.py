"""Processes for the benchmarks: started pinned to a CPU when asked, made to die with the
harness (Linux parent-death signal), always stopped by PID in a ``finally``; their resident
memory and CPU time read from ``/proc``."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator

from remediator.demo.processes import free_port as free_port  # (the demo's: one way to pick)

ROOT = pathlib.Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


def cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def named_cpu_seconds(name: str) -> float:
    """User plus system CPU time of every live process named ``name`` (``postgres``: the
    server and its backends; a backend that exits takes its time with it)."""
    total = 0
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        end = text.rfind(")")
        if text[text.find("(") + 1 : end] == name:
            fields = text[end + 1 :].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def pinned(argv: list[str], cpu: int | None) -> list[str]:
    """``argv`` run on ``cpu`` only (taskset), when there is such a CPU and taskset."""
    if cpu is None or cpus() < 2 or shutil.which("taskset") is None:
        return argv
    return ["taskset", "-c", str(cpu), *argv]


def _die_with_parent() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


@dataclasses.dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    log: pathlib.Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            text = self.log.read_text(encoding="utf-8", errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return ""

    def rss_mb(self) -> float:
        """Resident memory of the process (the server itself, taskset has exec'd into it)."""
        for line in pathlib.Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_seconds(self) -> float:
        """User plus system CPU time the process has used so far."""
        fields = pathlib.Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, grace: float = 10.0) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


@contextlib.contextmanager
def spawn(
    argv: list[str],
    *,
    log: pathlib.Path,
    env: dict[str, str] | None = None,
    cpu: int | None = None,
) -> Iterator[Proc]:
    """Run ``argv`` (stdout and stderr to ``log``) for the ``with`` block, then stop it."""
    with log.open("ab") as out:
        popen = subprocess.Popen(
            pinned(argv, cpu),
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent(),
        )
    proc = Proc(popen, log)
    try:
        yield proc
    finally:
        proc.stop()


def wait_http(
    url: str, proc: Proc, *, timeout: float = 60.0, headers: dict[str, str] | None = None
) -> None:
    """Wait until ``url`` answers 200; fail with the process's last lines if it died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.popen.args} exited:\n{proc.tail()}")
        request = urllib.request.Request(url, headers=headers or {})
        with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=2) as answer:
            if answer.status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s:\n{proc.tail()}")
