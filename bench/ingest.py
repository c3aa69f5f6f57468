"""Benchmark: webhook intake of ``remediator serve`` against a bare durable-insert server.

    python -m bench.ingest [--concurrency 32] [--duration 10] [--new-fraction 0.03] [--rate N]

Both servers run as their own processes on SQLite in a temporary directory. Deliveries are the
real Alertmanager 0.25 bodies, made realistic: mostly repeats of firing alerts (what
Alertmanager sends every group/repeat interval), some new episodes, some resolutions. Phase 1
(closed loop, fixed concurrency, fixed duration) measures the highest rate; phase 2 offers half
of the bare server's rate (open loop; ``--rate`` offers a fixed rate instead) and measures
latency. Prints deliveries/s, p50/p99 and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import random
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import aiohttp

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "alertmanager-0.25"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


NEW_FRACTION = 0.03


def deliveries(seed: int = 7, new_fraction: float | None = None) -> Iterator[bytes]:
    """Endless realistic deliveries: mostly repeats, some new episodes, a third of those resolve.

    Alertmanager re-sends every alert of a group at each group interval and repeat interval,
    so repeats dominate; new episodes (and the runs they start) are the minority even in a storm.
    ``new_fraction`` (default 3 %) sets how many deliveries carry a new episode.
    """
    fraction = NEW_FRACTION if new_fraction is None else new_fraction
    rng = random.Random(seed)
    bodies = [json.loads(p.read_bytes()) for p in sorted(FIXTURES.glob("*firing*.json"))]
    episode = 0
    while True:
        body = json.loads(json.dumps(rng.choice(bodies)))
        roll = rng.random()
        if roll < fraction:
            episode += 1
        for alert in body["alerts"]:
            if roll < fraction:
                alert["startsAt"] = f"2026-11-30T00:{episode % 60:02d}:{episode // 60 % 60:02d}Z"
                alert["fingerprint"] = f"{(hash(alert['fingerprint']) + episode) % 16**16:016x}"
            if roll < fraction / 3:
                alert["status"] = "resolved"
                alert["endsAt"] = "2026-11-30T01:00:00Z"
        yield json.dumps(body, separators=(",", ":")).encode() + b"\n"


@contextlib.contextmanager
def fresh_postgres(server_url: str) -> Iterator[str]:
    """A new, migrated database on the Postgres server at ``server_url``; dropped afterwards."""
    import asyncpg

    name = f"remediator_bench_{os.getpid()}_{secrets.token_hex(4)}"

    async def admin(statement: str) -> None:
        conn = await asyncpg.connect(server_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    url = f"{server_url.rstrip('/')}/{name}"
    try:
        subprocess.run(
            [sys.executable, "-m", "remediator", "migrate", "--database-url", url],
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        yield url
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextlib.contextmanager
def server(kind: str, parent: pathlib.Path, postgres: str | None = None) -> Iterator[str]:
    """A server of ``kind`` on a fresh database (remediator on Postgres if given a server)."""
    workdir = pathlib.Path(tempfile.mkdtemp(dir=parent))
    port = _port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    stack = contextlib.ExitStack()
    database_url = f"sqlite+aiosqlite:///{workdir / 'remediator.db'}"
    if kind == "remediator" and postgres:
        database_url = stack.enter_context(fresh_postgres(postgres))
    if kind == "bare":
        argv = [sys.executable, "-m", "bench.bare_server", str(workdir / "bare.db"), str(port)]
    else:
        argv = [
            sys.executable,
            "-m",
            "remediator",
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--database-url",
            database_url,
            "--rules",
            str(ROOT / "rules"),
        ]
        env |= {"REMEDIATOR_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            time.sleep(0.1)
        time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        stack.close()


async def _deliver(
    session: aiohttp.ClientSession, url: str, body: bytes, latencies: list[float]
) -> None:
    """Post one delivery; its latency is recorded once it was answered 200."""
    started = time.perf_counter()
    async with session.post(
        f"{url}/api/v1/alerts", data=body, headers={"Content-Type": "application/json"}
    ) as r:
        await r.read()
        assert r.status == 200, r.status
    latencies.append(time.perf_counter() - started)


async def closed_loop(
    url: str, concurrency: int, duration: float, new_fraction: float = NEW_FRACTION
) -> tuple[int, list[float]]:
    source = deliveries(new_fraction=new_fraction)
    latencies: list[float] = []
    stop = time.monotonic() + duration
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def worker() -> None:
            while time.monotonic() < stop:
                await _deliver(session, url, next(source), latencies)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(latencies), latencies


async def open_loop(
    url: str, rate: float, duration: float, new_fraction: float = NEW_FRACTION
) -> list[float]:
    source = deliveries(seed=11, new_fraction=new_fraction)
    latencies: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512)) as session:
        tasks = []
        start = time.monotonic()
        for n in range(int(rate * duration)):
            delay = start + n / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_deliver(session, url, next(source), latencies)))
        await asyncio.gather(*tasks)
    return latencies


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1000 if len(values) > 1 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument(
        "--new-fraction",
        type=float,
        default=NEW_FRACTION,
        help="share of deliveries that start a new alert episode (default 0.03)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="deliveries/s offered in phase 2 (default: half of the bare server's rate)",
    )
    parser.add_argument(
        "--postgres",
        metavar="URL",
        help="run remediator on a fresh database on this Postgres server "
        "(e.g. postgresql://postgres@127.0.0.1:5432); the bare server stays on SQLite",
    )
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("bare", "remediator"):
            with server(kind, pathlib.Path(tmp), args.postgres) as url:
                asyncio.run(closed_loop(url, args.concurrency, 1.0))  # warm-up
                done, lat = asyncio.run(
                    closed_loop(url, args.concurrency, args.duration, args.new_fraction)
                )
                results[kind] = {
                    "rate": done / args.duration,
                    "p50": pct(lat, 50),
                    "p99": pct(lat, 99),
                }
        half = args.rate or results["bare"]["rate"] / 2
        for kind in ("bare", "remediator"):
            with server(kind, pathlib.Path(tmp), args.postgres) as url:
                lat = asyncio.run(open_loop(url, half, args.duration, args.new_fraction))
                results[kind] |= {"half_p50": pct(lat, 50), "half_p99": pct(lat, 99)}
    print(
        f"concurrency {args.concurrency}, {args.duration:g}s per phase, "
        f"{args.new_fraction:.0%} new episodes, "
        f"{os.cpu_count()} CPUs, SQLite WAL synchronous=FULL"
        + (", remediator on PostgreSQL" if args.postgres else "")
    )
    load = f"  at {'fixed' if args.rate else 'half'} load ({half:.0f}/s): p50 ms"
    print(f"{'server':<12}{'deliveries/s':>14}{'p50 ms':>9}{'p99 ms':>9}{load:>37}{'p99 ms':>9}")
    for kind, r in results.items():
        print(
            f"{kind:<12}{r['rate']:>14.0f}{r['p50']:>9.1f}{r['p99']:>9.1f}"
            f"{r['half_p50']:>37.1f}{r['half_p99']:>9.1f}"
        )
    print(f"ratio remediator/bare: {results['remediator']['rate'] / results['bare']['rate']:.2f}")


if __name__ == "__main__":
    main()
