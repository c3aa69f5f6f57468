"""What a storm costs while the disruption budget holds it (``make bench``'s held stage).

A simulator of ``alerts`` GPU nodes and ``serve`` over the benchmark rules with
``guards.max_nodes`` 10; one Xid alert a node, 32 deliveries in flight. Once the budget's
nodes are cordoned and the rest of the storm's steps are held by the budget (the server's
``remediator_steps_held{reason="budget"}``), and ``settle`` seconds after the last delivery,
the CPU of ``serve`` (and of every Postgres process) is read over ``window`` seconds, nothing
asking the server or the database anything meanwhile: what a held storm costs while nothing
can change. Each held step was looked at again every ``guards.recheck`` (15 s) before held
steps waited in line for what holds them: 4.4-4.8 % of a core for ``serve`` on SQLite with
3,000 alerts, 0.8-0.9 % after (its idle polling).

Then one cordoned node is returned to service (the ``bench-return`` runbook uncordons it,
which frees its place in the budget), and the time until the next node is seen cordoned is
taken: the first step in line went only at its recheck before, up to 15 s later.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import re
import time
import urllib.request

import aiohttp

from bench import procs, reaction, runbooks, watch, world
from remediator.sim import fleet as sim_fleet

MAX_NODES = 10
SENDERS = 32
_HELD = re.compile(r'^remediator_steps_held\{reason="budget"\}\s+(\S+)$', re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Held:
    alerts: int
    cordons: int
    held: int  # steps the budget held, as the server counts them after the window
    serve_percent: float  # of a core, over the window
    postgres_percent: float | None  # every Postgres process's, on Postgres
    ready_seconds: float | None  # after the last delivery; None: never (measured anyway)
    next_seconds: float | None  # a node returned to service → the next node cordoned


def budget_held(server_url: str) -> int:
    with urllib.request.urlopen(f"{server_url}/metrics", timeout=30) as answer:
        return held_in(answer.read().decode())


def held_in(exposition: str) -> int:
    """The steps held by the budget, in a ``/metrics`` exposition (0 if it has none)."""
    found = _HELD.search(exposition)
    return int(float(found.group(1))) if found else 0


async def _storm(
    sim: world.Sim, server: world.Server, nodes: list[str], *, settle: float
) -> tuple[int, float | None]:
    """Deliver the storm; wait until it is held (at most a minute), and ``settle`` seconds
    after the last delivery. The cordons seen, and when the storm was held."""
    bodies = [world.alert_body(node, n + 1) for n, node in enumerate(nodes)]
    cordons = min(MAX_NODES, len(nodes))
    async with watch.nodes(sim) as seen, aiohttp.ClientSession() as session:

        async def sender(share: list[bytes]) -> None:
            for body in share:
                await reaction.post(session, server.url, body)

        await asyncio.gather(*(sender(bodies[i::SENDERS]) for i in range(SENDERS)))
        delivered = time.monotonic()
        ready: float | None = None
        while ready is None and time.monotonic() < delivered + 60:
            cordoned = len(seen.cordoned) >= cordons
            if (
                cordoned
                and await asyncio.to_thread(budget_held, server.url) >= len(nodes) - cordons
            ):
                ready = time.monotonic() - delivered
            else:
                await asyncio.sleep(0.5)
        await asyncio.sleep(max(0.0, delivered + settle - time.monotonic()))
        return len(seen.cordoned), ready


async def _next_in_line(sim: world.Sim, server: world.Server, timeout: float = 30) -> float | None:
    """Return a cordoned node to service (``bench-return`` uncordons it, which frees its place
    in the budget): seconds from the trigger until another node is seen cordoned."""
    async with watch.nodes(sim) as seen:
        before = dict(seen.cordoned)
        started = time.monotonic()
        body = {"params": {"node": min(before)}}
        await asyncio.to_thread(runbooks.trigger, server.url, "bench-return", body)
        await seen.wait_for_one_more(before.keys(), timeout)
        new = [at for node, at in seen.cordoned.items() if node not in before]
        return min(new) - started if new else None


def measure(
    workdir: pathlib.Path,
    backend: str,
    postgres: str,
    *,
    alerts: int,
    settle: float,
    window: float,
) -> Held:
    nodes = [sim_fleet.generated_node_name(i, alerts) for i in range(1, alerts + 1)]
    env = {"REMEDIATOR_GUARDS__MAX_NODES": str(MAX_NODES)}
    with (
        world.simulator(workdir, nodes=alerts) as sim,
        world.database(workdir, backend, postgres, "held") as url,
        world.serve(workdir, database_url=url, sim=sim, worker="held", extra_env=env) as server,
    ):
        cordons, ready = asyncio.run(_storm(sim, server, nodes, settle=settle))
        serve, pg = server.proc.cpu_seconds(), procs.named_cpu_seconds("postgres")
        began = time.monotonic()
        time.sleep(window)
        seconds = time.monotonic() - began
        serve = server.proc.cpu_seconds() - serve
        pg = procs.named_cpu_seconds("postgres") - pg
        held = budget_held(server.url)
        following = asyncio.run(_next_in_line(sim, server))
    return Held(
        alerts=alerts,
        cordons=cordons,
        held=held,
        serve_percent=100 * serve / seconds,
        postgres_percent=100 * pg / seconds if backend == "postgres" else None,
        ready_seconds=ready,
        next_seconds=following,
    )
