"""Intake in instructions: what ``remediator serve`` and the bare group-commit server execute
for one delivery, counted by Valgrind's callgrind.

    python -m bench.instructions [--deliveries N]

The wall-clock intake ratio (``bench.intake``) moved between 0.55 and 0.77 on the same code
on a shared 2-core machine, more than most changes to the webhook are worth; an instruction
count repeats within about a percent, so a change to the webhook's path shows here at its true
size. It is not the target (deliveries a second are): it leaves out what an instruction costs
(cache misses of a larger program, the writer thread's hand-offs) and the kernel's share.

Each server runs under callgrind with instrumentation off, so it starts at about a fiftieth
of its speed rather than a hundredth. It is given wrk's whole cycle of 4,000 deliveries
first, which stores their episodes; then instrumentation is switched on and the first
``deliveries`` of the cycle are posted again, 64 at a time, as wrk's steady state sends them
(repeats of stored episodes), and the count is dumped. The engine's timers are slowed for
the count: under Valgrind the deliveries take fifty times as long while a one-second timer
stays one second, so its idle passes would otherwise weigh fifty times what they do on a
real core.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import aiohttp

from bench import intake, procs, reaction, world

CONNECTIONS = 64
DELIVERIES = 1000
# The engine's idle timers, slowed while instructions are counted (see the module docstring).
QUIET = {
    "REMEDIATOR_POLL_INTERVAL": "3600",
    "REMEDIATOR_RECONCILE_INTERVAL": "3600",
    "REMEDIATOR_APPROVAL_EXPIRY_INTERVAL": "3600",
    "REMEDIATOR_AUDIT_ANCHOR_INTERVAL": "3600",
}
_TOTALS = re.compile(r"^totals:\s+(\d+)", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Instructions:
    remediator: float  # instructions a delivery
    bare: float
    deliveries: int

    @property
    def ratio(self) -> float:
        """The bare server's count over remediator's: 1.0 would be as cheap as the bare one."""
        return self.bare / self.remediator


def available() -> bool:
    return shutil.which("valgrind") is not None and shutil.which("callgrind_control") is not None


def parse_totals(dump: str) -> int:
    """The instructions (``Ir``) a callgrind dump counted, from its ``totals:`` line."""
    found = _TOTALS.search(dump)
    if found is None:
        raise ValueError("no totals line in the callgrind dump")
    return int(found[1])


def _callgrind(out: pathlib.Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p"]


async def _post_all(url: str, bodies: list[bytes], connections: int) -> None:
    """Every body POSTed, ``connections`` at a time; anything but 200 fails the count."""
    pending = iter(bodies)
    connector = aiohttp.TCPConnector(limit=connections)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def sender() -> None:
            for body in pending:
                await reaction.post(session, url, body)

        await asyncio.gather(*(sender() for _ in range(connections)))


def _count(url: str, proc: procs.Proc, out: pathlib.Path, bodies: list[bytes], n: int) -> float:
    """Instructions a delivery for the first ``n`` bodies posted again, all of them stored."""
    asyncio.run(_post_all(url, bodies, CONNECTIONS))
    subprocess.run(
        ["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True
    )
    asyncio.run(_post_all(url, bodies[:n], CONNECTIONS))
    subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
    dump = pathlib.Path(f"{out}.{proc.pid}.1")  # the first dump of that process
    deadline = time.monotonic() + 60
    while not dump.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return parse_totals(dump.read_text(encoding="utf-8", errors="replace")) / n


@contextlib.contextmanager
def _bare(workdir: pathlib.Path, out: pathlib.Path) -> Iterator[tuple[str, procs.Proc]]:
    port = procs.free_port()
    argv = [*_callgrind(out), sys.executable, "-m", "bench.bare_server"]
    argv += [str(workdir / "bare-callgrind.db"), str(port), "group-commit"]
    with procs.spawn(argv, log=workdir / "bare-callgrind.log") as proc:
        url = f"http://127.0.0.1:{port}"
        procs.wait_http(f"{url}/readyz", proc, timeout=600)
        yield url, proc


@contextlib.contextmanager
def _serve(workdir: pathlib.Path, out: pathlib.Path) -> Iterator[tuple[str, procs.Proc]]:
    port = procs.free_port()
    database_url = world.sqlite_url(workdir, "callgrind")
    env = world.serve_env(workdir, database_url=database_url, sim=None, worker="callgrind")
    env |= {"REMEDIATOR_LISTEN": f"127.0.0.1:{port}", **QUIET}
    argv = [*_callgrind(out), sys.executable, "-m", "remediator", "serve"]
    with procs.spawn(argv, log=workdir / "serve-callgrind.log", env=env) as proc:
        url = f"http://127.0.0.1:{port}"
        procs.wait_http(f"{url}/readyz", proc, timeout=600)
        yield url, proc


def measure(workdir: pathlib.Path, *, deliveries: int = DELIVERIES) -> Instructions:
    bodies = intake.bodies_file(workdir).read_bytes().splitlines()
    if not 0 < deliveries <= len(bodies):
        raise ValueError(f"deliveries: 1 to {len(bodies)}")
    out = workdir / "callgrind"
    with _bare(workdir, out) as (url, proc):
        bare = _count(url, proc, out, bodies, deliveries)
    with _serve(workdir, out) as (url, proc):
        ours = _count(url, proc, out, bodies, deliveries)
    return Instructions(remediator=ours, bare=bare, deliveries=deliveries)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=DELIVERIES)
    args = parser.parse_args(argv)
    if not available():
        print("valgrind is not installed (make system-deps)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="remediator-callgrind-") as tmp:
        got = measure(pathlib.Path(tmp), deliveries=args.deliveries)
    print(f"instructions a delivery, {got.deliveries:,} repeats, 64 at a time:")
    print(f"  remediator serve  {got.remediator:12,.0f}")
    print(f"  bare server       {got.bare:12,.0f}")
    print(f"  ratio             {got.ratio:12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
