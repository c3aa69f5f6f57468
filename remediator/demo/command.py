"""``remediator demo``: set up the world, play the scenario, show the audit trail, and either
stop everything or (``--keep-running``) leave it up until Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pathlib
import signal
import sys
import tempfile
from collections.abc import Iterator
from typing import TextIO

import httpx

from remediator.demo import acts, display, processes, runner


@dataclasses.dataclass(frozen=True)
class Options:
    keep_running: bool = False
    interactive: bool = False
    color: str = "auto"
    rules: pathlib.Path | None = None
    data_dir: pathlib.Path | None = None
    act_timeout: float = runner.ACT_TIMEOUT


def find_rules(given: pathlib.Path | None) -> pathlib.Path:
    """``--rules``, else ``./rules``, else the ``rules/`` next to the package (a checkout)."""
    if given is not None:
        if not given.is_dir():
            raise processes.DemoError(f"--rules {given}: not a directory")
        return given.resolve()
    package_root = pathlib.Path(__file__).resolve().parents[2]
    installed = pathlib.Path(__file__).resolve().parents[1] / "_rules"  # inside a wheel
    for candidate in (pathlib.Path.cwd() / "rules", package_root / "rules", installed):
        if candidate.is_dir() and any(candidate.glob("*.yaml")):
            return candidate.resolve()
    raise processes.DemoError("no rules/ directory here or next to the package: pass --rules DIR")


@contextlib.contextmanager
def workdir(data_dir: pathlib.Path | None) -> Iterator[pathlib.Path]:
    """A temporary directory removed afterwards, or ``--data-dir`` (kept; must be fresh)."""
    if data_dir is None:
        with tempfile.TemporaryDirectory(prefix="remediator-demo-") as tmp:
            yield pathlib.Path(tmp)
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    if (data_dir / "remediator.db").exists():
        raise processes.DemoError(
            f"{data_dir} holds a previous demo's database: remove it or choose another --data-dir"
        )
    yield data_dir.resolve()


def run(options: Options, out: TextIO | None = None) -> int:
    stream = out or sys.stdout
    isatty = stream.isatty()
    show = display.Display(
        stream, color=display.use_color(options.color, isatty=isatty), live=isatty
    )
    try:
        return asyncio.run(_main(options, show))
    except KeyboardInterrupt:
        show.line("interrupted: everything stopped")
        return 130
    except BrokenPipeError:  # `remediator demo | head`: stopped cleanly, nothing more to say
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
        return 1
    except processes.DemoError as e:
        show.line("")
        show.line(show.style(f"demo failed: {e}", "red", "bold"))
        return 1


async def _main(options: Options, show: display.Display) -> int:
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:  # SIGTERM/SIGHUP stop the demo the way Ctrl-C does: cleanly
        for sig in (signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, task.cancel)
    try:
        return await _demo(options, show)
    except asyncio.CancelledError:
        show.line("stopped: everything shut down")
        return 130


async def _demo(options: Options, show: display.Display) -> int:
    rules = find_rules(options.rules)
    tokens = processes.Tokens.generate()
    show.line(
        show.style("remediator demo", "bold") + " — a simulated GPU cluster, the real server, "
        "real Alertmanager 0.25 deliveries"
    )
    with workdir(options.data_dir) as work:
        kept = "kept" if options.data_dir else "removed on exit"
        show.event("●", f"working directory {work} ({kept})")
        async with processes.simulator(work) as sim:
            show.event(
                "●",
                f"simulator: default GPU fleet (4 GPU nodes, 1 CPU node) at {sim.url}, "
                f"time runs {1 / processes.TIME_SCALE:g}x faster",
            )
            async with processes.server(
                workdir=work, rules=rules, sim=sim, tokens=tokens
            ) as server:
                _intro(show, server, rules)
                async with httpx.AsyncClient(base_url=server.url, timeout=30.0) as client:
                    player = runner.Player(
                        show=show,
                        api=runner.Api(client, tokens),
                        sim=sim,
                        server=server,
                        interactive=options.interactive,
                        act_timeout=options.act_timeout,
                    )
                    try:
                        await _play(show, player)
                    except processes.DemoError as e:
                        if not options.keep_running:
                            raise
                        # Whatever went wrong, --keep-running leaves it all up to look at.
                        show.line("")
                        show.line(show.style(f"demo failed: {e}", "red", "bold"))
                        await _keep_running(show, server, sim, tokens, work, options)
                        return 1
                    if options.keep_running:
                        await _keep_running(show, server, sim, tokens, work, options)
    return 0


async def _play(show: display.Display, player: runner.Player) -> None:
    for number, act in enumerate(acts.SCENARIO, start=1):
        await player.play(number, act)
    verified = await player.audit()
    _summary(show, player)
    if not verified:
        raise processes.DemoError("the audit chain did not verify")


def _intro(show: display.Display, server: processes.Server, rules: pathlib.Path) -> None:
    show.event("●", f"remediator serve at {server.url} (SQLite, playbooks from {rules})")
    for name, value, why in processes.SERVER_TUNING:
        show.line(show.style(f"{name}={value}: {why}", "dim"), indent=11)
    show.line(
        show.style(
            "tokens: alertmanager (ingest) posts alerts, demo-operator approves, "
            "demo-auditor verifies the audit chain",
            "dim",
        ),
        indent=11,
    )


def _summary(show: display.Display, player: runner.Player) -> None:
    runs = player.details.values()
    approvals = sum(len(d.get("approvals") or []) for d in runs)
    elapsed = show.clock() - show.started
    show.heading(
        show.style(
            f"Scenario complete: {len(acts.SCENARIO)} acts, {player.deliveries} deliveries, "
            f"{len(player.details)} runs, {approvals} approval(s), every check passed "
            f"in {elapsed:.1f} s.",
            "green",
        )
    )


async def _keep_running(
    show: display.Display,
    server: processes.Server,
    sim: processes.Sim,
    tokens: processes.Tokens,
    work: pathlib.Path,
    options: Options,
) -> None:
    kept = "kept" if options.data_dir else "removed on exit"
    lines = [
        f"API            {server.url}/api/v1/runs   (header: Authorization: Bearer <token>)",
        f"console        {server.url}/   (sign in with the operator token)",
        f"CLI            {runner.command_prefix()} status --server {server.url} "
        f"--token {tokens.operator}",
        f"simulator      {sim.url}   kubectl --kubeconfig {sim.kubeconfig} get nodes",
        f"tokens         operator (demo-operator): {tokens.operator}",
        f"               auditor (demo-auditor):   {tokens.auditor}",
        f"               ingest (alertmanager):    {tokens.ingest}",
        f"data           {work} ({kept}); server log {server.log}",
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)  # before saying Ctrl-C stops it
    try:
        show.heading("Everything stays up until Ctrl-C:")
        for line in lines:
            show.line(line, indent=2)
        exited = asyncio.create_task(server.process.wait())
        waiting = asyncio.create_task(stop.wait())
        done, pending = await asyncio.wait({exited, waiting}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if exited in done:
            raise processes.DemoError(f"remediator serve exited:\n{server.tail()}")
        show.line("stopping…")
    finally:
        loop.remove_signal_handler(signal.SIGINT)
