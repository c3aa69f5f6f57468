"""The stages of ``make bench``: each builds its world, measures, and returns table rows."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib
import sqlite3
import time
import urllib.request
from collections.abc import Iterator

from bench import held as held_mod
from bench import instructions, procs, runbooks, seed, soak, table, world
from bench import intake as intake_mod
from bench import reaction as reaction_mod
from remediator.sim import fleet as sim_fleet

POSTGRES = "postgresql://postgres@127.0.0.1:5432"
Row = table.Row


@dataclasses.dataclass(frozen=True)
class Plan:
    workdir: pathlib.Path
    quick: bool
    duration: float
    rates: tuple[float, ...]
    burst: int
    drain_pods: int
    open_episodes: int
    episode_counts: tuple[int, ...]
    fleet_nodes: int
    postgres: str | None = POSTGRES
    max_episodes: int | None = None
    sweep_concurrency: int | None = None
    soak_seconds: float = 3600.0
    held_alerts: int = 3000

    @classmethod
    def full_run(cls, workdir: pathlib.Path) -> Plan:
        return cls(
            workdir=workdir,
            quick=False,
            duration=30.0,
            rates=(10, 50, 100),
            burst=1000,
            drain_pods=200,
            open_episodes=10_000,
            episode_counts=(10**3, 10**5, 10**6),
            fleet_nodes=5000,
        )

    @classmethod
    def quick_run(cls, workdir: pathlib.Path) -> Plan:
        return cls(
            workdir=workdir,
            quick=True,
            duration=3.0,
            rates=(10, 50, 100),
            burst=200,
            drain_pods=200,
            open_episodes=10_000,
            episode_counts=(10**3, 10**4),
            fleet_nodes=1000,
            soak_seconds=60.0,
            held_alerts=300,
        )

    def dir(self, name: str) -> pathlib.Path:
        path = self.workdir / name
        path.mkdir(exist_ok=True)
        return path

    def backends(self) -> Iterator[str]:
        yield "sqlite"
        if self.postgres and world.postgres_available(self.postgres):
            yield "postgres"


def _names(count: int, total: int, first: int = 1) -> list[str]:
    return [sim_fleet.generated_node_name(i, total) for i in range(first, first + count)]


def _skipped_postgres(plan: Plan, measure: str) -> list[Row]:
    if "postgres" in plan.backends():
        return []
    return [Row(measure, "postgres", "skipped", note=f"no Postgres at {plan.postgres}")]


# ---- intake ---------------------------------------------------------------------------


_TURNS = (
    f"each server {intake_mod.ROUNDS} turns at saturation, taken in turn with the other's "
    "(the machine's speed drifts from minute to minute)"
)


def intake(plan: Plan) -> list[Row]:
    if not intake_mod.available():
        return [Row("intake", "-", "skipped", note="wrk not installed (make system-deps)")]
    workdir = plan.dir("intake")
    rows: list[Row] = []
    with intake_mod.bare(workdir) as bare_url:
        for backend in plan.backends():
            with (
                world.database(workdir, backend, plan.postgres or "", f"intake-{backend}") as url,
                world.serve(workdir, database_url=url, worker=f"intake-{backend}") as server,
            ):
                got, bare = intake_mod.measure(server.url, bare_url, workdir, plan.duration)
            if backend == "sqlite":  # the bare server's own row, from its turns beside SQLite's
                half = intake_mod.half_load(bare_url, workdir, bare.rate / 2, plan.duration)
                rows.append(
                    Row(
                        "intake deliveries/s, bare group-commit server",
                        "sqlite",
                        f"{bare.rate:,.0f}",
                        note=f"wrk 64 conn on CPU 0, server on CPU 1; {_TURNS}; half load "
                        f"{half.rate:,.0f}/s: p50/p99 {table.ms(half.p50)} / "
                        f"{table.ms(half.p99)} ms",
                    )
                )
            rows.append(
                Row(
                    "intake deliveries/s, remediator serve",
                    backend,
                    f"{got.rate:,.0f} (ratio {table.ratio(got.rate, bare.rate)})",
                    "ratio ≥ 0.9" if backend == "sqlite" else "",
                    f"errors {got.errors}; saturated p99 {table.ms(got.p99)} ms; in turns with "
                    f"the bare server, which did {bare.rate:,.0f}/s in them",
                )
            )
            rows.append(
                Row(
                    "intake p50 / p99 at half the bare rate",
                    backend,
                    f"{table.ms(got.half_p50)} / {table.ms(got.half_p99)} ms",
                    "p99 ≤ 25 ms",
                    f"{got.half_rate:,.0f} deliveries/s reached",
                )
            )
    return [*rows, _instructions(workdir), *_skipped_postgres(plan, "intake")]


def _instructions(workdir: pathlib.Path) -> Row:
    measure = "intake instructions a delivery, remediator serve / bare server"
    if not instructions.available():
        return Row(measure, "sqlite", "skipped", note="valgrind not installed (make system-deps)")
    got = instructions.measure(workdir)
    return Row(
        measure,
        "sqlite",
        f"{got.remediator:,.0f} / {got.bare:,.0f} (ratio {table.ratio(got.bare, got.remediator)})",
        note=f"callgrind, {got.deliveries:,} repeats 64 at a time; repeats within about 1 %, "
        "where the rate above moves ±20 % from run to run; not the target (rates are)",
    )


# ---- reaction, burst, replicas ---------------------------------------------------------


def _duplicates(sim: world.Sim) -> int:
    request = urllib.request.Request(f"{sim.url}/sim/v1/mutations?since=0", headers=sim.headers)
    with urllib.request.urlopen(request, timeout=60) as answer:
        return len(json.loads(answer.read())["repeated"])


def _duplicate_runs(url: str) -> int | None:
    if not url.startswith("sqlite"):
        return None
    path = url.split("///", 1)[1]
    with sqlite3.connect(path) as db:
        row = db.execute("SELECT count(*) - count(DISTINCT episode_id) FROM runs").fetchone()
    return int(row[0])


def reaction(plan: Plan) -> list[Row]:
    rows: list[Row] = []
    counts = [max(1, int(r * plan.duration)) for r in plan.rates]
    for backend in plan.backends():
        replicas = backend == "postgres"
        total = sum(counts) + plan.burst * (3 if replicas else 1)
        workdir = plan.dir(f"reaction-{backend}")
        with world.simulator(workdir, nodes=total) as sim:
            rows += _reaction_on(plan, backend, sim, counts, total)
            burst_rows, one, one_cpu = _burst_on(
                plan, backend, sim, first=sum(counts) + 1, total=total
            )
            rows += burst_rows
            if replicas:
                first = sum(counts) + plan.burst + 1
                rows += _replicas_on(plan, sim, one, one_cpu, first=first, total=total)
    return rows + _skipped_postgres(plan, "reaction, burst, replicas")


def _reaction_on(
    plan: Plan, backend: str, sim: world.Sim, counts: list[int], total: int
) -> list[Row]:
    rows = []
    workdir = plan.dir(f"reaction-{backend}")
    with (
        world.database(workdir, backend, plan.postgres or "", "reaction") as url,
        world.serve(workdir, database_url=url, sim=sim, worker="reaction") as server,
    ):
        first = 1
        for rate, count in zip(plan.rates, counts, strict=True):
            got = asyncio.run(
                reaction_mod.reaction(
                    server.url,
                    sim,
                    nodes=_names(count, total, first),
                    rate=rate,
                    duration=plan.duration,
                    first_seq=first,
                )
            )
            first += count
            target = {10: "≤ 25 / ≤ 100 ms (p50/p99)", 100: "p50 ≤ 50 ms, no backlog"}
            if backend == "postgres":
                target = {10: "p50 ≤ 40 ms"}
            rows.append(
                Row(
                    f"reaction p50 / p90 / p99 at {rate:g} alerts/s",
                    backend,
                    table.latencies(got.latencies),
                    target.get(int(rate), ""),
                    f"{got.sent} alerts over {plan.duration:g} s; backlog (no cordon 15 s "
                    f"after the last POST) {got.missing}",
                )
            )
    return rows


def _burst_on(
    plan: Plan, backend: str, sim: world.Sim, *, first: int, total: int
) -> tuple[list[Row], float, float]:
    """The burst's rows, its cordons/s and the CPU it cost an alert (ms, every process)."""
    workdir = plan.dir(f"burst-{backend}")
    nodes = _names(plan.burst, total, first)
    with (
        world.database(workdir, backend, plan.postgres or "", "burst") as url,
        world.serve(workdir, database_url=url, sim=sim, worker="burst") as server,
    ):
        idle = server.proc.rss_mb()
        used = _Cpu(sim, [server.proc])
        got = asyncio.run(reaction_mod.burst([server.url], sim, nodes=nodes, first_seq=first))
        cpu = used.since()
        after = server.proc.rss_mb()
        duplicate_runs = _duplicate_runs(url)
    target = "≥ 200" if backend == "sqlite" else "≥ 150"
    rows = [
        Row(
            f"cordon runs/s, {plan.burst:,}-alert burst over {plan.burst:,} nodes",
            backend,
            f"{got.per_second:,.1f}",
            target,
            f"{got.cordoned}/{got.alerts} cordoned in {got.seconds:.1f} s; simulator "
            f"({total:,} nodes) used {cpu.sim:.1f} CPU s of it"
            + (f"; duplicate runs {duplicate_runs}" if duplicate_runs is not None else "")
            + (f"; {cpu.against(got.seconds)}" if backend == "postgres" else ""),
        )
    ]
    if backend == "sqlite":
        rows.append(
            Row(
                "RSS idle / after the burst",
                backend,
                f"{idle:.0f} / {after:.0f} MB",
                "≤ 100 MB idle",
                f"idle: read once the server watches the nodes, the {total:,}-node "
                "simulator's GPU nodes cached (the memory stage's cluster has 50)",
            )
        )
    return rows, got.per_second, cpu.per_alert_ms(got.alerts)


