"""A long, light soak: is ``remediator serve``'s footprint flat while alerts keep coming?

Alertmanager's traffic for a fleet with a steady trickle of faults: every second ``rate`` new
Xid 79 episodes on nodes taken in turn from the fleet (each a cordon + label run), each episode
re-sent 30 s later (a repeat: deduplicated) and resolved 60 s after it fired. RSS is read
every ``sample`` seconds; the growth is measured from the end of the warm-up (caches, pools
and the SQLite page cache filled) to the end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import aiohttp

from bench import procs, world

REPEAT_AFTER = 30.0
RESOLVE_AFTER = 60.0


@dataclasses.dataclass
class Soak:
    seconds: float
    samples: list[tuple[float, float]]  # (seconds since start, RSS MB)
    sent: int
    failed: int
    warm_up: float

    def rss_at(self, at: float) -> float:
        return min(self.samples, key=lambda s: abs(s[0] - at))[1]

    @property
    def peak(self) -> float:
        return max(rss for _, rss in self.samples)

    @property
    def growth_per_hour(self) -> float:
        """MB per hour from the end of the warm-up to the end (least squares over samples)."""
        points = [(t, rss) for t, rss in self.samples if t >= self.warm_up]
        if len(points) < 2:
            return 0.0
        mean_t = sum(t for t, _ in points) / len(points)
        mean_r = sum(r for _, r in points) / len(points)
        var = sum((t - mean_t) ** 2 for t, _ in points)
        cov = sum((t - mean_t) * (r - mean_r) for t, r in points)
        return cov / var * 3600 if var else 0.0


async def soak(
    url: str,
    proc: procs.Proc,
    *,
    nodes: list[str],
    seconds: float,
    rate: int = 5,
    sample: float = 30.0,
) -> Soak:
    samples: list[tuple[float, float]] = []
    sent = failed = 0
    fired: list[tuple[float, str, int]] = []  # (when, node, seq), oldest first
    repeated = 0  # fired[:repeated] were re-sent
    seq = 0
    start = time.monotonic()
    next_sample = 0.0
    async with aiohttp.ClientSession() as session:

        async def post(body: bytes) -> None:
            nonlocal sent, failed
            sent += 1
            try:
                async with session.post(
                    f"{url}/api/v1/alerts",
                    data=body,
                    headers={"Content-Type": "application/json"},
                ) as answer:
                    await answer.read()
                    failed += answer.status != 200
            except aiohttp.ClientError:
                failed += 1

        while (elapsed := time.monotonic() - start) < seconds:
            if elapsed >= next_sample:
                samples.append((elapsed, proc.rss_mb()))
                next_sample += sample
            bodies = []
            for _ in range(rate):
                seq += 1
                node = nodes[seq % len(nodes)]
                fired.append((elapsed, node, seq))
                bodies.append(world.alert_body(node, seq))
            while repeated < len(fired) and fired[repeated][0] <= elapsed - REPEAT_AFTER:
                _, node, number = fired[repeated]
                bodies.append(world.alert_body(node, number))
                repeated += 1
            while fired and fired[0][0] <= elapsed - RESOLVE_AFTER:
                _, node, number = fired.pop(0)
                repeated -= 1
                bodies.append(world.alert_body(node, number, status="resolved"))
            await asyncio.gather(*(post(body) for body in bodies))
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - start - elapsed)))
    samples.append((time.monotonic() - start, proc.rss_mb()))
    return Soak(
        seconds=seconds,
        samples=samples,
        sent=sent,
        failed=failed,
        warm_up=min(300.0, seconds / 4),
    )
