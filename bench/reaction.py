"""Reaction latency and burst throughput, measured outside the process: alerts POSTed to
``remediator serve``, each for its own simulated node, timed until a watch on the simulator sees
the node cordoned.

- reaction: an open loop at a fixed rate of new episodes for ``duration`` seconds; latency from
  just before the POST to the cordon seen on the watch; alerts still without a cordon
  ``settle`` seconds after the last POST are the backlog.
- burst: every alert POSTed at once (32 in flight); cordons per second from the first POST to
  the last cordon seen.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time

import aiohttp

from bench import watch, world


@dataclasses.dataclass
class Reaction:
    rate: float
    latencies: list[float]
    sent: int
    missing: int


@dataclasses.dataclass
class Burst:
    alerts: int
    seconds: float
    cordoned: int

    @property
    def per_second(self) -> float:
        return self.cordoned / self.seconds if self.seconds else float("nan")


async def post(session: aiohttp.ClientSession, url: str, body: bytes) -> None:
    """One delivery to the webhook; anything but 200 fails the measurement."""
    async with session.post(
        f"{url}/api/v1/alerts", data=body, headers={"Content-Type": "application/json"}
    ) as answer:
        await answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{url} answered {answer.status} to a delivery")


async def reaction(
    url: str,
    sim: world.Sim,
    *,
    nodes: list[str],
    rate: float,
    duration: float,
    first_seq: int,
    settle: float = 15.0,
) -> Reaction:
    count = min(len(nodes), max(1, int(rate * duration)))
    targets = nodes[:count]
    sent: dict[str, float] = {}
    async with watch.nodes(sim) as seen, aiohttp.ClientSession() as session:
        tasks = []
        start = time.monotonic()
        for n, node in enumerate(targets):
            delay = start + n / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            sent[node] = time.monotonic()
            body = world.alert_body(node, first_seq + n)
            tasks.append(asyncio.create_task(post(session, url, body)))
        await asyncio.gather(*tasks)
        await seen.wait_for(set(targets), settle)
    latencies = [seen.cordoned[n] - sent[n] for n in targets if n in seen.cordoned]
    return Reaction(rate=rate, latencies=latencies, sent=count, missing=count - len(latencies))


async def burst(
    urls: list[str],
    sim: world.Sim,
    *,
    nodes: list[str],
    first_seq: int,
    timeout: float = 600.0,
    in_flight: int = 32,
) -> Burst:
    """All alerts at once, spread round-robin over ``urls`` (one per replica)."""
    bodies = [world.alert_body(node, first_seq + n) for n, node in enumerate(nodes)]
    queue = list(zip(itertools.cycle(urls), bodies, strict=False))
    async with watch.nodes(sim) as seen, aiohttp.ClientSession() as session:
        start = time.monotonic()

        async def sender(share: list[tuple[str, bytes]]) -> None:
            for url, body in share:
                await post(session, url, body)

        await asyncio.gather(*(sender(queue[i::in_flight]) for i in range(in_flight)))
        await seen.wait_for(set(nodes), timeout)
    times = [seen.cordoned[n] for n in nodes if n in seen.cordoned]
    elapsed = max(times) - start if times else float("nan")
    return Burst(alerts=len(nodes), seconds=elapsed, cordoned=len(times))