def _replicas_on(
    plan: Plan,
    sim: world.Sim,
    one_replica: float,
    one_replica_cpu: float,
    *,
    first: int,
    total: int,
) -> list[Row]:
    workdir = plan.dir("replicas")
    nodes = _names(plan.burst, total, first)
    with (
        world.database(workdir, "postgres", plan.postgres or "", "replicas") as url,
        world.serve(workdir, database_url=url, sim=sim, worker="replica-a", cpu=None) as one,
        world.serve(workdir, database_url=url, sim=sim, worker="replica-b", cpu=None) as two,
    ):
        used = _Cpu(sim, [one.proc, two.proc])
        got = asyncio.run(reaction_mod.burst([one.url, two.url], sim, nodes=nodes, first_seq=first))
        cpu = used.since()
    cores = procs.cpus()
    most = cpu.most_per_second(got.alerts, cores)
    busy = cores_busy(one_replica_cpu, one_replica)
    return [
        Row(
            "two replicas, cordon runs/s (same burst)",
            "postgres",
            f"{got.per_second:,.1f} ({table.ratio(got.per_second, one_replica)}x one)",
            "≥ 1.6x one replica, 0 duplicates",
            f"{got.cordoned}/{got.alerts} cordoned; effects applied twice (simulator's "
            f"mutation log, whole run): {_duplicates(sim)}; replicas unpinned; "
            f"{cpu.against(got.seconds)}; CPU an alert, all processes, "
            f"{cpu.per_alert_ms(got.alerts):.1f} ms against {one_replica_cpu:.1f} ms with one "
            "replica (what two replicas cost over one, whatever the cores); at that CPU an "
            f"alert the {cores} cores carry at most {most:,.0f} alerts/s "
            f"({table.ratio(most, one_replica)}x one replica); one replica alone kept "
            f"{busy:.2f} of them busy, so even a free second replica could do at most "
            f"{table.ratio(cores, busy)}x one here",
        )
    ]


