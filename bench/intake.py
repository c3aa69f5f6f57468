"""Intake: ``remediator serve`` against the bare group-commit server, driven by ``wrk``.

wrk (one thread, 64 connections) runs pinned to CPU 0 and the server to CPU 1; a Lua script
posts realistic Alertmanager 0.25 deliveries (``ingest.deliveries``: mostly repeats, 3 % new
episodes). The two servers are driven in turn, a few rounds each (``alternating``), so
both meet the same minutes of a machine whose speed drifts. Then wrk again at about half of
the bare server's rate (connections that pause between requests) gives the latency at half
load.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import pathlib
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator

from bench import ingest, procs

CONNECTIONS = 64
ROUNDS = 4  # turns each server takes at saturation (``alternating``): even, see there
LUA = """
local bodies = {}
local n = 0
local pause = 0
init = function(args)
  for line in io.lines(args[1]) do bodies[#bodies + 1] = line end
  pause = tonumber(args[2] or "0")
end
delay = function()
  return pause
end
request = function()
  n = n % #bodies + 1
  return wrk.format("POST", "/api/v1/alerts", {["Content-Type"] = "application/json"}, bodies[n])
end
"""
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


@dataclasses.dataclass
class WrkResult:
    rate: float
    p50: float
    p99: float
    errors: int


@dataclasses.dataclass
class Intake:
    rate: float
    p99: float
    half_rate: float
    half_p50: float
    half_p99: float
    errors: int


def parse_wrk(text: str) -> WrkResult:
    """Requests/s, the 50th and 99th latency percentiles (seconds) and failed requests."""
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", text)[1])  # type: ignore[index]
    found = {
        q: float(v) * _UNITS[u]
        for q, v, u in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s|m)\s*$", text, re.M)
    }
    errors = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses:\s+(\d+)", text))
    socket = re.search(r"Socket errors:(.*)", text)
    if socket:
        errors += sum(int(n) for n in re.findall(r"\d+", socket[1]))
    return WrkResult(
        rate=rate,
        p50=found.get("50", float("nan")),
        p99=found.get("99", float("nan")),
        errors=errors,
    )


def bodies_file(workdir: pathlib.Path, count: int = 4000) -> pathlib.Path:
    path = workdir / "deliveries.jsonl"
    if not path.exists():
        lines = itertools.islice(ingest.deliveries(seed=13), count)
        path.write_bytes(b"".join(lines))
    return path


def wrk(
    url: str,
    workdir: pathlib.Path,
    seconds: float,
    *,
    connections: int = CONNECTIONS,
    pause_ms: int = 0,
) -> WrkResult:
    """wrk on CPU 0; ``pause_ms``: each connection waits that long between requests."""
    script = workdir / "post.lua"
    script.write_text(LUA, encoding="utf-8")
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency"]
    argv += ["-s", str(script), f"{url}/api/v1/alerts", "--", str(bodies_file(workdir))]
    argv += [str(pause_ms)]
    done = subprocess.run(
        procs.pinned(argv, 0), capture_output=True, text=True, timeout=seconds + 60, check=True
    )
    return parse_wrk(done.stdout)


def half_load(url: str, workdir: pathlib.Path, rate: float, seconds: float) -> WrkResult:
    """About ``rate`` requests/s: 32 connections, each pausing 32/rate s between requests
    (wrk's ``delay``), so the latency is the server's answer time, not a queue in front of it;
    the rate reached is a little lower (the answer time adds to each connection's period)."""
    connections = 32
    return wrk(
        url, workdir, seconds, connections=connections, pause_ms=round(connections * 1000 / rate)
    )


def available() -> bool:
    return shutil.which("wrk") is not None


@contextlib.contextmanager
def bare(workdir: pathlib.Path) -> Iterator[str]:
    port = procs.free_port()
    argv = [sys.executable, "-m", "bench.bare_server", str(workdir / "bare.db"), str(port)]
    with procs.spawn([*argv, "group-commit"], log=workdir / "bare.log", cpu=1) as proc:
        url = f"http://127.0.0.1:{port}"
        procs.wait_http(f"{url}/readyz", proc)
        yield url


def combined(segments: list[WrkResult]) -> WrkResult:
    """Runs of equal length as one: their mean rate, errors summed, and the worst p50 and
    p99 (percentiles of separate runs do not combine; the worst does not flatter)."""
    return WrkResult(
        rate=sum(s.rate for s in segments) / len(segments),
        p50=max(s.p50 for s in segments),
        p99=max(s.p99 for s in segments),
        errors=sum(s.errors for s in segments),
    )


def alternating(
    urls: list[str], workdir: pathlib.Path, seconds: float, rounds: int = ROUNDS
) -> list[WrkResult]:
    """Each server at saturation for ``seconds`` in all, in ``rounds`` turns taken in order.

    The machine's speed moves from minute to minute (the bare server alone did 7,464-11,266
    deliveries/s on one machine in one day), so a ratio of two rates measured one after the
    other moved ±10 % with the minute it fell in. Taken in turns, both servers meet the same
    minutes; the order turns round each round (A B, B A, A B, B A: over an even number of
    rounds a steady drift favours neither), and each turn is a whole wrk run, combined as
    ``combined`` says."""
    for url in urls:
        wrk(url, workdir, 1)  # warm-up
    turns: dict[str, list[WrkResult]] = {url: [] for url in urls}
    for n in range(rounds):
        for url in urls if n % 2 == 0 else urls[::-1]:
            turns[url].append(wrk(url, workdir, seconds / rounds))
    return [combined(turns[url]) for url in urls]


def measure(
    url: str, bare_url: str, workdir: pathlib.Path, seconds: float
) -> tuple[Intake, WrkResult]:
    """``url`` and the bare server at saturation in turns, then ``url`` at half the bare
    server's rate; the bare server's combined saturated result too."""
    top, bare = alternating([url, bare_url], workdir, seconds)
    half = half_load(url, workdir, bare.rate / 2, seconds)
    got = Intake(
        rate=top.rate,
        p99=top.p99,
        half_rate=half.rate,
        half_p50=half.p50,
        half_p99=half.p99,
        errors=top.errors + half.errors,
    )
    return got, bare
