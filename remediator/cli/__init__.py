"""``remediator``: serve, migrate, lint, plan, schema, docs, sim and demo here; the operator
commands that talk to a server's API with a token (status, runs, runbook, breaker, audit) in
``operators``, their API client in ``client``, what they print in ``output``.

``main`` turns what goes wrong around a command into one line on stderr and an exit status."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import pathlib
import sys

import pydantic

from remediator import __version__
from remediator.cli import operators, options
from remediator.cli.operators import DEFAULT_SERVER, server_url
from remediator.domain import terminal

__all__ = ["DEFAULT_SERVER", "build_parser", "main", "server_url"]

logger = logging.getLogger("remediator")

_SERVE_OPTIONS = ("listen", "database_url", "rules", "tokens")


# Allocations between two collections of the youngest generation (Python's default: 700).
YOUNG_COLLECTION = 7000


def settle_collector() -> None:
    """Tune the garbage collector for a long-running server, once start-up is done.

    Everything start-up built (imported modules, the app, the Kubernetes client's model
    classes once a cluster is connected) lives for the whole process: it is frozen, moved out
    of the collector's way, so a full collection does not pause the webhook for ~100 ms while
    it walks 160,000 objects. And the youngest generation is collected every
    ``YOUNG_COLLECTION`` allocations instead of every 700: with 64 webhook requests in flight
    each collection walked the objects of all of them, 5 % of the instructions a delivery
    cost. Collected ten times less often, fewer of them are walked at all (most of what a
    request allocates is freed by its reference count before the next collection), and the
    cyclic garbage left for longer is a few thousand objects at most.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION, *gc.get_threshold()[1:])


def _serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    import remediator.app as app_mod
    from remediator.adapters import files
    from remediator.app import logs

    settings = options.load_settings(args, _SERVE_OPTIONS)
    logs.configure(settings.log_level, settings.log_format)
    app_mod.check_exposure(settings)
    try:
        app = app_mod.create_app(settings, migrate_apart=True)
    except files.RulesInvalid as e:
        print(f"playbooks are invalid:\n{e}", file=sys.stderr)
        return 2
    except files.TokensInvalid as e:
        problems = "; ".join(" ".join(line.split()) for line in str(e).splitlines() if line)
        print(f"remediator: the tokens file is invalid: {problems}", file=sys.stderr)
        return 2
    host, port = settings.host_port

    async def settle(_: web.Application) -> None:
        settle_collector()

    app.on_startup.append(settle)  # once it has started, before it listens
    logger.info("listening on %s:%s", host, port, extra={"database": settings.is_sqlite})
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    shown = f"[{shown}]" if ":" in shown else shown
    logger.info("web console: http://%s:%s/", shown, port)
    web.run_app(
        app,
        host=host,
        port=port,
        print=None,
        access_log=None,
        shutdown_timeout=settings.shutdown_grace + 5,
        **app_mod.SERVER_OPTIONS,
    )
    return 1 if app[app_mod.FAILED] else 0


def _migrate(args: argparse.Namespace) -> int:
    from remediator.adapters.db import database, migrate

    settings = options.load_settings(args, ("database_url",))

    async def run() -> str | None:
        db = database.Database(settings.database_url)
        try:
            if args.revision.startswith("-") or args.downgrade:
                await migrate.downgrade(db, args.revision)
            else:
                await migrate.upgrade(db, args.revision)
            return await migrate.current_revision(db)
        finally:
            await db.dispose()

    current = asyncio.run(run())
    print(f"database at revision {current}")
    return 0


def _lint(args: argparse.Namespace) -> int:
    from remediator.adapters import files
    from remediator.app import build_registry

    registry = build_registry(args.plugin or [])
    paths = [pathlib.Path(path) for path in args.paths]
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        print(f"no such file or directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    loaded, problems = files.load_playbooks(paths, registry)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} problem(s) in {len(files.playbook_files(paths))} file(s)")
        return 1
    print(f"{len(loaded)} playbook(s) OK")
    return 0


def _schema(args: argparse.Namespace) -> int:
    from remediator.domain import playbooks

    schema = playbooks.Playbook.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "remediator playbook"
    print(json.dumps(schema, indent=2, sort_keys=True))
    return 0