def cores_busy(cpu_ms_per_alert: float, per_second: float) -> float:
    """Cores a burst kept busy: the CPU an alert (every process) times the alerts a second.
    On a machine of N cores, N over this bounds what any number of replicas can add."""
    return cpu_ms_per_alert * per_second / 1000


@dataclasses.dataclass(frozen=True)
class _Used:
    """CPU seconds the servers, the simulator and Postgres used."""

    servers: float
    sim: float
    postgres: float

    def per_alert_ms(self, alerts: int) -> float:
        """Milliseconds of CPU an alert, the servers, the simulator and Postgres together."""
        return 1000 * (self.servers + self.sim + self.postgres) / max(alerts, 1)

    def most_per_second(self, alerts: int, cores: int) -> float:
        """Alerts/s ``cores`` could carry at this CPU an alert, every core busy: what no
        number of replicas can pass on this machine."""
        return cores * 1000 / self.per_alert_ms(alerts)

    def against(self, seconds: float) -> str:
        """Set against what the machine's cores could give in ``seconds`` (when that is
        nearly all, more replicas cannot go faster on this machine)."""
        cores = procs.cpus()
        total = self.servers + self.sim + self.postgres
        return (
            f"CPU {total:.1f} s of the {cores} cores' {cores * seconds:.1f} s (server(s) "
            f"{self.servers:.1f}, simulator {self.sim:.1f}, Postgres {self.postgres:.1f})"
        )


