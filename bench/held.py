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

Last, the fleet view of the held storm: ``/runbooks/fleet`` and ``/api/v1/fleet`` fetched
``VIEWS`` times each (the median time and the size), the API a page of ``API_PAGE`` nodes
too, and the webhook's latency for
``REPEATS`` of the storm's deliveries sent one at a time (Alertmanager's repeats, 10 ms
apart), first alone, then while the page is fetched back to back, as consoles left open do
every 5 s. Before the view was bounded (5,000 nodes, 3,000 alerts): the page 0.65 s and
1.7 MB, the webhook's p99 4 ms alone and 300 ms beside it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import re
import statistics
import time
import urllib.request

import aiohttp

from bench import procs, reaction, runbooks, table, watch, world
from remediator.sim import fleet as sim_fleet

MAX_NODES = 10
SENDERS = 32
VIEWS = 5
REPEATS = 300
API_PAGE = 500  # nodes a page of the API, as a script paging them asks
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
    view: View


@dataclasses.dataclass(frozen=True)
class View:
    page_seconds: float  # medians
    page_bytes: int
    api_seconds: float
    api_bytes: int
    api_page_seconds: float  # ``?limit=API_PAGE``: a script paging the nodes
    api_page_bytes: int
    alone_p99: float  # the webhook's, seconds
    beside_p99: float  # while the page is fetched back to back


def _fetch(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as answer:
        size = len(answer.read())
    return time.perf_counter() - started, size


async def _repeats(server: world.Server, bodies: list[bytes], *, paging: bool) -> float:
    """The webhook's p99 over the repeats, with the page fetched meanwhile or not."""
    took: list[float] = []
    done = asyncio.Event()

    async def pages() -> None:
        while paging and not done.is_set():
            await asyncio.to_thread(_fetch, f"{server.url}/runbooks/fleet")

    async with aiohttp.ClientSession() as session:
        fetching = asyncio.create_task(pages())
        for body in bodies:
            started = time.perf_counter()
            await reaction.post(session, server.url, body)
            took.append(time.perf_counter() - started)
            await asyncio.sleep(0.01)
        done.set()
        await fetching
    return table.percentile(took, 99)


def _view(server: world.Server, nodes: list[str]) -> View:
    page = [_fetch(f"{server.url}/runbooks/fleet") for _ in range(VIEWS)]
    api = [_fetch(f"{server.url}/api/v1/fleet") for _ in range(VIEWS)]
    paged = [_fetch(f"{server.url}/api/v1/fleet?limit={API_PAGE}") for _ in range(VIEWS)]
    bodies = [world.alert_body(node, n + 1) for n, node in enumerate(nodes[:REPEATS])]
    return View(
        page_seconds=statistics.median(t for t, _ in page),
        page_bytes=page[-1][1],
        api_seconds=statistics.median(t for t, _ in api),
        api_bytes=api[-1][1],
        api_page_seconds=statistics.median(t for t, _ in paged),
        api_page_bytes=paged[-1][1],
        alone_p99=asyncio.run(_repeats(server, bodies, paging=False)),
        beside_p99=asyncio.run(_repeats(server, bodies, paging=True)),
    )


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
        view = _view(server, nodes)
    return Held(
        alerts=alerts,
        cordons=cordons,
        held=held,
        serve_percent=100 * serve / seconds,
        postgres_percent=100 * pg / seconds if backend == "postgres" else None,
        ready_seconds=ready,
        next_seconds=following,
        view=view,
    )
