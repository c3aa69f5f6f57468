"""``make bench``: every fleet-scale benchmark in one run, printed as one Markdown table.

    python -m bench.run [--quick] [--duration S] [--only intake,reaction,...]

Stages (each starts its own processes on loopback and stops them, whatever happens):
intake, reaction (latency and burst, SQLite and Postgres, two replicas on Postgres), drain,
memory, growth, fleet (the simulator carrying a large fleet, and the fleet-health sweep),
held (a storm the disruption budget holds: the CPU it costs while it waits);
``soak`` (RSS under a light alert load for ``--soak`` seconds, an hour) only when named in
``--only``. A stage that cannot run (no wrk, no kubectl, no Postgres) leaves a row saying
why. Not a test: nothing is asserted; the numbers are what this machine did in this run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import platform
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable

from bench import procs, stages, table

STAGES: dict[str, Callable[[stages.Plan], list[table.Row]]] = {
    "intake": stages.intake,
    "reaction": stages.reaction,
    "drain": stages.drain,
    "memory": stages.memory,
    "growth": stages.growth,
    "fleet": stages.fleet,
    "held": stages.held,
    "soak": stages.soak_stage,
}


def plan_from(args: argparse.Namespace, workdir: pathlib.Path) -> stages.Plan:
    quick = args.quick or os.environ.get("BENCH_QUICK") == "1"
    plan = stages.Plan.quick_run(workdir) if quick else stages.Plan.full_run(workdir)
    updates = {
        "duration": args.duration,
        "burst": args.burst,
        "fleet_nodes": args.fleet_nodes,
        "postgres": args.postgres,
        "max_episodes": args.max_episodes,
        "sweep_concurrency": args.sweep_concurrency,
        "soak_seconds": args.soak,
    }
    plan = dataclasses.replace(plan, **{k: v for k, v in updates.items() if v is not None})
    return dataclasses.replace(plan, postgres=None) if args.no_postgres else plan


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short smoke run (or BENCH_QUICK=1)")
    parser.add_argument("--duration", type=float, help="seconds per sustained phase (30; quick 3)")
    parser.add_argument("--burst", type=int, help="alerts (and nodes) in the burst (1000)")
    parser.add_argument("--fleet-nodes", type=int, help="nodes of the large fleet (5000)")
    parser.add_argument("--max-episodes", type=int, help="largest stored history (10^6)")
    parser.add_argument("--sweep-concurrency", type=int, help="the sweep's parallel execs")
    parser.add_argument(
        "--soak", type=float, metavar="SECONDS", help="length of the soak stage (3600; quick 60)"
    )
    parser.add_argument(
        "--postgres", default=os.environ.get("BENCH_POSTGRES", stages.POSTGRES), metavar="URL"
    )
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--only", default="", help=f"comma-separated stages of {', '.join(STAGES)}")
    parser.add_argument("--output", type=pathlib.Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    unknown = {s for s in args.only.split(",") if s} - set(STAGES)
    if unknown:
        parser.error(f"unknown stages: {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    # The soak lasts an hour: only when asked for (``--only soak``).
    chosen = [s for s in args.only.split(",") if s] or [s for s in STAGES if s != "soak"]
    # SIGTERM unwinds like Ctrl-C: every stage's ``finally`` stops its processes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows: list[table.Row] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="remediator-bench-") as tmp:
        plan = plan_from(args, pathlib.Path(tmp))
        try:
            for name in chosen:
                rows += _stage(name, plan)
        finally:  # an interrupted run still shows what it measured
            _report(rows, plan, started, args.output)
    return 0


def _stage(name: str, plan: stages.Plan) -> list[table.Row]:
    print(f"bench: {name} ...", file=sys.stderr, flush=True)
    began = time.monotonic()
    try:
        return STAGES[name](plan)
    except Exception as e:  # one failed stage must not lose the others' numbers
        traceback.print_exc(file=sys.stderr)
        return [table.Row(name, "-", "failed", note=f"{type(e).__name__}: {e}"[:200])]
    finally:
        print(f"bench: {name} took {time.monotonic() - began:.0f} s", file=sys.stderr)


def _report(
    rows: list[table.Row], plan: stages.Plan, started: float, output: pathlib.Path | None
) -> None:
    title = (
        f"remediator bench ({'quick' if plan.quick else 'full'}, {plan.duration:g} s phases), "
        f"{procs.cpus()} CPUs, {platform.machine()}, Python {platform.python_version()}, "
        f"{time.monotonic() - started:.0f} s"
    )
    text = table.render(rows, title=title)
    print(text, flush=True)
    if output:
        output.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