class _Cpu:
    """The CPU the servers, the simulator and Postgres use from now on."""

    def __init__(self, sim: world.Sim, servers: list[procs.Proc]) -> None:
        self.sim, self.servers = sim, servers
        self.start = self._now()

    def _now(self) -> _Used:
        return _Used(
            servers=sum(proc.cpu_seconds() for proc in self.servers),
            sim=self.sim.proc.cpu_seconds(),
            postgres=procs.named_cpu_seconds("postgres"),
        )

    def since(self) -> _Used:
        now, start = self._now(), self.start
        return _Used(
            servers=now.servers - start.servers,
            sim=now.sim - start.sim,
            postgres=now.postgres - start.postgres,
        )


# ---- drain ------------------------------------------------------------------------------


def drain(plan: Plan) -> list[Row]:
    workdir = plan.dir("drain")
    fleet_file = runbooks.drain_fleet(workdir, plan.drain_pods)
    with (
        world.simulator(workdir, fleet_file=fleet_file, tls=True) as sim,
        world.serve(workdir, database_url=world.sqlite_url(workdir), sim=sim) as server,
    ):
        ours, run = runbooks.run_runbook(
            server.url, "bench-drain", {"node": "gpu-node-0001"}, timeout=900
        )
        theirs = runbooks.kubectl_drain(sim, "gpu-node-0002", timeout=900)
    status = run.get("status", "?")
    measure = f"drain of a {plan.drain_pods}-pod node (30 s grace at time scale 0.05)"
    if theirs is None:
        return [Row(measure, "sqlite", f"{ours:.1f} s", "≤ 0.5x kubectl", "kubectl missing")]
    return [
        Row(
            measure,
            "sqlite",
            f"{ours:.1f} s vs kubectl {theirs:.1f} s (ratio {table.ratio(ours, theirs)})",
            "≤ 0.5x kubectl",
            f"run {status}; kubectl drain --ignore-daemonsets --delete-emptydir-data --force",
        )
    ]


# ---- memory -----------------------------------------------------------------------------


def memory(plan: Plan) -> list[Row]:
    """Both with the simulator configured as the cluster, each reading 8 s after ``/readyz``."""
    workdir = plan.dir("memory")
    url = world.sqlite_url(workdir, "open")
    seed.seed(url, plan.open_episodes, open_count=plan.open_episodes)
    with world.simulator(workdir, nodes=50) as sim:
        with world.serve(workdir, database_url=world.sqlite_url(workdir), sim=sim) as server:
            time.sleep(8)
            idle = server.proc.rss_mb()
        with world.serve(workdir, database_url=url, sim=sim, worker="memory") as server:
            time.sleep(8)  # engine passes over the stored episodes
            rss = server.proc.rss_mb()
    return [
        Row(
            "RSS idle, cluster configured",
            "sqlite",
            f"{idle:.0f} MB",
            "≤ 100 MB",
            "a new database (the first start migrates it); 50-node simulator",
        ),
        Row(
            f"RSS with {plan.open_episodes:,} open episodes",
            "sqlite",
            f"{rss:.0f} MB",
            "≤ 150 MB",
            "episodes seeded in bulk (firing, handled); 50-node simulator as the cluster",
        ),
    ]


