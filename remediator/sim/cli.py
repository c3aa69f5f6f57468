"""``remediator sim``: run the simulated cluster and write a kubeconfig for its clients."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import secrets
import signal
import sys

from remediator.sim import fleet as fleet_mod


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        default="127.0.0.1:6443",
        metavar="HOST:PORT",
        help="address to serve the Kubernetes API on (port 0: any free port)",
    )
    parser.add_argument(
        "--fleet",
        default=None,
        metavar="FILE",
        help="fleet description (YAML); default: the packaged default fleet",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=None,
        metavar="N",
        help="generate a fleet of N GPU nodes (eight H100 each, the GPU Operator's driver and "
        "DCGM pods on every node: gpu-node-0001 ...) instead of --fleet",
    )
    parser.add_argument(
        "--token", default=None, help="bearer token clients must present (default: random, printed)"
    )
    parser.add_argument(
        "--kubeconfig",
        default=None,
        metavar="PATH",
        help="where to write a kubeconfig for the simulator (default: a temporary directory, "
        "removed on exit; the path is printed)",
    )
    parser.add_argument(
        "--tls",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serve HTTPS with the bundled self-signed certificate; --no-tls serves plain HTTP, "
        "over which kubectl sends no credentials, so requests without a token are served too "
        "(see --anonymous)",
    )
    parser.add_argument(
        "--anonymous",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve requests that carry no token (a wrong token is always refused); default: "
        "on with --no-tls, so kubectl works over plain HTTP, off with TLS",
    )
    parser.add_argument(
        "--state-file",
        default=None,
        metavar="PATH",
        help="restore the cluster saved in PATH (if it exists) and save it there on exit, "
        "so a restarted simulator keeps its state; without it a restart starts from the fleet",
    )
    parser.add_argument(
        "--restore",
        choices=("all", "gpus"),
        default="all",
        help="what to restore from --state-file: everything, or only the GPUs (an API server "
        "that lost its etcd: objects start over from the fleet, GPUs keep their power limits)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=None,
        metavar="FACTOR",
        help="real seconds per simulated second (e.g. 0.1 runs 10x faster)",
    )
    parser.add_argument(
        "--default-grace",
        type=int,
        default=None,
        metavar="SECONDS",
        help="override every pod's terminationGracePeriodSeconds",
    )
    parser.add_argument(
        "--bug-report-seconds",
        type=float,
        default=None,
        metavar="SECONDS",
        help="simulated duration of nvidia-bug-report.sh",
    )


def _load_fleet(args: argparse.Namespace) -> fleet_mod.Fleet:
    if args.nodes is not None and args.fleet:
        raise ValueError("give --fleet or --nodes, not both")
    if args.nodes is not None:
        fleet = fleet_mod.generate(args.nodes)
    elif args.fleet:
        fleet = fleet_mod.Fleet.from_file(args.fleet)
    else:
        fleet = fleet_mod.Fleet.default()
    updates: dict[str, object] = {}
    if args.default_grace is not None:
        updates["default_grace_seconds"] = args.default_grace
    if args.bug_report_seconds is not None:
        updates["bug_report_seconds"] = args.bug_report_seconds
    if updates:
        fleet = fleet.model_copy(update={"settings": fleet.settings.model_copy(update=updates)})
    return fleet


async def _serve(args: argparse.Namespace, fleet: fleet_mod.Fleet, token: str) -> None:
    # The server is imported here, not at the top: every ``remediator`` command builds this
    # module's options, and only ``remediator sim`` needs aiohttp's server.
    from remediator.sim import server, testing

    host, _, port = args.listen.rpartition(":")
    sim = await testing.start_sim(
        fleet,
        token=token,
        time_scale=args.time_scale,
        host=host or "127.0.0.1",
        port=int(port),
        kubeconfig_path=args.kubeconfig,
        tls=args.tls,
        state_file=args.state_file,
        restore=args.restore,
        anonymous=not args.tls if args.anonymous is None else args.anonymous,
    )
    # The fleet (5,000 nodes: millions of objects) lives as long as the simulator: out of the
    # collector's way once built, so a full collection does not stall every answer for a
    # quarter of a second while it walks them (the webhook server does the same at start).
    gc.collect()
    gc.freeze()
    print(f"remediator sim: serving the Kubernetes API on {sim.url}", flush=True)
    log = sim.cluster.mutations
    if log.boot > 1:
        print(
            f"remediator sim: state restored from {args.state_file} "
            f"(epoch {log.epoch}, boot {log.boot})",
            flush=True,
        )
    print(f"remediator sim: token {token}", flush=True)
    kept = "" if args.kubeconfig else ", removed on exit"
    print(
        f"remediator sim: kubeconfig written to {sim.kubeconfig_path} (context "
        f"{testing.CONTEXT}{kept}): export KUBECONFIG={sim.kubeconfig_path}",
        flush=True,
    )
    if sim.app[server.ANONYMOUS]:
        print(
            "remediator sim: requests without a token are served (kubectl sends none over "
            "plain HTTP); a wrong token is refused",
            flush=True,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await sim.stop()


def run(args: argparse.Namespace) -> int:
    try:
        fleet = _load_fleet(args)
    except (OSError, ValueError) as e:
        print(f"remediator sim: cannot load fleet: {e}", file=sys.stderr)
        return 2
    token = args.token or secrets.token_urlsafe(24)
    try:
        asyncio.run(_serve(args, fleet, token))
    except (OSError, ValueError) as e:
        print(f"remediator sim: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m remediator.sim", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