def _plan(args: argparse.Namespace) -> int:
    from remediator.adapters import files
    from remediator.app import planner

    settings = options.load_settings(args, ("database_url", "rules"))
    if not settings.kubernetes and not args.offline:
        print(
            "remediator plan: no `kubernetes` setting, so a plan would show no live state (pods "
            "a drain evicts, current labels, power limits): point it at the cluster or the "
            "simulator, or pass --offline",
            file=sys.stderr,
        )
        return 2
    try:
        body = pathlib.Path(args.alert).read_bytes()
        result = asyncio.run(
            planner.plan_body(settings, body, use_database=planner.database_exists(settings))
        )
    except pydantic.ValidationError as e:
        print(f"{args.alert}: not an Alertmanager webhook payload:\n{e}", file=sys.stderr)
        return 2
    except files.RulesInvalid as e:
        print(f"playbooks are invalid:\n{e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"cannot read {args.alert}: {e}", file=sys.stderr)
        return 2
    operators.emit(args, result, "plan")
    if not settings.kubernetes:
        print(
            "remediator plan: --offline, so the plan shows no live state (which pods a drain "
            "would evict, current labels and power limits)",
            file=sys.stderr,
        )
    return 0


def _docs(args: argparse.Namespace) -> int:
    from remediator.app import docs

    if args.check:
        stale = docs.stale(args.out)
        for name in stale:
            print(f"{args.out / name} is stale: run `remediator docs`", file=sys.stderr)
        return 1 if stale else 0
    for name in docs.write(args.out):
        print(f"wrote {args.out / name}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from remediator.demo import command

    chosen = command.Options(
        keep_running=args.keep_running,
        interactive=args.interactive,
        color=args.color,
        rules=args.rules,
        data_dir=args.data_dir,
        act_timeout=args.act_timeout,
    )
    return command.run(chosen)


def _sim(args: argparse.Namespace) -> int:
    from remediator.sim import cli as sim_cli

    return sim_cli.run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="remediator", description="Alert remediation for Kubernetes GPU clusters."
    )
    parser.add_argument("--version", action="version", version=f"remediator {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the webhook, API and engine")
    options.add_settings_options(serve, _SERVE_OPTIONS)
    serve.set_defaults(func=_serve)

    migrate = commands.add_parser("migrate", help="upgrade the database schema (Alembic)")
    options.add_settings_options(migrate, ("database_url",))
    migrate.add_argument("--revision", default="head", help="target revision (default head)")
    migrate.add_argument("--downgrade", action="store_true", help="downgrade to --revision")
    migrate.set_defaults(func=_migrate)

    lint = commands.add_parser("lint", help="validate playbook files")
    lint.add_argument("paths", nargs="+", help="playbook files or directories")
    lint.add_argument("--plugin", action="append", help="module registering extra actions")
    lint.set_defaults(func=_lint)

    plan = commands.add_parser(
        "plan", help="show what remediator would do for an alert payload; changes nothing"
    )
    plan.add_argument("--alert", required=True, help="an Alertmanager webhook body (JSON file)")
    plan.add_argument(
        "--offline",
        action="store_true",
        help="plan without cluster settings (no live state); without it, no `kubernetes` "
        "setting is an error",
    )
    operators.add_output_option(plan)
    options.add_settings_options(plan, ("database_url", "rules"))
    plan.set_defaults(func=_plan)

    schema = commands.add_parser("schema", help="print the playbook JSON Schema")
    schema.set_defaults(func=_schema)

    docs = commands.add_parser(
        "docs", help="write the generated reference docs (configuration, actions, schema)"
    )
    docs.add_argument("--out", type=pathlib.Path, default=pathlib.Path("docs"))
    docs.add_argument("--check", action="store_true", help="fail if the files are stale")
    docs.set_defaults(func=_docs)

    sim = commands.add_parser("sim", help="run the simulated GPU cluster (Kubernetes API)")
    try:
        from remediator.sim import cli as sim_cli

        sim_cli.add_arguments(sim)
    except ImportError:  # pragma: no cover - the simulator ships with the package
        pass
    sim.set_defaults(func=_sim)

    demo = commands.add_parser(
        "demo", help="replay real GPU alerts against the simulator and a real server"
    )
    demo.add_argument(
        "--keep-running",
        action="store_true",
        help="after the scenario, whatever its outcome, keep the simulator and the server up "
        "until Ctrl-C",
    )
    demo.add_argument(
        "--interactive",
        action="store_true",
        help="wait, as long as you like, for you to approve the drains (in the console or with "
        "`remediator runs approve`; the demo prints both)",
    )
    demo.add_argument(
        "--act-timeout",
        type=_seconds,
        default=45.0,
        metavar="SECONDS",
        help="give up on an act that has not ended after this long (default 45; time a step "
        "waits for your approval does not count)",
    )
    demo.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    demo.add_argument("--rules", type=pathlib.Path, help="playbook directory (default ./rules)")
    demo.add_argument("--data-dir", type=pathlib.Path, help="keep the database and artifacts here")
    demo.set_defaults(func=_demo)
    operators.add_commands(commands)
    return parser


def _seconds(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise argparse.ArgumentTypeError("a positive number of seconds")
    return number


def _raised(error: BaseException, module: str, name: str) -> bool:
    """``error`` is ``module.name`` (looked up only if that module is loaded: a command that
    never imported it cannot have raised it)."""
    loaded = sys.modules.get(module)
    kind = getattr(loaded, name, None) if loaded is not None else None
    return isinstance(kind, type) and isinstance(error, kind)


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return " ".join(text[0].split()) if text else type(error).__name__


def _explain(error: Exception, args: argparse.Namespace) -> tuple[str, int] | None:
    """What went wrong outside remediator as one line and an exit status; None for a bug."""
    if _raised(error, "remediator.cli.client", "ApiError"):
        return str(error), 1
    if isinstance(error, operators.ServerAddressError):
        return str(error), 2
    if _raised(error, "httpx", "InvalidURL"):
        return f"--server {getattr(args, 'server', '')!r} is not a usable URL: {error}", 2
    if _raised(error, "httpx", "HTTPError"):
        where = getattr(args, "server", None) or DEFAULT_SERVER
        return f"cannot reach the server at {where}: {_one_line(error)}", 2
    if _raised(error, "remediator.domain.errors", "RemediatorError"):
        return _one_line(error), 1
    if _raised(error, "sqlalchemy.exc", "SQLAlchemyError"):
        return f"database error: {_one_line(error)}", 1
    if isinstance(error, OSError):
        return _one_line(error), 1
    return None


def main(argv: list[str] | None = None) -> int:
    """Run a command; what goes wrong outside remediator (a server that does not answer, an
    API error, a database that cannot be reached, a closed pipe, Ctrl-C) is one line on stderr
    and an exit status, never a traceback."""
    args = build_parser().parse_args(argv)
    try:
        result: int = args.func(args)
        sys.stdout.flush()  # what is still buffered meets a closed pipe here, not at exit
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, and keep Python from complaining
        # when it flushes standard output on exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        explained = _explain(e, args)
        if explained is None:
            raise
        message, status = explained
        print(f"remediator: {terminal.printable(message)}", file=sys.stderr)
        return status
    return result


if __name__ == "__main__":
    sys.exit(main())