def held(plan: Plan) -> list[Row]:
    """A storm the budget holds, measured while it waits (``bench/held.py``)."""
    rows = []
    settle = 5.0 if plan.quick else 20.0
    for backend in plan.backends():
        got = held_mod.measure(
            plan.dir(f"held-{backend}"),
            backend,
            plan.postgres or POSTGRES,
            alerts=plan.held_alerts,
            settle=settle,
            window=plan.duration,
        )
        cpu = f"serve {got.serve_percent:.1f} % of a core"
        if got.postgres_percent is not None:
            cpu += f", Postgres {got.postgres_percent:.1f} %"
        held_at = "never" if got.ready_seconds is None else f"{got.ready_seconds:.1f} s"
        following = (
            "none in 30 s" if got.next_seconds is None else f"{table.ms(got.next_seconds)} ms"
        )
        rows.append(
            Row(
                f"CPU while a {got.alerts:,}-alert storm waits for the budget",
                backend,
                cpu,
                "its idle polling",
                f"max_nodes {held_mod.MAX_NODES}: {got.cordons} cordoned, {got.held} steps "
                f"held ({held_at} after the last delivery); {plan.duration:.0f} s measured "
                f"from {settle:.0f} s after it; then a node returned to service: the next "
                f"cordoned {following} after",
            )
        )
        view = got.view
        rows.append(
            Row(
                f"fleet view of the held storm ({got.alerts:,} nodes): page / API / API page",
                backend,
                f"{table.ms(view.page_seconds)} / {table.ms(view.api_seconds)} / "
                f"{table.ms(view.api_page_seconds)} ms",
                "",
                f"page {view.page_bytes / 1000:,.0f} KB, API {view.api_bytes / 1e6:.1f} MB, "
                f"API page of {held_mod.API_PAGE} nodes {view.api_page_bytes / 1000:,.0f} KB "
                f"(medians of {held_mod.VIEWS}); the webhook's p99 over "
                f"{held_mod.REPEATS} repeats 10 ms apart: {table.ms(view.alone_p99)} ms alone, "
                f"{table.ms(view.beside_p99)} ms with the page fetched back to back",
            )
        )
    return rows + _skipped_postgres(plan, "CPU while a storm waits for the budget")


def soak_stage(plan: Plan) -> list[Row]:
    """``remediator serve`` under a light, endless alert load (``bench.soak``), with the
    simulator as the cluster; RSS sampled throughout. Not in the default run (it lasts
    ``soak_seconds``, an hour unless told): ``--only soak``."""
    workdir = plan.dir("soak")
    nodes = 500
    with (
        world.simulator(workdir, nodes=nodes) as sim,
        world.serve(workdir, database_url=world.sqlite_url(workdir), sim=sim) as server,
    ):
        got = asyncio.run(
            soak.soak(
                server.url,
                server.proc,
                nodes=_names(nodes, nodes, 1),
                seconds=plan.soak_seconds,
                sample=max(1.0, min(30.0, plan.soak_seconds / 60)),
            )
        )
        runs = _run_count(world.sqlite_url(workdir))
    minutes = plan.soak_seconds / 60
    warm = got.warm_up / 60
    return [
        Row(
            f"RSS over a {minutes:.0f}-minute soak: after {warm:.0f} min / end / peak",
            "sqlite",
            f"{got.rss_at(got.warm_up):.0f} / {got.samples[-1][1]:.0f} / {got.peak:.0f} MB",
            "flat",
            f"growth after the warm-up {got.growth_per_hour:+.1f} MB/h (least squares); "
            f"{got.sent:,} deliveries ({got.failed} failed), {runs:,} runs; 5 new "
            "episodes/s, each repeated after 30 s and resolved after 60 s",
        )
    ]


def _run_count(url: str) -> int:
    path = url.split("///", 1)[1]
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT count(*) FROM runs").fetchone()[0])


# ---- growth -----------------------------------------------------------------------------


