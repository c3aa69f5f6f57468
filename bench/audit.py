"""Auditor queries on a large audit log (not a test).

Builds ``--events`` hash-chained audit events (default 1,000,000) with realistic runs, steps and
alert episodes (10 events per run, 1,000 nodes, 8 GPUs each, 12 playbooks, 5 principals),
inserted in bulk; then times each filter's first page (p50/p99 over ``--repeat`` calls, random
filter values) and a full streamed export, sampling the process's resident memory.

    python -m bench.audit --backend sqlite
    python -m bench.audit --backend postgres --pg postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import statistics
import subprocess
import tempfile
import time
import uuid
from typing import Any

import sqlalchemy as sa

from remediator.adapters.db import audit as db_audit
from remediator.adapters.db import database, migrate, tables
from remediator.domain import audit

NODES = [f"gpu-node-{n:04d}" for n in range(1000)]
PLAYBOOKS = [f"playbook-{n:02d}" for n in range(12)]
ALERTS = ["GPUXidError79", "GPUECCUncorrectableError", "GPUTemperatureCritical", "GPUIdleHeld"]
ACTIONS = ["log", "gpu.power_cap", "node.cordon", "node.drain", "gpu.collect_bug_report"]
PRINCIPALS = ["olivia", "oscar", "otto", "ola", "omar"]
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def gpu_uuid(node: int, index: int) -> str:
    return f"GPU-{node:08x}-0000-4000-8000-{index:012x}"


def _rows(n_events: int) -> Any:
    """Yield (episodes, runs, steps, events) batches of one thousand runs each."""
    rng = random.Random(7)
    prev = audit.GENESIS
    event_id = 0
    n_runs = n_events // 10
    for first in range(0, n_runs, 1000):
        episodes, runs, steps, events = [], [], [], []
        for run_id in range(first + 1, min(first + 1000, n_runs) + 1):
            at = START + dt.timedelta(seconds=run_id * 30)
            node_i = rng.randrange(len(NODES))
            node, gpu = NODES[node_i], gpu_uuid(node_i, rng.randrange(8))
            alertname, playbook = rng.choice(ALERTS), rng.choice(PLAYBOOKS)
            principal = rng.choice(PRINCIPALS)
            outcome = rng.choice(["succeeded"] * 8 + ["failed", "rejected"])
            episodes.append(
                {
                    "id": run_id,
                    "fingerprint": f"{run_id:016x}",
                    "starts_at": at,
                    "alertname": alertname,
                    "status": "resolved",
                    "handled_status": "resolved",
                    "labels": {"alertname": alertname, "node": node, "UUID": gpu},
                    "annotations": {},
                    "generator_url": "http://prometheus/graph",
                    "created_at": at,
                }
            )
            runs.append(
                {
                    "id": run_id,
                    "playbook": playbook,
                    "kind": "alert",
                    "status": outcome,
                    "episode_id": run_id,
                    "node": node,
                    "gpu": gpu,
                    "exclusive": True,
                    "dry_run": False,
                    "principal": None,
                    "params": {},
                    "on_resolve": "cancel",
                    "reason": "",
                    "created_at": at,
                    "updated_at": at,
                    "finished_at": at,
                }
            )
            step_ids = [run_id * 2 - 1, run_id * 2]
            for seq, step_id in enumerate(step_ids):
                steps.append(
                    {
                        "id": step_id,
                        "run_id": run_id,
                        "seq": seq,
                        "key": f"s{seq}",
                        "phase": "do",
                        "action": ACTIONS[(run_id + seq) % len(ACTIONS)],
                        "params": {},
                        "status": "succeeded",
                        "requires_approval": seq == 1,
                        "approvals_required": 1,
                        "attempt": 1,
                        "max_attempts": 1,
                        "timeout_seconds": 300.0,
                        "on_failure": "stop",
                        "retry": {},
                        "output": {},
                    }
                )
            plan = [("run.created", "engine", None, "pending")]
            plan += [("step.transition", "engine", step_ids[0], s) for s in ("running",)]
            plan += [("step.transition", "engine", step_ids[0], "succeeded")]
            plan += [("step.transition", "engine", step_ids[1], "waiting_approval")]
            plan += [("step.transition", principal, step_ids[1], "pending")]
            plan += [("step.transition", "engine", step_ids[1], "running")]
            plan += [("step.transition", "engine", step_ids[1], "succeeded")]
            plan += [("run.transition", "engine", None, "running")]
            plan += [("run.transition", principal, None, "running")]
            plan += [("run.transition", "engine", None, outcome)]
            for offset, (kind, actor, step_id, to) in enumerate(plan):
                event_id += 1
                content = {
                    "id": event_id,
                    "at": at + dt.timedelta(seconds=offset),
                    "kind": kind,
                    "actor": actor,
                    "run_id": run_id,
                    "step_id": step_id,
                    "episode_id": run_id,
                    "from_status": None,
                    "to_status": to,
                    "reason": "",
                    "data": {},
                }
                digest = audit.chain_hash(prev, content)
                events.append({**content, "prev_hash": prev, "hash": digest})
                prev = digest
        yield episodes, runs, steps, events, (event_id, prev)


def populate(url: str, n_events: int) -> None:
    started = time.perf_counter()
    asyncio.run(_populate_async(url, n_events))
    print(f"inserted {n_events} events in {time.perf_counter() - started:.0f} s")


async def _populate_async(url: str, n_events: int) -> None:
    db = database.Database(url)
    await migrate.upgrade(db)
    head = None
    for episodes, runs, steps, events, reached in _rows(n_events):
        head = reached
        async with db.write("bench.insert") as conn:
            await conn.execute(sa.insert(tables.alert_episodes), episodes)
            await conn.execute(sa.insert(tables.runs), runs)
            await conn.execute(sa.insert(tables.steps), steps)
            await conn.execute(sa.insert(tables.audit_events), events)
    assert head is not None
    async with db.write("bench.head") as conn:
        await conn.execute(sa.update(tables.audit_head).values(last_id=head[0], last_hash=head[1]))
        await conn.execute(sa.text("ANALYZE"))
    await db.dispose()


def rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as stream:
        for line in stream:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _filters(rng: random.Random) -> dict[str, Any]:
    node_i = rng.randrange(len(NODES))
    since = START + dt.timedelta(days=rng.randrange(30))
    return {
        "node": {"node": NODES[node_i]},
        "gpu": {"gpu": gpu_uuid(node_i, rng.randrange(8))},
        "alertname": {"alertname": rng.choice(ALERTS)},
        "fingerprint": {"fingerprint": f"{rng.randrange(1, 1000):016x}"},
        "playbook": {"playbook": rng.choice(PLAYBOOKS)},
        "action": {"action": rng.choice(ACTIONS)},
        "outcome": {"outcome": rng.choice(["failed", "rejected"])},
        "principal": {"principal": rng.choice(PRINCIPALS)},
        "time range": {"since": since, "until": since + dt.timedelta(hours=6)},
        "node + outcome": {"node": NODES[node_i], "outcome": "succeeded"},
    }


async def measure(url: str, repeat: int) -> dict[str, Any]:
    db = database.Database(url)
    queries = db_audit.AuditQueries(db)
    rng = random.Random(11)
    results: dict[str, Any] = {}
    for what in ("events", "runs"):
        for name in _filters(rng):
            timings = []
            for _ in range(repeat):
                values = dict(_filters(rng)[name])
                started = time.perf_counter()
                method = queries.events if what == "events" else queries.runs
                await method(db_audit.Filters(**values), limit=50, cursor=None)
                timings.append((time.perf_counter() - started) * 1000)
            timings.sort()
            p99 = timings[min(len(timings) - 1, int(len(timings) * 0.99))]
            results[f"{what}: {name}"] = (statistics.median(timings), p99)
    before = rss_kib()
    peak, count, started = before, 0, time.perf_counter()
    async for batch in queries.stream_events(db_audit.Filters()):
        count += len(json.dumps(batch))
        peak = max(peak, rss_kib())
    results["export"] = {
        "seconds": time.perf_counter() - started,
        "bytes": count,
        "rss_start_mib": before / 1024,
        "rss_peak_mib": peak / 1024,
    }
    await db.dispose()
    return results


def _pg_database(admin: str) -> tuple[str, str]:
    name = f"rmbench_{uuid.uuid4().hex[:8]}"
    subprocess.run(["psql", admin, "-q", "-c", f"CREATE DATABASE {name}"], check=True)
    base = admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://")
    return name, f"{base}/{name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        name = None
        if args.backend == "sqlite":
            url = f"sqlite+aiosqlite:///{tmp}/bench.db"
        else:
            name, url = _pg_database(args.pg)
        try:
            populate(url, args.events)
            results = asyncio.run(measure(url, args.repeat))
        finally:
            if name is not None:
                subprocess.run(
                    ["psql", args.pg, "-q", "-c", f"DROP DATABASE {name} WITH (FORCE)"],
                    check=False,
                )
    print("| backend | query (first page of 50) | p50 ms | p99 ms |\n|---|---|---:|---:|")
    for key, value in results.items():
        if key != "export":
            print(f"| {args.backend} | {key} | {value[0]:.1f} | {value[1]:.1f} |")
    print(json.dumps({"export": results["export"]}, indent=2))


if __name__ == "__main__":
    main()