def growth(plan: Plan) -> list[Row]:
    counts = [c for c in plan.episode_counts if c <= (plan.max_episodes or c)]
    burst = min(plan.burst, 300)
    rows = []
    workdir = plan.dir("growth")
    backends = list(plan.backends())
    total = burst * len(counts) * len(backends)
    with world.simulator(workdir, nodes=total) as sim:
        for b, backend in enumerate(backends):
            for n, count in enumerate(counts):
                first = (b * len(counts) + n) * burst
                with world.database(
                    workdir, backend, plan.postgres or "", f"stored-{count}"
                ) as url:
                    began = time.monotonic()
                    seed.seed(url, count)
                    seeded = time.monotonic() - began
                    rows.append(
                        _grown(plan, sim, url, backend, (count, seeded), burst, first, total)
                    )
    return rows + _skipped_postgres(plan, "growth")


def _grown(
    plan: Plan,
    sim: world.Sim,
    url: str,
    backend: str,
    stored: tuple[int, float],
    burst: int,
    first: int,
    total: int,
) -> Row:
    """A row of the growth stage: ``stored`` episodes, seeded in so many seconds."""
    count, seeded = stored
    workdir = plan.dir("growth")
    worker = f"growth-{backend}-{count}"
    with world.serve(workdir, database_url=url, sim=sim, worker=worker) as server:
        half = (
            intake_mod.half_load(server.url, workdir, 300, plan.duration)
            if intake_mod.available()
            else None
        )
        nodes = _names(burst, total, first + 1)
        got = asyncio.run(
            reaction_mod.burst([server.url], sim, nodes=nodes, first_seq=10**8 + first)
        )
    p99 = table.ms(half.p99) if half else "- (no wrk)"
    return Row(
        f"with {count:,} stored episodes: cordon runs/s ({burst} burst), intake p99",
        backend,
        f"{got.per_second:,.1f}/s, {p99} ms",
        "flat",
        f"intake at ~300 deliveries/s; seeding took {seeded:.0f} s",
    )


# ---- fleet ------------------------------------------------------------------------------


def _list_nodes_seconds(sim: world.Sim) -> float:
    request = urllib.request.Request(f"{sim.url}/api/v1/nodes", headers=sim.headers)
    began = time.monotonic()
    with urllib.request.urlopen(request, timeout=120) as answer:
        answer.read()
    return time.monotonic() - began


def fleet(plan: Plan) -> list[Row]:
    workdir = plan.dir("fleet")
    params: dict[str, object] = {"fail_on": "never"}
    if plan.sweep_concurrency is not None:
        params["max_concurrency"] = plan.sweep_concurrency
    began = time.monotonic()
    with world.simulator(workdir, nodes=plan.fleet_nodes, timeout=900) as sim:
        started = time.monotonic() - began
        rss = sim.proc.rss_mb()
        listing = _list_nodes_seconds(sim)
        with world.serve(workdir, database_url=world.sqlite_url(workdir), sim=sim) as server:
            cpu, serve_cpu = sim.proc.cpu_seconds(), server.proc.cpu_seconds()
            seconds, run = runbooks.run_runbook(
                server.url, "fleet-health-sweep", {"params": params}, timeout=1800
            )
            sim_cpu = sim.proc.cpu_seconds() - cpu
            serve_cpu = server.proc.cpu_seconds() - serve_cpu
    return [
        Row(
            f"simulator carrying {plan.fleet_nodes:,} GPU nodes",
            "-",
            f"start {started:.0f} s, RSS {rss:.0f} MB, LIST nodes {table.ms(listing)} ms",
            "not the bottleneck",
            f"{plan.fleet_nodes * 2:,} driver and DCGM pods, {plan.fleet_nodes * 8:,} GPUs",
        ),
        Row(
            f"fleet-health sweep of {plan.fleet_nodes:,} nodes",
            "sqlite",
            f"{seconds:.1f} s",
            "≤ 60 s",
            f"run {run.get('status', '?')}; {params.get('max_concurrency', 8)} nodes at a time; "
            f"CPU: remediator {serve_cpu:.0f} s, simulator {sim_cpu:.0f} s",
        ),
    ]
